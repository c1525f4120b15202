"""Which alerts still need delivering, and the record of what was delivered (`notifications`).

An alert is pending for a destination while `notifications` has no row for that pair (nor for the
same finding under an earlier version of its rule) and the alert is not suppressed; with
`retry_dead`, one whose only outcomes are dead is pending again (the receiver was down or refused
it, and is fixed now). `notify` delivers the pending ones
oldest first and then appends one row per outcome (delivered, or dead with its last error). A
crash between a delivery and its row makes the next `notify` deliver that alert again: at least
once, and the receiver sees the same `Idempotency-Key`.
"""
from __future__ import annotations

import functools
import operator
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.notify.delivery import Destination, Outcome, deliver
from pipelines.rules.tables import ALERTS_TABLE, FINDING_COLUMNS
from pipelines.schemas import SEVERITIES

NOTIFICATIONS_TABLE = "notifications"


def pending(spark: SparkSession, lake: Lake, destination: Destination, limit: int = 1000,
            retry_dead: bool = False) -> list[dict]:
    """Alerts `destination` wants and has no outcome for (no delivery, with `retry_dead`), oldest first."""
    if not lake.exists(ALERTS_TABLE):
        return []
    alerts = lake.read(spark, ALERTS_TABLE)
    if "suppressed_by" in alerts.columns:
        alerts = alerts.where(F.col("suppressed_by").isNull())
    wanted = SEVERITIES[SEVERITIES.index(destination.min_severity):]
    alerts = alerts.where(F.col("severity").isin(*wanted))
    if lake.exists(NOTIFICATIONS_TABLE):
        done = lake.read(spark, NOTIFICATIONS_TABLE).where(F.col("destination") == destination.name)
        if retry_dead:
            done = done.where(F.col("status") == "delivered")
        done = done.select("alert_id")
        # Nor a finding brought under an earlier version of its rule: the new version's backfill raises
        # it again under another alert_id, and the receiver would be paged twice for one thing.
        told = (lake.read(spark, ALERTS_TABLE).join(done, "alert_id")
                .select(*FINDING_COLUMNS, "rule_version").alias("told"))
        same = [F.col(f"a.{c}").eqNullSafe(F.col(f"told.{c}")) for c in FINDING_COLUMNS]
        same.append(F.col("told.rule_version") < F.col("a.rule_version"))
        alerts = (alerts.join(done, "alert_id", "left_anti").alias("a")
                  .join(told, functools.reduce(operator.and_, same), "left_anti"))
    return [row.asDict() for row in alerts.orderBy("detected_at", "alert_id").limit(limit).collect()]


def notify(spark: SparkSession, lake: Lake, destination: Destination, max_attempts: int = 5,
           retry_dead: bool = False, **deliver_options: Any) -> Outcome:
    """Deliver what is pending for `destination`, then record every outcome in `notifications`."""
    alerts = pending(spark, lake, destination, retry_dead=retry_dead)
    outcome = deliver(alerts, destination, max_attempts=max_attempts, **deliver_options)
    at = datetime.now(timezone.utc)
    rows: list[tuple[str, str, str, str | None, datetime]] = [
        (key, destination.name, "delivered", None, at) for key in outcome.delivered]
    rows += [(key, destination.name, "dead", error, at) for key, error in outcome.dead]
    if rows:
        lake.ensure(spark, NOTIFICATIONS_TABLE)
        frame = spark.createDataFrame(rows, lake.spec(NOTIFICATIONS_TABLE).schema)
        lake.sink(NOTIFICATIONS_TABLE, app_id=f"notify:{destination.name}").write_next(lambda: frame)
    return outcome
