"""One streaming query of the pipeline: how it is started, what it reports, how it is stopped.

Every stage (ETL, attribution, each rule) is a `foreachBatch` writer behind a query started by
`start_query`; the writer records a `BatchStats` per micro-batch, `report` folds them with
Spark's progress into a `QueryReport`, and `error_summary` turns a failure into one line.
Nothing here knows which stages exist (`pipelines/stages.py` does).
"""
from __future__ import annotations

import json
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.checkpoint import clear_unstarted, newest
from pipelines.lake.sink import CommitResult, DeltaSink

if TYPE_CHECKING:
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

AVAILABLE_NOW: dict[str, object] = {"availableNow": True}


def processing_time(interval: str) -> dict[str, object]:
    """The trigger of continuous mode.

    >>> processing_time("10 seconds")
    {'processingTime': '10 seconds'}
    """
    return {"processingTime": interval}


class OwnQuery:
    """A `foreachBatch` writer's handle on the query that runs it (`writer.query = query`), held
    weakly. The JVM's query holds the writer (its foreachBatch function, through py4j's callback
    proxy); a writer holding the query back makes a cycle across the two runtimes that neither
    garbage collector can see whole, so every stopped query stayed in the JVM with its last plans
    (the test JVM filled its 6 GB heap with 174 of them). The query's `RunningQuery` keeps it alive
    while it matters.

    >>> class Writer:
    ...     query = OwnQuery()
    >>> class Query:
    ...     pass
    >>> writer, query = Writer(), Query()
    >>> writer.query = query
    >>> writer.query is query
    True
    >>> del query
    >>> writer.query is None
    True
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = f"_{name}_ref"

    def __get__(self, writer: object, owner: type | None = None) -> StreamingQuery | None:
        ref = getattr(writer, self._attr, None)
        return ref() if ref is not None else None

    def __set__(self, writer: object, query: StreamingQuery | None) -> None:
        setattr(writer, self._attr, weakref.ref(query) if query is not None else None)


@dataclass
class BatchStats:
    """What one micro-batch committed: rows and versions per table, tables whose commit was a replay
    (`skipped`), and rows a rule found already in `alerts` (`already_known`); `read` counts the
    batch's input in its own units where they are not rows (the ETL: files and data lines).

    >>> stats = BatchStats(0)
    >>> stats.record(CommitResult("silver_dns", 0, 3, 120, False))
    >>> stats.rows, stats.versions
    ({'silver_dns': 120}, {'silver_dns': 3})
    """

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    already_known: int = 0
    read: dict[str, int] = field(default_factory=dict)

    def record(self, result: CommitResult) -> None:
        """Add one table's commit (or replay) to this batch."""
        if result.skipped:
            self.skipped.append(result.table)
        elif result.version is not None:
            self.rows[result.table] = self.rows.get(result.table, 0) + result.rows
            self.versions[result.table] = result.version


@dataclass(frozen=True)
class LateBatch:
    """A finished micro-batch whose watermark dropped `rows` input rows older than `watermark`."""

    batch_id: int
    watermark: datetime | None
    rows: int


def late_batches(query: StreamingQuery, after: int) -> tuple[list[LateBatch], int]:
    """The batches after batch `after` whose watermark dropped rows, and the newest batch id seen.

    Drops are known only from a finished batch's progress, which Spark keeps in memory (the last
    100 batches): a writer asks after each batch for the ones before it, and once more when the
    query ends. Batches that ran just before a crash are not reported (their rows stay in their table).
    A trigger that found nothing new is reported too, under the id of the batch it did not run: it
    is no batch here, or a stream between inputs would count that batch seen before it ran.
    """
    found, last = [], after
    for progress in _batches_after(query, after):
        last = max(last, progress.batchId)
        dropped = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        if dropped:
            mark = progress.eventTime.get("watermark")
            found.append(LateBatch(progress.batchId,
                                   datetime.fromisoformat(mark.replace("Z", "+00:00")) if mark else None, dropped))
    return found, last


