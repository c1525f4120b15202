/*
id: 698543fc-41b2-4a62-b172-a068f14e51ab
name: C2 beaconing at a regular interval
version: 2
severity: high
mitre: [T1071.001, T1573]
description: >
  Implants call home on a timer: within one hour a host makes 20 or more connections to
  the same external address and port, and the gaps between consecutive connections are
  nearly constant (standard deviation at most 15% of the mean gap, mean gap 10 s to 3 min).
  People browsing make bursts with irregular gaps. Streaming SQL has no lag(), so the gaps
  are computed inside the hour's aggregate: the connection start times are collected,
  de-duplicated per connection (both sensors log each one), sorted and differenced.
false_positives:
  - Software update or telemetry agents polling on a fixed timer more than 20 times an hour.
  - Monitoring agents and heartbeats to SaaS endpoints.
  - "IoT devices checking in with their cloud (every 5 minutes here, 12 an hour: below the threshold)."
references:
  - https://attack.mitre.org/techniques/T1071/001/
tables: [enriched_conn]
event_time: event_time
window: 1 hour
keys: [src_ip, mac, dst_ip, dst_port]
*/
WITH external_tcp AS (
    SELECT
        src_ip, mac, device, owner, dst_ip, dst_port, event_time,
        -- one connection, whichever sensor logged it
        coalesce(community_id, concat_ws(':', src_port, dst_port)) AS connection
    FROM enriched_conn
    WHERE proto = 'tcp'
      AND NOT (dst_ip LIKE '10.%' OR dst_ip LIKE '192.168.%' OR dst_ip RLIKE '^172[.](1[6-9]|2[0-9]|3[01])[.]')
),

per_pair AS (
    SELECT
        src_ip, mac, device, owner, dst_ip, dst_port,
        window(event_time, '1 hour') AS w,
        array_sort(collect_set(named_struct('at', unix_seconds(event_time), 'connection', connection))) AS seen,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM external_tcp
    GROUP BY src_ip, mac, device, owner, dst_ip, dst_port, window(event_time, '1 hour')
),

connections AS (
    SELECT
        *,
        -- earliest sighting of each connection, in time order
        transform(filter(seen, (c, i) -> NOT exists(slice(seen, 1, i), p -> p.connection = c.connection)),
                  c -> c.at) AS starts
    FROM per_pair
    WHERE size(seen) >= 20
),

gaps AS (
    SELECT
        *,
        size(starts) AS n,
        -- get(), not starts[k]: the optimizer may evaluate this before the WHERE below drops short arrays
        transform(sequence(1, size(starts) - 1), k -> get(starts, k) - get(starts, k - 1)) AS gap
    FROM connections
    WHERE size(starts) >= 20            -- a beacon every 3 minutes or faster for an hour
),

regularity AS (
    SELECT
        *,
        aggregate(gap, 0D, (total, g) -> total + g) / size(gap) AS mean_gap
    FROM gaps
),

scored AS (
    SELECT
        *,
        sqrt(aggregate(gap, 0D, (total, g) -> total + (g - mean_gap) * (g - mean_gap)) / size(gap)) AS gap_stddev
    FROM regularity
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    dst_ip, dst_port, n AS connections,
    round(mean_gap, 1) AS mean_gap_s,
    round(gap_stddev, 2) AS gap_stddev_s,
    concat(n, ' connections to ', dst_ip, ':', dst_port, ' in 1 hour, every ', round(mean_gap, 1),
           ' s +- ', round(gap_stddev, 1), ' s') AS evidence
FROM scored
WHERE mean_gap BETWEEN 10 AND 180      -- timer-driven, not a single long session nor a download burst
  AND gap_stddev <= 0.15 * mean_gap    -- near-constant spacing; the generator's beacon has 60 s +- 3 s jitter
