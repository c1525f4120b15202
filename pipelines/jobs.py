"""Run the pipeline's streaming queries once (AvailableNow) or continuously (processing time).

Run-once is a trigger, not a second code path: both modes start the very same queries.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from py4j.protocol import Py4JNetworkError
from pyspark.sql import SparkSession

from pipelines.lake.registry import Lake
from pipelines.operations.running import STREAM, WriterLock, refuse_while_streaming, running_stream, writer_lock
from pipelines.query import (
    QueryReport,
    RunningQuery,
    Stage,
    error_summary,
    processing_time,
    report,
    stop_between_batches,
)
from pipelines.settings import READ_ONLY_BY, Settings
from pipelines.spark import context_stopped
from pipelines.stages import (
    StageError,
    idle,
    is_rule,
    run_stage,
    run_unless_idle,
    stages,
    table_stages,
    waiting,
    waves,
)
from pipelines.terminal import stamped

log = logging.getLogger("seclake")

# Backoff of a failed stage's restart in `seclake stream`: 10 s, doubling up to 5 minutes.
RESTART_SECONDS = 10.0
RESTART_MAX_SECONDS = 300.0
RULE_SYNC_SECONDS = 5.0
# `seclake stream` starts the rules' application once every table query has finished a trigger,
# or this long after start: a second JVM starting ten rule queries beside the ETL on 2 cores
# doubled the time from a restart to the ETL's first commit (52 s -> 100 s, measured on a killed
# home), and the rules have nothing new to read before the ETL and attribution commit.
RULES_START_MAX_WAIT_SECONDS = 60.0


def run_once(spark: SparkSession | Callable[[], SparkSession], lake: Lake, settings: Settings = Settings(),
             only: list[str] | None = None, on_report: Callable[[QueryReport], None] | None = None
             ) -> list[QueryReport]:
    """Process everything available now through each stage in order, then stop. The stages of a
    wave (`stages.waves`: the enriched tables, then the rules) run at once, as they do in
    `seclake stream`; a rule suspected of killing the application runs alone (`_probation`).

    A stage that fails is reported (its report's `error`) and the later stages still run on what
    committed. A stage that would process nothing (`stages.run_unless_idle`: nothing new in
    landing or in the tables it reads since its last batch, or no input table yet) is not started
    at all: starting a query costs seconds, and hourly run-once mostly finds nothing new.
    `spark` may be a function that makes the session: it is then called only when a stage must
    run, so a run-once that finds nothing new starts no JVM. `only` names the stages to run (see
    `seclake run-once --only`). Refused while `seclake stream` runs on the home: both would write
    the same tables and checkpoints (on S3, two drivers committing one table lose commits).
    If the Spark application stops under a stage (its JVM dies, or Spark stops its context, as
    an OutOfMemoryError does), the run ends with a RuntimeError naming the stage(s) it ran.
    """
    session = _session_maker(spark)
    reports = []
    with start_run_once(lake, "seclake run-once"):
        for wave in waves(stages()):
            reports += run_wave(session, lake, settings, [stage for stage in wave if not only or stage.name in only],
                                on_report)
    if warning := late_attribution_warning(reports):
        log.warning(warning)
    return reports


def late_attribution_warning(reports: Iterable[QueryReport]) -> str | None:
    """What to say when attribution dropped events older than its watermark (an older capture or a
    sensor behind the others landed after newer data): no enriched table and so no rule holds them,
    and a backtest, which reads the enriched tables, cannot add their alerts. Said once by run-once
    and by the Dagster op of the attribution stages.

    >>> late_attribution_warning([QueryReport("enriched_conn"), QueryReport("rule_c2_beaconing", late_rows=3)])
    >>> late_attribution_warning([QueryReport("enriched_dns", late_rows=1200)])[:62]
    'attribution dropped rows older than its watermark (enriched_dn'
    """
    from pipelines.attribution import ENRICHED_INPUTS, LEASES

    late = {r.name: r.late_rows for r in reports if r.late_rows and r.name in (LEASES, *ENRICHED_INPUTS)}
    if not late:
        return None
    return ("attribution dropped rows older than its watermark ("
            + ", ".join(f"{name} {rows:,}" for name, rows in late.items())
            + "): kept in silver and counted in late_events, but no enriched table or rule has them; "
            "`seclake rollback dhcp_leases --empty --cascade` then `seclake run-once` attributes them, "
            "recomputing attribution and the rules over all of silver (docs/attribution.md, \"Late rows\")")


def run_wave(spark: SparkSession | Callable[[], SparkSession], lake: Lake, settings: Settings, wave: list[Stage],
             on_report: Callable[[QueryReport], None] | None = None) -> list[QueryReport]:
    """Run the stages of one wave (`stages.waves`) as `run_once` does: at once, `settings.stages_at_once`
    at a time, rules suspected of a death alone first (`_probation`); each stage's report (also
    to `on_report` as it comes). Dagster's rules op runs the selected rules with it.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [r.line() for r in run_wave(print, Lake(Home.resolve(tmp)), Settings(), stages()[2:3])]
    ['dhcp_leases: waiting for input: no dhcp_clock, silver_dhcp, end_of_input yet (not started)']
    """
    session = _session_maker(spark)
    reports = []
    for group, probe in _probation(session, lake, settings, wave):
        for rep in _run_wave(session, lake, settings, group, probe):
            reports.append(rep)
            if on_report:
                on_report(rep)
    return reports


def _probation(session: Callable[[], SparkSession], lake: Lake, settings: Settings, wave: list[Stage]
               ) -> list[tuple[list[Stage], bool]]:
    """`wave` cut into the groups to run one after the other, each with whether it is a probe. The
    rules' wave: each rule suspected of killing the application in an earlier run-once alone first,
    as a probe (started even with nothing new: ending cleanly clears it; a death names it), then
    the others together (`pipelines.rules.engine.prepare_rules`). The session is only made when a
    rule has work or a death is left to charge: a run-once with nothing new starts no JVM."""
    from pipelines.rules.engine import in_flight, prepare_rules

    if not wave or not all(is_rule(s) for s in wave):
        return [(wave, False)]
    if not in_flight(lake, "once") and all(waiting(lake, s) or idle(lake, s, settings) for s in wave):
        return [(wave, False)]
    suspects = prepare_rules(session(), lake, settings)
    return [*(([s], True) for s in wave if s.name in suspects), ([s for s in wave if s.name not in suspects], False)]


def _run_wave(session: Callable[[], SparkSession], lake: Lake, settings: Settings, wave: list[Stage],
              probe: bool = False) -> list[QueryReport]:
    """Run the stages of one wave (`stages.waves`) at once, `settings.stages_at_once` at a time, each
    in a thread of its own (a `probe` is started even when idle); their reports in the wave's order.
    RuntimeError naming the stages still running or waiting to if the Spark application stopped."""
    if len(wave) <= 1:
        outcomes = [_outcome(session, lake, settings, stage, probe) for stage in wave]
    else:
        threads = max(1, min(len(wave), settings.stages_at_once))
        with ThreadPoolExecutor(threads, thread_name_prefix="run-once") as pool:
            outcomes = list(pool.map(lambda stage: _outcome(session, lake, settings, stage, probe), wave))
    stopped = [stage.name for stage, outcome in zip(wave, outcomes) if isinstance(outcome, BaseException)]
    if stopped:
        cause = next(o for o in outcomes if isinstance(o, BaseException))
        if isinstance(cause, (ConnectionError, Py4JNetworkError)) or context_stopped():
            raise _stopped_during(stopped) from cause
        raise cause
    reports = [o for o in outcomes if isinstance(o, QueryReport)]
    if any(rep.error for rep in reports) and context_stopped():
        # An OutOfMemoryError can also stop the SparkContext and leave the JVM up: every later
        # stage would fail with "No active or default Spark session found".
        raise _stopped_during([rep.name for rep in reports if rep.error])
    return reports


def _outcome(session: Callable[[], SparkSession], lake: Lake, settings: Settings, stage: Stage, probe: bool = False
             ) -> QueryReport | BaseException:
    """`stage`'s report (its `error` when its query failed), or the exception that ended it otherwise
    (the JVM died under it, or Spark stopped its context: every committed batch stays; a rule
    stage is charged at the next run-once). A `probe` is run even when idle."""
    try:
        if probe and not waiting(lake, stage):
            return run_stage(session(), lake, settings, stage)
        return run_unless_idle(session, lake, settings, stage)
    except StageError as err:
        rep = err.report or QueryReport(stage.name)
        rep.error = rep.error or error_summary(err.__cause__ or err)
        return rep
    except Exception as exc:
        return exc


def _stopped_during(stages: list[str]) -> RuntimeError:
    which = f"stage {stages[0]}" if len(stages) == 1 else f"stages {', '.join(stages)}"
    return RuntimeError(f"the Spark application stopped during {which} (its last lines above say why, e.g. "
                        "java.lang.OutOfMemoryError); what committed is kept, the next run resumes from there")


def _session_maker(spark: SparkSession | Callable[[], SparkSession]) -> Callable[[], SparkSession]:
    if isinstance(spark, SparkSession):
        session = spark
        return lambda: session
    make = functools.cache(spark)
    lock = threading.Lock()  # the stages of a wave may ask at once: one session, made once

    def session_once() -> SparkSession:
        with lock:
            return make()

    return session_once


def start_run_once(lake: Lake, writer: str, *, landing: bool = True) -> WriterLock:
    """What a run-once does before its stages, from `seclake run-once` or a Dagster op: refused
    (RuntimeError, one line) while `seclake stream` runs on the home, the home made, its writer
    lock taken for `writer` (HomeBusy while another command holds it) and, when the run reads
    `landing`, a moved home's checkpoints rewritten and changed landing files named. The caller
    holds the lock it returns while it writes (`with start_run_once(...):`).

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with start_run_once(Lake(Home.resolve(tmp)), "seclake run-once"):
    ...         (Home.resolve(tmp).landing).is_dir()
    True
    """
    refuse_while_streaming(lake.home, "a run-once")
    lake.home.create()
    lock = writer_lock(lake.home, writer)
    if landing:
        try:
            _reconcile_landing(lake)  # rewrites checkpoints: under the lock
        except BaseException:
            lock.release()
            raise
    return lock


def _reconcile_landing(lake: Lake) -> None:
    """Checkpoint entries of a moved home rewritten (`follow_move`); landing files changed since read named."""
    from pipelines.etl import changed_after_read
    from pipelines.operations.relocate import follow_move

    moved = follow_move(lake.home)
    if moved:
        log.warning("this home was moved or copied here: %d path(s) its checkpoints record (landing files "
                    "read, state schemas) now point into %s", moved, lake.home.root)
    changed = changed_after_read(lake)
    if changed:
        log.warning("%d landing file(s) changed after the ETL read them, so their new lines are not read "
                    "(a sensor writes a file under a hidden name, then renames it into place; new data goes "
                    "in a new file): %s", len(changed), ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else ""))


@contextmanager
def _stop_on_signals(stop: threading.Event, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
                     ) -> Iterator[None]:
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stream(spark: SparkSession, lake: Lake, settings: Settings = Settings(), stop: threading.Event | None = None,
           on_report: Callable[[QueryReport], None] | None = None, report_every: float = 60.0,
           only: str | None = None) -> list[QueryReport]:
    """Run every stage continuously until `stop` is set, SIGINT or SIGTERM; then stop cleanly.

    A clean stop lets the running micro-batch finish its commits; a kill at any point is also
    safe (exactly-once), it only replays the interrupted batch on restart. A stage query that
    fails is restarted from its checkpoint after RESTART_SECONDS, doubling per failure.

    The rules run in a Spark application of their own: a child process (`seclake stream --only
    rules`) that this one starts, restarts with the same back-off if it dies, and stops. A rule
    that exhausts memory or kills its JVM cannot take the ETL and attribution with it; the rules
    that were in a micro-batch when it died are charged a failure (docs/rules.md). `only` runs
    one part in this process: "tables" (ETL and attribution) or "rules".
    """
    if only not in (None, "tables", "rules"):
        raise ValueError(f"only={only!r}: expected 'tables' or 'rules'")
    home = lake.home.create()
    if only == "rules" and running_stream(home) == os.getppid():
        # Started by `seclake stream`, which holds the home's writer lock and made the tables.
        return _stream(spark, lake, settings, stop, on_report, report_every, tables=False, rules=True, child=True)
    # Held until the streams stop; the rules' child process runs under it. Its holder's name makes
    # `seclake rollback`/`maintain`/`retention` and Dagster's launches refuse with a stream's advice.
    with writer_lock(home, STREAM):
        _reconcile_landing(lake)
        # Each stage streams from the tables of the one before it: on a fresh home they start empty.
        # Made here, before a rules application starts: two JVMs creating one table conflict.
        for name in lake.names():
            lake.ensure(spark, name, settings.checkpoint_interval)
        if only is not None:
            return _stream(spark, lake, settings, stop, on_report, report_every,
                           tables=only == "tables", rules=only == "rules")
        with RulesApp(lake, settings, report_every) as rules_app:
            return _stream(spark, lake, settings, stop, on_report, report_every, tables=True, rules=False,
                           rules_app=rules_app)


# How long the rules' application has to stop after SIGTERM (a running micro-batch finishing) before SIGKILL.
RULES_STOP_SECONDS = 60


class RulesApp:
    """The rules' Spark application: `seclake stream --only rules` as a child process.

    Started with the parent's settings, stdout and stderr by `check` (called every second), once
    the tables' queries are up (the alert path first); `check` also restarts it after a back-off
    when it died by itself, first charging the rules it was running a batch of; leaving the block
    stops it (SIGTERM, then SIGKILL after a minute). On Linux the child also dies with its
    parent, so a killed `seclake stream` leaves no rules running.
    """

    def __init__(self, lake: Lake, settings: Settings, report_every: float) -> None:
        self.lake = lake
        self.settings = settings
        self.report_every = report_every
        self.proc: subprocess.Popen | None = None
        self.failures = 0
        self.restart_at: float | None = None

    def __enter__(self) -> RulesApp:
        # The first start's deadline; `check` starts it sooner once the tables are up.
        self.restart_at = time.monotonic() + RULES_START_MAX_WAIT_SECONDS
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=RULES_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                # Safe (a rule replays its interrupted batch), but not the clean stop the caller reports.
                log.warning("the rules' application did not stop within %d s of SIGTERM: killed; its rules "
                            "replay their interrupted micro-batch at the next start", RULES_STOP_SECONDS)
                self.proc.kill()
                self.proc.wait()

    def command(self) -> list[str]:
        """The child's command line: this interpreter, the parent's home and changed settings."""
        # Not another command's own settings (a Dagster run's config may hold them): the child refuses those.
        changed = [f"{f.name}={getattr(self.settings, f.name)}" for f in dataclasses.fields(Settings)
                   if getattr(self.settings, f.name) != getattr(Settings(), f.name)
                   and not f.name.startswith(tuple(READ_ONLY_BY))]
        return [sys.executable, "-m", "pipelines.cli", "stream", "--only", "rules",
                "--home", str(self.lake.home.root), "--report-every", str(self.report_every),
                *[arg for assignment in changed for arg in ("--set", assignment)]]

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.command(), preexec_fn=_child_setup(self.settings.rules_niceness))

    def check(self, spark: SparkSession, now: float, tables_up: Callable[[], bool]) -> None:
        """Start the child when `tables_up()` (or RULES_START_MAX_WAIT_SECONDS after entering);
        restart it if it died by itself (charging the rules it was running), after a back-off."""
        from pipelines.rules.engine import charge_in_flight

        if self.proc is None or self.proc.poll() is None:
            if self.restart_at is not None and (now >= self.restart_at or (not self.failures and tables_up())):
                self.restart_at = None
                self._start()
                if self.failures:
                    log.warning("the rules application restarted")
            return
        code = self.proc.returncode
        self.proc = None
        self.failures += 1
        charged = charge_in_flight(spark, self.lake, self.settings)
        wait = _backoff(self.failures)
        self.restart_at = now + wait
        log.error("the rules application stopped (exit code %s)%s; restarting it in %.0f s", code,
                  f", in a batch of {', '.join(charged)}" if charged else "", wait)


def _child_setup(niceness: int) -> Callable[[], None]:
    """What the rules application's process runs before exec: SIGKILL when its parent dies (Linux
    prctl PR_SET_PDEATHSIG), Ctrl-C ignored (the terminal sends it to both processes; the parent
    stops the child with SIGTERM), and `niceness` added to its scheduling niceness. libc is loaded
    here, in the parent: code between fork and exec must not import (the import lock may be held by
    another thread)."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # not Linux: the child notices its parent is gone within a second instead
        prctl = None

    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.nice(niceness)
        if prctl is not None:
            prctl(1, signal.SIGKILL)

    return setup


