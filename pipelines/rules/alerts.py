"""Rows a rule returns -> rows of the one `alerts` table, with stable alert ids."""
from __future__ import annotations

import os
from contextlib import AbstractContextManager

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.lake.read import read_table
from pipelines.lake.registry import Lake
from pipelines.rules.spec import REQUIRED_COLUMNS, Rule, RuleError
from pipelines.rules.tables import ALERTS_TABLE
from pipelines.schemas import ALERTS_SCHEMA

_SEP = "\u001f"   # unit separator: cannot appear in an IP, MAC or hostname
_NULL = "\u0000"  # stands for NULL in the hash input, so (NULL, 'a') and ('a', NULL) differ


def alert_id(rule: Rule, *key_columns: Column, window_start: Column, window_end: Column,
             with_version: bool = True) -> Column:
    """sha256(rule id, rule version, group keys, window) as 32 hex chars: the same alert always
    gets the same id, whether found by the stream, a replay, a restart or a backtest.
    Without the version it matches the same finding across versions of a rule."""
    parts = [F.lit(rule.id)] + ([F.lit(str(rule.version))] if with_version else [])
    parts += [F.coalesce(k.cast("string"), F.lit(_NULL)) for k in key_columns]
    parts += [F.unix_micros(window_start).cast("string"), F.unix_micros(window_end).cast("string")]
    return F.substring(F.sha2(F.concat_ws(_SEP, *parts), 256), 1, 32)


def alert_frame(rows: DataFrame, rule: Rule, carry: tuple[str, ...] = ()) -> DataFrame:
    """Turn what `rule`'s SELECT returned into alerts-table rows (ALERTS_SCHEMA, in order).

    Extra columns of the rule go to `details` as JSON; `event_date` is window_start's UTC date;
    columns named in `carry` are passed through after the table's columns (not into details).
    `detected_at` is NULL here: `detected` sets it where the alerts are found (a batch) or
    committed (a stream's writer). Spark puts a streaming plan's current time into each
    micro-batch's generated code as a constant, so that code compiled anew in every batch of
    every rule (docs/performance.md, "What a rule batch costs").

    >>> from pipelines.rules.pack import RULES_DIR
    >>> from pipelines.rules.spec import validate_rule
    >>> rule = validate_rule(RULES_DIR / "dns" / "dga_nxdomain_burst.sql")
    >>> found = spark.sql("SELECT '10.0.0.5' AS src_ip, NULL AS mac, NULL AS device, NULL AS owner, 'x' AS evidence, "
    ...                   "TIMESTAMP'2026-11-20 10:00' AS window_start, TIMESTAMP'2026-11-20 10:05' AS window_end, "
    ...                   "window_start AS first_seen, window_end AS last_seen, 25 AS domains")
    >>> alert_frame(found, rule).select("severity", "details", "event_date").first()
    Row(severity='medium', details='{"domains":25}', event_date=datetime.date(2026, 11, 20))
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise RuleError(f"rule {rule.slug} returned no column(s) {missing}")
    extra = [c for c in rows.columns if c not in REQUIRED_COLUMNS and c not in carry]
    details = F.to_json(F.struct(*[F.col(f"`{c}`") for c in extra])) if extra else F.lit(None)
    values = {
        "alert_id": alert_id(rule, *[F.col(k) for k in rule.keys],
                             window_start=F.col("window_start"), window_end=F.col("window_end")),
        "rule_id": F.lit(rule.id),
        "rule_name": F.lit(rule.name),
        "rule_version": F.lit(rule.version),
        "severity": F.lit(rule.severity),
        "mitre": F.array(*[F.lit(m) for m in rule.mitre]),
        **{c: F.col(c) for c in REQUIRED_COLUMNS},
        "details": details,
        "detected_at": F.lit(None),  # set by `detected`
        "event_date": F.to_date(F.col("window_start")),
        "suppressed_by": F.lit(None),  # set by pipelines.triage.suppressions.mark when written
    }
    # Types by name: a DataType object costs Py4J round trips to convert, per column and query start.
    return rows.select(*[values[f.name].cast(f.dataType.simpleString()).alias(f.name) for f in ALERTS_SCHEMA.fields],
                       *carry)


def detected(alerts: DataFrame) -> DataFrame:
    """`alerts` (`alert_frame` rows, or a stream's micro-batch of them) with `detected_at` now."""
    return alerts.withColumn("detected_at", F.current_timestamp())


def writers_of(lake: Lake, rule_id: str) -> AbstractContextManager[None]:
    """The home's lock that the writers of one rule's alerts (its query in run-once or the stream, a
    backtest that writes, the intel sweep) hold from their look at `alerts` (`unseen`) to their commit:
    each adds what the table lacks, and another's commit of the same alerts in between would be added
    twice. Writers of other rules never wait for it."""
    return lake.home.commit_lock(f"{ALERTS_TABLE}-rule-{rule_id}")


def unseen(alerts: DataFrame, alerts_path: str | os.PathLike, rule_id: str) -> DataFrame:
    """The rows of `alerts` whose alert_id the alerts table does not hold yet (for rule
    `rule_id`, in the partitions the batch touches): a replay without its txn, a restarted
    checkpoint, a backfill or a second sweep never adds an alert twice."""
    dates = [r.event_date for r in alerts.select("event_date").distinct().collect()]
    if not dates:
        return alerts
    existing = (read_table(alerts.sparkSession, alerts_path)
                .where(F.col("event_date").isin(dates) & (F.col("rule_id") == rule_id))
                .select("alert_id"))
    return alerts.join(existing, "alert_id", "left_anti")
