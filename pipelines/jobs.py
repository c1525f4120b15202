"""Run the pipeline's streaming queries once (AvailableNow) or continuously (processing time).

Run-once is a trigger, not a second code path: both modes start the very same queries.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.lake.registry import Lake
from pipelines.settings import Settings

log = logging.getLogger("seclake")

AVAILABLE_NOW: dict[str, object] = {"availableNow": True}
# Backoff of a failed stage's restart in `seclake stream`: 10 s, doubling up to 5 minutes.
RESTART_SECONDS = 10.0
RESTART_MAX_SECONDS = 300.0
RULE_SYNC_SECONDS = 5.0


def processing_time(interval: str) -> dict[str, object]:
    """The trigger of continuous mode. >>> processing_time("10 seconds")
    {'processingTime': '10 seconds'}
    """
    return {"processingTime": interval}


class BatchWriter(Protocol):
    history: list
    def close(self) -> None: ...


@dataclass
class RunningQuery:
    """A started streaming query, the `foreachBatch` writer behind it and the tables it writes."""

    name: str
    query: StreamingQuery
    writer: BatchWriter
    tables: tuple[str, ...]


@dataclass
class QueryReport:
    """Progress of one query over a run: what `seclake run-once` prints and Dagster records."""

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

    def line(self) -> str:
        out = ", ".join(f"{t}={n}" for t, n in self.rows_out.items() if n) or "nothing new"
        extra = f", watermark {self.watermark}" if self.watermark else ""
        if self.state_rows:
            extra += f", state {self.state_rows} rows/{self.state_bytes // 1024} KiB"
        if self.late_rows:
            extra += f", {self.late_rows} late rows"
        status = f" FAILED: {self.error}" if self.error else ""
        return (f"{self.name}: {self.batches} batches, {self.rows_in} rows in -> {out} "
                f"in {self.duration_s:.1f}s{extra}{status}")


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


def report(running: RunningQuery, started: float) -> QueryReport:
    """Summarise a query's progress events and its writer's per-batch stats."""
    rep = QueryReport(running.name, duration_s=time.monotonic() - started)
    for progress in running.query.recentProgress:
        rep.rows_in += progress.numInputRows
        if progress.eventTime.get("watermark"):
            rep.watermark = progress.eventTime["watermark"]
        ops = progress.stateOperators
        if ops:
            rep.state_rows = sum(op.numRowsTotal for op in ops)
            rep.state_bytes = sum(op.memoryUsedBytes for op in ops)
            rep.state_commit_ms += sum(op.commitTimeMs for op in ops)
            rep.late_rows += sum(op.numRowsDroppedByWatermark for op in ops)
    for stats in running.writer.history:
        rep.batches += 1
        for table, rows in stats.rows.items():
            rep.rows_out[table] = rep.rows_out.get(table, 0) + rows
        rep.versions.update(stats.versions)
    exc = running.query.exception()
    if exc is not None:
        rep.error = error_summary(exc)
    return rep


Starter = Callable[[SparkSession, Lake, Settings, dict], RunningQuery]


def stages() -> list[tuple[str, Starter]]:
    """The pipeline's queries in dependency order (each reads tables the ones before it write)."""
    from pipelines import attribution, etl
    from pipelines.rules import rule_stages

    return [(etl.QUERY_NAME, etl.start), *attribution.STAGES, *rule_stages()]


