"""The pipeline's stages in dependency order: what `seclake run-once`, `seclake stream` and Dagster run.

A stage is one streaming query (`pipelines.query.Stage`): its name (also its checkpoint folder
and Dagster op), the tables it reads and writes, and how to start it. `stages()` is the one
ordered list; the runner (`pipelines/jobs.py`) and the asset graph (`assets/`) both read it.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from pipelines.lake.registry import Lake
from pipelines.lake.source import caught_up
from pipelines.query import AVAILABLE_NOW, QueryReport, Stage, python_cause, report
from pipelines.rules.tables import ALERTS_TABLE
from pipelines.settings import Settings

# Deterministic failures: retrying the same query on the same data fails the same way.
NOT_RETRIABLE = frozenset({"SchemaMismatchError", "RuleError", "AnalysisException", "ParseException"})


def stages(rules_dir: str | os.PathLike | None = None) -> list[Stage]:
    """Every stage, each after the stages whose tables it reads: the ETL, attribution, one per rule file.

    >>> [s.name for s in stages()][:4]
    ['etl', 'end_of_input', 'dhcp_leases', 'enriched_conn']
    >>> stages()[3].reads
    ('silver_conn', 'dhcp_leases', 'end_of_input')
    """
    from pipelines import attribution, etl
    from pipelines.rules.engine import rule_stages

    found = [*etl.stages(), *attribution.stages(), *rule_stages(rules_dir)]
    known = set(Lake.names())
    written: set[str] = set()
    for stage in found:
        unknown = [t for t in (*stage.reads, *stage.writes) if t not in known]
        if unknown:
            raise ValueError(f"stage {stage.name!r} names {unknown}, which are not in the table registry "
                             "(pipelines/lake/registry.py)")
        upstream = [t for t in stage.reads if t not in written]
        if upstream:
            raise ValueError(f"stage {stage.name!r} reads {upstream} before any stage writes them")
        written.update(stage.writes)
    # alerts has no writer while the rules folder is empty; state tables are kept by commands.
    orphans = known - written - {ALERTS_TABLE} - {name for name in known if Lake.spec(name).kept_by}
    if orphans:
        raise ValueError(f"no stage writes table(s) {sorted(orphans)}: list each in the `writes` of its stage")
    return found


def table_stages(all_stages: list[Stage]) -> list[Stage]:
    """The stages that write tables of their own; rule stages (they only append to `alerts`) are left
    out, as Dagster shows one asset per rule file instead.

    >>> [s.name for s in table_stages(stages())][-1]
    'enriched_ids_alerts'
    """
    return [s for s in all_stages if not is_rule(s)]


def shared_tables(all_stages: list[Stage]) -> dict[str, list[Stage]]:
    """Each table that several stages append to (`late_events`, `alerts`) -> those stages. A stage
    that is `part_of` another writes that one's tables and is not counted.

    >>> sorted(shared_tables(table_stages(stages())))
    ['late_events']
    """
    writers: dict[str, list[Stage]] = {}
    for stage in all_stages:
        if stage.part_of:
            continue
        for table in stage.writes:
            writers.setdefault(table, []).append(stage)
    return {table: found for table, found in writers.items() if len(found) > 1}


def own_tables(stage: Stage, all_stages: list[Stage]) -> tuple[str, ...]:
    """The tables only `stage` writes.

    >>> found = stages(); own_tables(found[2], found)
    ('dhcp_leases',)
    """
    if stage.part_of:  # its tables are its parent's
        return ()
    shared = shared_tables(all_stages)
    return tuple(t for t in stage.writes if t not in shared)


def parts(stage: Stage, all_stages: list[Stage]) -> list[Stage]:
    """The stages that are `part_of` `stage` (the ETL from Kafka, for `etl`): run with it by Dagster.

    >>> found = stages(); parts(found[1], found)
    []
    """
    return [s for s in all_stages if s.part_of == stage.name]


def waves(all_stages: list[Stage]) -> list[list[Stage]]:
    """`all_stages` (in order) cut into runs of consecutive stages that may run at once: table
    stages none of which reads a table another one of the run writes, nor writes one that another
    writes (tables several stages append to, `late_events`, aside); and the rule stages, which
    only append to `alerts`. Which rule killed the application is told by probation
    (`pipelines.rules.engine.prepare_rules`: suspects of a death run alone).

    `seclake stream` runs every table query at once; run-once does the same within a wave, where
    one stage's planning and commits fill the cores while another's tasks run.

    >>> [[s.name for s in wave] for wave in waves(stages())][1:4]
    [['end_of_input'], ['dhcp_leases'], ['enriched_conn', 'enriched_dns', 'enriched_ids_alerts']]
    >>> len(waves(stages())[-1]) == len(stages()) - len(table_stages(stages()))
    True
    """
    shared = shared_tables(all_stages)
    tables = {s.name for s in table_stages(all_stages)}
    found: list[list[Stage]] = []
    for stage in all_stages:
        wave = found[-1] if found else []
        written = {t for s in wave for t in s.writes}
        together = (all(s.name in tables for s in wave) and stage.name in tables
                    and not written & set(stage.reads) and not (written - set(shared)) & set(stage.writes))
        if wave and (together or is_rule(stage) and all(is_rule(s) for s in wave)):
            wave.append(stage)
        else:
            found.append([stage])
    return found


def is_rule(stage: Stage) -> bool:
    """A rule's stage: it only appends to `alerts`.

    >>> [is_rule(s) for s in stages()][:1], is_rule(stages()[-1])
    ([False], True)
    """
    return set(stage.writes) == {ALERTS_TABLE}


def idle(lake: Lake, stage: Stage, settings: Settings) -> bool:
    """True when starting `stage` now with `settings` would process nothing, told from files alone
    (no JVM): its own `idle` test, else its checkpoint has read every commit of the tables it reads
    (`caught_up`). A stage without either (the ETL from Kafka) is never idle.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [idle(Lake(Home.resolve(tmp)), s, Settings()) for s in stages()][:3]
    [False, False, False]
    """
    if stage.idle is not None:
        return stage.idle(lake, settings)
    # A table that does not exist yet is one its checkpoint cannot have read: then not caught up.
    return bool(stage.reads) and caught_up(lake.home.checkpoint(stage.checkpoint_name),
                                           [lake.path(t) for t in stage.reads if lake.exists(t)])


class StageError(RuntimeError):
    """A stage's query failed. `python_error` names the Python exception raised inside the query
    (e.g. `pipelines.lake.schema.SchemaMismatchError`), `report` is its progress up to the failure."""

    def __init__(self, stage: str, message: str, python_error: str | None, report: QueryReport | None) -> None:
        super().__init__(message)
        self.stage = stage
        self.python_error = python_error
        self.report = report

    @property
    def error_class(self) -> str:
        """The exception's class name without its module, e.g. `SchemaMismatchError`."""
        return (self.python_error or "").rsplit(".", 1)[-1]

    @property
    def retriable(self) -> bool:
        """False for errors a retry cannot fix: a schema mismatch, an invalid rule, bad SQL.

        >>> StageError("etl", "x", "pyspark.errors.AnalysisException", None).retriable
        False
        """
        return self.error_class not in NOT_RETRIABLE


