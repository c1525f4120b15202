"""Incidents: the alerts of one entity grouped in time, with a risk score (risk-based alerting).

The entity is the device when the alert was attributed, else its MAC, else its source IP, else
`(network)`: a finding about no one host (DHCP starvation from many made-up MACs) is an incident
of the network's. Suppressed alerts and platform alerts (a rule disabled) take no part.
An entity's alerts, ordered by window start, form one incident while each starts within `span`
of the one before; a longer gap starts another. The risk score adds, per distinct rule in the
incident, the weight of the highest severity it raised (critical 100, high 50, medium 20, low 5):
ten alerts of one noisy rule weigh less than three different rules firing on one host,
which is the point of risk-based alerting.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.rules.tables import PLATFORM_RULE_PREFIX
from pipelines.schemas import SEVERITIES
from pipelines.triage.store import CLOSED, TRIAGE_TABLE, newest_versions, triaged_alerts

INCIDENTS_TABLE = "incidents"
NETWORK = "(network)"  # the entity of alerts that name no host
SEVERITY_WEIGHT = dict(zip(SEVERITIES, (5, 20, 50, 100), strict=True))


def incidents(spark: SparkSession, lake: Lake, span: timedelta = timedelta(hours=24)) -> DataFrame:
    """One row per incident: `entity`, `first_seen`, `last_seen`, `alerts`, `open_alerts`,
    `rules` (distinct rule ids), `max_severity`, `risk`, `alert_ids`; riskiest first."""
    weight = F.create_map(*[x for s, w in SEVERITY_WEIGHT.items() for x in (F.lit(s), F.lit(w))])
    alerts = (newest_versions(triaged_alerts(spark, lake))
              .where(~F.col("rule_id").startswith(PLATFORM_RULE_PREFIX) & F.col("suppressed_by").isNull())
              .withColumn("entity", F.coalesce("device", "mac", "src_ip", F.lit(NETWORK)))
              .withColumn("weight", F.coalesce(weight[F.col("severity")], F.lit(0))))
    by_entity = Window.partitionBy("entity").orderBy("window_start", "alert_id")
    gap = F.col("window_start").cast("long") - F.lag("window_start").over(by_entity).cast("long")
    starts = F.when(gap.isNull() | (gap > int(span.total_seconds())), 1).otherwise(0)
    numbered = (alerts.withColumn("starts", starts)
                .withColumn("incident", F.sum("starts").over(by_entity.rowsBetween(Window.unboundedPreceding, 0))))
    per_rule = (numbered.groupBy("entity", "incident", "rule_id").agg(F.max("weight").alias("rule_weight")))
    risk = per_rule.groupBy("entity", "incident").agg(F.sum("rule_weight").alias("risk"),
                                                      F.sort_array(F.collect_list("rule_id")).alias("rules"))
    grouped = numbered.groupBy("entity", "incident").agg(
        F.min("window_start").alias("first_seen"), F.max(F.coalesce("window_end", "window_start")).alias("last_seen"),
        F.count("*").alias("alerts"), F.sum(F.when(F.col("status") != CLOSED, 1).otherwise(0)).alias("open_alerts"),
        F.max("weight").alias("top_weight"), F.sort_array(F.collect_list("alert_id")).alias("alert_ids"))
    names = F.create_map(*[x for s, w in SEVERITY_WEIGHT.items() for x in (F.lit(w), F.lit(s))])
    return (grouped.join(risk, ["entity", "incident"])
            .withColumn("max_severity", names[F.col("top_weight")])
            .select("entity", "first_seen", "last_seen", "alerts", "open_alerts", "rules", "max_severity", "risk",
                    "alert_ids")
            .orderBy(F.col("risk").desc(), F.col("last_seen").desc(), "entity"))


class Refreshed(NamedTuple):
    """What `refresh` left: the `incidents` version, its rows, and whether this call wrote it."""

    version: int
    incidents: int
    written: bool


def refresh(session: Callable[[], SparkSession], lake: Lake, span: timedelta = timedelta(hours=24)) -> Refreshed:
    """Rebuild the `incidents` table from `incidents()` (the Dagster asset), unless its newest commit
    was built from the same versions of `alerts` and `alert_triage` with the same `span`: every
    scheduled run would otherwise write an identical version (the commit's userMetadata names them).
    That look reads the logs only (delta-rs): `session` starts Spark when there is something to build.
    """
    from pipelines.lake.log import commits, summary
    from pipelines.lake.merge import replace
    from pipelines.rules.tables import ALERTS_TABLE

    path = lake.path(INCIDENTS_TABLE)
    tag = "built from " + ", ".join(f"{t} v{summary(lake.path(t)).version if lake.exists(t) else '-'}"
                                    for t in (ALERTS_TABLE, TRIAGE_TABLE)) + f", span {span}"
    if lake.exists(INCIDENTS_TABLE):
        last, rows = commits(path, limit=1)[0], summary(path).rows
        if last["user_metadata"] == tag and rows is not None:
            return Refreshed(last["version"], rows, written=False)
    spark = session()
    lake.ensure(spark, ALERTS_TABLE)
    lake.ensure(spark, INCIDENTS_TABLE)
    schema = lake.spec(INCIDENTS_TABLE).schema
    built = incidents(spark, lake, span).select(*[F.col(f.name).cast(f.dataType) for f in schema.fields]).persist()
    try:
        return Refreshed(replace(path, built, tag, lock=lake.home.commit_lock(INCIDENTS_TABLE)), built.count(),
                         written=True)
    finally:
        built.unpersist()


def riskiest(session: Callable[[], SparkSession], lake: Lake, n: int = 5) -> list[dict[str, Any]]:
    """The `n` riskiest rows of the `incidents` table (entity, risk, alerts, rules), read by delta-rs
    from those columns alone (Spark, through `session`, when delta-rs cannot read the table alone)."""
    from pipelines.lake.log import read_columns

    columns = ["entity", "risk", "alerts", "rules"]
    try:
        rows = read_columns(lake.path(INCIDENTS_TABLE), columns).sort_by([("risk", "descending")]).slice(0, n)
        return rows.to_pylist()
    except LookupError:
        top = lake.read(session(), INCIDENTS_TABLE).orderBy(F.col("risk").desc()).select(*columns).limit(n)
        return [row.asDict() for row in top.collect()]