def run_once(spark: SparkSession, lake: Lake, settings: Settings = Settings(), only: list[str] | None = None,
             on_report: Callable[[QueryReport], None] | None = None) -> list[QueryReport]:
    """Process everything available now through each stage in order, then stop.

    >>> for r in run_once(spark, Lake(Home.resolve("/tmp/x"))): print(r.line())  # doctest: +SKIP
    """
    lake.home.create()
    reports = []
    for name, start in stages():
        if only and name not in only:
            continue
        started = time.monotonic()
        try:
            running = start(spark, lake, settings, AVAILABLE_NOW)
        except ValueError as exc:  # e.g. an input table not created yet: report it, go on
            rep = QueryReport(name, error=error_summary(exc))
            reports.append(rep)
            if on_report:
                on_report(rep)
            continue
        try:
            running.query.awaitTermination()
        except Exception:  # the report carries the error; later stages still run on what committed
            pass
        finally:
            running.writer.close()
        rep = report(running, started)
        reports.append(rep)
        if on_report:
            on_report(rep)
    return reports


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stream(spark: SparkSession, lake: Lake, settings: Settings = Settings(), stop: threading.Event | None = None,
           on_report: Callable[[QueryReport], None] | None = None, report_every: float = 60.0) -> list[QueryReport]:
    """Run every stage continuously until `stop` is set, SIGINT or SIGTERM; then stop cleanly.

    A clean stop lets the running micro-batch finish its commits; a kill at any point is also
    safe (exactly-once), it only replays the interrupted batch on restart. A stage query that
    fails is restarted from its checkpoint after RESTART_SECONDS, doubling per failure.
    """
    from pipelines.rules import RuleManager

    lake.home.create()
    stop = stop or threading.Event()
    trigger = processing_time(settings.trigger_interval)
    started = time.monotonic()
    running: list[RunningQuery] = []
    # Each stage streams from the tables of the one before it: on a fresh home they start empty.
    for name in lake.names():
        lake.ensure(spark, name, settings.checkpoint_interval)
    starters = dict(stages())
    try:
        for start in starters.values():
            running.append(start(spark, lake, settings, trigger))
    except BaseException:
        for r in running:  # never leave half the pipeline running behind an error
            r.query.stop()
            r.writer.close()
        raise
    rules = RuleManager()
    reported: set[str] = set()
    failures: dict[str, int] = {}
    restart_at: dict[str, float] = {}
    last_report = last_sync = time.monotonic()
    with _stop_on_signals(stop):
        while not stop.wait(1.0):
            now = time.monotonic()
            if now - last_sync >= RULE_SYNC_SECONDS:
                # Deploy = add or edit a rule file: only that rule's query (re)starts.
                rules.sync(spark, lake, settings, trigger, running)
                last_sync = now
            reported -= {r.name for r in running if r.query.isActive}  # a restarted query may fail anew
            failed = [r for r in running if not r.query.isActive and r.query.exception() is not None]
            for r in failed:
                if r.name not in reported:  # once per failure, not once a second
                    reported.add(r.name)
                    if r.name in starters:
                        # A stage that fails (e.g. a Python worker that timed out under load) restarts
                        # from its checkpoint, which is exactly-once; the wait doubles per failure.
                        failures[r.name] = failures.get(r.name, 0) + 1
                        wait = _backoff(failures[r.name])
                        restart_at[r.name] = now + wait
                        log.error("query %s failed: %s; restarting it in %.0f s", r.name,
                                  error_summary(r.query.exception()), wait)
                    else:
                        log.error("query %s failed: %s", r.name, error_summary(r.query.exception()))
                elif r.name in restart_at and now >= restart_at[r.name]:
                    r.writer.close()
                    try:
                        running[running.index(r)] = starters[r.name](spark, lake, settings, trigger)
                    except Exception as exc:  # still broken: try again after a longer wait
                        failures[r.name] += 1
                        wait = _backoff(failures[r.name])
                        restart_at[r.name] = now + wait
                        log.error("query %s did not restart: %s; next try in %.0f s", r.name, error_summary(exc), wait)
                        continue
                    del restart_at[r.name]
                    log.warning("query %s restarted", r.name)
            if on_report and time.monotonic() - last_report >= report_every:
                for r in running:
                    on_report(report(r, started))
                last_report = time.monotonic()
    for r in running:
        _stop_between_batches(r.query)
        r.writer.close()
    return [report(r, started) for r in running]


def _backoff(failures: int) -> float:
    return min(RESTART_MAX_SECONDS, RESTART_SECONDS * 2 ** (failures - 1))


def _stop_between_batches(query: StreamingQuery, patience_s: float = 60.0) -> None:
    # Stopping mid-batch is safe (the batch replays) but wasteful; give the batch time to commit.
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