def _batches_after(query: StreamingQuery, after: int) -> list:
    """The progress of the batches that ran after batch `after`, oldest first, from Spark's last
    100 reports. Read from the newest back, and only a batch's report converted: PySpark's
    `recentProgress` converts all 100, and a stream between inputs leaves a report per idle
    trigger, so every batch's writer would pay for all of them."""
    import json

    from pyspark.sql.streaming.listener import StreamingQueryProgress

    reports = query._jsq.recentProgress()
    ran: list = []
    for i in range(len(reports) - 1, -1, -1):
        report = reports[i]
        if report.batchId() <= after:
            break
        if report.durationMs().containsKey("addBatch"):
            ran.append(StreamingQueryProgress.fromJson(json.loads(report.json())))
    return ran[::-1]


def batch_watermark(query: StreamingQuery) -> int:
    """The event-time watermark (epoch ms) of `query`'s running micro-batch: its stateful operators
    have emitted everything older by the end of the batch. Call it from the query's foreachBatch.

    PySpark has no public call for it; the batch's plan (lastExecution) carries it.
    """
    return int(query._jsq.streamingQuery().lastExecution().offsetSeqMetadata().batchWatermarkMs())


class BatchWriter(Protocol):
    """What reports read from a query's writer: one BatchStats per batch it ran (the writer of a
    query that never started has none), and `close` once the query has stopped."""

    history: list[BatchStats]

    def close(self) -> None: ...


class QueryHandle(Protocol):
    """The part of a StreamingQuery the runner uses; a rule that could not start stands in with
    an object of this shape (`StoppedQuery`)."""

    @property
    def isActive(self) -> bool: ...

    @property
    def recentProgress(self) -> list: ...

    @property
    def status(self) -> dict: ...

    def exception(self) -> BaseException | None: ...

    def awaitTermination(self, timeout: int | None = None) -> bool | None: ...

    def stop(self) -> None: ...


@dataclass
class ProgressTally:
    """Spark's progress of one query over every batch it ran, as `report` gives it. Spark keeps a
    query's last 100 reports only; a stream's reports (every minute, for days) each add the
    batches since the one before, so the counts stay totals since the query started.

    >>> ProgressTally().add(StoppedQuery("rule_x")).rows_in
    0
    """

    after: int = -1  # the newest batch id added
    rows_in: int = 0
    late_rows: int = 0
    state_commit_ms: int = 0
    # As of the newest batch:
    watermark: str | None = None
    state_rows: int = 0
    state_bytes: int = 0

    def add(self, query: QueryHandle) -> ProgressTally:
        """Add the batches `query` ran since the last call; returns self."""
        # A started query's reports, newest back to the last one added; a stand-in's, all of them.
        ran = (_batches_after(cast(StreamingQuery, query), self.after) if hasattr(query, "_jsq")
               else [p for p in query.recentProgress if p.batchId > self.after])
        for progress in ran:
            self.after = max(self.after, progress.batchId)
            self.rows_in += progress.numInputRows
            mark = progress.eventTime.get("watermark")
            if mark and not mark.startswith("1970-01-01T00:00:00"):  # Spark's 0 before any event time
                self.watermark = mark
            ops = progress.stateOperators
            if ops:
                self.state_rows = sum(op.numRowsTotal for op in ops)
                self.state_bytes = sum(op.memoryUsedBytes for op in ops)
                self.state_commit_ms += sum(op.commitTimeMs for op in ops)
                self.late_rows += sum(op.numRowsDroppedByWatermark for op in ops)
        return self


@dataclass
class RunningQuery:
    """A started streaming query, the `foreachBatch` writer behind it and the tables it writes."""

    name: str
    query: QueryHandle
    writer: BatchWriter
    tables: tuple[str, ...]
    progress: ProgressTally = field(default_factory=ProgressTally)


class StoppedQuery:
    """Stands in for the StreamingQuery of a stage that has none: a rule that could not start
    (`error` set) or was held back (`note` says why: disabled, backing off), or run-once's
    end-of-input mark, written directly. Inactive, so reports and `jobs.stream` treat it like a
    query that ended (with `error`, failed)."""

    def __init__(self, name: str, error: BaseException | None = None, note: str | None = None,
                 disabled: bool = False) -> None:
        self.name = name
        self.error = error
        self.note = note
        self.disabled = disabled
        self.id = None
        self.isActive = False
        self.recentProgress: list = []
        self.lastProgress = None
        state = f"not started: {error}" if error is not None else note or "done"
        self.status = {"message": state, "isDataAvailable": False, "isTriggerActive": False}

    def exception(self) -> BaseException | None:
        return self.error

    def awaitTermination(self, timeout: float | None = None) -> bool:
        return True

    def stop(self) -> None:
        pass


