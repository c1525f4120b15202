"""Zeek logs (TSV with headers, or JSON lines) -> typed, normalised columns.

Values are looked up by field name in the line's own `#fields` header (TSV) or by JSON key,
never by position, so extra or reordered columns (`_node_name`, `label`) are harmless. Every
field is first read as a string (JSON numbers and arrays included, as their JSON text) and
converted with try_cast, so a value of the wrong type becomes a 'bad <field> value' reason
rather than a NULL or an exception.
"""
from __future__ import annotations

from pipelines.parsers.common import (
    Query,
    bad,
    bad_time,
    file_stem,
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

SCALARS = (
    "ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "_node_name", "community_id",
    # dns
    "trans_id", "query", "qtype_name", "rcode_name",
    # conn
    "service", "duration", "orig_bytes", "resp_bytes", "orig_pkts", "resp_pkts", "conn_state",
    # dhcp (Zeek >= 2.6); `assigned_ip` only exists in the older schema
    "client_addr", "server_addr", "mac", "host_name", "client_fqdn", "domain", "requested_addr",
    "assigned_addr", "lease_time", "assigned_ip",
)
LISTS = ("answers", "TTLs", "uids", "msg_types")
FIELDS = SCALARS + LISTS

# Every key a STRING: JSON numbers and arrays arrive as their JSON text.
JSON_SCHEMA = "struct<_path: string, " + ", ".join(f"`{n}`: string" for n in FIELDS) + ", _corrupt_record: string>"

# Header lines whose value is used, with their defaults when absent. `#separator` is followed
# by a space (the separator is not known yet), the others by the separator.
_HEADER_DEFAULTS = {"set_separator": ",", "empty_field": "(empty)", "unset_field": "-", "path": None}

OLD_DHCP = "old Zeek (<2.6) dhcp.log schema not supported"


def _r(name: str) -> str:
    return "_r_" + name.replace(".", "_")


def parse_zeek(q: Query) -> Query:
    """Add the steps turning Zeek data lines (columns of `split_lines(files, 'zeek')`) into source, file,
    line_number, raw, sensor, kind, error, event_time and the payload columns Zeek has.

    >>> from pipelines.parsers import split_lines
    >>> tsv = "#path\\tdns\\n#fields\\tts\\tquery\\n1521911720.86\\texample.org\\n"   # no #separator: a tab
    >>> lines = split_lines(spark.createDataFrame([("dns.log", tsv)], "file string, text string"), "zeek")
    >>> parse_zeek(Query(lines.columns)).build(lines).select("line_number", "kind", "error", "query").first()
    Row(line_number=3, kind='dns', error=None, query='example.org')
    """
    base = ["source", "file", "line_number", "raw"]
    q.stage([*base, "zeek_header"],
               _pre=first_error(*line_checks("raw", "valid_utf8")),
               _tsv="(zeek_header IS NOT NULL OR zeek_format = 'tsv' "
                    "OR (zeek_format IS NULL AND NOT startswith(ltrim(raw), '{')))")
    q.stage("*",
               _vals=f"CASE WHEN _tsv AND _pre IS NULL "
                     f"THEN split(raw, {separator_regex('zeek_header.separator')}, -1) END",
               _j=f"CASE WHEN NOT _tsv AND _pre IS NULL THEN from_json(raw, {lit(JSON_SCHEMA)}) END")
    # Positions as columns of their own: read inside each field's expression instead, the same parse
    # took 5.7 s against 3.2 (performance.md, "The demo's ETL batch, cold and warm").
    q.stage("*", **{f"_i{i}": f"zeek_header.positions[{i}]" for i in range(len(FIELDS))})
    kind = "CASE WHEN _tsv THEN zeek_header.path ELSE _j._path END"
    old_dhcp = ("CASE WHEN _tsv THEN array_contains(zeek_header.fields, 'assigned_ip') "
                "ELSE _j.assigned_ip IS NOT NULL OR (_j.uid IS NOT NULL AND _j.uids IS NULL) END")

    def raw_value(i: int, name: str) -> str:
        v = f"get(_vals, _i{i})"
        tsv = (f"CASE WHEN {v} = zeek_header.unset_field THEN NULL "
               f"WHEN {v} = zeek_header.empty_field THEN '' ELSE {v} END")
        return f"CASE WHEN _tsv THEN {tsv} ELSE _j.`{name}` END"

    q.stage([*base, "_pre", "_tsv"],
               _nvals="size(_vals)", _nfields="size(zeek_header.fields)",
               _no_header="zeek_header IS NULL", _no_json="(_j IS NULL OR _j._corrupt_record IS NOT NULL)",
               _set_sep="zeek_header.set_separator",
               kind=f"coalesce(nullif({kind}, ''), {file_stem('file')})",
               _old_dhcp=old_dhcp,
               **{_r(name): raw_value(i, name) for i, name in enumerate(FIELDS)})

    def listed(name: str) -> str:
        v = _r(name)
        return (f"CASE WHEN _tsv THEN "
                f"CASE WHEN {v} = '' THEN array() ELSE split({v}, {separator_regex('_set_sep')}, -1) END "
                f"ELSE from_json({v}, 'array<string>') END")

    q.stage("*",
               event_time=to_time(_r("ts")),
               src_port=to_port(_r("id.orig_p")),
               dst_port=to_port(_r("id.resp_p")),
               trans_id=f"try_cast({_r('trans_id')} AS INT)",
               answers=listed("answers"),
               ttls=f"try_cast({listed('TTLs')} AS array<double>)",
               uids=listed("uids"),
               msg_types=listed("msg_types"),
               duration=f"try_cast({_r('duration')} AS DOUBLE)",
               orig_bytes=f"try_cast({_r('orig_bytes')} AS BIGINT)",
               resp_bytes=f"try_cast({_r('resp_bytes')} AS BIGINT)",
               orig_pkts=f"try_cast({_r('orig_pkts')} AS BIGINT)",
               resp_pkts=f"try_cast({_r('resp_pkts')} AS BIGINT)",
               lease_time=f"try_cast({_r('lease_time')} AS DOUBLE)",
               mac=to_mac(_r("mac")))

    def checked(kinds: tuple[str, ...], *pairs: tuple[str, str]) -> list[tuple[str, str]]:
        in_kinds = "kind IN (" + ", ".join(lit(k) for k in kinds) + ")"
        return [(f"{in_kinds} AND {cond}", reason) for cond, reason in (bad(f, _r(f), typed) for f, typed in pairs)]

    joined = joined_json("raw")
    error = first_error(
        ("_pre IS NOT NULL", "_pre"),
        ("_tsv AND _no_header", lit("no #fields header")),
        ("NOT _tsv AND _no_json", lit("invalid JSON")),
        (f"NOT _tsv AND {joined[0]}", joined[1]),
        ("kind = 'dhcp' AND _old_dhcp", lit(OLD_DHCP)),
        ("_tsv AND _nvals != _nfields",
         "format_string('wrong field count: %d values for %d #fields', _nvals, _nfields)"),
        (f"{_r('ts')} IS NULL", lit("missing ts value")),
        bad_time("ts", _r("ts"), "event_time"),
        *checked(("conn", "dns"), ("id.orig_p", "src_port"), ("id.resp_p", "dst_port")),
        *checked(("dns",), ("trans_id", "trans_id"), ("answers", "answers"), ("TTLs", "ttls")),
        ("kind = 'dns' AND size(ttls) != size(array_compact(ttls))", lit("bad TTLs value")),
        *checked(("conn",), ("duration", "duration"), ("orig_bytes", "orig_bytes"), ("resp_bytes", "resp_bytes"),
                 ("orig_pkts", "orig_pkts"), ("resp_pkts", "resp_pkts")),
        *checked(("dhcp",), ("uids", "uids"), ("msg_types", "msg_types"), ("lease_time", "lease_time"),
                 ("mac", "mac")),
    )
    return q.stage([*base, "kind", "event_time", "src_port", "dst_port", "trans_id", "answers", "ttls", "uids",
                      "msg_types", "mac", "lease_time", "duration", "orig_bytes", "resp_bytes", "orig_pkts",
                      "resp_pkts"],
                 sensor=f"coalesce({_r('_node_name')}, 'zeek')",
                 error=error,
                 uid=f"coalesce({_r('uid')}, get(uids, 0))",
                 community_id=_r("community_id"),
                 src_ip=_r("id.orig_h"),
                 dst_ip=_r("id.resp_h"),
                 proto=to_proto(_r("proto")),
                 dns_type=f"CASE WHEN kind = 'dns' THEN CASE WHEN {_r('rcode_name')} IS NOT NULL "
                          f"THEN 'query+answer' ELSE 'query' END END",
                 hostname=_r("host_name"),  # Zeek's dhcp.log name; `hostname` across seclake's tables
                 **{name: _r(name) for name in ("query", "qtype_name", "rcode_name", "client_fqdn",
                                                "domain", "client_addr", "server_addr", "requested_addr",
                                                "assigned_addr", "service", "conn_state")})


def header_blocks(q: Query) -> None:
    """Turn one row per file into one row per header block: _bi, _nblocks, _before (lines before it), _block
    text, zeek_format, zeek_header.

    A Zeek file is cut at each `#separator` line (Zeek starts every header with it, and
    concatenated logs repeat it); the block's header values are read with regular expressions.
    `zeek_format` is 'tsv' | 'json' | NULL from the file's first characters; `zeek_header` is a
    struct (separator, set_separator, empty_field, unset_field, path, fields, types, and positions:
    the index of each of FIELDS in `fields`, -1 when absent), NULL when the block has no `#fields`.
    """
    start = "ltrim(substr(text, 1, 64))"
    q.stage(["file", "text", "_file_utf8"],
            zeek_format=f"CASE WHEN {start} LIKE '#%' THEN 'tsv' WHEN {start} LIKE '{{%' THEN 'json' END",
            _blocks="split(text, '\\n(?=#separator )', -1)")
    q.stage("*", _nblocks="size(_blocks)")
    q.explode(["file", "text", "_file_utf8", "zeek_format", "_nblocks"], "_blocks", "_bi", "_block")
    # The text before block k ends just before the k-th '\n#separator '.
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_block"],
            _prefix="CASE WHEN _bi > 0 THEN substring_index(text, '\\n#separator ', _bi) END")

    def header_line(name: str) -> str:
        # Only blocks that start with a header are searched: a JSON file has no headers and
        # a regex miss scans the whole block.
        return f"CASE WHEN _block LIKE '#%' THEN nullif(regexp_extract(_block, '(?m)^(#{name}[^\\r\\n]*)', 1), '') END"

    lines = {f"_h_{name}": header_line(name) for name in [*_HEADER_DEFAULTS, "fields", "types"]}
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_block"],
            _before="coalesce(octet_length(_prefix) - octet_length(replace(_prefix, '\\n', '')) + 1, 0)",
            _sep_raw="CASE WHEN _block LIKE '#%' THEN regexp_extract(_block, '^#separator ([^\\r\\n]*)', 1) END",
            **lines)
    # '#separator \x09' spells the separator as hex escapes; absent means tab. Only ASCII bytes are
    # decoded (another byte is not UTF-8 on its own, and decode() would fail the batch): any other
    # spelling is taken as written, so its lines do not split and are quarantined.
    q.stage("*", _sep="CASE WHEN coalesce(_sep_raw, '') = '' THEN '\\t' "
                      "WHEN _sep_raw RLIKE '^(\\\\\\\\x[0-7][0-9a-fA-F])+$' "
                      "THEN decode(unhex(replace(_sep_raw, '\\\\x', '')), 'UTF-8') ELSE _sep_raw END")

    def value(name: str) -> str:
        return f"substr(_h_{name}, {len(name) + 2} + char_length(_sep))"

    def values_of(name: str) -> str:
        return f"split({value(name)}, {separator_regex('_sep')}, -1)"

    defaults = {name: value(name) if default is None else f"coalesce({value(name)}, {lit(default)})"
                for name, default in _HEADER_DEFAULTS.items()}
    q.stage("*", _fields=values_of("fields"))
    # Each of FIELDS' position in the block's #fields (-1 when absent: get() then gives NULL),
    # found once per block rather than once per line.
    positions = ", ".join(f"CAST(array_position(_fields, {lit(name)}) - 1 AS INT)" for name in FIELDS)
    header = ", ".join(["'separator', _sep", *[f"'{n}', {sql}" for n, sql in defaults.items()],
                        "'fields', _fields", f"'types', {values_of('types')}", f"'positions', array({positions})"])
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_before", "_block"],
            zeek_header=f"CASE WHEN _h_fields IS NOT NULL THEN named_struct({header}) END")


def separator_regex(sep: str) -> str:
    """SQL: a regex matching the separator in column/expression `sep` literally.

    A tab stays a bare tab, which Java's String.split handles without a regex engine.
    """
    return (f"CASE WHEN {sep} = '\\t' THEN {sep} "
            f"ELSE concat('\\\\Q', replace({sep}, '\\\\E', '\\\\E\\\\\\\\E\\\\Q'), '\\\\E') END")  # Pattern.quote


SOURCE = Source(
    name="zeek",
    description="every data line from zeek sensors, raw, with file and line",
    parse=parse_zeek,
    silver={"dns": "silver_dns", "dhcp": "silver_dhcp", "conn": "silver_conn"},
    flows=("conn", "dns"),
    address_labels=("id.orig_h", "id.resp_h"),
    header_blocks=header_blocks,
    block_columns=("zeek_format", "zeek_header"),
    comment_prefix="#",
)
