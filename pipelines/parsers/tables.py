"""Parsed lines -> rows of the bronze, quarantine and silver tables.

`parse` runs the source's parser and adds what every source shares: address validation,
the Community ID, `event_id` and `event_date`. The `to_*` functions only filter and select,
so the ETL can call all of them on one parsed micro-batch.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from pipelines.parsers.common import Query, first_error, lit, to_date
from pipelines.parsers.community_id import add_community_id, add_ip_hex
from pipelines.parsers.sources import get_source, silver_feeds
from pipelines.schemas import BRONZE_SCHEMA, QUARANTINE_SCHEMA, SILVER_SCHEMAS, silver_schema

# Silver columns that are not payload: parse names them differently or derives them here.
_LINEAGE = ("event_id", "event_time", "event_date", "source", "sensor", "source_file", "line_number")


def _payload_types() -> dict[str, DataType]:
    types: dict[str, DataType] = {}
    for schema in SILVER_SCHEMAS.values():
        for field in schema.fields:
            if field.name not in _LINEAGE:
                types.setdefault(field.name, field.dataType)
    return types


PAYLOAD_TYPES = _payload_types()
PARSED_COLUMNS = ("source", "sensor", "file", "line_number", "raw", "kind", "error", "event_id", "event_time",
                  "event_date", *PAYLOAD_TYPES)

def parse(lines: DataFrame, source: str) -> DataFrame:
    """Data lines (from `split_lines`) -> one row per line with every bronze column, `kind`, `error`,
    `event_id`, `event_time`, `event_date` and the typed payload of all silver tables (PARSED_COLUMNS).

    `error` is NULL when the line parsed, else a short reason ('invalid JSON', 'wrong field
    count: 18 values for 20 #fields', ...); `event_time`/`event_date` are NULL for such lines.
    `event_id` is sha256 of source + ':' + raw line, so byte-identical duplicates share it.
    No actions: works on streaming and batch DataFrames.

    >>> from pipelines.parsers import split_lines
    >>> eve = ('{"timestamp":"2026-11-20T10:00:00.000000+0000","event_type":"alert","src_ip":"10.0.0.1",'
    ...        '"src_port":1234,"dest_ip":"10.0.0.2","dest_port":80,"proto":"TCP","alert":{"signature_id":1}}')
    >>> files = spark.createDataFrame([("eve.json", eve + "\\n{\\n")], "file string, text string")
    >>> parsed = parse(split_lines(files, "suricata"), "suricata")
    >>> [tuple(r) for r in parsed.select("kind", "error", "community_id").collect()]
    [('alert', None, '1:LzRJKgjvUJlC/VQLtISlfACcEzA='), (None, 'invalid JSON', None)]
    """
    spec = get_source(source)
    q = Query(lines.columns)
    spec.parse(q)
    derived = {
        "event_id": "sha2(concat(source, ':', raw), 256)",
        "event_time": "CASE WHEN error IS NULL THEN event_time END",
        "event_date": f"CASE WHEN error IS NULL THEN {to_date('event_time')} END",
    }
    if spec.flows:
        src_label, dst_label = spec.address_labels
        add_ip_hex(q, _src_hex="src_ip", _dst_hex="dst_ip")
        flow = "kind IN (" + ", ".join(lit(k) for k in spec.flows) + ")"
        q.stage("*", error=first_error(
            ("error IS NOT NULL", "error"),
            (f"{flow} AND src_ip IS NULL", lit(f"missing {src_label} value")),
            (f"{flow} AND _src_hex IS NULL", lit(f"bad {src_label} value")),
            (f"{flow} AND dst_ip IS NULL", lit(f"missing {dst_label} value")),
            (f"{flow} AND _dst_hex IS NULL", lit(f"bad {dst_label} value")),
        ))
        add_community_id(q, "_cid", "src_ip", "dst_ip", "src_port", "dst_port", "proto", "_src_hex", "_dst_hex")
        # A sensor's own Community ID wins: it may have been computed with a seed we cannot know.
        derived["community_id"] = f"CASE WHEN {flow} THEN coalesce(community_id, _cid) END"
    present = set(q.columns)

    def column(name: str) -> str:
        # Payload a source never has (e.g. alert fields for Zeek) is NULL.
        sql = derived.get(name) or (f"`{name}`" if name in present else "NULL")
        return f"CAST({sql} AS {PAYLOAD_TYPES[name].simpleString()})" if name in PAYLOAD_TYPES else sql

    return q.stage([], **{name: column(name) for name in PARSED_COLUMNS}).build(lines)


def to_silver(parsed: DataFrame, table: str) -> DataFrame:
    """Good rows of one silver table, exactly SILVER_SCHEMAS[table]'s columns and types in order.

    >>> from pipelines.parsers import split_lines
    >>> dns = ('{"ts":1521911720.86,"uid":"C1","id.orig_h":"10.0.0.1","id.orig_p":5353,"id.resp_h":"10.0.0.2",'
    ...        '"id.resp_p":53,"proto":"udp","query":"example.org","_path":"dns"}')
    >>> files = spark.createDataFrame([("dns.log", dns)], "file string, text string")
    >>> silver = to_silver(parse(split_lines(files, "zeek"), "zeek"), "silver_dns")
    >>> silver.columns == SILVER_SCHEMAS["silver_dns"].names, silver.select("event_time", "query").first()
    (True, Row(event_time=datetime.datetime(2018, 3, 24, 17, 15, 20, 860000), query='example.org'))
    """
    schema = silver_schema(table)
    feeds = F.lit(False)
    for source, kind in silver_feeds(table):
        feeds = feeds | ((F.col("source") == source) & (F.col("kind") == kind))
    names = {"source_file": "file"}
    # Types by name: a DataType object costs Py4J round trips to convert, per column and micro-batch.
    return parsed.where(F.col("error").isNull() & feeds).select(
        *[F.col(names.get(f.name, f.name)).cast(f.dataType.simpleString()).alias(f.name) for f in schema.fields])


def to_quarantine(parsed: DataFrame) -> DataFrame:
    """Lines that did not parse: source, sensor, file, line_number, raw, reason.

    The ETL adds batch_id and ingest_time to complete QUARANTINE_SCHEMA.

    >>> from pipelines.parsers import split_lines
    >>> files = spark.createDataFrame([("dns.log", "{oops\\n")], "file string, text string")
    >>> to_quarantine(parse(split_lines(files, "zeek"), "zeek")).first()
    Row(source='zeek', sensor='zeek', file='dns.log', line_number=1, raw='{oops', reason='invalid JSON')
    """
    names = {"reason": "error"}
    return parsed.where(F.col("error").isNotNull()).select(
        *[F.col(names.get(f.name, f.name)).cast(f.dataType.simpleString()).alias(f.name)
          for f in QUARANTINE_SCHEMA.fields if f.name not in ("batch_id", "ingest_time")])


def to_bronze(parsed: DataFrame) -> DataFrame:
    """Every data line, good and bad: source, sensor, file, line_number, raw, kind, event_date, parse_ok.

    `event_date` (the partition) is NULL for lines that did not parse. The ETL adds batch_id
    and ingest_time to complete BRONZE_SCHEMA.

    >>> from pipelines.parsers import split_lines
    >>> files = spark.createDataFrame([("dns.log", "{oops\\n")], "file string, text string")
    >>> to_bronze(parse(split_lines(files, "zeek"), "zeek")).select("raw", "kind", "event_date", "parse_ok").first()
    Row(raw='{oops', kind='dns', event_date=None, parse_ok=False)
    """
    derived = {"parse_ok": F.col("error").isNull()}
    return parsed.select(*[derived.get(f.name, F.col(f.name)).cast(f.dataType.simpleString()).alias(f.name)
                           for f in BRONZE_SCHEMA.fields if f.name not in ("batch_id", "ingest_time")])
