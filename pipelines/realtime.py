"""The real-time path: per-event IDS rules from the IDS topic to an alerts topic, in milliseconds.

`seclake realtime` runs one Structured Streaming query in Spark's real-time mode
(`trigger(realTime=...)`, Spark 4.1+: long-running tasks, records flow through as they arrive;
the trigger's duration is only how often offsets are checkpointed). It reads the Suricata topic
(`suricata.eve`), parses each line with the ETL's EVE parser, attributes each alert by a
stream-static join with the newest lease of its address (`dhcp_leases`) and the device
inventory, runs the `realtime` CTE of every rule that declares one (pipelines/rules/spec.py), and
sends one message per matching event to `seclake.alerts`, keyed by the alert id.

The alert id is the one the micro-batch path writes to the Delta `alerts` table for the same
rule, keys and window, so the two paths name the same alert alike. Both deliver at least once
here (the Kafka sink may send a message again after a restart; several events of one window send
the same id): a consumer de-duplicates by the message key.

Attribution: the lease piece of `dhcp_leases` that held the address at the alert's time, the
newest piece of each address taken as still held (a live alert's lease piece is not committed
yet: the micro-batch path waits for DHCP to be complete, this path does not wait). An address
that changed hands after its newest committed piece is attributed to the previous holder here
(another mac, so another alert id); the Delta `alerts` table has the exact one.
"""
from __future__ import annotations

import os
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipelines.attribution import INVENTORY_FILE, LEASES, attributed_ip, load_devices
from pipelines.checkpoint import clear_unstarted
from pipelines.etl import check_reachable, kafka_files, kafka_lines
from pipelines.lake.registry import Lake
from pipelines.parsers import parse, split_lines, to_silver
from pipelines.rules.alerts import alert_id
from pipelines.rules.engine import rule_session
from pipelines.rules.pack import load_rules
from pipelines.rules.spec import REALTIME_TABLES, Rule, RuleError
from pipelines.schemas import ATTRIBUTION_WATERMARK, ENRICHED_SCHEMAS
from pipelines.settings import interval_seconds

QUERY_NAME = "realtime_alerts"
ALERTS_TOPIC = "seclake.alerts"
# Offsets are checkpointed this often; records do not wait for it (real-time mode).
CHECKPOINT_EVERY = "1 minute"
# How much lease history attributes an alert: the path is for live events, so a day back is ample.
LEASE_SPAN = "1 day"
[ENRICHED] = REALTIME_TABLES
MESSAGE_FIELDS = ("alert_id", "rule_id", "rule_name", "rule_version", "severity", "src_ip", "mac", "device",
                  "owner", "window_start", "window_end", "event_time", "event_id")


def realtime_rules(rules_dir: str | os.PathLike | None = None) -> list[Rule]:
    """The valid rules that declare a `realtime` CTE.

    >>> [r.slug for r in realtime_rules()]
    ['high_severity_ids_alert']
    """
    return [r for r in load_rules(rules_dir) if r.realtime_sql is not None]


def lease_pieces(spark: SparkSession, lake: Lake, span: str = LEASE_SPAN) -> DataFrame:
    """The `dhcp_leases` pieces of the last `span` of lease history (lease_ip, lease_mac,
    lease_hostname, lease_valid_from, lease_valid_to), the newest piece of each address open-ended
    (lease_valid_to NULL): a lease goes on until a newer piece says otherwise. Empty before the
    first lease. Computed when the query starts; a restart takes newer leases in."""
    schema = ("lease_ip string, lease_mac string, lease_hostname string, lease_valid_from timestamp, "
              "lease_valid_to timestamp")
    if not lake.exists(LEASES):
        return spark.createDataFrame([], schema)
    leases = lake.read(spark, LEASES)
    [newest_end] = leases.agg(F.max("valid_to")).first() or [None]
    if newest_end is None:
        return spark.createDataFrame([], schema)
    newest = Window.partitionBy("ip").orderBy(F.col("valid_from").desc())
    recent = leases.where(F.col("valid_to") >= F.lit(newest_end) - F.expr(f"INTERVAL {span}"))
    return (recent.withColumn("_n", F.row_number().over(newest))
            .select(F.col("ip").alias("lease_ip"), F.col("mac").alias("lease_mac"),
                    F.col("hostname").alias("lease_hostname"), F.col("valid_from").alias("lease_valid_from"),
                    F.when(F.col("_n") > 1, F.col("valid_to")).alias("lease_valid_to"))
            .localCheckpoint())


