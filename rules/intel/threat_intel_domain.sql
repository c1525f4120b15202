/*
id: bb5ac140-6712-439e-bd9b-b66dc4abdecf
name: DNS lookup of a threat-intel domain
version: 3
severity: high
mitre: [T1071.004, T1568]
description: >
  A host resolved a domain, or a sub-domain of a domain, that a loaded threat-intelligence
  feed lists as malicious (the `indicators` table, `seclake intel load`). Command-and-control
  and phishing infrastructure is looked up by name first, so the lookup is the earliest trace
  of the contact. One alert per host, indicator and day; loading a feed also sweeps the last
  90 days with this rule, with the same alert ids, so history and the stream never alert twice.
false_positives:
  - Feeds that list shared hosting or a CDN domain that legitimate sites also use.
  - Security tools and browsers' safe-browsing look-ups resolving the listed name themselves.
references:
  - https://attack.mitre.org/techniques/T1071/004/
  - https://abuse.ch/
tables: [enriched_dns]
lookups: [indicators]
event_time: event_time
window: 1 day
emit: crossed                 # one matching lookup is enough: alert in the batch that sees it
keys: [src_ip, mac, indicator]
*/
WITH lookups AS (
    SELECT
        src_ip, mac, device, owner, event_time,
        -- one lookup, whichever sensor logged it (Suricata writes its query and its answer)
        concat_ws('|', src_port, trans_id, query) AS transaction,
        lower(query) AS name,
        split(lower(query), '[.]') AS labels
    FROM enriched_dns
    WHERE query LIKE '%.%'
),

candidates AS (                         -- the name and each parent domain of two labels or more
    SELECT
        src_ip, mac, device, owner, event_time, transaction, name,
        explode(transform(sequence(1, size(labels) - 1), i -> array_join(slice(labels, i, size(labels)), '.'))) AS domain
    FROM lookups
),

hits AS (
    SELECT c.src_ip, c.mac, c.device, c.owner, c.event_time, c.transaction, c.name, i.value AS indicator, i.source AS feed
    FROM candidates c
    JOIN indicators i ON i.value = c.domain AND i.type = 'domain'
)

SELECT
    src_ip, mac, device, owner, indicator,
    window(event_time, '1 day').start AS window_start,
    window(event_time, '1 day').end AS window_end,
    min(event_time) AS first_seen,
    max(event_time) AS last_seen,
    size(collect_set(transaction)) AS lookups,
    min(feed) AS feed,
    concat(coalesce(device, src_ip), ' resolved ', min(name), ', listed by ', min(feed), ' as ', indicator,
           ' (', size(collect_set(transaction)), ' lookup(s) between ', date_format(min(event_time), 'HH:mm'), ' and ',
           date_format(max(event_time), 'HH:mm'), ' UTC)') AS evidence
FROM hits
GROUP BY src_ip, mac, device, owner, indicator, window(event_time, '1 day')