@dataclass
class DoneWriter:
    """The writer of a stage without a query: the batches it wrote, nothing to close."""

    history: list[BatchStats] = field(default_factory=list)

    def close(self) -> None:
        pass


Starter = Callable[["SparkSession", "Lake", "Settings", dict], RunningQuery]


@dataclass(frozen=True)
class Stage:
    """One streaming query of the pipeline.

    `name` is the query's name, its checkpoint folder (`checkpoints/<name>`, unless `checkpoint`
    names another: a rule's is per version), its writers' Delta app_id and its Dagster op; `reads`
    and `writes` are registry tables (landing folders are not tables); `start(spark, lake,
    settings, trigger)` starts it. `part_of` names the stage whose tables this one also writes from
    another input (`etl_kafka` is part of `etl`): Dagster shows both as that stage's asset.
    `idle(lake, settings)`, where given, tells from files alone (no JVM) that starting the stage now
    with `settings` would process nothing; without it, `stages.idle` asks the checkpoint and the
    tables it reads.
    """

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    start: Starter
    checkpoint: str = ""
    part_of: str = ""
    idle: Callable[["Lake", "Settings"], bool] | None = None

    @property
    def checkpoint_name(self) -> str:
        """The checkpoint folder under `<home>/checkpoints/`.

        >>> Stage("enriched_dns", ("silver_dns",), ("enriched_dns",), print).checkpoint_name
        'enriched_dns'
        """
        return self.checkpoint or self.name


def clone_session(spark: SparkSession) -> SparkSession:
    """A session of its own: settings and temp views set on it stay in it.

    A clone, not `spark.newSession()`: it starts with what was set on `spark` (SQL settings,
    temp views), which a new session would start without.
    """
    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


# Spark generates Java source for a plan and compiles it; a streaming query does so for every
# micro-batch. A streaming rule's batch is tens of rows in `seclake stream`, and Spark compiled about
# five classes for each one anew (its stateful operators write the batch's watermark into their code
# as a constant): on 2 cores that cost more than the rows, and run-once's rules ran faster too
# (docs/performance.md, "Rules without generated code"). Run-once's ETL generated the source of its
# parse's hundreds of expressions for each micro-batch (~0.3 s), and its day-in-one-batch was no
# slower interpreted ("The ETL without generated code"); the stream's ETL, whose rows decide under
# load, and the attribution joins keep generated code, since they ran slower interpreted.
INTERPRETED: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def without_codegen(session: SparkSession) -> SparkSession:
    """`session`, set to evaluate its plans without generated code (INTERPRETED); use it on a clone
    (`clone_session`), since the settings stay on the session.

    >>> without_codegen(clone_session(spark)).conf.get("spark.sql.codegen.wholeStage")
    'false'
    """
    for key, value in INTERPRETED.items():
        session.conf.set(key, value)
    return session


def stateful_session(spark: SparkSession, settings: Settings) -> SparkSession:
    """A clone of `spark` (`clone_session`) for building and starting a stateful query: a new
    checkpoint keeps its state in `settings.state_partitions` partitions; an existing one keeps
    the count it was created with (Spark restores it from the checkpoint's offsets).
    """
    session = clone_session(spark)
    session.conf.set("spark.sql.shuffle.partitions", str(settings.state_partitions))
    return session


# The Java exceptions by which Spark tells a stop from a failure in a `foreachBatch` function
# (`StreamExecution.IO_EXCEPTION_NAMES`, Spark 4.2).
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")


class InterruptedBatch(RuntimeError):
    """A micro-batch whose JVM call was interrupted, by its query's stop as a rule (the batch replays on restart)."""


