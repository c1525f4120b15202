/*
id: cfa03269-307e-49a0-96fe-8fb38b918816
name: Connection with a threat-intel IP address
version: 4
severity: high
mitre: [T1071]
description: >
  A host exchanged traffic with an IP address that a loaded threat-intelligence feed lists as
  malicious, by itself or inside a listed IPv4 range (the `indicators` table, `seclake intel
  load`): outbound to a command-and-control server, or inbound from a listed scanner or exploit
  source. The alert names the internal
  side (the attributed host). One alert per host, indicator and day; loading a feed also
  sweeps the last 90 days with this rule, with the same alert ids.
false_positives:
  - Feeds that list shared hosting, cloud or CDN addresses that legitimate services also use.
  - Blocked attempts (a connection the firewall rejected is still a connection in the logs).
references:
  - https://attack.mitre.org/techniques/T1071/
  - https://feodotracker.abuse.ch/
  - https://www.spamhaus.org/blocklists/do-not-route-or-peer/
tables: [enriched_conn]
lookups: [indicators]
event_time: event_time
window: 1 day
emit: crossed                 # one matching connection is enough: alert in the batch that sees it
keys: [src_ip, mac, indicator]
*/
WITH sides AS (
    SELECT
        coalesce(attributed_ip, src_ip) AS src_ip, mac, device, owner, event_time,
        CASE WHEN coalesce(attributed_ip, src_ip) = src_ip THEN dst_ip ELSE src_ip END AS remote,
        CASE WHEN coalesce(attributed_ip, src_ip) = src_ip THEN 'to' ELSE 'from' END AS direction,
        dst_port,
        -- one connection, whichever sensor logged it (Zeek and Suricata both do)
        coalesce(community_id, concat_ws(':', src_ip, src_port, dst_ip, dst_port)) AS connection
    FROM enriched_conn
),

numbered AS (                           -- an IPv4 remote as a number and its first octet (NULL for IPv6)
    SELECT *,
        CASE WHEN size(octets) = 4 THEN
            try_cast(octets[0] AS BIGINT) * 16777216 + try_cast(octets[1] AS BIGINT) * 65536
            + try_cast(octets[2] AS BIGINT) * 256 + try_cast(octets[3] AS BIGINT)
        END AS remote_number,
        try_cast(octets[0] AS INT) AS first_octet
    FROM (SELECT *, split(remote, '[.]') AS octets FROM sides)
),

ranges AS (                             -- each listed range (/8 or longer: one first octet) as its first and last address
    SELECT value, source, first_octet, first_number, first_number + shiftleft(1L, 32 - prefix) - 1 AS last_number
    FROM (
        SELECT value, source, prefix, try_cast(octets[0] AS INT) AS first_octet,
            try_cast(octets[0] AS BIGINT) * 16777216 + try_cast(octets[1] AS BIGINT) * 65536
            + try_cast(octets[2] AS BIGINT) * 256 + try_cast(octets[3] AS BIGINT) AS first_number
        FROM (
            SELECT value, source, split(split(value, '/')[0], '[.]') AS octets,
                try_cast(split(value, '/')[1] AS INT) AS prefix
            FROM indicators
            WHERE type = 'cidr'
        )
    )
),

hits AS (
    SELECT s.src_ip, s.mac, s.device, s.owner, s.event_time, s.remote, s.direction, s.dst_port, s.connection,
        i.value AS indicator, i.source AS feed
    FROM sides s
    JOIN indicators i ON i.value = s.remote AND i.type = 'ip'
    UNION ALL
    SELECT n.src_ip, n.mac, n.device, n.owner, n.event_time, n.remote, n.direction, n.dst_port, n.connection,
        r.value AS indicator, r.source AS feed
    FROM numbered n
    JOIN ranges r ON r.first_octet = n.first_octet AND n.remote_number BETWEEN r.first_number AND r.last_number
)

SELECT
    src_ip, mac, device, owner, indicator,
    window(event_time, '1 day').start AS window_start,
    window(event_time, '1 day').end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    size(collect_set(connection)) AS connections,
    min(feed) AS feed,
    concat(coalesce(device, src_ip), ' exchanged ', size(collect_set(connection)), ' connection(s) ', min(direction), ' ',
           CASE WHEN min(remote) = indicator THEN indicator
                WHEN min(remote) = max(remote) THEN concat(min(remote), ' in ', indicator)
                ELSE concat(min(remote), ' and other addresses in ', indicator) END,
           ' (port ', coalesce(cast(min(dst_port) AS string), 'unknown'), ') between ',
           date_format(min(event_time), 'HH:mm'), ' and ', date_format(max(event_time), 'HH:mm'),
           ' UTC, listed by ', min(feed)) AS evidence
FROM hits
GROUP BY src_ip, mac, device, owner, indicator, window(event_time, '1 day')
