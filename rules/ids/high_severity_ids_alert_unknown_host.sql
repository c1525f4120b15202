/*
id: 9faa2dfd-3784-4ae8-94f8-6586249fd090
name: High-severity IDS alert on a host without an inventory device
version: 1
severity: high
mitre: [T1190, T1071]
description: >
  Suricata raised a priority-1 (high severity) signature for traffic of an internal address
  that no inventory device held at the alert's time: a server with a static address (no DHCP
  lease names it), a device the inventory does not list, or a network whose DHCP logs seclake
  does not receive. Inbound exploits mostly hit such hosts. With high_severity_ids_alert
  (inventory devices) every priority-1 alert on an internal host raises one alert. The alert
  names the address, and the MAC when a lease held the address then. One alert per address,
  MAC, signature and ten minutes.
false_positives:
  - Signatures that are high priority but noisy in this network (tune them in Suricata's threshold.config).
  - Penetration tests and vulnerability scans of the servers.
references:
  - https://docs.suricata.io/en/latest/rules/meta.html#priority
tables: [enriched_ids_alerts]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
keys: [src_ip, mac, signature_id]
*/
WITH high_alerts AS (
    SELECT
        attributed_ip AS src_ip,        -- the alert's internal side, whichever direction the signature matched
        mac, hostname, event_time, signature_id, signature, category,
        CASE WHEN attributed_ip = src_ip THEN concat(dst_ip, ':', dst_port) ELSE concat(src_ip, ':', src_port) END AS remote
    FROM enriched_ids_alerts
    WHERE severity = 1                  -- Suricata priority 1 = high; 2-3 are policy and protocol noise
      AND device IS NULL                -- no inventory device held the address (high_severity_ids_alert has those)
)

SELECT
    src_ip, mac,
    CAST(NULL AS STRING) AS device,
    CAST(NULL AS STRING) AS owner,
    window.start AS window_start,
    window.end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    signature_id, signature, category,
    max(hostname) AS hostname,
    count(*) AS hits,
    slice(array_sort(collect_set(remote)), 1, 5) AS remotes,
    concat('Suricata sid ', signature_id, ' "', signature, '" (', category, ') for ', src_ip,
           CASE WHEN mac IS NULL THEN ' (no DHCP lease held it: a static address or a network without DHCP logs)'
                ELSE concat(' (MAC ', mac, ', DHCP hostname ', coalesce(max(hostname), '?'), ', not in the inventory)') END,
           ', remote ', array_join(slice(array_sort(collect_set(remote)), 1, 3), ', ')) AS evidence
FROM high_alerts
GROUP BY src_ip, mac, signature_id, signature, category, window(event_time, '10 minutes')
