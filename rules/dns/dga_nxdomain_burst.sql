/*
id: f6097087-51a0-4890-829e-23f828e73b08
name: DGA-like burst of NXDOMAIN answers
version: 2
severity: medium
mitre: [T1568.002]
description: >
  Malware with a domain generation algorithm tries many algorithmically generated domains
  until one resolves, so one host receives NXDOMAIN for 20 or more distinct registered
  domains within five minutes. People mistype a handful of names an hour, and browsers'
  intranet probes are single-label names, which this rule ignores.
false_positives:
  - A misconfigured application retrying a long list of dead domains.
  - Security scanners or crawlers resolving lists of (expired) domains.
references:
  - https://attack.mitre.org/techniques/T1568/002/
tables: [enriched_dns]
event_time: event_time
window: 5 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
*/
WITH failed_lookups AS (
    SELECT
        src_ip, mac, device, owner, event_time,
        lower(query) AS name,
        substring_index(lower(query), '.', -2) AS domain
    FROM enriched_dns
    WHERE rcode_name = 'NXDOMAIN'
      AND query LIKE '%.%'              -- single-label names are Chrome's intranet probes and WPAD, not DGA
),

per_host AS (
    SELECT
        src_ip, mac, device, owner,
        window(event_time, '5 minutes') AS w,
        size(collect_set(domain)) AS domains,
        size(collect_set(name)) AS names,
        slice(array_sort(collect_set(name)), 1, 5) AS examples,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM failed_lookups
    GROUP BY src_ip, mac, device, owner, window(event_time, '5 minutes')
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    domains, names, examples,
    concat(domains, ' distinct non-existent domains (NXDOMAIN) in 5 minutes, e.g. ',
           array_join(slice(examples, 1, 3), ', ')) AS evidence
FROM per_host
WHERE domains >= 20                     -- typos and dead links give a few per hour; a DGA burst gives dozens a minute
