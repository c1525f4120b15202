/*
id: 5c284923-fe82-4abe-a092-1675e2d3c4fe
name: Unknown device on the network
version: 4
severity: medium
mitre: [T1200]
description: >
  A device whose MAC address is not in the inventory holds a DHCP lease and talks on the
  network: a rogue Raspberry Pi behind a desk, an unregistered laptop, a hardware implant.
  Its connections are attributed to its MAC through the lease valid at their time, but no
  inventory entry (device, owner) matches. One alert per device and hour while it is active.
false_positives:
  - New hardware handed out before the inventory was updated.
  - Phones or laptops with MAC randomisation on a network that registers MACs.
references:
  - https://attack.mitre.org/techniques/T1200/
tables: [enriched_conn]
event_time: event_time
window: 1 hour
emit: crossed                 # any attributed connection qualifies: alert in the batch that sees the first one
*/
WITH unregistered AS (
    SELECT src_ip, mac, device, owner, hostname, event_time, dst_ip, dst_port
    FROM enriched_conn
    WHERE mac IS NOT NULL               -- a lease names the device holding the address then
      AND device IS NULL                -- ... and the inventory does not know that MAC
      AND src_ip <> '0.0.0.0'
)

SELECT
    src_ip, mac, device, owner,
    window.start AS window_start,
    window.end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    max(hostname) AS hostname,
    count(*) AS connection_records,
    slice(array_sort(collect_set(dst_port)), 1, 10) AS dst_ports,
    mode(dst_port) AS top_dst_port,     -- what the device talks to most: the lowest ports are often DHCP and NetBIOS
    concat('MAC ', mac, ' (DHCP hostname ', coalesce(max(hostname), '?'), ') is not in the inventory; ',
           count(*), ' connection records, most to port ', mode(dst_port),
           ' (distinct ports: ', size(collect_set(dst_port)), ')') AS evidence
FROM unregistered
GROUP BY src_ip, mac, device, owner, window(event_time, '1 hour')
