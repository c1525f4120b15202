"""Suricata EVE JSON lines -> typed, normalised columns.

One `from_json` with every leaf declared STRING (numbers arrive as their text), then
try_cast: a value of the wrong type becomes a 'bad <field> value' reason instead of making
Spark treat the whole line as corrupt. Both DNS layouts are read: v1 (one event per answer:
`dns.type=answer` with `rrname`, `rrtype`, `rdata`, `ttl`) and v2/v3 (`dns.answers` list
and/or `grouped` map; v3 `queries` list, `type` request/response).
"""
from __future__ import annotations

from pipelines.parsers.common import (
    Query,
    bad,
    bad_time,
    first_error,
    joined_json,
    line_checks,
    lit,
    to_mac,
    to_port,
    to_proto,
    to_time,
)
from pipelines.parsers.source import Source


def _struct(*names: str, **nested: str) -> str:
    return "struct<" + ", ".join([f"`{n}`: string" for n in names] + [f"`{n}`: {t}" for n, t in nested.items()]) + ">"


EVE_SCHEMA = _struct(
    "timestamp", "flow_id", "event_type", "src_ip", "src_port", "dest_ip", "dest_port", "proto", "app_proto",
    "community_id", "host", "icmp_type", "icmp_code", "_corrupt_record",
    alert=_struct("action", "gid", "signature_id", "rev", "signature", "category", "severity"),
    flow=_struct("pkts_toserver", "pkts_toclient", "bytes_toserver", "bytes_toclient", "start", "end", "state"),
    dns=_struct("version", "type", "id", "rrname", "rrtype", "rcode", "rdata", "ttl",
                answers=f"array<{_struct('rrname', 'rrtype', 'ttl', 'rdata')}>",
                grouped="map<string, array<string>>",
                queries=f"array<{_struct('rrname', 'rrtype')}>"),
    dhcp=_struct("type", "id", "client_mac", "assigned_ip", "client_ip", "requested_ip", "dhcp_type", "hostname",
                 "lease_time"),
)

# Event types that carry a flow 5-tuple into a silver table.
FLOW_KINDS = ("flow", "dns", "alert")