def attributed_ids_alerts(ids: DataFrame, leases: DataFrame, devices: DataFrame) -> DataFrame:
    """Silver IDS alert rows -> rows shaped like `enriched_ids_alerts`, attributed by the lease piece
    of `leases` (`lease_pieces`) holding the address at the alert's time and by `devices`
    (`load_devices`): a stream-static join, stateless, so real-time mode runs it."""
    rows = ids.withColumn("attributed_ip", attributed_ip(ENRICHED))
    held = ((rows.attributed_ip == leases.lease_ip) & (leases.lease_valid_from <= rows.event_time)
            & (leases.lease_valid_to.isNull() | (rows.event_time < leases.lease_valid_to)))
    matched = rows.join(F.broadcast(leases), held, "left_outer")
    with_devices = matched.join(F.broadcast(devices), matched.lease_mac == devices.inv_mac, "left_outer")
    # No micro-batch wrote the row: no attribution watermark.
    derived = {"mac": F.col("lease_mac"), "hostname": F.col("lease_hostname"), ATTRIBUTION_WATERMARK: F.lit(None)}
    return with_devices.select(*[derived.get(f.name, F.col(f.name)).cast(f.dataType).alias(f.name)
                                 for f in ENRICHED_SCHEMAS[ENRICHED].fields])


def rule_messages(session: SparkSession, rule: Rule) -> DataFrame:
    """(key, value) Kafka messages of `rule`: one per row of its `realtime` CTE over the view
    `enriched_ids_alerts` of `session`, the key its alert id (rule, version, keys and the tumbling
    window holding the event's time)."""
    if rule.realtime_sql is None:
        raise RuleError(f"rule {rule.slug} declares no realtime CTE")
    rows = session.sql(rule.realtime_sql)
    width = interval_seconds(rule.window)
    # The window of the rule's GROUP BY window(event_time, ...): tumbling, aligned on the epoch.
    start = F.timestamp_seconds(F.floor(F.unix_seconds(F.col(rule.event_time)) / width) * width)
    end = F.timestamp_seconds(F.floor(F.unix_seconds(F.col(rule.event_time)) / width) * width + width)
    alert = rows.select(
        alert_id(rule, *[F.col(k) for k in rule.keys], window_start=start, window_end=end).alias("alert_id"),
        F.lit(rule.id).alias("rule_id"), F.lit(rule.name).alias("rule_name"), F.lit(rule.version).alias("rule_version"),
        F.lit(rule.severity).alias("severity"),
        *[(F.col(c) if c in rows.columns else F.lit(None)).alias(c) for c in ("src_ip", "mac", "device", "owner")],
        start.alias("window_start"), end.alias("window_end"),
        F.col(rule.event_time).alias("event_time"),
        (F.col("event_id") if "event_id" in rows.columns else F.lit(None)).alias("event_id"))
    return alert.select(F.col("alert_id").alias("key"), F.to_json(F.struct(*MESSAGE_FIELDS)).alias("value"))


def start(spark: SparkSession, lake: Lake, bootstrap: str, rules: list[Rule],
          checkpoint_every: str = CHECKPOINT_EVERY) -> StreamingQuery:
    """Start the real-time query over `rules` (`realtime_rules()`); ValueError when there is none or
    no broker answers at `bootstrap`."""
    if not rules:
        raise ValueError("no rule declares a realtime CTE (docs/kafka.md): the real-time path has nothing to run")
    check_reachable(bootstrap)
    # The rules' SQL sees only this session's views, files not readable (as in the rule engine).
    session = rule_session(spark)
    files = kafka_files(session, bootstrap, "suricata", topics="suricata[.]eve", starting="latest")
    parsed = kafka_lines(parse(split_lines(files, "suricata"), "suricata"))
    enriched = attributed_ids_alerts(to_silver(parsed, "silver_ids_alerts"), lease_pieces(session, lake),
                                     load_devices(session, lake.home.reference / INVENTORY_FILE))
    enriched.createOrReplaceTempView(ENRICHED)
    messages = reduce(DataFrame.unionByName, [rule_messages(session, r) for r in rules])
    clear_unstarted(lake.home.checkpoint(QUERY_NAME))
    return (messages.writeStream.queryName(QUERY_NAME).format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", ALERTS_TOPIC)
            .option("checkpointLocation", str(lake.home.checkpoint(QUERY_NAME)))
            .outputMode("update")
            .trigger(realTime=checkpoint_every)  # type: ignore[call-overload]  # PySpark 4.2's stubs lack it
            .start())
