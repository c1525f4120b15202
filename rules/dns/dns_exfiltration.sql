/*
id: 568b4923-9b43-430d-9af7-356dbea2fc5a
name: DNS exfiltration by aggregate query size
version: 2
severity: high
mitre: [T1048.003, T1071.004]
description: >
  One host puts an unusually large amount of data into DNS query names within ten minutes:
  the summed length of its distinct long query names (40+ characters) reaches 10,000
  characters. Ordinary names are about 20 characters and repeat; data encoded into labels
  (base32/hex chunks under an attacker's domain) makes every name long and unique. This is
  the example of the Structured Streaming paper (SIGMOD 2018, section 8.1).
false_positives:
  - Security products that look up file hashes or URLs as DNS names (e.g. anti-virus reputation over DNS).
  - CDN or anti-spam services that encode tokens in long query names (DNSBL lookups by mail servers).
  - A DNS tunnel raises this alert as well as the tunnelling rule.
references:
  - https://attack.mitre.org/techniques/T1048/003/
tables: [enriched_dns]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
*/
WITH long_queries AS (
    SELECT
        src_ip, mac, device, owner, event_time, query,
        -- one DNS transaction, whichever sensor logged it (Zeek and Suricata both do)
        concat_ws('|', src_port, trans_id, query) AS transaction,
        substring_index(query, '.', -2) AS domain
    FROM enriched_dns
    WHERE query IS NOT NULL
      AND length(query) >= 40           -- long enough to carry data; typical names are ~20 characters
),

per_host AS (
    SELECT
        src_ip, mac, device, owner,
        window(event_time, '10 minutes') AS w,
        collect_set(named_struct('transaction', transaction, 'bytes', length(query))) AS transactions,
        collect_set(domain) AS domains,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM long_queries
    GROUP BY src_ip, mac, device, owner, window(event_time, '10 minutes')
),

sized AS (
    SELECT
        *,
        size(transactions) AS queries,
        aggregate(transactions, 0L, (total, t) -> total + t.bytes) AS query_bytes
    FROM per_host
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    queries, query_bytes,
    slice(array_sort(domains), 1, 5) AS top_domains,
    concat(query_bytes, ' bytes in ', queries, ' long DNS query names in 10 minutes, to ',
           array_join(slice(array_sort(domains), 1, 3), ', ')) AS evidence
FROM sized
WHERE query_bytes >= 10000              -- 10 KB of names in 10 minutes; the generator's exfiltration sends ~44 KB
