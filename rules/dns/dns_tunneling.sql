/*
id: af471ec4-dc86-4e6d-a3a7-e623682079b7
name: DNS tunnelling over TXT/NULL records with long labels
version: 2
severity: high
mitre: [T1071.004, T1572]
description: >
  A host keeps asking for TXT or NULL records (the record types that carry arbitrary data
  back) of names with a long label (30+ characters, the encoded payload), at least 30
  distinct such queries in ten minutes: the polling pattern of DNS tunnels (iodine,
  dnscat2, DNS-based C2).
false_positives:
  - Mail servers checking SPF/DKIM/DMARC TXT records (short labels, so rarely above the label threshold).
  - Domain-verification or licence checks that query TXT records with long random tokens.
references:
  - https://attack.mitre.org/techniques/T1572/
tables: [enriched_dns]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
*/
WITH payload_queries AS (
    SELECT
        src_ip, mac, device, owner, event_time, qtype_name,
        concat_ws('|', src_port, trans_id, query) AS transaction,
        substring_index(query, '.', -2) AS domain,
        aggregate(split(query, '[.]'), 0, (longest, label) -> greatest(longest, length(label))) AS longest_label
    FROM enriched_dns
    WHERE qtype_name IN ('TXT', 'NULL')  -- record types whose answers carry arbitrary bytes
      AND query IS NOT NULL
),

per_host AS (
    SELECT
        src_ip, mac, device, owner,
        window(event_time, '10 minutes') AS w,
        size(collect_set(transaction)) AS queries,
        collect_set(domain) AS domains,
        collect_set(qtype_name) AS qtypes,
        max(longest_label) AS longest_label,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM payload_queries
    WHERE longest_label >= 30           -- an encoded chunk; hostnames and SPF/DKIM selectors are shorter
    GROUP BY src_ip, mac, device, owner, window(event_time, '10 minutes')
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    queries, longest_label, domains, qtypes,
    concat(queries, ' ', array_join(array_sort(qtypes), '/'), ' queries with labels up to ', longest_label,
           ' characters in 10 minutes, to ', array_join(slice(array_sort(domains), 1, 3), ', ')) AS evidence
FROM per_host
WHERE queries >= 30                     -- one every 20 s or faster; the generator's tunnel polls every 5 s
