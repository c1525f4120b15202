/*
id: 4cf96db2-c68c-4b63-bf83-4b22919975d7
name: DHCP starvation (many client MACs in a short time)
version: 2
severity: high
mitre: [T1557.003, T1498]
description: >
  An attacker (Yersinia, dhcpstarv) sends DHCP DISCOVER/REQUEST messages from many forged
  client MACs to exhaust the address pool, then often runs a rogue DHCP server. The rule
  counts distinct client MACs asking for an address within five minutes: 50 or more.
  The forged requests come from 0.0.0.0, so the DHCP log cannot name the attacking host:
  src_ip, mac, device and owner are empty; the details list the subnets hit.
false_positives:
  - A mass reconnect after a Wi-Fi controller or switch restart in a large network (size the threshold to the network).
  - Lab networks that boot many virtual machines at once.
references:
  - https://attack.mitre.org/techniques/T1557/003/
tables: [silver_dhcp]
event_time: event_time
window: 5 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
*/
WITH client_requests AS (
    SELECT
        event_time, mac, assigned_addr,
        coalesce(regexp_extract(coalesce(assigned_addr, requested_addr), '^([0-9]+[.][0-9]+[.][0-9]+)[.]', 1), '') AS subnet
    FROM silver_dhcp
    WHERE mac IS NOT NULL
      AND (array_contains(msg_types, 'DISCOVER') OR array_contains(msg_types, 'REQUEST'))
)

SELECT
    CAST(NULL AS STRING) AS src_ip,
    CAST(NULL AS STRING) AS mac,
    CAST(NULL AS STRING) AS device,
    CAST(NULL AS STRING) AS owner,
    window.start AS window_start,
    window.end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    size(collect_set(mac)) AS client_macs,
    size(collect_set(CASE WHEN assigned_addr IS NOT NULL THEN mac END)) AS leased_macs,
    array_sort(array_remove(collect_set(subnet), '')) AS subnets,
    concat(size(collect_set(mac)), ' distinct client MACs sent DISCOVER/REQUEST in 5 minutes (',
           size(collect_set(CASE WHEN assigned_addr IS NOT NULL THEN mac END)), ' were offered an address) on ',
           coalesce(nullif(array_join(array_sort(array_remove(collect_set(subnet), '')), '.0/24, '), ''), '?'),
           '.0/24') AS evidence
FROM client_requests
GROUP BY (window(event_time, '5 minutes'))  -- parenthesised: sqlglot misreads a leading window(
HAVING size(collect_set(mac)) >= 50     -- a 50-device office renews a few leases per 5 minutes; starvation forges hundreds