def parse_eve(q: Query) -> Query:
    """Add the steps turning EVE data lines (columns of `split_lines(files, 'suricata')`) into source, file,
    line_number, raw, sensor, kind, error, event_time and the payload columns EVE has.

    >>> from pipelines.parsers import split_lines
    >>> eve = ('{"timestamp":"2026-11-20T10:00:00.000000+0000","event_type":"alert","src_ip":"10.0.0.1",'
    ...        '"src_port":1234,"dest_ip":"10.0.0.2","dest_port":80,"proto":"TCP","alert":{"signature_id":1}}')
    >>> lines = split_lines(spark.createDataFrame([("eve.json", eve)], "file string, text string"), "suricata")
    >>> parse_eve(Query(lines.columns)).build(lines).select("kind", "error", "sensor", "proto", "signature_id").first()
    Row(kind='alert', error=None, sensor='suricata', proto='tcp', signature_id=1)
    """
    base = ["source", "file", "line_number", "raw"]
    q.stage(base, _pre=first_error(*line_checks("raw", "valid_utf8")))
    q.stage("*", _j=f"CASE WHEN _pre IS NULL THEN from_json(raw, {lit(EVE_SCHEMA)}) END")
    icmp = f"{to_proto('_j.proto')} = 'icmp'"
    q.stage(
        [*base, "_pre"],
        _no_json="(_j IS NULL OR _j._corrupt_record IS NOT NULL)",
        kind="_j.event_type", _ts="_j.timestamp", _host="_j.host", _flow_id="_j.flow_id",
        _community_id="_j.community_id", _src_ip="_j.src_ip", _dest_ip="_j.dest_ip", _app_proto="_j.app_proto",
        proto=to_proto("_j.proto"),
        # ICMP has no ports: its type and code take their places, as Zeek logs them.
        _sport=f"CASE WHEN {icmp} AND _j.src_port IS NULL THEN _j.icmp_type ELSE _j.src_port END",
        _dport=f"CASE WHEN {icmp} AND _j.dest_port IS NULL THEN _j.icmp_code ELSE _j.dest_port END",
        _alert="_j.alert", _flow="_j.flow", _dns="_j.dns", _dhcp="_j.dhcp",
        dns_type="CASE WHEN _j.dns.type IN ('query', 'request') THEN 'query' "
                 "WHEN _j.dns.type IN ('answer', 'response') THEN 'answer' END",
    )
    v1_answer = "(dns_type = 'answer' AND _dns.answers IS NULL AND _dns.grouped IS NULL)"
    q.stage(
        "*",
        _time=to_time("_ts"), _start=to_time("_flow.start"), _end=to_time("_flow.end"),
        src_port=to_port("_sport"), dst_port=to_port("_dport"),
        trans_id="try_cast(_dns.id AS INT)",
        query="coalesce(_dns.rrname, get(_dns.queries, 0).rrname)",
        qtype_name="coalesce(_dns.rrtype, get(_dns.queries, 0).rrtype)",
        # One entry per answer record (NULL rdata for records logged without it, e.g. SOA),
        # so answers and ttls line up.
        answers=f"CASE WHEN _dns.answers IS NOT NULL THEN _dns.answers.rdata "
                f"WHEN _dns.grouped IS NOT NULL THEN flatten(map_values(_dns.grouped)) "
                f"WHEN {v1_answer} THEN CASE WHEN _dns.rdata IS NULL THEN array() ELSE array(_dns.rdata) END END",
        ttls=f"CASE WHEN _dns.answers IS NOT NULL THEN try_cast(_dns.answers.ttl AS array<double>) "
             f"WHEN {v1_answer} THEN CASE WHEN _dns.ttl IS NULL THEN array() "
             f"ELSE array(try_cast(_dns.ttl AS DOUBLE)) END END",
        mac=to_mac("_dhcp.client_mac"),
        lease_time="try_cast(_dhcp.lease_time AS DOUBLE)",
        orig_bytes="try_cast(_flow.bytes_toserver AS BIGINT)",
        resp_bytes="try_cast(_flow.bytes_toclient AS BIGINT)",
        orig_pkts="try_cast(_flow.pkts_toserver AS BIGINT)",
        resp_pkts="try_cast(_flow.pkts_toclient AS BIGINT)",
        gid="try_cast(_alert.gid AS INT)",
        signature_id="try_cast(_alert.signature_id AS INT)",
        rev="try_cast(_alert.rev AS INT)",
        severity="try_cast(_alert.severity AS INT)",
    )

    def checked(kinds: tuple[str, ...], *triples: tuple[str, str, str]) -> list[tuple[str, str]]:
        in_kinds = "kind IN (" + ", ".join(lit(k) for k in kinds) + ")"
        return [(f"{in_kinds} AND {cond}", reason)
                for cond, reason in (bad(name, raw, typed) for name, raw, typed in triples)]

    error = first_error(
        ("_pre IS NOT NULL", "_pre"),
        ("_no_json", lit("invalid JSON")),
        joined_json("raw"),
        ("kind IS NULL", lit("missing event_type")),
        ("_ts IS NULL", lit("missing timestamp")),
        bad_time("timestamp", "_ts", "_time"),
        *[(f"kind = '{n}' AND _{n} IS NULL", lit(f"missing {n} object")) for n in ("flow", "dns", "dhcp", "alert")],
        *checked(FLOW_KINDS, ("src_port", "_sport", "src_port"), ("dest_port", "_dport", "dst_port")),
        (f"kind = 'flow' AND {bad_time('flow.start', '_flow.start', '_start')[0]}", lit("bad flow.start value")),
        (f"kind = 'flow' AND {bad_time('flow.end', '_flow.end', '_end')[0]}", lit("bad flow.end value")),
        *checked(("flow",), ("flow.bytes_toserver", "_flow.bytes_toserver", "orig_bytes"),
                 ("flow.bytes_toclient", "_flow.bytes_toclient", "resp_bytes"),
                 ("flow.pkts_toserver", "_flow.pkts_toserver", "orig_pkts"),
                 ("flow.pkts_toclient", "_flow.pkts_toclient", "resp_pkts")),
        *checked(("dns",), ("dns.id", "_dns.id", "trans_id")),
        ("kind = 'dns' AND size(ttls) != size(array_compact(ttls))", lit("bad dns ttl value")),
        *checked(("dhcp",), ("dhcp.client_mac", "_dhcp.client_mac", "mac"),
                 ("dhcp.lease_time", "_dhcp.lease_time", "lease_time")),
        *checked(("alert",), ("alert.gid", "_alert.gid", "gid"), ("alert.signature_id", "_alert.signature_id",
                                                                  "signature_id"),
                 ("alert.rev", "_alert.rev", "rev"), ("alert.severity", "_alert.severity", "severity")),
    )
    return q.stage(
        [*base, "kind", "src_port", "dst_port", "proto", "trans_id", "dns_type", "query", "qtype_name", "answers",
             "ttls", "mac", "lease_time", "orig_bytes", "resp_bytes", "orig_pkts", "resp_pkts", "gid",
             "signature_id", "rev", "severity"],
        sensor="coalesce(_host, 'suricata')",
        error=error,
        # Flows are dated by their start, like Zeek conn records; other events by their timestamp.
        event_time="CASE WHEN kind = 'flow' AND _start IS NOT NULL THEN _start ELSE _time END",
        uid="_flow_id",
        uids="CASE WHEN _flow_id IS NOT NULL THEN array(_flow_id) END",
        community_id="_community_id",
        src_ip="_src_ip",
        dst_ip="_dest_ip",
        rcode_name="_dns.rcode",
        hostname="_dhcp.hostname",
        client_addr="nullif(_dhcp.client_ip, '0.0.0.0')",
        server_addr="CASE WHEN _dhcp.type = 'reply' THEN _src_ip END",
        requested_addr="nullif(_dhcp.requested_ip, '0.0.0.0')",
        assigned_addr="nullif(_dhcp.assigned_ip, '0.0.0.0')",
        msg_types="CASE WHEN _dhcp.dhcp_type IS NOT NULL THEN array(upper(_dhcp.dhcp_type)) END",
        service="nullif(_app_proto, 'failed')",
        # try_: times far apart give NULL; the overflow of `-` failed the batch.
        duration="try_subtract(unix_micros(_end), unix_micros(_start)) / 1e6",
        conn_state="_flow.state",
        app_proto="_app_proto",
        action="_alert.action",
        signature="_alert.signature",
        category="_alert.category",
    )


SOURCE = Source(
    name="suricata",
    description="every data line from suricata sensors (EVE JSON), raw, with file and line",
    parse=parse_eve,
    silver={"dns": "silver_dns", "dhcp": "silver_dhcp", "flow": "silver_conn", "alert": "silver_ids_alerts"},
    flows=FLOW_KINDS,
    address_labels=("src_ip", "dest_ip"),
)
