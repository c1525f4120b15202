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

from pyspark.sql import SparkSession

from pipelines.lake.registry import Lake
from pipelines.lake.source import caught_up
from pipelines.query import (
    QueryReport,
    RunningQuery,
    error_summary,
    processing_time,
    report,
    stop_between_batches,
)
from pipelines.settings import Settings
from pipelines.stages import StageError, run_stage, stages

log = logging.getLogger("seclake")

# Backoff of a failed stage's restart in `seclake stream`: 10 s, doubling up to 5 minutes.
RESTART_SECONDS = 10.0
RESTART_MAX_SECONDS = 300.0
RULE_SYNC_SECONDS = 5.0


def run_once(spark: SparkSession, lake: Lake, settings: Settings = Settings(), only: list[str] | None = None,
             on_report: Callable[[QueryReport], None] | None = None) -> list[QueryReport]:
    """Process everything available now through each stage in order, then stop.

    A stage that fails is reported (its report's `error`) and the later stages still run on what
    committed. A stage whose checkpoint shows that it has read every commit of the tables it
    reads is not started at all (`QueryReport.skipped`): starting a query costs seconds, and
    hourly run-once mostly finds nothing new for most stages. `only` names the stages to run
    (see `seclake run-once --only`).
    """
    lake.home.create()
    reports = []
    for stage in stages():
        if only and stage.name not in only:
            continue
        if stage.reads and all(lake.exists(t) for t in stage.reads) and caught_up(
                lake.home.checkpoint(stage.checkpoint_name), [lake.path(t) for t in stage.reads]):
            rep = QueryReport(stage.name, skipped=True)
            reports.append(rep)
            if on_report:
                on_report(rep)
            continue
        try:
            rep = run_stage(spark, lake, settings, stage)
        except StageError as err:
            rep = err.report or QueryReport(stage.name)
            rep.error = rep.error or error_summary(err.__cause__ or err)
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
    from pipelines.operations.running import stream_marker

    # The marker makes `seclake rollback`/`maintain`/`retention` refuse while the streams run.
    with stream_marker(lake.home.create()):
        return _stream(spark, lake, settings, stop, on_report, report_every)


def _stream(spark: SparkSession, lake: Lake, settings: Settings, stop: threading.Event | None,
            on_report: Callable[[QueryReport], None] | None, report_every: float) -> list[QueryReport]:
    from pipelines.rules import RuleManager

    stop = stop or threading.Event()
    trigger = processing_time(settings.trigger_interval)
    started = time.monotonic()
    running: list[RunningQuery] = []
    # Each stage streams from the tables of the one before it: on a fresh home they start empty.
    for name in lake.names():
        lake.ensure(spark, name, settings.checkpoint_interval)
    starters = {stage.name: stage.start for stage in stages()}
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
                                  error_summary(r.query.exception() or "unknown error"), wait)
                    else:
                        log.error("query %s failed: %s", r.name, error_summary(r.query.exception() or "unknown error"))
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
        stop_between_batches(r.query)
        r.writer.close()
    return [report(r, started) for r in running]


def _backoff(failures: int) -> float:
    return min(RESTART_MAX_SECONDS, RESTART_SECONDS * 2 ** (failures - 1))