def stop_aware(writer: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """`writer`, whose interrupted JVM calls fail with a short `InterruptedBatch` instead of the
    Py4JJavaError and its Java stack traces.

    Spark tells a stop from a failure by a regex over the Python error's whole text,
    `An error occurred while calling((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|...)`, whose
    group recurses once per character: a stack trace of 5-10 KB overflowed the stream thread's stack
    (a `java.lang.StackOverflowError` and a thousand lines on stderr at most stops mid-batch). The
    short error keeps the words the regex finds, so Spark decides as before.
    """
    from py4j.protocol import Py4JJavaError

    def batch(frame: DataFrame, batch_id: int) -> None:
        try:
            writer(frame, batch_id)
        except Py4JJavaError as exc:
            text = _java_text(exc) or ""
            cause = next((name for name in INTERRUPTIONS if name in text), None)
            if cause is None:
                raise
            first = text.split("\n\tat ", 1)[0].strip()  # the call and the Java exception's first line
            raise InterruptedBatch(f"py4j.protocol.Py4JJavaError: {first}\n(interrupted: {cause})") from None
    return batch


def _java_text(exc: Exception) -> str | None:
    """`str(exc)` of a Py4JJavaError (its Java stack trace, read from the JVM), None if unreadable."""
    for _ in range(2):
        try:
            return str(exc)
        except Exception:  # a stop's interrupt fails the thread's next JVM call, and is cleared by it
            continue
    return None


def start_query(frame: DataFrame, name: str, writer: Callable[[DataFrame, int], None], checkpoint: Path,
                trigger: dict, output_mode: str = "append", sinks: tuple[DeltaSink, ...] = ()) -> StreamingQuery:
    """Start `frame` as query `name` (also its checkpoint folder's name) writing through `writer`,
    whose tables' sinks are `sinks` (`check_new_checkpoint`)."""
    clear_unstarted(checkpoint)
    if newest(checkpoint) is None:
        check_new_checkpoint(frame.sparkSession, name, checkpoint, sinks)
    return (frame.writeStream
            .queryName(name)
            .outputMode(output_mode)
            .foreachBatch(stop_aware(writer))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start())


def check_new_checkpoint(spark: SparkSession, name: str, checkpoint: Path, sinks: tuple[DeltaSink, ...]) -> None:
    """ValueError when query `name` starts a new checkpoint but a table it writes already holds
    batches of its app id: the new checkpoint numbers its batches from 0 again, and its sinks would
    skip every id the table holds, losing those batches' rows in silence. A checkpoint deleted
    without its tables does this; restoring it, or rebuilding the stage, does not. The rebuild named
    is that of the stage's first table: a shared one (`late_events`) has several writers."""
    for sink in sinks:
        last = sink.last_batch(spark)
        if last >= 0:
            raise ValueError(
                f"{name}: its checkpoint {checkpoint} is new, but {sink.name} already holds its batches up to {last} "
                f"(app id {sink.app_id}): run from it, their ids would be skipped and their rows lost; restore the "
                f"checkpoint, or rebuild the stage from its inputs: seclake rollback {sinks[0].name} --empty --cascade")


def stop_between_batches(query: QueryHandle, patience_s: float = 60.0) -> None:
    """Stop `query` once its running micro-batch (if any) has committed, or after `patience_s`."""
    # Stopping mid-batch is safe (the batch replays) but wasteful; give the batch time to commit.
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()


# The columns of `QueryReport.cells`: one table row per stage in `seclake run-once`, `stream` and `demo`.
REPORT_COLUMNS: tuple[str, ...] = ("stage", "batches", "read", "written", "time", "notes")


@dataclass
class QueryReport:
    """Progress of one query over a run: what `seclake run-once` prints and Dagster records.

    `rows_in` is Spark's count of rows its sources delivered; `read`, when the writer counts its
    input in other units (the ETL: files and data lines), is what the report shows instead, since
    Spark counts a whole landing file as one row, once per source branch that scans it.
    """

    name: str
    batches: int = 0
    rows_in: int = 0
    rows_out: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    watermark: str | None = None
    state_rows: int = 0
    state_bytes: int = 0
    state_commit_ms: int = 0
    late_rows: int = 0
    error: str | None = None
    # The Python exception that failed the query (`StageError.python_error`, set by `run_stage`):
    # whether a retry can help.
    python_error: str | None = None
    skipped: bool = False
    read: dict[str, int] = field(default_factory=dict)
    # Why the stage did not run: a disabled rule, one backing off, no input table yet.
    note: str | None = None
    # A rule held back until `seclake rules enable`: run-once exits 1 for it on every run, not only
    # on the run that disabled it, as `seclake rules status` does.
    disabled: bool = False

    def line(self) -> str:
        """One line for the terminal (progress, logs).

        >>> QueryReport("etl", batches=1, read={"files": 4, "data lines": 5936},
        ...             rows_out={"silver_dns": 1797}, duration_s=1.25).line()
        'etl: 1 batch, 4 files, 5,936 data lines in -> silver_dns=1,797 in 1.2s'
        >>> QueryReport("enriched_dns", batches=2, rows_in=1942, duration_s=7).line()
        'enriched_dns: 2 batches, 1,942 rows in -> nothing written in 7.0s'
        >>> QueryReport("enriched_dns", skipped=True).line()
        'enriched_dns: nothing new since its last batch (not started)'
        >>> QueryReport("rule_x", error="[UNRESOLVED_ROUTINE] ...", duration_s=1).line()
        'rule_x: FAILED in 1.0s: [UNRESOLVED_ROUTINE] ...'
        """
        if self.skipped:
            return f"{self.name}: nothing new since its last batch (not started)"
        if self.note and not self.error:
            return f"{self.name}: {self.note}"
        if self.error and not self.batches:
            return f"{self.name}: FAILED in {self.duration_s:.1f}s: {self.error}"
        notes = self.notes()
        return (f"{self.name}: {_plural(self.batches, 'batch', 'batches')}, {self.input()} in -> {self.output()} "
                f"in {self.duration_s:.1f}s{', ' + notes if notes else ''}")

    def input(self) -> str:
        """What the query read: '4 files, 5,936 data lines' (the ETL) or '1,942 rows'."""
        if self.read:
            return ", ".join(_plural(n, unit.removesuffix("s"), unit) for unit, n in self.read.items())
        return _plural(self.rows_in, "row", "rows")

    def output(self) -> str:
        """Rows committed per table ('silver_dns=1,797, silver_conn=3,548'), or 'nothing written' (rows
        read may be held in a query's state, a stream's report spans many triggers, a failed batch
        wrote nothing: none of them is "nothing new")."""
        return ", ".join(f"{t}={n:,}" for t, n in self.rows_out.items() if n) or "nothing written"

    def notes(self) -> str:
        """Watermark, state, late rows and failure, as far as there are any."""
        notes = [f"watermark {self.watermark}"] if self.watermark else []
        if self.state_rows:
            notes.append(f"state {self.state_rows:,} rows/{self.state_bytes // 1024:,} KiB")
        if self.late_rows:
            notes.append(f"{self.late_rows:,} late rows")
        if self.error:
            notes.append(f"FAILED: {self.error}")
        return ", ".join(notes)

    def to_json(self) -> str:
        """The report as one line of JSON, every field by name: what `seclake run-once --json` prints
        for scripts, which then need not read the terminal's wording.

        >>> QueryReport("etl", batches=1, read={"files": 4}, duration_s=1.25).to_json()[:44]
        '{"name": "etl", "batches": 1, "rows_in": 0, '
        """
        return json.dumps(asdict(self))

    def cells(self) -> tuple[object, ...]:
        """One row under REPORT_COLUMNS.

        >>> QueryReport("enriched_dns", skipped=True).cells()
        ('enriched_dns', 0, '-', '-', '-', 'nothing new since its last batch (not started)')
        """
        if self.skipped:
            return (self.name, 0, "-", "-", "-", "nothing new since its last batch (not started)")
        if self.note and not self.error:
            return (self.name, 0, "-", "-", "-", self.note)
        return (self.name, self.batches, self.input(), self.output(), f"{self.duration_s:.1f}s", self.notes())


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def report(running: RunningQuery, started: float) -> QueryReport:
    """Summarise a query's progress (`ProgressTally`) and its writer's per-batch stats, every
    batch since the query started; `duration_s` counts from `started` (monotonic)."""
    tally = running.progress.add(running.query)
    rep = QueryReport(running.name, duration_s=time.monotonic() - started, rows_in=tally.rows_in,
                      watermark=tally.watermark, state_rows=tally.state_rows, state_bytes=tally.state_bytes,
                      state_commit_ms=tally.state_commit_ms, late_rows=tally.late_rows)
    for stats in running.writer.history:
        rep.batches += 1
        for unit, n in stats.read.items():
            rep.read[unit] = rep.read.get(unit, 0) + n
        for table, rows in stats.rows.items():
            rep.rows_out[table] = rep.rows_out.get(table, 0) + rows
        rep.versions.update(stats.versions)
    exc = running.query.exception()
    if exc is not None:
        rep.error = error_summary(exc)
    rep.note = getattr(running.query, "note", None)
    rep.disabled = getattr(running.query, "disabled", False)
    if rep.note is None and rep.error is None and not rep.batches:
        # A stream's report while its first micro-batch runs would otherwise read "nothing written".
        status = getattr(running.query, "status", None)
        if isinstance(status, dict) and status.get("isTriggerActive"):
            rep.note = "first micro-batch running"
    return rep


def error_summary(exc: BaseException | str) -> str:
    """One line naming a failed query's cause, not its wrapper.

    A failure inside foreachBatch reaches Spark as 'An exception was raised by the Python
    Proxy', followed by the Python traceback; the cause is the traceback's last exception
    line, and for a failed Spark job the deepest 'Caused by:' below it (e.g. 'Mkdirs failed').

    >>> error_summary("An exception was raised by the Python Proxy. Return Message: Traceback "
    ...               "(most recent call last):\\n  File \\"x.py\\", line 1, in f\\n    g()\\nOSError: disk full")
    'OSError: disk full'
    >>> error_summary("py4j.protocol.Py4JJavaError: An error occurred while calling o9.save.\\n"
    ...               ": io.delta.DeltaIOException: Cannot create /t/_delta_log\\n\\tat x.y(Z.scala:1)")
    'io.delta.DeltaIOException: Cannot create /t/_delta_log'
    """
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__ if isinstance(exc, BaseException) else "unknown error"
    head = lines[0]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if "Python Proxy" in head and frames:
        # The exception line follows the last frame and its indented source line.
        after = [line for line in lines[frames[-1] + 1:] if not line.startswith(" ")]
        head = after[0] if after else head
    causes = [line.strip().removeprefix("Caused by:").strip() for line in lines
              if line.strip().startswith("Caused by:")]
    if head.startswith("py4j.protocol.Py4JJavaError"):
        # 'An error occurred while calling o123.save' says nothing; the cause does: the deepest
        # 'Caused by:', else the JVM exception on the line after, which Py4J starts with ': '.
        if causes:
            return causes[-1]
        index = lines.index(head)
        if index + 1 < len(lines) and lines[index + 1].startswith(": "):
            return lines[index + 1].removeprefix(": ").strip()
    if causes and causes[-1] not in head:
        head = f"{head} (caused by {causes[-1]})"
    return head


# The last "module.Class: message" line of a Python traceback embedded in a JVM error.
_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Conflict|Failed)): (.*)$", re.M)
_JVM_PREFIXES = ("py4j.", "org.", "java.", "scala.")
# e.g. ": org.apache.spark.SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] ..." in a Py4JJavaError
_JVM_ERROR = re.compile(r"^:? ?((?:org|java|scala)\.[\w.$]*(?:Error|Exception)): (.*)$", re.M)


def python_cause(exc: BaseException) -> tuple[str | None, str]:
    """(qualified name, message) of the Python exception that failed a streaming query.

    An exception raised in a `foreachBatch` function reaches the driver as a
    StreamingQueryException whose text holds the Python traceback; this finds its last line.

    >>> python_cause(RuntimeError("...\\npipelines.lake.schema.SchemaMismatchError: column 'x' changed"))
    ('pipelines.lake.schema.SchemaMismatchError', "column 'x' changed")
    >>> python_cause(ValueError("plain"))
    ('ValueError', 'plain')
    >>> python_cause(RuntimeError("calling o1.load.\\n: org.apache.spark.SparkException: [X] no"))
    ('org.apache.spark.SparkException', '[X] no')
    """
    text = str(exc)
    found = [m for m in _PY_ERROR.finditer(text) if not m.group(1).startswith(_JVM_PREFIXES)]
    if found:
        return found[-1].group(1), found[-1].group(2).strip()
    jvm = _JVM_ERROR.search(text)  # no Python error inside: name the JVM exception instead
    if jvm:
        return jvm.group(1), jvm.group(2).strip()
    kind = type(exc)
    qualified = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return qualified, (text.splitlines()[0] if text else kind.__name__)
