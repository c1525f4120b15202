"""`intel_load_job` and `intel_sensor`: an indicator feed dropped in `<home>/intel/` is loaded
into `indicators` and history is swept for matches (`pipelines.intel.store.load`)."""
import json
from pathlib import Path

from dagster import (
    AssetMaterialization,
    Config,
    DefaultSensorStatus,
    Failure,
    OpExecutionContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    in_process_executor,
    job,
    op,
    sensor,
)
from pydantic import Field

from assets.automation import active_lake_run, file_versions, new_files
from assets.jobs import STREAM_JOB
from assets.resources import LakeResource, SparkResource
from assets.tables import LAKE_POOL, RETRY_POLICY, table_key, table_state
from pipelines.operations.running import HomeBusy, RollbackPending, refuse_while_rolling_back
from pipelines.settings import MAX_DAYS

INTEL_JOB = "intel_load_job"


class IntelConfig(Config):
    file: str = Field(description="the feed to load: a plain list, CSV or STIX 2.1 bundle of IPs and domains")
    source: str | None = Field(default=None, description="the feed's name (default: the file name)")
    # As `seclake intel load --sweep-days`: a negative count swept the future (0 alerts, reported a
    # success), and one past MAX_DAYS overflowed the date after the indicators' MERGE had committed.
    sweep_days: int = Field(default=90, ge=1, le=MAX_DAYS,
                            description=f"days of history searched for matches, 1 to {MAX_DAYS}")


# Retried: the sensor's cursor has moved past the feed, so a sweep that failed after the MERGE (a
# commit conflict with a rule's append, say) would otherwise never run; both steps can be done again.
@op(pool=LAKE_POOL, retry_policy=RETRY_POLICY,
    description="Upsert a feed's indicators (MERGE) and sweep history for matches into alerts")
def load_indicators(context: OpExecutionContext, config: IntelConfig, spark: SparkResource, lake: LakeResource):
    from pipelines.intel.feeds import skipped_summary
    from pipelines.intel.store import INDICATORS_TABLE, load
    from pipelines.rules.tables import ALERTS_TABLE

    the_lake = lake.existing_lake(or_landing=True)  # as `seclake intel load`: a mistyped home is not a new one
    try:
        result = load(spark.session, the_lake, Path(config.file), source=config.source, sweep_days=config.sweep_days)
    except (ValueError, RollbackPending) as err:  # the feed, or a rollback to finish: a retry fails the same
        raise Failure(description=str(err), allow_retries=False) from None
    context.log.info(f"{result.indicators} indicator(s) loaded, {result.alerts} new alert(s) from the sweep")
    if result.skipped:
        context.log.warning(f"{config.file}: {skipped_summary(result.skipped)}")
    context.log_event(AssetMaterialization(
        asset_key=table_key(INDICATORS_TABLE), description=f"loaded from {config.file}",
        # The table's state (`table_version` ...) as every table materialisation has it: table_state_sensor
        # then finds this version recorded.
        metadata={**table_state(the_lake, INDICATORS_TABLE), "version": result.version,
                  "indicators_in_file": result.indicators,
                  "skipped_lines": len(result.skipped), "new_alerts": result.alerts,
                  "sweep_rules": ", ".join(result.rules)}))
    if result.alerts:
        context.log_event(AssetMaterialization(
            asset_key=table_key(ALERTS_TABLE), description=f"{result.alerts} alert(s) from the sweep of {config.file}",
            metadata={**table_state(the_lake, ALERTS_TABLE), "new_alerts": result.alerts}))


@job(name=INTEL_JOB, executor_def=in_process_executor, tags={"seclake/mode": "intel"},
     description="Load one indicator feed and sweep history for matches")
def intel_load_job():
    load_indicators()


@sensor(name="intel_sensor", job_name=INTEL_JOB, minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description="Requests a run of intel_load_job for each new or changed feed file under <home>/intel/ "
                    "(names starting with . or _ are ignored)")
def intel_sensor(context: SensorEvaluationContext, lake: LakeResource):
    folder = lake.lake.home.intel
    current = file_versions(folder)  # the same rules as landing/: `.`/`_` names are files being written
    changed = new_files(current, json.loads(context.cursor) if context.cursor else {})
    if not changed:
        return SkipReason(f"no new or changed feed under {folder}")
    try:
        refuse_while_rolling_back(lake.lake.home, f"{len(changed)} new or changed feed(s) are loaded")
    except HomeBusy as err:  # its run would be refused, not retried, and the cursor past the feed: it waits
        return SkipReason(str(err))
    # Not behind `stream_job`, which never finishes: its rules match the feed from their next
    # micro-batch, and the sweep appends beside their appends, reading `alerts` again on a conflict.
    busy = active_lake_run(context.instance, besides=(STREAM_JOB,))
    if busy:
        # Beside a run-once, the sweep would sweep rules its run is writing; the cursor is kept, so the
        # feeds are looked at again once that run has finished.
        return SkipReason(f"{len(changed)} new or changed feed(s) wait for run {busy} to finish")
    requests = [RunRequest(run_key=f"{name}@{changed[name]}",
                           run_config={"ops": {"load_indicators": {"config": {"file": str(folder / name)}}}},
                           tags={"seclake/trigger": "intel_sensor", "seclake/feed": name})
                for name in changed]
    return SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True, separators=(",", ":")))
