"""Run a job of the code location as a Dagster run recorded in `$DAGSTER_HOME` (default: the home's
`dagster/` folder), from a shell.

`seclake demo` runs its pipeline this way, so the demo's run, its steps, logs and the tables'
materialisations are in the Dagster UI started with the same `DAGSTER_HOME`:

    DAGSTER_HOME=DIR SECLAKE_HOME=HOME python -m assets.launch run_once_job

Progress is one line per finished step (and per retry) on stderr (a live bar on a terminal), not
Dagster's event log; then a table of the steps, a line per failed check, and the steps that did not
run. The exit code is 0 when the run succeeded, else 1 with each failed step named in one line.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import threading
import uuid
import warnings
from typing import TYPE_CHECKING

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, JobDefinition

from assets.checks import max_quarantine_ratio
from assets.intel import INTEL_JOB
from assets.jobs import LAKE_JOBS, RUN_ONCE_JOB
from assets.resources import LakeResource, SparkResource, resources_for_environment
from pipelines import environment
from pipelines.home import dagster_instance
from pipelines.operations.running import refuse_while_streaming
from pipelines.terminal import Progress, print_table

if TYPE_CHECKING:
    from dagster._utils.error import SerializableErrorInfo

FINISHED = {DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_SKIPPED,
            DagsterEventType.STEP_UP_FOR_RETRY}
# intel_load_job needs a feed file as its op's config: `seclake intel load FILE` runs it.
LAUNCHABLE_JOBS = tuple(name for name in LAKE_JOBS if name != INTEL_JOB)
OUTCOME = {DagsterEventType.STEP_SUCCESS: "ok", DagsterEventType.STEP_FAILURE: "FAILED",
           DagsterEventType.STEP_SKIPPED: "skipped"}


def launch(job_name: str, tags: dict[str, str]) -> int:
    """Execute `job_name` in this process on the `$DAGSTER_HOME` instance, else the home's
    (`Home.dagster`); 0 if the run succeeded."""
    from assets.definitions import defs

    job = defs.resolve_job_def(job_name)
    lake = resources_for_environment()["lake"]
    assert isinstance(lake, LakeResource)
    # Said at once: the run's first op would say it too, after Spark and Dagster's set-up (~20 s).
    try:
        environment.check_spark_variables()
        if job_name in LAKE_JOBS:
            refuse_while_streaming(lake.lake.home, f"a {job_name} run")
        if job_name == RUN_ONCE_JOB:
            max_quarantine_ratio()  # a bad value is said now, not by the check after the ETL ran
    except (RuntimeError, ValueError) as err:  # ValueError: a bad variable, a home recorded with another lake
        print(f"{job_name}: {err}", file=sys.stderr)
        return 1
    # Dagster reads the variable itself, and without it refuses in a screenful: the home's instance,
    # as `seclake demo` uses and docs/dagster.md starts the UI on, is the one to record the run in.
    os.environ["DAGSTER_HOME"] = str(dagster_instance(environment.dagster_home() or lake.lake.home.dagster))
    # The run's SparkSession is built beside Dagster's own set-up of the run (its instance, the run's
    # record: the demo's first step starts ~9 s after this process), not by that step; the run's `spark` resource
    # then finds it running. This resource started it, so it stops it when the run is over.
    spark = resources_for_environment()["spark"]
    assert isinstance(spark, SparkResource)
    # Two threads importing the same modules at once can see them half-initialised (a CI run's demo
    # failed on "partially initialized module 'sqlalchemy.orm.exc'"), so each module is imported by
    # one thread. The session's first JVM call imports pyspark.testing.utils (NumPy, pandas: py4j's
    # argument converters); the checks' Great Expectations imports them too. Imported first, here.
    importlib.import_module("pyspark.testing.utils")
    warm = threading.Thread(target=_build_session, args=(spark,), daemon=True)
    warm.start()
    # Great Expectations takes ~4 s of a core to import, paid by the run's first check. Imported
    # here instead, on this thread, while the Spark JVM comes up.
    importlib.import_module("pipelines.quality")
    try:
        return _run(job, job_name, tags)
    finally:
        warm.join()
        spark.teardown_after_execution(None)  # type: ignore[arg-type]  # the context is not used


def _build_session(spark: SparkResource) -> None:
    """Build `spark`'s session; an error is left to the run's first step, which reports it in its own words."""
    with contextlib.suppress(Exception):
        _ = spark.session


def _run(job: JobDefinition, job_name: str, tags: dict[str, str]) -> int:
    instance = DagsterInstance.get()
    run_id = str(uuid.uuid4())
    steps: list[tuple[str, str, float | None]] = []
    done = threading.Event()
    with Progress(job_name, total=len(job.nodes_in_topological_order)) as progress:
        watcher = threading.Thread(target=_follow, args=(instance, run_id, progress, steps, done), daemon=True)
        watcher.start()
        try:
            # Dagster's console logger would print each failure with its stack: the lines below say it.
            job.execute_in_process(instance=instance, run_id=run_id, raise_on_error=False, tags=tags,
                                   run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}})
        finally:
            done.set()
            watcher.join()
    run = instance.get_run_by_id(run_id)
    print_table(["step", "outcome", "seconds"], steps, title=f"Dagster run {run_id} ({job_name})")
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records:
        event = record.event_log_entry.dagster_event
        check = event.asset_check_evaluation_data if event is not None else None
        if check is not None and not check.passed:
            print(f"{job_name}: check {check.check_name} of {check.asset_key.to_user_string()} did not pass "
                  f"({check.severity.value}): {check.description or '-'}", file=sys.stderr)
    ran = {step for step, _, _ in steps}
    not_run = [node.name for node in job.nodes_in_topological_order if node.name not in ran]
    if not_run and run is not None and run.status != DagsterRunStatus.SUCCESS:
        print(f"{job_name}: {len(not_run)} step(s) did not run: {', '.join(not_run)}", file=sys.stderr)
    if run is not None and run.status == DagsterRunStatus.SUCCESS:
        return 0
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records:
        event = record.event_log_entry.dagster_event
        error = event.step_failure_data.error if event is not None and event.step_failure_data else None
        print(f"{job_name}: step {event.step_key if event else '?'} failed: {_said(error)}", file=sys.stderr)
    return 1


def _said(error: SerializableErrorInfo | None) -> str:
    """A step's error in one line, without the class name Dagster puts before an op's own `Failure`.

    >>> from types import SimpleNamespace as Error
    >>> _said(Error(message="dagster._core.definitions.events.Failure: 1 rule(s) failed: x"))
    '1 rule(s) failed: x'
    >>> _said(Error(message="SchemaMismatchError: column a"))
    'SchemaMismatchError: column a'
    """
    if error is None or not error.message.strip():
        return "failed"
    return error.message.strip().splitlines()[0].removeprefix("dagster._core.definitions.events.Failure: ")


def _follow(instance: DagsterInstance, run_id: str, progress: Progress,
            steps: list[tuple[str, str, float | None]], done: threading.Event) -> None:
    """Report each finished step of the run once, until `done` (then one last look)."""
    cursor: str | None = None
    while True:
        stop = done.wait(1.0)
        connection = instance.get_records_for_run(run_id, cursor=cursor, of_type=FINISHED)
        cursor = connection.cursor
        for record in connection.records:
            event = record.event_log_entry.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.event_type == DagsterEventType.STEP_UP_FOR_RETRY:
                retry = event.step_retry_data
                # The policy's retry request wraps the op's own error.
                error = (retry.error.cause or retry.error) if retry.error else None
                wait = f" in {retry.seconds_to_wait:.0f}s" if retry.seconds_to_wait else ""
                progress.note(f"{event.step_key} up for retry{wait}: {_said(error)}")
                continue
            duration = getattr(event.event_specific_data, "duration_ms", None)
            seconds = duration / 1000 if duration is not None else None
            steps.append((event.step_key, OUTCOME[event.event_type], seconds))
            progress.step(f"{event.step_key} {OUTCOME[event.event_type]}"
                          + (f" in {seconds:.1f}s" if seconds is not None else ""))
        if stop:
            return


def _tag(text: str) -> tuple[str, str]:
    """A `--tag` argument as a (key, value) pair; argparse names the argument when it is not one.

    >>> _tag("owner=soc")
    ('owner', 'soc')
    >>> _tag("owner")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'owner' is not KEY=VALUE
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.launch", description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=LAUNCHABLE_JOBS, help="a job of the code location")
    parser.add_argument("--tag", action="append", default=[], type=_tag, metavar="KEY=VALUE",
                        help="a tag of the run")
    args = parser.parse_args(argv)
    # Dagster's own warnings (preview APIs, instance defaults) are not the user's business here.
    warnings.filterwarnings("ignore")
    logging.getLogger("dagster").setLevel(logging.ERROR)
    return launch(args.job, dict(args.tag))


if __name__ == "__main__":
    sys.exit(main())
