"""The `rule_status` table: each rule's health (pipelines/rules/health.py), kept in the lake.

Every runner (run-once, stream, Dagster) reads a rule's health before starting it and appends a
row when it changes, so a rule disabled by the stream stays disabled for the next run-once and
`seclake rules enable` in another process is seen by the stream within a sync. Disabling a rule
also appends a platform alert (rule_id `seclake.rule_disabled`) to `alerts`, where analysts
look.

Status rows are plain appends, not exactly-once batches: a repeated row says the same thing
again, and a rule's newest row wins.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from pipelines.lake.log import commit_versions
from pipelines.lake.registry import Lake
from pipelines.rules.health import DISABLED, RuleHealth
from pipelines.rules.tables import ALERTS_TABLE, RULE_DISABLED_ID, RULE_STATUS_TABLE

log = logging.getLogger("seclake.rules")


def utc_now() -> datetime:
    """Now, timezone-aware UTC: health compares and stores aware times."""
    return datetime.now(timezone.utc)


def _newest_version(path: Path) -> int:
    """The newest commit of a local table, from its log folder's file names (-1: no table)."""
    try:
        return max(commit_versions(path / "_delta_log"), default=-1)
    except FileNotFoundError:
        return -1


def recorded_health(lake: Lake, spark: Callable[[], SparkSession]) -> dict[str, RuleHealth]:
    """rule -> its newest row of `rule_status` (what file it was about aside), read by delta-rs: no
    JVM, so `seclake rules status` answers at once. A table delta-rs cannot read alone (deletion
    vectors, column mapping: `read_columns`) is read by Spark, `spark` making the session. Empty
    before the table's first row.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     recorded_health(Lake(Home.resolve(tmp)), lambda: spark)
    {}
    """
    from pipelines.lake.log import read_columns

    if not lake.exists(RULE_STATUS_TABLE):
        return {}
    try:
        rows = read_columns(lake.path(RULE_STATUS_TABLE), list(lake.spec(RULE_STATUS_TABLE).schema.fieldNames())
                            ).to_pylist()
    except LookupError:
        rows = [row.asDict() for row in lake.read(spark(), RULE_STATUS_TABLE).collect()]
    newest: dict[str, dict] = {}
    for row in rows:
        if row["rule"] not in newest or row["changed_at"] > newest[row["rule"]]["changed_at"]:
            newest[row["rule"]] = row
    # delta-rs gives UTC times with their zone, Spark naive local ones: astimezone reads both right.
    return {rule: RuleHealth(rule, r["content_hash"], r["state"], r["failures"], r["reason"],
                             r["retry_at"].astimezone(timezone.utc) if r["retry_at"] else None)
            for rule, r in newest.items()}


def health_of(recorded: dict[str, RuleHealth], rule: str, content_hash: str) -> RuleHealth:
    """The health of `rule` as deployed now (the file with `content_hash`), from `recorded_health`."""
    found = recorded.get(rule)
    return found.for_file(content_hash) if found else RuleHealth.fresh(rule, content_hash)


