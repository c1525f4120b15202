"""Schemas of every table (bronze, quarantine, silver, attribution, alerts) and the column each is partitioned by.

Built from StructField constructors (not DDL strings) so importing this module needs no
SparkSession. Every column is documented in docs/tables.md.
"""
from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


def _fields(*columns: tuple[str, DataType]) -> list[StructField]:
    return [StructField(name, dtype, True) for name, dtype in columns]


_STRINGS = ArrayType(StringType(), True)

# Lineage columns every data line carries from the landing file.
_LINE = (
    ("source", StringType()),
    ("sensor", StringType()),
    ("file", StringType()),
    ("line_number", LongType()),
    ("raw", StringType()),
)

# batch_id and ingest_time are added by the ETL job, not by the parsers.
_INGEST = (("batch_id", LongType()), ("ingest_time", TimestampType()))

BRONZE_SCHEMA = StructType(_fields(
    *_LINE,
    ("kind", StringType()),
    ("event_date", DateType()),
    ("parse_ok", BooleanType()),
    *_INGEST,
))

QUARANTINE_SCHEMA = StructType(_fields(*_LINE, ("reason", StringType()), *_INGEST))

# Leading columns of every silver table, in this order.
_SILVER_HEAD = (
    ("event_id", StringType()),
    ("event_time", TimestampType()),
    ("event_date", DateType()),
    ("source", StringType()),
    ("sensor", StringType()),
    ("source_file", StringType()),
    ("line_number", LongType()),
    ("uid", StringType()),
)

_FLOW = (
    ("community_id", StringType()),
    ("src_ip", StringType()),
    ("src_port", IntegerType()),
    ("dst_ip", StringType()),
    ("dst_port", IntegerType()),
    ("proto", StringType()),
)

SILVER_SCHEMAS: dict[str, StructType] = {
    "silver_dns": StructType(_fields(
        *_SILVER_HEAD, *_FLOW,
        ("trans_id", IntegerType()),
        ("dns_type", StringType()),
        ("query", StringType()),
        ("qtype_name", StringType()),
        ("rcode_name", StringType()),
        ("answers", _STRINGS),
        ("ttls", ArrayType(DoubleType(), True)),
    )),
    "silver_dhcp": StructType(_fields(
        *_SILVER_HEAD,
        ("uids", _STRINGS),
        ("mac", StringType()),
        ("hostname", StringType()),
        ("client_fqdn", StringType()),
        ("domain", StringType()),
        ("client_addr", StringType()),
        ("server_addr", StringType()),
        ("requested_addr", StringType()),
        ("assigned_addr", StringType()),
        ("lease_time", DoubleType()),
        ("msg_types", _STRINGS),
    )),
    "silver_conn": StructType(_fields(
        *_SILVER_HEAD, *_FLOW,
        ("service", StringType()),
        ("duration", DoubleType()),
        ("orig_bytes", LongType()),
        ("resp_bytes", LongType()),
        ("orig_pkts", LongType()),
        ("resp_pkts", LongType()),
        ("conn_state", StringType()),
    )),
    "silver_ids_alerts": StructType(_fields(
        *_SILVER_HEAD, *_FLOW,
        ("app_proto", StringType()),
        ("action", StringType()),
        ("gid", IntegerType()),
        ("signature_id", IntegerType()),
        ("rev", IntegerType()),
        ("signature", StringType()),
        ("category", StringType()),
        ("severity", IntegerType()),
    )),
}

# What each silver table holds, for the catalog and the Dagster UI; which sources feed it is
# declared by the sources (`pipelines/parsers/sources.py`).
SILVER_DESCRIPTIONS: dict[str, str] = {
    "silver_dns": "DNS queries and answers from Zeek dns.log and Suricata EVE dns, typed and de-duplicated",
    "silver_dhcp": "DHCP messages from Zeek dhcp.log and Suricata EVE dhcp",
    "silver_conn": "connections from Zeek conn.log and Suricata EVE flow, with Community ID",
    "silver_ids_alerts": "Suricata EVE alerts, with Community ID to join Zeek conn",
}
assert SILVER_DESCRIPTIONS.keys() == SILVER_SCHEMAS.keys(), "every silver table needs a description"


def silver_schema(table: str) -> StructType:
    """The schema of one silver table; ValueError names an unknown table.

    >>> silver_schema("silver_dns").fieldNames()[:3]
    ['event_id', 'event_time', 'event_date']
    """
    try:
        return SILVER_SCHEMAS[table]
    except KeyError:
        raise ValueError(f"unknown silver table {table!r}; expected one of {sorted(SILVER_SCHEMAS)}") from None


# --- alerts (appended by the rule engine, pipelines/rules/) ---------------------------------
# One row per alert of any rule; `alert_id` is a stable hash of (rule id, rule version, the
# rule's group keys, window), so re-runs and backfills never add a second row for an alert.
# `details` holds the rule's extra output columns as JSON. Partitioned by event_date =
# UTC date of window_start.
# `severity` is one of these, least urgent first: a rule's metadata, the queue's order, incidents'
# weights and a webhook's least severity all take this scale.
SEVERITIES: tuple[str, ...] = ("low", "medium", "high", "critical")
ALERTS_SCHEMA = StructType(_fields(
    ("alert_id", StringType()),
    ("rule_id", StringType()),
    ("rule_name", StringType()),
    ("rule_version", IntegerType()),
    ("severity", StringType()),
    ("mitre", _STRINGS),
    ("src_ip", StringType()),
    ("mac", StringType()),
    ("device", StringType()),
    ("owner", StringType()),
    ("window_start", TimestampType()),
    ("window_end", TimestampType()),
    ("first_seen", TimestampType()),
    ("last_seen", TimestampType()),
    ("evidence", StringType()),
    ("details", StringType()),
    ("detected_at", TimestampType()),
    ("event_date", DateType()),
    ("suppressed_by", StringType()),
))

