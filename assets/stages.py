"""What the Dagster layer needs to know about the pipeline's streaming stages, and how it runs one.

No Dagster imports here: this is the glue between `pipelines.jobs` and the asset factories
(`assets/tables.py`, `assets/rules.py`), kept separate so it can move into `pipelines/` as is.

A stage is one streaming query (`pipelines.jobs.stages()`), e.g. `etl`, which writes several
tables in one transaction per micro-batch. The asset graph needs, before any query starts, the
tables each stage writes and reads. `pipelines.jobs.stages()` entries may carry them
(`.writes` / `.reads`); for plain `(name, start)` pairs they are derived, see `discover()`.
"""
from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipelines import jobs
from pipelines.lake.registry import Lake
from pipelines.settings import Settings

ALERTS_TABLE = "alerts"
# Deterministic failures: retrying the same query on the same data fails the same way.
NOT_RETRIABLE = frozenset({"SchemaMismatchError", "RuleError", "AnalysisException", "ParseException"})


@dataclass(frozen=True)
class StageInfo:
    """One streaming query: its name (= checkpoint name), start function, and tables written/read.

    `writes` are the tables only this stage writes (its assets); `shared` the tables it writes
    together with other stages (e.g. `late_events`), which get one asset of their own.
    """

    name: str
    start: Callable
    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()


def discover(entries: Iterable | None = None) -> list[StageInfo]:
    """The table-writing stages of `pipelines.jobs.stages()` (or of `entries`), in dependency order.

    Rule stages (stages that write the `alerts` table) are left out: `assets/rules.py` builds one
    asset per rule file instead. For each entry:

    - writes: `entry.writes` (or `.tables`) if present; else the start function's module constant
      `<NAME>_TABLES` or `TABLES` (e.g. `etl.ETL_TABLES`); else `(name,)` if `name` is a table.
    - reads: `entry.reads` if present; else the tables written by the stage before it, since
      `stages()` is in dependency order. Tables not in the registry are ignored.

    >>> [s.name for s in discover()]  # doctest: +SKIP
    ['etl', 'dhcp_leases', 'enriched_conn', 'enriched_dns', 'enriched_ids_alerts']
    """
    known = set(Lake.names())
    out: list[StageInfo] = []
    previous: tuple[str, ...] = ()
    for entry in (jobs.stages() if entries is None else entries):
        name, start = _name_and_start(entry)
        writes = _writes(entry, name, start)
        if writes is None:
            if name.startswith("rule"):
                continue  # a rule stage without metadata: covered by the rule assets
            raise ValueError(f"cannot tell which tables stage {name!r} writes: give its stages() entry a "
                             f"`writes` attribute, a module constant {name.upper()}_TABLES, or name it after its table")
        if ALERTS_TABLE in writes:
            continue
        unknown = [t for t in writes if t not in known]
        if unknown:
            raise ValueError(f"stage {name!r} writes {unknown}, which are not in the table registry "
                             f"(pipelines/lake/registry.py)")
        reads = getattr(entry, "reads", None)
        reads = tuple(reads) if reads is not None else previous
        reads = tuple(t for t in reads if t in known and t not in writes)
        out.append(StageInfo(name, start, tuple(writes), reads))
        previous = tuple(writes)
    return _split_shared(out)


def _split_shared(stages: list[StageInfo]) -> list[StageInfo]:
    """Move tables written by more than one stage from `writes` to `shared`."""
    writers: dict[str, int] = {}
    for stage in stages:
        for table in stage.writes:
            writers[table] = writers.get(table, 0) + 1
    out = []
    for stage in stages:
        own = tuple(t for t in stage.writes if writers[t] == 1)
        shared = tuple(t for t in stage.writes if writers[t] > 1)
        if not own:
            raise ValueError(f"stage {stage.name!r} writes only tables other stages write too ({list(shared)}); "
                             "it needs a table of its own to be an asset")
        reads = tuple(t for t in stage.reads if t not in shared)
        out.append(StageInfo(stage.name, stage.start, own, reads, shared))
    return out


def shared_tables(stages: list[StageInfo]) -> dict[str, list[StageInfo]]:
    """Each table written by several stages -> the stages that write it."""
    out: dict[str, list[StageInfo]] = {}
    for stage in stages:
        for table in stage.shared:
            out.setdefault(table, []).append(stage)
    return out


def _name_and_start(entry) -> tuple[str, Callable]:
    if hasattr(entry, "name") and hasattr(entry, "start"):
        return entry.name, entry.start
    name, start = entry[0], entry[1]
    return name, start


def _writes(entry, name: str, start: Callable) -> tuple[str, ...] | None:
    for attr in ("writes", "tables"):
        value = getattr(entry, attr, None)
        if value:
            return tuple(value)
    module = sys.modules.get(getattr(start, "__module__", "") or "")
    for const in (f"{name.upper()}_TABLES", "TABLES"):
        value = getattr(module, const, None)
        if isinstance(value, (tuple, list)) and value:
            return tuple(value)
    if name in set(Lake.names()):
        return (name,)
    return None


# --- running one stage with AvailableNow -------------------------------------------------------

class StageError(RuntimeError):
    """A stage's query failed. `python_error` names the Python exception raised inside the query
    (e.g. `pipelines.lake.schema.SchemaMismatchError`), `report` is its progress up to the failure."""

    def __init__(self, stage: str, message: str, python_error: str | None, report: jobs.QueryReport) -> None:
        super().__init__(message)
        self.stage = stage
        self.python_error = python_error
        self.report = report

    @property
    def error_class(self) -> str:
        """The exception's class name without its module, e.g. `SchemaMismatchError`."""
        return (self.python_error or "").rsplit(".", 1)[-1]

    @property
    def is_schema_error(self) -> bool:
        return self.error_class == "SchemaMismatchError"

    @property
    def retriable(self) -> bool:
        """False for errors a retry cannot fix: a schema mismatch, an invalid rule, bad SQL."""
        return self.error_class not in NOT_RETRIABLE


def run_stage(spark, lake: Lake, settings: Settings, name: str, start: Callable,
              trigger: dict | None = None) -> jobs.QueryReport:
    """Run one stage's query until it has processed everything available now, then stop.

    Like `pipelines.jobs.run_once(only=[name])`, but a failed query raises `StageError` (with the
    Python exception that failed it) instead of being folded into the report.
    """
    lake.home.create()
    started = time.monotonic()
    try:
        running = start(spark, lake, settings, trigger or jobs.AVAILABLE_NOW)
    except Exception as exc:  # the query did not even start (bad plan, missing source, ...)
        python_error, message = python_cause(exc)
        empty = jobs.QueryReport(name, duration_s=time.monotonic() - started, error=message)
        raise StageError(name, f"stage {name} did not start: {message}", python_error, empty) from exc
    failure: BaseException | None = None
    try:
        running.query.awaitTermination()
        failure = running.query.exception()  # a query that never started returns, with its error here
    except Exception as exc:  # StreamingQueryException: the query stopped on an error
        failure = exc
    finally:
        running.writer.close()
    report = jobs.report(running, started)
    if failure is not None:
        python_error, message = python_cause(failure)
        raise StageError(name, f"stage {name} failed: {message}", python_error, report) from failure
    return report


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