def _stream(spark: SparkSession, lake: Lake, settings: Settings, stop: threading.Event | None,
            on_report: Callable[[QueryReport], None] | None, report_every: float, *, tables: bool, rules: bool,
            rules_app: RulesApp | None = None, child: bool = False) -> list[QueryReport]:
    from pipelines.rules import RuleManager
    from pipelines.rules.engine import clear_in_flight, watch_rule

    stop = stop or threading.Event()
    trigger = processing_time(settings.trigger_interval)
    started = time.monotonic()
    parent = os.getppid()
    running: list[RunningQuery] = []
    starters = {stage.name: stage.start for stage in table_stages(stages())} if tables else {}
    try:
        for start in starters.values():
            running.append(start(spark, lake, settings, trigger))
    except BaseException:
        for r in running:  # never leave half the pipeline running behind an error
            r.query.stop()
            r.writer.close()
        raise
    rule_manager = RuleManager() if rules else None
    if rule_manager is not None:
        clear_in_flight(lake)  # left by a rules application killed with its parent: nothing to charge
    reported: set[str] = set()
    failures: dict[str, int] = {}
    restart_at: dict[str, float] = {}
    last_report = time.monotonic()
    last_sync = 0.0
    # The rules application of a `seclake stream` leaves Ctrl-C to its parent, which stops it with SIGTERM.
    with _stop_on_signals(stop, (signal.SIGTERM,) if child else (signal.SIGINT, signal.SIGTERM)):
        while not stop.wait(1.0):
            now = time.monotonic()
            if child and os.getppid() != parent:
                log.error("the parent `seclake stream` is gone: stopping the rules")
                break
            if rules_app is not None:
                rules_app.check(spark, now, lambda: tables_up(running))
            if rule_manager is not None:
                for r in running:
                    watch_rule(r, now)  # batch budget; which rules are in a batch (charged if this app dies)
                if now - last_sync >= RULE_SYNC_SECONDS:
                    # Deploy = add or edit a rule file: only that rule's query (re)starts.
                    if deployed := rule_manager.sync(spark, lake, settings, trigger, running).summary:
                        print(stamped(f"rules: {deployed}"), file=sys.stderr, flush=True)
                    last_sync = now
            reported -= {r.name for r in running if r.query.isActive}  # a restarted query may fail anew
            failed = [r for r in running if r.name in starters and not r.query.isActive
                      and r.query.exception() is not None]
            for r in failed:
                if r.name not in reported:  # once per failure, not once a second
                    reported.add(r.name)
                    # A stage that fails (e.g. a Python worker that timed out under load) restarts
                    # from its checkpoint, which is exactly-once; the wait doubles per failure.
                    failures[r.name] = failures.get(r.name, 0) + 1
                    wait = _backoff(failures[r.name])
                    restart_at[r.name] = now + wait
                    log.error("query %s failed: %s; restarting it in %.0f s", r.name,
                              error_summary(r.query.exception() or "unknown error"), wait)
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


def tables_up(running: list[RunningQuery]) -> bool:
    """Whether every active query of `running` has finished a trigger. A stage without a query
    (`end_of_input` in a stream) or one that failed is not waited for: it never reports progress.

    >>> from pipelines.query import StoppedQuery
    >>> tables_up([RunningQuery("end_of_input", StoppedQuery("end_of_input"), None, ())])
    True
    """
    return all(r.query.recentProgress for r in running if r.query.isActive)


def _backoff(failures: int) -> float:
    return min(RESTART_MAX_SECONDS, RESTART_SECONDS * 2 ** (failures - 1))
