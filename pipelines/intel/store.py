"""`indicators` (loaded with MERGE) and the sweep of retained history for matches.

Loading a feed upserts its indicators, keyed by (source, type, value): a known one gets its
`valid_until` and `loaded_at` moved on, a new one is inserted. Then the sweep looks for every
indicator of the table in the last `sweep_days` of DNS queries (the query name is the domain or
one of its sub-domains) and connections (either endpoint is the IP), in the enriched tables so
the alert names the device. One alert per (indicator, source IP, day), rule id
`seclake.intel_match`, with a stable id: a second load or sweep never adds it again.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.intel.feeds import DOMAIN, IP, read_feed
from pipelines.lake.registry import Lake
from pipelines.rules.alerts import unseen
from pipelines.rules.tables import ALERTS_TABLE
from pipelines.triage.suppressions import mark

INDICATORS_TABLE = "indicators"
INTEL_RULE_ID = "seclake.intel_match"
INTEL_RULE_NAME = "Threat-intel indicator seen in traffic"
INTEL_SEVERITY = "high"
INTEL_MITRE = ("T1071",)  # application-layer protocol: the usual channel to known-bad infrastructure


@dataclass(frozen=True)
class LoadResult:
    """What `load` did: indicators in the file, lines skipped, the table's new version, alerts added."""

    indicators: int
    skipped: int
    version: int
    alerts: int


def load(spark: SparkSession, lake: Lake, path: Path, source: str | None = None, valid_days: int = 30,
         sweep_days: int = 90, now: datetime | None = None) -> LoadResult:
    """Upsert the indicators of the feed at `path` (source: the file name unless given), then sweep."""
    from pipelines.lake.merge import upsert

    feed = read_feed(path)
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    name = source or path.name
    rows = spark.createDataFrame([(f"{name}\u001f{kind}\u001f{value}", name, kind, value, at,
                                   at + timedelta(days=valid_days), at) for kind, value in feed.indicators],
                                 lake.spec(INDICATORS_TABLE).schema)
    lake.ensure(spark, INDICATORS_TABLE)
    version = upsert(spark, lake.path(INDICATORS_TABLE), rows, "indicator_key",
                     update={"valid_until": "s.valid_until", "loaded_at": "s.loaded_at"},
                     insert={c: f"s.{c}" for c in rows.columns})
    alerts = sweep(spark, lake, version, sweep_days, at)
    return LoadResult(len(feed.indicators), len(feed.skipped), version, alerts)


def matches(spark: SparkSession, lake: Lake, since: datetime, at: datetime) -> DataFrame:
    """Alert rows (ALERTS_SCHEMA) for every indicator valid at `at` seen since `since`."""
    from pipelines.schemas import ALERTS_SCHEMA

    live = (lake.read(spark, INDICATORS_TABLE)
            .where((F.col("valid_from") <= F.lit(at)) & (F.col("valid_until") > F.lit(at))))
    found = []
    for table, kind, condition in (
            ("enriched_dns", DOMAIN, (F.col("e.query") == F.col("i.value"))
             | F.lower(F.col("e.query")).endswith(F.concat(F.lit("."), F.col("i.value")))),
            ("enriched_conn", IP, (F.col("e.dst_ip") == F.col("i.value")) | (F.col("e.src_ip") == F.col("i.value")))):
        if not lake.exists(table):
            continue
        events = lake.read(spark, table).where(F.col("event_time") >= F.lit(since)).alias("e")
        seen = (events.join(F.broadcast(live.where(F.col("type") == kind).alias("i")), condition)
                .select("e.*", F.col("i.value").alias("indicator"), F.col("i.source").alias("feed"),
                        F.lit(table).alias("seen_in"),
                        (F.col("e.query") if kind == DOMAIN else F.col("e.dst_ip")).alias("observed")))
        found.append(seen)
    if not found:
        return spark.createDataFrame([], ALERTS_SCHEMA)
    seen = found[0] if len(found) == 1 else found[0].unionByName(found[1], allowMissingColumns=True)
    grouped = seen.groupBy("indicator", "src_ip", "event_date").agg(
        F.min("event_time").alias("first_seen"), F.max("event_time").alias("last_seen"),
        F.count("*").alias("events"), F.first("mac", ignorenulls=True).alias("mac"),
        F.first("device", ignorenulls=True).alias("device"), F.first("owner", ignorenulls=True).alias("owner"),
        F.first("feed").alias("feed"), F.first("observed").alias("observed"), F.first("seen_in").alias("seen_in"))
    day_start = F.to_timestamp(F.col("event_date"))
    values = {
        "alert_id": F.substring(F.sha2(F.concat_ws("\u001f", F.lit(INTEL_RULE_ID), "indicator",
                                                   F.coalesce("src_ip", F.lit("\u0000")),
                                                   F.col("event_date").cast("string")), 256), 1, 32),
        "rule_id": F.lit(INTEL_RULE_ID), "rule_name": F.lit(INTEL_RULE_NAME), "rule_version": F.lit(1),
        "severity": F.lit(INTEL_SEVERITY), "mitre": F.array(*[F.lit(m) for m in INTEL_MITRE]),
        "src_ip": F.col("src_ip"), "mac": F.col("mac"), "device": F.col("device"), "owner": F.col("owner"),
        "window_start": day_start, "window_end": day_start + F.expr("INTERVAL 1 DAY"),
        "first_seen": F.col("first_seen"), "last_seen": F.col("last_seen"),
        "evidence": F.format_string("%s contacted %s, listed by %s as %s (%d event(s) in %s)", F.col("src_ip"),
                                    F.col("observed"), F.col("feed"), F.col("indicator"), F.col("events"),
                                    F.col("seen_in")),
        "details": F.to_json(F.struct("indicator", "feed", "events", "seen_in")),
        "detected_at": F.current_timestamp(), "event_date": F.col("event_date"), "suppressed_by": F.lit(None),
    }
    return grouped.select(*[values[f.name].cast(f.dataType).alias(f.name) for f in ALERTS_SCHEMA.fields])


def sweep(spark: SparkSession, lake: Lake, batch_id: int, sweep_days: int = 90, now: datetime | None = None) -> int:
    """Append the alerts of `matches` over the last `sweep_days` that `alerts` lacks; how many.

    `batch_id` (the indicators version swept) makes the append idempotent, like a stream batch."""
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    lake.ensure(spark, ALERTS_TABLE)
    found = matches(spark, lake, at - timedelta(days=sweep_days), at)
    fresh = mark(unseen(found, lake.path(ALERTS_TABLE), INTEL_RULE_ID), lake, at).persist()
    try:
        count = fresh.count()
        if count:
            lake.sink(ALERTS_TABLE, app_id=INTEL_RULE_ID).write_batch(fresh, batch_id)
        return count
    finally:
        fresh.unpersist()