def run_stage(spark: SparkSession, lake: Lake, settings: Settings, stage: Stage,
              trigger: dict | None = None) -> QueryReport:
    """Run one stage's query until it has processed everything available now (or `trigger`
    says otherwise), then stop; a failed query raises `StageError` with the Python exception
    that failed it and the progress made before.
    """
    lake.home.create()
    started = time.monotonic()
    try:
        running = stage.start(spark, lake, settings, trigger or AVAILABLE_NOW)
    except Exception as exc:  # the query did not even start (bad plan, missing source, ...)
        python_error, message = python_cause(exc)
        empty = QueryReport(stage.name, duration_s=time.monotonic() - started, error=message, python_error=python_error)
        raise StageError(stage.name, f"stage {stage.name} did not start: {message}", python_error, empty) from exc
    failure: BaseException | None = None
    try:
        running.query.awaitTermination()
        failure = running.query.exception()  # a query that never started returns, with its error here
    except Exception as exc:  # StreamingQueryException: the query stopped on an error
        failure = exc
    finally:
        running.writer.close()
    result = report(running, started)
    if failure is not None:
        python_error, message = python_cause(failure)
        result.python_error = python_error
        raise StageError(stage.name, f"stage {stage.name} failed: {message}", python_error, result) from failure
    return result


def run_unless_idle(spark: Callable[[], SparkSession], lake: Lake, settings: Settings, stage: Stage) -> QueryReport:
    """`run_stage`, unless there is nothing to run: a stage none of whose input tables exists yet
    is reported waiting (`note`), an `idle` one skipped (`skipped`). `spark` makes (or returns) the
    session and is only called when the stage runs: run-once and Dagster's ops start no JVM for
    work that is not there.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     run_unless_idle(print, Lake(Home.resolve(tmp)), Settings(), stages()[2]).line()
    'dhcp_leases: waiting for input: no dhcp_clock, silver_dhcp, end_of_input yet (not started)'
    """
    if waiting(lake, stage):
        # No input written yet (a home before its first logs): nothing to read, not a failure.
        return QueryReport(stage.name, note=f"waiting for input: no {', '.join(stage.reads)} yet (not started)")
    if idle(lake, stage, settings):
        return QueryReport(stage.name, skipped=True)
    try:
        return run_stage(spark(), lake, settings, stage)
    except StageError as err:
        # A rule whose own table nothing has written yet, beside run-once's end_of_input mark
        # (`pipelines.rules.engine.MissingInputError`): waiting too, not a failure.
        if err.error_class != "MissingInputError":
            raise
        missing = [t for t in stage.reads if not lake.exists(t)]
        return QueryReport(stage.name, note=f"waiting for input: no {', '.join(missing)} yet (not started)")


def waiting(lake: Lake, stage: Stage) -> bool:
    """True when none of the tables `stage` reads exists yet (told from files alone).

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     waiting(Lake(Home.resolve(tmp)), stages()[2])
    True
    """
    return bool(stage.reads) and not any(lake.exists(t) for t in stage.reads)
