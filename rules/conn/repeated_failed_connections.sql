/*
id: 8b6f5857-b18d-4c81-ae17-553442cc52c1
name: Repeated failed connections to one Internet server
version: 1
severity: medium
mitre: [T1071, T1571]
description: >
  One host tries, and fails, 30 or more TCP connections to the same external address and
  port within ten minutes: refused (Zeek REJ) or never answered (S0, SH, RSTOS0; Suricata
  flows that stayed "new"). Malware retries its command-and-control server in a tight loop
  when the server is down, has moved or is blocked: the RemcosRAT host of the real labelled
  capture refused 718 times in eight minutes on port 5888, and its connections never succeed,
  so c2_beaconing (which times connections) and the IDS see nothing. Ordinary software
  gives up or backs off after a few attempts.
false_positives:
  - An application or updater retrying a server that is down, or a port the firewall rejects.
  - Peer-to-peer clients dialling a stale peer.
references:
  - https://attack.mitre.org/techniques/T1071/
  - https://docs.zeek.org/en/master/scripts/base/protocols/conn/main.zeek.html#type-Conn::Info
tables: [enriched_conn]
event_time: event_time
window: 10 minutes
emit: crossed                 # counts only grow: alert as soon as the window qualifies
keys: [src_ip, mac, dst_ip, dst_port]
*/
WITH failed_external_tcp AS (
    SELECT
        src_ip, mac, device, owner, dst_ip, dst_port, event_time, conn_state,
        -- one connection, whichever sensor logged it
        coalesce(community_id, concat_ws(':', src_port, dst_port)) AS connection
    FROM enriched_conn
    WHERE proto = 'tcp'
      AND NOT (dst_ip LIKE '10.%' OR dst_ip LIKE '192.168.%' OR dst_ip RLIKE '^172[.](1[6-9]|2[0-9]|3[01])[.]')
      -- no handshake: refused, unanswered, or given up before an answer (Suricata: one side only)
      AND conn_state IN ('REJ', 'S0', 'SH', 'RSTOS0', 'new')
),

per_pair AS (
    SELECT
        src_ip, mac, device, owner, dst_ip, dst_port,
        window(event_time, '10 minutes') AS w,
        size(collect_set(connection)) AS failed,
        size(collect_set(CASE WHEN conn_state = 'REJ' THEN connection END)) AS refused,
        min(event_time) AS first_seen,
        max(event_time) AS last_seen
    FROM failed_external_tcp
    GROUP BY src_ip, mac, device, owner, dst_ip, dst_port, window(event_time, '10 minutes')
)

SELECT
    src_ip, mac, device, owner,
    w.start AS window_start,
    w.end AS window_end,
    first_seen, last_seen,
    dst_ip, dst_port, failed, refused,
    concat(failed, ' failed TCP connections to ', dst_ip, ':', dst_port, ' in 10 minutes (', refused,
           ' refused, ', failed - refused, ' unanswered): a client retrying a server that is down or blocked') AS evidence
FROM per_pair
WHERE failed >= 30                      -- one every 20 s; the generator's browsing fails <1% of connections, spread over sites
