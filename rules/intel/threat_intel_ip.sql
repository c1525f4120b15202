/*
id: cfa03269-307e-49a0-96fe-8fb38b918816
name: Connection with a threat-intel IP address
version: 2
severity: high
mitre: [T1071]
description: >
  A host exchanged traffic with an IP address that a loaded threat-intelligence feed lists as
  malicious (the `indicators` table, `seclake intel load`): outbound to a command-and-control
  server, or inbound from a listed scanner or exploit source. The alert names the internal
  side (the attributed host). One alert per host, indicator and day; loading a feed also
  sweeps the last 90 days with this rule, with the same alert ids.
false_positives:
  - Feeds that list shared hosting, cloud or CDN addresses that legitimate services also use.
  - Blocked attempts (a connection the firewall rejected is still a connection in the logs).
references:
  - https://attack.mitre.org/techniques/T1071/
  - https://feodotracker.abuse.ch/
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
        dst_port
    FROM enriched_conn
),

hits AS (
    SELECT s.*, i.value AS indicator, i.source AS feed
    FROM sides s
    JOIN indicators i ON i.value = s.remote AND i.type = 'ip'
)

SELECT
    src_ip, mac, device, owner, indicator,
    window(event_time, '1 day').start AS window_start,
    window(event_time, '1 day').end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    count(*) AS connections,
    min(feed) AS feed,
    concat(coalesce(device, src_ip), ' exchanged ', count(*), ' connection(s) ', min(direction), ' ', indicator,
           ' (port ', coalesce(cast(min(dst_port) AS string), 'unknown'), ') between ',
           date_format(min(event_time), 'HH:mm'), ' and ', date_format(max(event_time), 'HH:mm'),
           ' UTC, listed by ', min(feed)) AS evidence
FROM hits
GROUP BY src_ip, mac, device, owner, indicator, window(event_time, '1 day')
