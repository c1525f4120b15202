/*
id: af17274f-539a-4731-afe7-60af887fc10e
name: Internal port scan
version: 2
severity: medium
mitre: [T1046]
description: >
  One host opens TCP connections to 100 or more distinct internal targets (address and
  port pairs) within ten minutes, spread over at least 10 ports or 10 hosts: horizontal,
  vertical or block scans of the internal network (nmap -sS and the like). Workstations
  talk to a handful of internal services (domain controller, file server, intranet).
false_positives:
  - Vulnerability scanners and asset-discovery tools (Nessus, Qualys, Lansweeper) run by IT.
  - Monitoring servers polling many hosts and ports.
references:
  - https://attack.mitre.org/techniques/T1046/
tables: [enriched_conn]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
*/
WITH internal_tcp AS (
    SELECT
        src_ip, mac, device, owner, event_time, dst_ip, dst_port, conn_state,
        concat(dst_ip, ':', dst_port) AS target
    FROM enriched_conn
    WHERE proto = 'tcp'
      -- RFC 1918 destinations: scans of the organisation's own network
      AND (dst_ip LIKE '10.%' OR dst_ip LIKE '192.168.%' OR dst_ip RLIKE '^172[.](1[6-9]|2[0-9]|3[01])[.]')
),

per_host AS (
    SELECT
        src_ip, mac, device, owner,
        window(event_time, '10 minutes') AS w,
        size(collect_set(target)) AS targets,
        size(collect_set(dst_ip)) AS hosts,
        size(collect_set(dst_port)) AS ports,
        size(collect_set(CASE WHEN conn_state IN ('S0', 'REJ') THEN target END)) AS unanswered,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM internal_tcp
    GROUP BY src_ip, mac, device, owner, window(event_time, '10 minutes')
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    targets, hosts, ports, unanswered,
    concat(targets, ' internal targets (', hosts, ' hosts x ', ports, ' ports, ', unanswered,
           ' unanswered or rejected) in 10 minutes') AS evidence
FROM per_host
WHERE targets >= 100                    -- a workstation reaches ~10 internal services; the generator's scan probes 800
  AND (ports >= 10 OR hosts >= 10)      -- vertical or horizontal spread, not one busy service
