"""`maintenance_job` and `retention_job` with their schedules (stopped until turned on in the UI).

Rollback is deliberately not a job: it is a command an operator runs after reading its dry run
(docs/operations.md). Both jobs refuse, in one line, while `seclake stream` runs on the home, and
their schedules skip while another lake-writing run is active.
"""
from dagster import (
    DefaultScheduleStatus,
    Failure,
    OpExecutionContext,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
    schedule,
)

from assets.automation import active_lake_run
from assets.resources import LakeResource, SparkResource
from assets.tables import LAKE_POOL

MAINTENANCE_JOB = "maintenance_job"
RETENTION_JOB = "retention_job"


@op(pool=LAKE_POOL, description="OPTIMIZE, VACUUM (retention >= 7 days) and checkpoint the log of every table")
def maintain_tables(context: OpExecutionContext, spark: SparkResource, lake: LakeResource) -> None:
    from pipelines.operations.maintain import maintain

    the_lake = lake.existing_lake()  # as `seclake maintain`: a mistyped home is not maintained as an empty one
    try:
        # Each table said as it is done: a home's maintenance takes minutes.
        maintain(lambda: spark.session, the_lake, lake.stream_settings,
                 on_table=lambda step: context.log.info(step.line()))
    except (ValueError, RuntimeError) as exc:
        raise Failure(description=str(exc)) from exc


@op(pool=LAKE_POOL, description="Delete rows and processed landing files older than each layer's retention")
def apply_retention(context: OpExecutionContext, spark: SparkResource, lake: LakeResource) -> None:
    from pipelines.operations.retention import apply_retention as apply

    the_lake = lake.existing_lake()  # as `seclake retention`: a mistyped home is not aged out as an empty one
    try:
        steps = apply(lambda: spark.session, the_lake, lake.stream_settings)
    except (ValueError, RuntimeError) as exc:
        raise Failure(description=str(exc)) from exc
    for step in steps:
        context.log.info(step.line(False))


@job(name=MAINTENANCE_JOB, executor_def=in_process_executor, tags={"seclake/mode": "maintenance"},
     description="Compact, vacuum and checkpoint every table (seclake maintain)")
def maintenance_job():
    maintain_tables()


@job(name=RETENTION_JOB, executor_def=in_process_executor, tags={"seclake/mode": "retention"},
     description="Age out data per layer (seclake retention; settings in pipelines/settings.py)")
def retention_job():
    apply_retention()


def _when_idle(context: ScheduleEvaluationContext, trigger: str):
    busy = active_lake_run(context.instance)
    if busy:
        return SkipReason(f"run {busy} is still writing the lake")
    return RunRequest(tags={"seclake/trigger": trigger})


# Nightly, away from the quarter-hourly run_once_schedule's minutes.
@schedule(name="maintenance_schedule", cron_schedule="17 3 * * *", job_name=MAINTENANCE_JOB,
          execution_timezone="UTC", default_status=DefaultScheduleStatus.STOPPED,
          description="maintenance_job daily at 03:17 UTC, skipped while another lake run is active")
def maintenance_schedule(context: ScheduleEvaluationContext):
    return _when_idle(context, "maintenance_schedule")


@schedule(name="retention_schedule", cron_schedule="47 2 * * *", job_name=RETENTION_JOB,
          execution_timezone="UTC", default_status=DefaultScheduleStatus.STOPPED,
          description="retention_job daily at 02:47 UTC (before maintenance vacuums what it deleted)")
def retention_schedule(context: ScheduleEvaluationContext):
    return _when_idle(context, "retention_schedule")
