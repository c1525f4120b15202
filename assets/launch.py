"""Run a job of the code location as a Dagster run recorded in `$DAGSTER_HOME`, from a shell.

`seclake demo` runs its pipeline this way, so the demo's run, its steps, logs and the tables'
materialisations are in the Dagster UI started with the same `DAGSTER_HOME`:

    DAGSTER_HOME=DIR SECLAKE_HOME=HOME python -m assets.launch run_once_job

Progress is one line per finished step on stderr (a live bar on a terminal), not Dagster's
event log; the exit code is 0 when the run succeeded, else 1 with each failed step named.
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

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, JobDefinition

from assets.resources import SparkResource, resources_for_environment
from pipelines.home import dagster_instance
from pipelines.terminal import Progress, print_table

FINISHED = {DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_SKIPPED}
OUTCOME = {DagsterEventType.STEP_SUCCESS: "ok", DagsterEventType.STEP_FAILURE: "FAILED",
           DagsterEventType.STEP_SKIPPED: "skipped"}


def launch(job_name: str, tags: dict[str, str]) -> int:
    """Execute `job_name` in this process on the `$DAGSTER_HOME` instance; 0 if the run succeeded."""
    from assets.definitions import defs

    job = defs.resolve_job_def(job_name)
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
    importlib.import_module("assets.quality")
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
            job.execute_in_process(instance=instance, run_id=run_id, raise_on_error=False, tags=tags,
                                   run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}})
        finally:
            done.set()
            watcher.join()
    run = instance.get_run_by_id(run_id)
    print_table(["step", "outcome", "seconds"], steps, title=f"Dagster run {run_id} ({job_name})")
    if run is not None and run.status == DagsterRunStatus.SUCCESS:
        return 0
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records:
        event = record.event_log_entry.dagster_event
        error = event.step_failure_data.error if event is not None and event.step_failure_data else None
        message = error.message.strip().splitlines()[0] if error is not None and error.message.strip() else "failed"
        print(f"{job_name}: step {event.step_key if event else '?'} failed: {message}", file=sys.stderr)
    return 1


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
            duration = getattr(event.event_specific_data, "duration_ms", None)
            seconds = duration / 1000 if duration is not None else None
            steps.append((event.step_key, OUTCOME[event.event_type], seconds))
            progress.step(f"{event.step_key} {OUTCOME[event.event_type]}"
                          + (f" in {seconds:.1f}s" if seconds is not None else ""))
        if stop:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.launch", description=__doc__.splitlines()[0])
    parser.add_argument("job", help="a job of the code location, e.g. run_once_job")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag of the run")
    args = parser.parse_args(argv)
    # Dagster's own warnings (preview APIs, instance defaults) are not the user's business here.
    warnings.filterwarnings("ignore")
    logging.getLogger("dagster").setLevel(logging.ERROR)
    tags = dict(tag.split("=", 1) for tag in args.tag)
    if os.environ.get("DAGSTER_HOME"):
        dagster_instance(os.environ["DAGSTER_HOME"])
    return launch(args.job, tags)


if __name__ == "__main__":
    sys.exit(main())
