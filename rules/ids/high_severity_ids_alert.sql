/*
id: 3b8e661c-d0bb-47c6-85cd-837b3adab3b8
name: High-severity IDS alert on a known device
version: 2
severity: high
mitre: [T1071, T1204]
description: >
  Suricata raised a priority-1 (high severity) signature for traffic of a device in the
  inventory. The alert names the device and owner that held the IP address at the alert's
  own time (from the DHCP lease valid then), not whoever holds the address now: after an
  address is reassigned, the right laptop is still the one investigated. One alert per
  device, signature and ten minutes.
false_positives:
  - Signatures that are high priority but noisy in this network (tune them in Suricata's threshold.config).
  - Penetration tests and red-team exercises.
references:
  - https://docs.suricata.io/en/latest/rules/meta.html#priority
tables: [enriched_ids_alerts]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
keys: [src_ip, mac, signature_id]
realtime: high_alerts         # each such event raises its alert at once on the real-time path (docs/kafka.md)
*/
WITH high_alerts AS (
    SELECT
        attributed_ip AS src_ip,        -- the alert's internal side, whichever direction the signature matched
        mac, device, owner, event_time, signature_id, signature, category,
        CASE WHEN attributed_ip = src_ip THEN concat(dst_ip, ':', dst_port) ELSE concat(src_ip, ':', src_port) END AS remote
    FROM enriched_ids_alerts
    WHERE severity = 1                  -- Suricata priority 1 = high; 2-3 are policy and protocol noise
      AND device IS NOT NULL            -- attributed to an inventory device through the lease valid at alert time
)

SELECT
    src_ip, mac, device, owner,
    window.start AS window_start,
    window.end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    signature_id, signature, category,
    count(*) AS hits,
    slice(array_sort(collect_set(remote)), 1, 5) AS remotes,
    concat('Suricata sid ', signature_id, ' "', signature, '" (', category, ') for ', device, ' of ', owner,
           ', remote ', array_join(slice(array_sort(collect_set(remote)), 1, 3), ', ')) AS evidence
FROM high_alerts
GROUP BY src_ip, mac, device, owner, signature_id, signature, category, window(event_time, '10 minutes')
