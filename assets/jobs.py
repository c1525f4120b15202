"""Jobs: `run_once_job` (every asset and check, AvailableNow) and `stream_job` (continuous streams).

Both run in one process with the in-process executor, so a run has one SparkSession.
"""
import threading
import time
from typing import TYPE_CHECKING

from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    DagsterExecutionInterruptedError,
    DagsterRunStatus,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from assets.resources import LakeResource, SparkResource
from assets.tables import LAKE_POOL, table_key, table_state
from pipelines import jobs as pipeline_jobs
from pipelines.lake.registry import Lake
from pipelines.query import QueryReport

if TYPE_CHECKING:  # Dagster's public API has no name for the class define_asset_job returns
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

RUN_ONCE_JOB = "run_once_job"
STREAM_JOB = "stream_job"
# Runs of these jobs write the lake; the schedule and sensor do not start one while another runs.
# The last three: assets/operations.py and assets/intel.py.
LAKE_JOBS = (RUN_ONCE_JOB, STREAM_JOB, "maintenance_job", "retention_job", "intel_load_job")


def run_once_job_def() -> "UnresolvedAssetJobDefinition":
    """Every asset and asset check, in dependency order: each stage's query once with AvailableNow."""
    from dagster import define_asset_job

    return define_asset_job(
        RUN_ONCE_JOB,
        selection=AssetSelection.all(),
        executor_def=in_process_executor,
        description="Process everything in landing/ once: every streaming query with Trigger.AvailableNow, "
                    "in dependency order, then the data-quality checks",
        tags={"seclake/mode": "run-once"},
    )


class StreamConfig(Config):
    # report_every_s also goes to the rules' child process as --report-every, which refuses anything
    # but a finite number above 0: that child would be restarted forever and no rule ever run.
    # A poll of 0, less or NaN spins on the instance's run storage; inf kills the watcher (OverflowError),
    # and a termination request then goes unseen.
    report_every_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False,
                                  description="log progress and record materialisations this often "
                                              "(seconds, above 0, at most a day)")
    cancel_poll_s: float = Field(default=2.0, gt=0, le=3_600, allow_inf_nan=False,
                                 description="how often to look for a termination request (seconds, above 0, "
                                             "at most an hour)")


def _watch_for_termination(instance, run_id: str, stop: threading.Event, done: threading.Event,
                           poll_s: float) -> None:
    # Termination from the UI sends the run worker SIGINT, which jobs.stream turns into `stop`;
    # this also catches a run marked CANCELING when no signal arrives (e.g. run in-process).
    while not done.wait(poll_s):
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED):
            stop.set()
            return


def _stop_queries(spark, keep: set) -> None:
    """Stop the active streaming queries except those in `keep` (ids of queries not ours)."""
    for query in spark.streams.active:
        if query.id in keep:
            continue
        try:
            query.stop()
        except Exception:  # a query failing as it stops must not hide the original error
            pass


@op(pool=LAKE_POOL, description="Run every stage's query continuously (processing-time trigger) until the run "
                                "is terminated; then stop the queries between micro-batches")
def stream_queries(context: OpExecutionContext, config: StreamConfig, spark: SparkResource, lake: LakeResource):
    session, the_lake = spark.session, lake.lake
    stop, done = threading.Event(), threading.Event()
    watcher = threading.Thread(target=_watch_for_termination, name="seclake-stream-watcher", daemon=True,
                               args=(context.instance, context.run_id, stop, done, config.cancel_poll_s))
    watcher.start()
    versions: dict[str, int] = {}

    def on_report(report: QueryReport) -> None:
        context.log.info(report.line())
        _record_new_versions(context, report, versions, the_lake)

    started = time.monotonic()
    already_running = {q.id for q in session.streams.active}
    try:
        # jobs.stream turns SIGINT/SIGTERM into `stop` once its queries are started.
        reports = pipeline_jobs.stream(session, the_lake, lake.stream_settings, stop=stop,
                                       on_report=on_report, report_every=config.report_every_s)
    except BaseException:
        # Interrupted, or a stage failed to start, before jobs.stream could stop what it started.
        stop.set()
        _stop_queries(session, already_running)
        raise
    finally:
        done.set()
    for report in reports:
        context.log.info(report.line())
        _record_new_versions(context, report, versions, the_lake)
    failed = [r for r in reports if r.error]
    if failed:
        # Before the termination below: the stream runs until terminated, so a stage that failed
        # meanwhile would otherwise end the run "canceled", its error in no result.
        raise Failure(description="streaming queries failed: " + "; ".join(f"{r.name}: {r.error}" for r in failed),
                      metadata={r.name: r.line() for r in reports})
    context.log.info(f"streams ran {time.monotonic() - started:.0f}s and stopped cleanly")
    if stop.is_set():
        # Stopped on a termination request: report the run as interrupted (Dagster marks it canceled).
        raise DagsterExecutionInterruptedError("streaming queries stopped cleanly on termination")


def _record_new_versions(context: OpExecutionContext, report, versions: dict[str, int], lake: Lake) -> None:
    """An AssetMaterialization for every table that got a new version since the last report."""
    known = set(Lake.names())
    for table, version in report.versions.items():
        if table not in known or versions.get(table) == version:
            continue
        versions[table] = version
        context.log_event(AssetMaterialization(
            asset_key=table_key(table),
            description=f"committed by streaming query {report.name}",
            metadata={"version": version, "rows_out_since_start": report.rows_out.get(table, 0),
                      "stage": report.name, "mode": "stream", "path": str(lake.path(table)),
                      **table_state(lake, table)},
        ))


@job(name=STREAM_JOB, executor_def=in_process_executor, tags={"seclake/mode": "stream"},
     description="Run the pipeline continuously until terminated (Terminate in the UI stops the queries cleanly)")
def stream_job():
    stream_queries()
