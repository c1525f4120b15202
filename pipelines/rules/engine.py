"""Streaming execution of rules: one query per rule, all appending to the `alerts` table.

Per rule: a fresh child session (its own temp views, `spark.sql.runSQLOnFiles=false`), each
table it reads registered as a temp view over `read_stream(...)` with the rule's watermark,
`alert_frame(spark.sql(rule.sql))` as the streaming DataFrame (alerts-table rows, built once per
query start rather than once per micro-batch), and a `foreachBatch` writer that drops the alert
ids the table already holds and commits through DeltaSink (app_id per rule version and
checkpoint, so a replayed batch commits nothing).

A rule that cannot start (missing input table, analysis error) gives a `RunningQuery` whose
query is a `StoppedQuery` carrying the error: the other rules start and run regardless.

Run-time isolation (docs/rules.md): every start and end of a rule query updates its health in
`rule_status` (pipelines/rules/status.py). A rule that failed is held back until its back-off
passes, then retried; one that failed `rule_max_failures` times in a row is disabled. A
micro-batch over `rule_batch_budget` is stopped and counts as a failure. A marker in the
rule's checkpoint (RUNNING_MARKER) says the rule is in a batch: under run-once from its start
to its end (found at the next run-once: the application died in this rule); in the stream's
rules application while a micro-batch runs (`watch_rule`; `charge_in_flight` when it died).
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.attribution import held_to_attribution
from pipelines.checkpoint import newest
from pipelines.end_of_input import END_OF_INPUT, read_marks
from pipelines.lake.registry import Lake
from pipelines.lake.sink import CommitResult
from pipelines.lake.source import caught_up, check_resumable, read_stream
from pipelines.query import (
    BatchStats,
    OwnQuery,
    RunningQuery,
    Stage,
    StoppedQuery,
    clone_session,
    error_summary,
    late_batches,
    start_query,
    stateful_session,
    stop_between_batches,
    without_codegen,
)
from pipelines.rules.alerts import alert_frame, detected, unseen, writers_of
from pipelines.rules.health import DISABLED, FAILING, INVALID, RuleHealth
from pipelines.rules.pack import RulePack, default_rules_dir, scan_rules
from pipelines.rules.spec import LOGIC, Rule, RuleError, query_name
from pipelines.rules.status import (
    RuleStatus,
    append_platform_alerts,
    platform_alert,
    platform_alerts,
    rule_status,
    utc_now,
)
from pipelines.rules.tables import ALERTS_TABLE, RULE_LATE_ROWS_ID, RULE_STATUS_TABLE, lookup_view, table_path
from pipelines.settings import Settings, interval_seconds
from pipelines.triage.suppressions import mark

log = logging.getLogger("seclake.rules")

CHECKPOINT_MARKER = "seclake_rule.json"
# In a rule's checkpoint while it is in a batch: "once" (run-once) or "stream" (the rules application).
RUNNING_MARKER = "seclake_running"
DIED = "the Spark application stopped while this rule ran (out of memory, or killed)"
# Rules append to `alerts` side by side (run-once's wave, the stream's rules application): a batch
# whose append met another's on the same day looks the table up again, at most this many times.
CONFLICT = "DELTA_CONCURRENT_APPEND"
CONFLICT_ATTEMPTS = 5
T = TypeVar("T")


def retry_on_conflict(append: Callable[[], T], what: str) -> T:
    """Run `append` (a write to `alerts` that read it first, `unseen`) again when another writer's
    append to the same day committed in between (DELTA_CONCURRENT_APPEND), at most
    CONFLICT_ATTEMPTS times; any other error, or the last conflict, is raised.

    >>> calls = []
    >>> def append():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added to partition ...")
    ...     return len(calls)
    >>> retry_on_conflict(append, "a test")
    3
    """
    for _ in range(CONFLICT_ATTEMPTS - 1):
        try:
            return append()
        except Exception as exc:  # Delta's ConcurrentAppendException comes as a bare Py4JJavaError
            if CONFLICT not in str(exc):
                raise
            log.info("%s met a concurrent append to alerts; trying again", what)
    return append()


class MissingInputError(RuntimeError):
    """A table the rule reads does not exist yet (nothing has written it); retried on sync."""


class RuleRunError(RuntimeError):
    """A rule query failed while running; the message names the rule, the batch and the cause."""


class AlertWriter:
    """The `foreachBatch` function of one rule query.

    `start_rule` creates one per rule (`AlertWriter(lake, rule, app_id=...)`, the app id kept in
    the checkpoint) and passes it to the rule query's `writeStream.foreachBatch`.
    """

    query = OwnQuery()  # the query running this writer, set by its starter

    def __init__(self, lake: Lake, rule: Rule, app_id: str, status: RuleStatus, settings: Settings,
                 marker: Path) -> None:
        self.rule = rule
        self.content_hash = rule.content_hash
        self.lake = lake
        self.alerts_path = lake.path(ALERTS_TABLE)
        self.app_id = app_id
        self.sink = lake.sink(ALERTS_TABLE, app_id=app_id)
        self.history: list[BatchStats] = []
        self.error: str | None = None
        self.status = status
        self.settings = settings
        self.marker = marker
        # `query` is set by `start_rule` once the query runs; `overrun` by RuleQuery when a batch ran over budget.
        self.overrun: str | None = None
        self._closed = False
        self._late_after = -1  # the newest batch whose late rows were looked at
        self._spark: SparkSession | None = None

    def __call__(self, rows: DataFrame, batch_id: int) -> None:
        """Commit the new alerts among `rows` (alerts-table rows: the rule's stream is `alert_frame`d)."""
        self._spark = rows.sparkSession
        if not self.marker.exists():
            # Before the rule's SQL runs (its state and aggregates are computed in here): a rule
            # that kills the application in its first second is in flight too, which
            # `RuleQuery.check_budget`'s once-a-second look at the query's status can miss.
            self.marker.write_text("stream")
        alerts = None
        result = None
        try:
            alerts = rows.dropDuplicates(["alert_id"]).persist()
            total = new = alerts.count()
            # Most batches raise nothing new: no commit then (an empty append costs a Delta txn
            # look-up, and a replay of the batch finds the same alerts known or none).
            if total:
                new, result = retry_on_conflict(functools.partial(self._append, alerts, batch_id),
                                                f"rule {self.rule.slug}: batch {batch_id}")
        except Exception as exc:
            # Spark reports it wrapped in "[STREAM_FAILED] ... foreach batch ... Traceback": keep the cause.
            self.error = f"batch {batch_id}: {_first_line(exc)}"
            raise
        finally:
            if alerts is not None:
                alerts.unpersist()
        stats = BatchStats(batch_id, already_known=total - new)
        if result is not None:
            stats.record(result)
        self.history.append(stats)
        # Failures counted, or a suspect of a death (counted as 0 at most): cleared by a good batch.
        self.status.update(self.rule.slug, self.content_hash, lambda h: h.succeeded() if h.state == FAILING else h)
        self._report_late()

    def _append(self, alerts: DataFrame, batch_id: int) -> tuple[int, CommitResult | None]:
        """Commit the alerts `alerts_path` does not hold yet: (how many, the commit or None)."""
        with writers_of(self.lake, self.rule.id):
            fresh = detected(mark(unseen(alerts, self.alerts_path, self.rule.id), self.lake)).persist()
            try:
                new = fresh.count()
                return new, (self.sink.write_batch(fresh, batch_id) if new else None)
            finally:
                fresh.unpersist()

    def _report_late(self) -> None:
        """A platform alert (`seclake.rule_late_rows`) for each finished batch whose watermark
        dropped rows: they stay in their table, but this rule never sees them again, so an analyst
        must learn that its alerts for those hours may be missing (docs/rules.md, "Late events")."""
        if self.query is None or self._spark is None:
            return
        late, self._late_after = late_batches(self.query, self._late_after)
        if not late:
            return
        rows = []
        for batch in late:
            key = f"{RULE_LATE_ROWS_ID}\x1f{self.app_id}\x1f{batch.batch_id}"
            alert_id = hashlib.sha256(key.encode()).hexdigest()[:32]
            older = f"older than its watermark {batch.watermark:%Y-%m-%d %H:%M:%S} UTC" if batch.watermark else "late"
            summary = (f"rule {self.rule.slug} dropped {batch.rows:,} row(s) of {', '.join(self.rule.tables)} {older} "
                       f"(micro-batch {batch.batch_id}); its alerts on them are missing until their hours are re-run: "
                       f"`seclake rules backtest {self.rule.slug} --from DAY --to DAY --write`")
            details = json.dumps({"rule": self.rule.slug, "batch": batch.batch_id, "late_rows": batch.rows,
                                  "watermark": batch.watermark.isoformat() if batch.watermark else None})
            rows.append(platform_alert(alert_id, RULE_LATE_ROWS_ID, f"Rule dropped late rows: {self.rule.slug}",
                                       "medium", summary, details, utc_now()))
        # Its own ids: a batch replayed after a crash reports the same drops under the same id.
        frame = platform_alerts(self._spark, self.lake, rows)
        retry_on_conflict(lambda: append_platform_alerts(self.lake, unseen(frame, self.alerts_path, RULE_LATE_ROWS_ID)),
                          f"rule {self.rule.slug}: its late-rows alert")
        log.warning("rule %s: %s", self.rule.slug, "; ".join(f"{b.rows:,} late row(s) dropped in micro-batch "
                                                              f"{b.batch_id}" for b in late))

    def close(self) -> None:
        """Record how the query ended in `rule_status` (a failure: its error or a batch over
        budget); every batch's commit is complete when the batch ends, nothing else to release."""
        if self._closed:
            return
        failure = self.overrun
        # Raises when the JVM is gone: the marker stays, and the next run-once charges this rule.
        if failure is None and self.query is not None and not self.query.isActive:
            exc = self.query.exception()
            if exc is not None:
                failure = f"failed in {self.error}" if self.error else error_summary(exc)
        try:
            self._report_late()
        except Exception as exc:  # the batches' alerts are committed; only the notice is lost
            log.warning("rule %s: its late rows were not recorded: %s", self.rule.slug, _first_line(exc))
        self._closed = True
        if failure is not None:
            record_failure(self.status, self.settings, self.rule, failure)
        elif self.marker.is_file() and self.marker.read_text() == "once":
            # Run-once runs a suspect of a death alone (`prepare_rules`): ending cleanly, with
            # batches or none, shows the death was not its doing.
            self.status.update(self.rule.slug, self.content_hash,
                               lambda h: h.succeeded() if h.state == FAILING and h.reason == DIED else h)
        self.marker.unlink(missing_ok=True)


class RuleQuery:
    """A rule's StreamingQuery whose `exception()` names the rule and the root cause and whose
    micro-batches are held to a time budget (`check_budget`, also while `awaitTermination`
    waits); everything else is the StreamingQuery's own."""

    def __init__(self, query: StreamingQuery, writer: AlertWriter, budget: str, *, once: bool) -> None:
        self._query = query
        self._writer = writer
        self._stream_marker = not once
        self._budget = budget
        self._budget_s = interval_seconds(budget)
        self._busy: tuple[float, int] | None = None  # (since, batch id before it) of the running trigger

    def __getattr__(self, name: str):
        return getattr(self._query, name)

    def check_budget(self, now: float) -> bool:
        """Stop the query if its running micro-batch started more than the budget before `now`
        (monotonic seconds; called every second or so); True if it did. Under a processing-time
        trigger, also keep the in-batch marker (RUNNING_MARKER "stream") true."""
        marker = self._writer.marker
        status = self._query.status if self._query.isActive else {}
        if self._stream_marker:
            # In a batch = a trigger that has data: one that only looks for new data never dies of the rule's SQL.
            if status.get("isTriggerActive") and status.get("isDataAvailable"):
                if not marker.exists():
                    marker.write_text("stream")
            else:
                marker.unlink(missing_ok=True)
        if not status.get("isTriggerActive"):
            self._busy = None
            return False
        last = self._query.lastProgress
        batch = last.batchId if last is not None else -1
        if self._busy is None or self._busy[1] != batch:
            self._busy = (now, batch)
            return False
        if now - self._busy[0] <= self._budget_s:
            return False
        self._writer.overrun = f"a micro-batch ran over its budget of {self._budget} (rule_batch_budget)"
        log.error("rule %s: %s; stopping it", self._writer.rule.slug, self._writer.overrun)
        self._query.stop()
        return True

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._query.awaitTermination(1):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self.check_budget(time.monotonic())
        return True if timeout is not None else None

    def exception(self) -> BaseException | None:
        if self._writer.overrun:  # stopped by `check_budget`: Spark sees a clean stop, seclake a failure
            return RuleRunError(f"rule {self._writer.rule.slug}: {self._writer.overrun}; stopped")
        exc = self._query.exception()
        if exc is None or self._writer.error is None:
            return exc
        return RuleRunError(f"rule {self._writer.rule.slug} failed in {self._writer.error}")


class IdleWriter:
    """The writer of a rule query that never started: no batches, nothing to close."""

    def __init__(self, rule: Rule | None, content_hash: str) -> None:
        self.rule = rule
        self.content_hash = content_hash
        self.history: list[BatchStats] = []

    def close(self) -> None:
        pass


# Spark pushes filters that do not use the event-time column below the watermark operator, so
# a rule's watermark would only advance with the rows its WHERE clause keeps: a rule for rare
# events (a tunnel, a high-severity IDS alert) would leave its last windows open until the
# next such event. Streaming rule sessions therefore do not push predicates down; the
# watermark sees every row of the table (rule queries read whole rows anyway).
NO_PUSHDOWN_RULES: tuple[str, ...] = (
    "org.apache.spark.sql.catalyst.optimizer.PushDownPredicates",
    "org.apache.spark.sql.catalyst.optimizer.PushPredicateThroughNonJoin",
)


def rule_session(spark: SparkSession, stream: Settings | None = None) -> SparkSession:
    """A session for one rule (`clone_session`): its own temp views and settings, files not
    readable by SQL. Given the `stream`'s settings, one for a streaming rule: a `stateful_session`
    that also keeps filters above the watermark (see NO_PUSHDOWN_RULES) and generates no code
    (`without_codegen`)."""
    session = clone_session(spark) if stream is None else stateful_session(spark, stream)
    session.conf.set("spark.sql.runSQLOnFiles", "false")
    session.conf.set("spark.sql.session.timeZone", "UTC")
    if stream is not None:
        excluded = [r for r in (session.conf.get("spark.sql.optimizer.excludedRules", "") or "").split(",") if r]
        session.conf.set("spark.sql.optimizer.excludedRules", ",".join([*excluded, *NO_PUSHDOWN_RULES]))
        without_codegen(session)
    return session


def analysis_error(spark: SparkSession, rule: Rule, exc: BaseException) -> str:
    """Spark's error about `rule`'s SQL in one line, at the rule file's line (`Rule.locate`), with
    the closest of Spark's functions when it names a function Spark does not know (validation
    cannot tell: only Spark knows its functions)."""
    text = rule.locate(error_summary(exc))
    unknown = re.search(r"UNRESOLVED_ROUTINE\] Cannot resolve routine `([^`]+)`", text)
    if unknown:
        try:
            names = [row[0] for row in spark.sql("SHOW FUNCTIONS").collect()]
        except Exception:  # the session is gone: the error as it is
            return text
        close = difflib.get_close_matches(unknown[1].lower(), names, n=1)
        if close:
            text += f"; did you mean {close[0]}()?"
    return text


def logic_changed(checkpoint: Path, rule: Rule) -> str | None:
    """Why `rule` may not take its version's checkpoint (None when it may): the checkpoint was made
    by other SQL, event time, watermark, window, keys or emit under the same version and planned a
    batch with them. Told from files (no JVM): `rules status`, run-once's look for work, and the
    rule's start ask it.
    """
    marker = checkpoint / CHECKPOINT_MARKER
    if not marker.is_file() or json.loads(marker.read_text()).get("logic_hash") == rule.logic_hash:
        return None
    if newest(checkpoint) is None:
        return None  # nothing was written under it: an edit that failed to start and its fix share the version
    return (f"rule {rule.slug} v{rule.version}: its {LOGIC} changed since {checkpoint} was made; "
            "bump `version` (a new version gets a new checkpoint)")


def deployed_health(health: RuleHealth, lake: Lake, rule: Rule) -> RuleHealth:
    """`health`, recorded for the valid `rule` as deployed, as it stands now: `invalid` when its
    text changed under its version (`logic_changed`), else without an `invalid` verdict that the
    rest of the pack gave it (`RuleHealth.validated`). The rule's start and `rules status` ask it."""
    changed = logic_changed(lake.home.checkpoint(rule.checkpoint_name), rule)
    return health.invalid(changed) if changed else health.validated()


def claim_checkpoint(checkpoint: Path, rule: Rule) -> str:
    """The DeltaSink app_id of this rule version's checkpoint, created with it.

    The app_id names the checkpoint's incarnation too: after a checkpoint is deleted (a
    re-run from scratch) batch ids restart at 0 and must not be taken for already-committed
    ones. A checkpoint made by different SQL under the same version is refused (`logic_changed`),
    unless it never planned a batch: the corrected text then takes it.
    """
    reason = logic_changed(checkpoint, rule)
    if reason:
        raise RuleError(reason)
    marker = checkpoint / CHECKPOINT_MARKER
    info = json.loads(marker.read_text()) if marker.is_file() else {}
    if info.get("logic_hash") == rule.logic_hash:
        return info["app_id"]
    checkpoint.mkdir(parents=True, exist_ok=True)
    info = {"rule_id": rule.id, "version": rule.version, "logic_hash": rule.logic_hash,
            "app_id": info.get("app_id") or f"rule:{rule.id}:v{rule.version}:{uuid.uuid4().hex[:8]}"}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(marker)
    return info["app_id"]


def start_rule(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict, rule: Rule) -> RunningQuery:
    """Start `rule` as its own streaming query writing to the alerts table; never raises:
    a rule that cannot start comes back as a RunningQuery whose query is a StoppedQuery, with
    the error, or with a note when its health holds it back (disabled, backing off).

    Used as `running = start_rule(spark, lake, settings, {"availableNow": True}, rule)`, then
    `running.query.awaitTermination()` and `running.writer.close()` (tests/test_rules_engine.py).
    """
    writer: AlertWriter | None = None
    status = rule_status(spark, lake)
    once = "availableNow" in trigger
    checkpoint = lake.home.checkpoint(rule.checkpoint_name)
    marker = checkpoint / RUNNING_MARKER
    try:
        if marker.is_file():
            # A stream's marker is charged by the `seclake stream` that saw its rules application die.
            if once and marker.read_text() == "once":
                record_failure(status, settings, rule, DIED)
            marker.unlink()
        health = status.update(rule.slug, rule.content_hash, lambda h: deployed_health(h, lake, rule))
        if health.state == INVALID:
            # The file must change (a new version) before the rule can run: not a failure that
            # counts towards disabling it.
            if not once:
                log.error("rule %s did not start: %s", rule.slug, health.reason)
            return invalid_rule(rule.query_name, health.reason or "invalid", rule.content_hash)
        if not health.may_start(utc_now()):
            return RunningQuery(rule.query_name, StoppedQuery(rule.query_name, note=held_back(health),
                                                              disabled=health.state == DISABLED),
                                IdleWriter(rule, rule.content_hash), (ALERTS_TABLE,))
        missing = [t for t in rule.tables if not lake.exists(t)]
        if missing:
            raise MissingInputError(f"rule {rule.slug}: input table(s) {missing} do not exist yet")
        check_resumable(checkpoint)
        app_id = claim_checkpoint(checkpoint, rule)
        if once:
            marker.write_text("once")
        lake.ensure(spark, ALERTS_TABLE, settings.checkpoint_interval)
        rows = rule_rows(spark, lake, settings, rule, once=once)
        writer = AlertWriter(lake, rule, app_id, status, settings, marker)
        # "crossed": each batch hands over the windows it changed; alert ids already written are
        # dropped by the writer, so a window's alert is written once, when first crossed.
        mode = "update" if rule.emit == "crossed" else "append"
        query = start_query(rows, rule.query_name, writer, checkpoint, trigger, output_mode=mode)
        writer.query = query
        return RunningQuery(rule.query_name, RuleQuery(query, writer, settings.rule_batch_budget, once=once),
                            writer, (ALERTS_TABLE,))
    except Exception as exc:  # isolation: one broken rule must not stop the others
        # Missing input tables are normal until the upstream stages first commit; sync() retries
        # every few seconds, so that case is not an error (the stream reports it once).
        marker.unlink(missing_ok=True)
        if isinstance(exc, PySparkException):  # Spark's analysis of the SQL: said at the file's line
            exc = RuleError(analysis_error(spark, rule, exc))
        # Run-once's report of the rule says it (its progress line and table): logged only in a stream,
        # whose reports come every minute.
        (log.info if once or isinstance(exc, MissingInputError) else log.error)(
            "rule %s did not start: %s", rule.slug, _first_line(exc))
        if not isinstance(exc, MissingInputError):
            record_failure(status, settings, rule, f"did not start: {error_summary(exc)}")
        if writer is not None:
            writer.close()
        return RunningQuery(rule.query_name, StoppedQuery(rule.query_name, exc),
                            IdleWriter(rule, rule.content_hash), (ALERTS_TABLE,))


def rule_rows(spark: SparkSession, lake: Lake, settings: Settings, rule: Rule, *, once: bool) -> DataFrame:
    """`rule`'s alert rows as a streaming frame, in a session of its own with its input tables as
    views; Spark's analysis of the SQL runs here, so a missing column fails here, not in a batch."""
    for table in rule.lookups:  # empty until its command first writes it: the rule matches nothing yet
        lake.ensure(spark, table)
    session = rule_session(spark, settings)
    if rule.emit == "crossed" and not once:
        # Such a rule alerts in the batch that sees the rows; a batch of no data would only evict
        # state, which the next data batch does too. In a stream every input commit otherwise cost
        # each rule reading it two micro-batches (on 2 cores about 1 CPU s for 20 rows, then 0.3
        # for the one of no data). Run-once keeps them (one at most, after its last data batch).
        session.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    marks = read_marks(session, lake)
    for table in rule.tables:
        # Whole commits per micro-batch (no read limit): a commit of enriched rows spans minutes
        # of event time in every file, so splitting it by files would make the later files look late.
        held_to_attribution(read_stream(session, table_path(lake, table)), marks, rule.event_time,
                            rule.watermark or settings.rule_watermark).createOrReplaceTempView(table)
    for table in rule.lookups:
        lookup_view(lake.read(session, table), table).createOrReplaceTempView(table)
    return alert_frame(session.sql(rule.sql), rule)


def plan_error(spark: SparkSession, lake: Lake, settings: Settings, rule: Rule) -> str | None:
    """Why `rule`'s SQL would not start against the tables as they are now (Spark's analysis, in
    one line at the file's line), or None; no query is started. An input table that does not
    exist yet is not an error here: the rule's start waits for it."""
    if any(not lake.exists(t) for t in rule.tables):
        return None
    try:
        rule_rows(spark, lake, settings, rule, once=False)
    except PySparkException as exc:
        return analysis_error(spark, rule, exc)
    except RuleError as exc:
        return str(exc)
    return None


def watch_rule(running: RunningQuery, now: float) -> None:
    """Hold a rule query to its batch budget and keep its in-batch marker (`RuleQuery.check_budget`);
    any other query is left alone."""
    if isinstance(running.query, RuleQuery):
        running.query.check_budget(now)


def charge_in_flight(spark: SparkSession, lake: Lake, settings: Settings,
                     rules_dir: str | os.PathLike | None = None, kind: str = "stream") -> list[str]:
    """After the application running the rules died: charge every deployed rule that was in a
    micro-batch (its `kind` of marker, "stream" or "once", is still there); return their slugs.

    A rule already suspected of a death (on probation: suspects run one at a time) is charged a
    failure in full; the others become suspects, counted but never disabled by this death, since
    an innocent rule in a batch beside the culprit cannot be told from it. Under run-once a rule
    left alone in a batch is charged in full too: its marker is written before its query starts,
    so no other rule was running. A run-once suspect is not backed off: the next run-once probes it.
    """
    try:
        rules = scan_rules(rules_dir or default_rules_dir()).rules
    except ValueError:  # the folder is gone: no rule to charge (its markers stay for when it is back)
        return []
    status = rule_status(spark, lake)
    flying = [(rule, marker) for rule in rules
              if (marker := lake.home.checkpoint(rule.checkpoint_name) / RUNNING_MARKER).is_file()
              and marker.read_text() == kind]
    alone = kind == "once" and len(flying) == 1
    retry_s = 0.0 if kind == "once" else interval_seconds(settings.rule_retry)
    def charge(health: RuleHealth) -> RuleHealth:  # a failure when it ran alone or was suspected already
        if alone or health.reason == DIED:
            return failure(settings, DIED)(health)
        return health.suspected(DIED, utc_now(), max_failures=settings.rule_max_failures, retry_s=retry_s)

    for rule, marker in flying:
        status.update(rule.slug, rule.content_hash, charge)
        marker.unlink()
    # A marker in the checkpoint of a version or rule no longer deployed charges nothing, and left
    # there it would make every run-once start a JVM to look at it again.
    for marker in in_flight(lake, kind):
        marker.unlink(missing_ok=True)
    return [rule.slug for rule, _ in flying]


def prepare_rules(spark: SparkSession, lake: Lake, settings: Settings) -> set[str]:
    """Before run-once starts the rules' wave: charge the rules a run-once that died left in a
    batch (`charge_in_flight`), create the tables every rule appends to or looks up (one thread
    creates each, instead of several racing), and return the query names of the rules on
    probation (suspected of a death): run-once runs each of them alone, first.
    """
    charge_in_flight(spark, lake, settings, kind="once")
    pack = scan_rules(default_rules_dir())
    lake.ensure(spark, ALERTS_TABLE, settings.checkpoint_interval)
    lake.ensure(spark, RULE_STATUS_TABLE)
    for table in sorted({t for rule in pack.rules for t in rule.lookups}):
        lake.ensure(spark, table)
    status = rule_status(spark, lake)
    return {rule.query_name for rule in pack.rules
            if (health := status.get(rule.slug, rule.content_hash)).state == FAILING and health.reason == DIED}


def in_flight(lake: Lake, kind: str) -> list[Path]:
    """The in-batch markers of `kind` ("once", "stream") left in the rules' checkpoints."""
    return [m for m in lake.home.checkpoints.glob(f"rule_*/**/{RUNNING_MARKER}") if m.read_text() == kind]


def clear_in_flight(lake: Lake) -> None:
    """Remove the "stream" markers a rules application killed together with its parent left:
    a killed `seclake stream` charges no rule."""
    for marker in in_flight(lake, "stream"):
        marker.unlink(missing_ok=True)


def record_failure(status: RuleStatus, settings: Settings, rule: Rule, reason: str) -> RuleHealth:
    """Count a run-time failure of `rule` in `rule_status`: back off, or disable it."""
    return status.update(rule.slug, rule.content_hash, failure(settings, reason))


def failure(settings: Settings, reason: str) -> Callable[[RuleHealth], RuleHealth]:
    """A health's change for one more run-time failure for `reason`, under `settings`' back-off and limit."""
    return lambda health: health.failed(reason, utc_now(), max_failures=settings.rule_max_failures,
                                        retry_s=interval_seconds(settings.rule_retry))


def held_back(health: RuleHealth) -> str:
    """Why a rule is not started, for the run report.

    >>> held_back(RuleHealth("bomb", "h", DISABLED, 3, "Java heap space"))
    'disabled after 3 failure(s) in a row (Java heap space); `seclake rules enable bomb` re-enables it'
    """
    if health.state == DISABLED:
        return (f"disabled after {health.failures} failure(s) in a row ({health.reason}); "
                f"`seclake rules enable {health.rule}` re-enables it")
    retry = f"{health.retry_at:%Y-%m-%d %H:%M:%S} UTC" if health.retry_at else "later"
    return f"backing off after {health.failures} failure(s) in a row ({health.reason}); next try after {retry}"


def invalid_rule(name: str, reason: str, content_hash: str) -> RunningQuery:
    """The RunningQuery of a rule file that did not validate: failed, with the reason."""
    return RunningQuery(name, StoppedQuery(name, RuleError(reason)), IdleWriter(None, content_hash), (ALERTS_TABLE,))


def stop_rule(running: RunningQuery, patience_s: float = 60.0) -> None:
    """Stop a rule query between micro-batches (a stop mid-batch is safe but replays it) and release its sink."""
    stop_between_batches(running.query, patience_s)
    running.writer.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def file_hash(path: Path) -> str:
    """The sha256 of a rule file as deployed (its `Rule.content_hash` when it validates); "" if unreadable."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def rule_stage(rule: Rule) -> Stage:
    """The stage of one valid rule: it reads the rule's tables and the end-of-input marks (so it
    runs after `end_of_input`), appends to `alerts`, and keeps a checkpoint per rule version."""
    return Stage(rule.query_name, reads=(*rule.tables, END_OF_INPUT), writes=(ALERTS_TABLE,),
                 start=functools.partial(start_rule, rule=rule), checkpoint=rule.checkpoint_name,
                 idle=functools.partial(_rule_idle, rule))


def _rule_idle(rule: Rule, lake: Lake, settings: Settings) -> bool:
    """A rule stage has nothing to do when its checkpoint read every commit of its tables (whatever
    the `settings`), unless its text changed under its version: then its start says so at once,
    not at the next input."""
    checkpoint = lake.home.checkpoint(rule.checkpoint_name)
    if logic_changed(checkpoint, rule):
        return False
    return caught_up(checkpoint, [lake.path(t) for t in (*rule.tables, END_OF_INPUT) if lake.exists(t)])


def rule_stages(rules_dir: str | os.PathLike | None = None) -> list[Stage]:
    """One stage per rule file, reading the rule's tables and appending to `alerts`; an invalid rule
    is a stage too, whose query fails with the validation error (so run-once reports it).

    >>> [s.name for s in rule_stages("rules")][:2]
    ['rule_c2_beaconing', 'rule_dga_nxdomain_burst']
    """
    root = Path(rules_dir or default_rules_dir())
    pack = scan_rules(root)
    stages = [rule_stage(rule) for rule in pack.rules]
    for name, (path, reason) in invalid_names(root, pack).items():
        stages.append(Stage(name, reads=(), writes=(ALERTS_TABLE,),
                            start=functools.partial(_start_invalid, name, path, reason)))
    return sorted(stages, key=lambda stage: stage.name)  # an invalid file among the others, by name


def invalid_names(root: Path, pack: RulePack) -> dict[str, tuple[Path, str]]:
    """Each invalid file of `pack` (scanned from `root`) and its reason, by its stage's name: its
    file name's query name, or its path's under `root` when another file has that name."""
    named: dict[str, tuple[Path, str]] = {}
    taken = {rule.query_name for rule in pack.rules}
    for path, reason in pack.errors.items():
        name = query_name(path.stem)
        if name in taken:  # a duplicate file name: its folder tells it apart
            name = query_name(path.relative_to(root).with_suffix("").as_posix())
        taken.add(name)
        named[name] = (path, reason)
    return named


def _start_invalid(name: str, path: Path, reason: str, spark, lake, settings, trigger) -> RunningQuery:
    content_hash = file_hash(path)
    if own_name(name, path):
        rule_status(spark, lake).update(path.stem, content_hash, lambda h: h.invalid(reason))
    return invalid_rule(name, reason, content_hash)


def own_name(name: str, path: Path) -> bool:
    """Whether the invalid file at `path` has the stage `name` of its file name: rule_status keeps
    health per file name, and a file refused for another's name would overwrite that rule's."""
    return name == query_name(path.stem)


@dataclass
class SyncResult:
    """What one `RuleManager.sync` changed; `invalid` maps a rule file name to its error."""

    started: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    # Rules started again after waiting for their input tables to exist.
    retried: list[str] = field(default_factory=list)
    # Held-back rules started again: their back-off passed, or `seclake rules enable`.
    resumed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    # Rules whose query failed or ran over budget: counted in rule_status, held back or disabled.
    failed: list[str] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)
    # The deploys in one line ("started rule_a, rule_b; stopped rule_c"), empty when none.
    summary: str = ""

    def __bool__(self) -> bool:
        return bool(self.started or self.restarted or self.retried or self.resumed or self.stopped or self.failed)


class RuleManager:
    """Hot deploy for `seclake stream`: `sync` makes the rule queries in `running` match the
    rules folder, touching only what changed.

    - a new rule file: its query starts;
    - a changed file (any edit: new version, new SQL, new severity): its query restarts, on
      the checkpoint of its (possibly new) version;
    - a removed file: its query stops;
    - a file that no longer validates, or whose SQL changed under the version its checkpoint
      was made with: the running version keeps running, the error is logged once per content and
      reason (a duplicate removed can leave the same file refused for another reason);
    - a rule that could not start because an input table did not exist yet: retried;
    - a rule whose query failed or whose batch ran over budget: counted in `rule_status`,
      retried once its back-off has passed, left stopped once disabled (until
      `seclake rules enable` or an edit of its file);
    - rules charged because the application died in their batch: started one at a time.

    Queries that are not rules (their writer is not a rule's) are never touched. `jobs.stream`
    calls `sync` every few seconds with the queries it runs.
    """

    def __init__(self, rules_dir: str | os.PathLike | None = None) -> None:
        self.rules_dir = Path(rules_dir or default_rules_dir())
        self._logged: dict[Path, tuple[str, str]] = {}  # (content hash, reason) last logged per file
        self._refused: dict[str, str | None] = {}  # content hash of an edit -> why it would not start
        self._probing: set[str] = set()  # suspects of a dead application started, first trigger not done
        self._folder_gone = False  # logged once while the rules folder is missing

    def sync(self, spark: SparkSession, lake: Lake, settings: Settings, trigger: dict,
             running: list[RunningQuery]) -> SyncResult:
        """Start, restart and stop rule queries in `running` (edited in place)."""
        result = SyncResult()
        current = {r.name: r for r in running if isinstance(r.writer, (AlertWriter, IdleWriter))}
        # A running rule keeps its id over a copy of its file, however the two files' times go.
        rules = [r.writer.rule for r in running if isinstance(r.writer, (AlertWriter, IdleWriter))]
        try:
            pack = scan_rules(self.rules_dir, deployed={rule.path.resolve() for rule in rules
                                                        if rule is not None and rule.path is not None})
        except ValueError as exc:  # the folder removed or renamed: likelier a mistake than "stop every rule"
            if not self._folder_gone:
                log.error("%s: the running rules keep running as they are until it is back", exc)
            self._folder_gone = True
            return result
        self._folder_gone = False
        valid = pack.by_slug()
        invalid = invalid_names(self.rules_dir, pack)
        status = rule_status(spark, lake)
        start = functools.partial(start_rule, spark, lake, settings, trigger)
        self._restart_failed(start, valid, current, running, result)
        self._clear_probes(current, status)
        plan = functools.partial(plan_error, spark, lake, settings)
        self._deploy(start, plan, lake, valid, current, running, status, result)
        deployed = {rule.query_name for rule in valid.values()}
        for name, entry in current.items():
            if name in deployed or name in invalid:
                continue
            stop_rule(entry)
            running.remove(entry)
            result.stopped.append(name)
        self._record_invalid(invalid, current, status, result)
        # One line per sync for the stream's output (a deploy is worth seeing; ten lines a start are
        # not). A query that did not start is not named here: its error is logged.
        up = {e.name for e in running if not isinstance(e.query, StoppedQuery)}
        result.summary = "; ".join(f"{what} {', '.join(shown)}" for what, names in (
            ("started", result.started), ("restarted", result.restarted), ("stopped", result.stopped),
            ("started now that their input tables exist", result.retried),
            ("started again (back-off over, or enabled)", result.resumed))
            if (shown := names if what == "stopped" else [n for n in names if n in up]))
        return result

    @staticmethod
    def _restart_failed(start: Callable[[Rule], RunningQuery], valid: dict[str, Rule],
                        current: dict[str, RunningQuery], running: list[RunningQuery], result: SyncResult) -> None:
        """A rule query that stopped (failed, or stopped over its batch budget) is recorded and
        started again: `start_rule` holds it back while its back-off runs."""
        now = time.monotonic()
        for name, ran in list(current.items()):
            writer = ran.writer
            if not isinstance(ran.query, RuleQuery) or not isinstance(writer, AlertWriter):
                continue
            ran.query.check_budget(now)
            if not ran.query.isActive and writer.rule.slug in valid:
                writer.close()  # records the failure (or the overrun) in rule_status
                if ran.query.exception() is not None or writer.overrun:
                    result.failed.append(name)
                replacement = start(valid[writer.rule.slug])
                running[running.index(ran)] = replacement
                current[name] = replacement

    def _clear_probes(self, current: dict[str, RunningQuery], status: RuleStatus) -> None:
        """Rules charged with a dead application are probed one at a time: the next starts once the
        one before has finished a trigger, so a second death is charged to the rule that caused it."""
        for name in list(self._probing):
            probe = current.get(name)
            if probe is not None and _first_trigger_pending(probe):
                continue
            self._probing.discard(name)
            if probe is not None and isinstance(probe.writer, AlertWriter) and probe.query.isActive:
                # It ran a trigger without taking the application down: cleared.
                status.update(probe.writer.rule.slug, probe.writer.content_hash,
                              lambda h: h.succeeded() if h.reason == DIED else h)

    def _deploy(self, start: Callable[[Rule], RunningQuery], plan: Callable[[Rule], str | None], lake: Lake,
                valid: dict[str, Rule],
                current: dict[str, RunningQuery], running: list[RunningQuery], status: RuleStatus,
                result: SyncResult) -> None:
        """Start new rules, restart edited ones, retry held-back ones whose back-off passed."""
        for rule in valid.values():
            entry = current.get(rule.query_name)
            suspect = status.get(rule.slug, rule.content_hash).reason == DIED
            if suspect and self._probing and (entry is None or _retryable(entry, status)):
                continue
            if entry is None:
                running.append(start(rule))
                result.started.append(rule.query_name)
                if suspect:
                    self._probing.add(rule.query_name)
            elif _content_hash(entry) != rule.content_hash or _retryable(entry, status):
                edited = _content_hash(entry) != rule.content_hash
                if edited and self._keeps_running(entry, plan, lake, rule):
                    continue
                waited = isinstance(entry.query, StoppedQuery) and isinstance(entry.query.error, MissingInputError)
                if suspect:
                    self._probing.add(rule.query_name)
                stop_rule(entry)
                running[running.index(entry)] = start(rule)
                (result.restarted if edited else result.retried if waited else result.resumed).append(rule.query_name)

    def _keeps_running(self, entry: RunningQuery, plan: Callable[[Rule], str | None], lake: Lake, rule: Rule) -> bool:
        """An edit that would not start (its SQL changed under the version the running query's
        checkpoint was made with, or Spark's analysis refuses it) is not deployed: the running
        query is kept, and the reason logged once per content."""
        if isinstance(entry.query, StoppedQuery):
            return False
        if rule.content_hash not in self._refused:
            # Planned once per content: the edit's fix is another content, planned in its turn.
            self._refused[rule.content_hash] = (
                logic_changed(lake.home.checkpoint(rule.checkpoint_name), rule) or plan(rule))
        reason = self._refused[rule.content_hash]
        if reason and rule.path is not None and self._logged.get(rule.path) != (rule.content_hash, reason):
            self._logged[rule.path] = (rule.content_hash, reason)
            log.error("rule file not deployed (its running version keeps running): %s", reason)
        return bool(reason)

    def _record_invalid(self, invalid: dict[str, tuple[Path, str]], current: dict[str, RunningQuery],
                        status: RuleStatus, result: SyncResult) -> None:
        """A file that does not validate: `invalid` in rule_status unless its older version runs;
        its error logged once per content and reason."""
        for name, (path, reason) in invalid.items():
            result.invalid[name] = reason
            digest = file_hash(path)
            if name not in current and own_name(name, path):
                status.update(path.stem, digest, functools.partial(RuleHealth.invalid, reason=reason))
            if self._logged.get(path) != (digest, reason):  # a file's new reason is news, its content unchanged
                self._logged[path] = (digest, reason)
                kept = " (its running version keeps running)" if name in current else ""
                log.error("rule file not deployed%s: %s", kept, reason)


def _first_trigger_pending(entry: RunningQuery) -> bool:
    """A rule query that runs and has not finished a trigger since it started."""
    query = entry.query
    return isinstance(query, RuleQuery) and query.isActive and (
        query.lastProgress is None or bool(query.status.get("isTriggerActive")))


def _content_hash(entry: RunningQuery) -> str:
    """The hash of the rule file a rule query runs (its writer is an AlertWriter or IdleWriter)."""
    return getattr(entry.writer, "content_hash", "")


def _retryable(entry: RunningQuery, status: RuleStatus) -> bool:
    """A rule that did not start (held back, or its start failed) whose back-off passed or that
    was re-enabled, or one waiting for its tables. An invalid rule's writer has no rule: its file
    must change first."""
    if not isinstance(entry.query, StoppedQuery):
        return False
    if isinstance(entry.query.error, MissingInputError):
        return True
    rule = getattr(entry.writer, "rule", None)
    return rule is not None and status.get(rule.slug, rule.content_hash).may_start(utc_now())