class RuleStatus:
    """The health of every rule of one lake, cached until `rule_status` gets a new commit.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     status = RuleStatus(spark, Lake(Home.resolve(tmp)))
    ...     _ = status.update("r", "hash", lambda h: h.failed("boom", utc_now(), max_failures=1, retry_s=0))
    ...     RuleStatus(spark, Lake(Home.resolve(tmp))).get("r", "hash").state
    'disabled'
    """

    def __init__(self, spark: SparkSession, lake: Lake) -> None:
        self.spark = spark
        self.lake = lake
        self._version = -2
        self._health: dict[str, RuleHealth] = {}

    def all(self) -> dict[str, RuleHealth]:
        """rule -> its newest health, whatever file it was about."""
        path = self.lake.path(RULE_STATUS_TABLE)
        version = _newest_version(path)
        if version != self._version:
            self._health = self._load() if version >= 0 else {}
            self._version = version
        return dict(self._health)

    def get(self, rule: str, content_hash: str) -> RuleHealth:
        """The health of `rule` as deployed now (the file with `content_hash`)."""
        return health_of(self.all(), rule, content_hash)

    def update(self, rule: str, content_hash: str, change: Callable[[RuleHealth], RuleHealth]) -> RuleHealth:
        """Record `change` of the health of `rule` (the file with `content_hash`) unless it changes
        nothing; return the result. The table is read, `change` applied and the row appended under
        the home's `commit_lock`: `seclake rules enable` appends beside a stream, so a failure counted
        a moment later starts from the enable, not from the health read before it."""
        with self.lake.home.commit_lock(RULE_STATUS_TABLE):
            return self._put(change(self.get(rule, content_hash)))

    def _put(self, health: RuleHealth) -> RuleHealth:
        before = self.all().get(health.rule)
        if before == health or (before is None and health == RuleHealth.fresh(health.rule, health.content_hash)):
            return health
        now = utc_now()
        if health.state == DISABLED and (before is None or before.state != DISABLED):
            # The alert first: an application dying between the two appends then repeats the
            # disable (and its alert) instead of losing the alert.
            self._platform_alert(health, now)
        self.lake.ensure(self.spark, RULE_STATUS_TABLE)
        row: tuple = (health.rule, health.content_hash, health.state, health.failures, health.reason,
                      health.retry_at, now)
        frame = self.spark.createDataFrame([row], self.lake.spec(RULE_STATUS_TABLE).schema)
        self.lake.append(RULE_STATUS_TABLE, frame)
        self._health[health.rule] = health
        self._version = _newest_version(self.lake.path(RULE_STATUS_TABLE))
        if health.state == DISABLED and (before is None or before.state != DISABLED):
            log.error("rule %s disabled after %d failure(s) in a row: %s; `seclake rules enable %s` re-enables it",
                      health.rule, health.failures, health.reason, health.rule)
        return health

    def _load(self) -> dict[str, RuleHealth]:
        return recorded_health(self.lake, lambda: self.spark)

    def _platform_alert(self, health: RuleHealth, now: datetime) -> None:
        """An alert in `alerts` saying which rule stopped detecting and why."""
        alert_id = hashlib.sha256(f"{RULE_DISABLED_ID}\x1f{health.rule}\x1f{now.isoformat()}".encode()).hexdigest()[:32]
        details = json.dumps({"rule": health.rule, "failures": health.failures, "reason": health.reason})
        frame = platform_alerts(self.spark, self.lake, [
            platform_alert(alert_id, RULE_DISABLED_ID, f"Rule disabled: {health.rule}", "high",
                           f"rule {health.rule} stopped detecting: {health.reason}", details, now)])
        append_platform_alerts(self.lake, frame)


def platform_alert(alert_id: str, rule_id: str, name: str, severity: str, summary: str, details: str,
                   now: datetime) -> tuple:
    """One row of `alerts` raised by seclake itself about a rule (`rule_id` "seclake.<what>"), not
    about the network: no host, its window the moment it was raised."""
    return (alert_id, rule_id, name, 1, severity, [], None, None, None, None, now, now, now, now,
            summary, details, now, now.date(), None)


def platform_alerts(spark: SparkSession, lake: Lake, rows: list[tuple]) -> DataFrame:
    """`rows` (from `platform_alert`) as a frame of the alerts table's schema; the table is created if missing."""
    lake.ensure(spark, ALERTS_TABLE)
    return spark.createDataFrame(rows, lake.spec(ALERTS_TABLE).schema)


def append_platform_alerts(lake: Lake, frame: DataFrame) -> None:
    """Append platform alerts to `alerts` (a plain append: their ids say whether one is new)."""
    with lake.home.commit_lock(ALERTS_TABLE):
        lake.append(ALERTS_TABLE, frame)


_STATUS: dict[str, RuleStatus] = {}


def rule_status(spark: SparkSession, lake: Lake) -> RuleStatus:
    """The RuleStatus of `lake` for this process (one cache per home)."""
    key = str(lake.home.root)
    if key not in _STATUS or _STATUS[key].spark is not spark:
        _STATUS[key] = RuleStatus(spark, lake)
    return _STATUS[key]