# One row per change of a rule's health (pipelines/rules/health.py): a failure, a disable, a
# re-enable, a recovery, a file that does not validate. A rule's newest row is its state.
RULE_STATUS_SCHEMA = StructType(_fields(
    ("rule", StringType()),
    ("content_hash", StringType()),
    ("state", StringType()),
    ("failures", IntegerType()),
    ("reason", StringType()),
    ("retry_at", TimestampType()),
    ("changed_at", TimestampType()),
))

# One row per alert an analyst has touched (pipelines/triage/store.py), kept current with MERGE; an
# alert without a row is open. Earlier states are in the table's Delta history.
TRIAGE_NOTE = StructType(_fields(("at", TimestampType()), ("by", StringType()), ("text", StringType())))
ALERT_TRIAGE_SCHEMA = StructType(_fields(
    ("alert_id", StringType()),
    ("status", StringType()),
    ("assignee", StringType()),
    ("notes", ArrayType(TRIAGE_NOTE, True)),
    ("updated_by", StringType()),
    ("updated_at", TimestampType()),
))

# One row per suppression (pipelines/triage/suppressions.py); `expired_at` set by `suppress expire`.
SUPPRESSIONS_SCHEMA = StructType(_fields(
    ("suppression_id", StringType()),
    ("rule_id", StringType()),
    ("match_type", StringType()),
    ("match_value", StringType()),
    ("reason", StringType()),
    ("author", StringType()),
    ("created_at", TimestampType()),
    ("expires_at", TimestampType()),
    ("expired_at", TimestampType()),
))

# One row per (alert, destination) delivery outcome (pipelines/notify/outbox.py): delivered or dead.
NOTIFICATIONS_SCHEMA = StructType(_fields(
    ("alert_id", StringType()),
    ("destination", StringType()),
    ("status", StringType()),
    ("error", StringType()),
    ("recorded_at", TimestampType()),
))

# One row per incident (pipelines/triage/incidents.py): an entity's alerts close in time, with a
# risk score; rebuilt whole by the Dagster `incidents` asset, for BI tools and notebooks.
INCIDENTS_SCHEMA = StructType(_fields(
    ("entity", StringType()),
    ("first_seen", TimestampType()),
    ("last_seen", TimestampType()),
    ("alerts", LongType()),
    ("open_alerts", LongType()),
    ("rules", ArrayType(StringType())),
    ("max_severity", StringType()),
    ("risk", LongType()),
    ("alert_ids", ArrayType(StringType())),
))

# One row per indicator of compromise (pipelines/intel/): its feed, type (ip, cidr or domain), value
# and validity; `indicator_key` = source, type and value, the MERGE key of `seclake intel load`.
INDICATORS_SCHEMA = StructType(_fields(
    ("indicator_key", StringType()),
    ("source", StringType()),
    ("type", StringType()),
    ("value", StringType()),
    ("valid_from", TimestampType()),
    ("valid_until", TimestampType()),
    ("loaded_at", TimestampType()),
))

# ---- attribution (issue 5): dhcp_leases, enriched_<kind>, late_events; rules in docs/attribution.md

# One row per lease segment: [valid_from, valid_to) during which `mac` held `ip`. Segments of one
# IP never overlap and none is longer than Settings.lease_piece, so the enriched joins can bound state.
LEASE_SCHEMA = StructType(_fields(
    ("ip", StringType()),
    ("mac", StringType()),
    ("hostname", StringType()),
    ("valid_from", TimestampType()),
    ("valid_to", TimestampType()),
    ("lease_time", DoubleType()),
    ("start_reason", StringType()),
    ("end_reason", StringType()),
    ("event_date", DateType()),
))

# What attribution adds to every silver column; NULL when no lease held the IP at the event's time.
_ATTRIBUTION = (
    ("attributed_ip", StringType()),
    ("mac", StringType()),
    ("hostname", StringType()),
    ("device", StringType()),
    ("owner", StringType()),
    ("lease_valid_from", TimestampType()),
)

# The watermark of the attribution micro-batch that wrote the row: every row of the table with an
# earlier event_time was written by then (or dropped as late). Rules hold their watermark to it.
ATTRIBUTION_WATERMARK = "attribution_watermark"

ENRICHED_SCHEMAS: dict[str, StructType] = {
    f"enriched_{kind}": StructType(SILVER_SCHEMAS[f"silver_{kind}"].fields
                                   + _fields(*_ATTRIBUTION, (ATTRIBUTION_WATERMARK, TimestampType())))
    for kind in ("conn", "dns", "ids_alerts")
}

# Run-once's marks: every event before flush_at has arrived (pipelines/end_of_input.py); ip set
# on the copies addressed to one IP's lease state.
END_OF_INPUT_SCHEMA = StructType(_fields(
    ("flush_at", TimestampType()),
    ("ip", StringType()),
    ("written_at", TimestampType()),
))

# The DHCP clock (pipelines/dhcp_clock.py): a row each time it moves, the lowest newest event over
# the feeds (source/sensor) that deliver DHCP, and each such feed's newest.
DHCP_CLOCK_SCHEMA = StructType(_fields(
    ("clock", TimestampType()),
    ("feeds", MapType(StringType(), TimestampType())),
    ("written_at", TimestampType()),
))

# One row per micro-batch in which a stateful attribution query dropped rows older than its watermark.

LATE_EVENTS_SCHEMA = StructType(_fields(
    ("query", StringType()),
    ("batch_id", LongType()),
    ("watermark", TimestampType()),
    ("late_rows", LongType()),
    ("recorded_at", TimestampType()),
))
