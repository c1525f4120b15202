"""`run_once_schedule`, `landing_sensor` and `kafka_lag_sensor`: when `run_once_job` runs on its own.

Both skip while another lake-writing run is queued or in progress (a safety that needs no
dagster.yaml; the `seclake_lake` pool orders runs that are started anyway, see docs/dagster.md).
"""
import hashlib
import json
from pathlib import Path

from dagster import (
    DagsterInstance,
    DagsterInvalidDefinitionError,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.jobs import LAKE_JOBS, RUN_ONCE_JOB
from assets.resources import LakeResource
from pipelines import environment
from pipelines.etl import unprocessed_files, visible_files
from pipelines.home import Home
from pipelines.operations.running import running_stream

DEFAULT_CRON = "*/15 * * * *"
ACTIVE_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                   DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def active_lake_run(instance: DagsterInstance, besides: tuple[str, ...] = ()) -> str | None:
    """The id of a queued or running run that writes the lake (our jobs or an ad-hoc asset run), if
    any, leaving out runs of the jobs `besides` names."""
    for run in instance.get_runs(filters=RunsFilter(statuses=ACTIVE_STATUSES), limit=50):
        if run.job_name in besides:
            continue
        if run.job_name in LAKE_JOBS or run.job_name.startswith("__ASSET_JOB"):
            return run.run_id
    return None


def lake_writer(instance: DagsterInstance, home: Home) -> str | None:
    """What writes the lake now and would refuse a run-once: a Dagster run (`run <id>`), or a
    `seclake stream` started from the command line (`seclake stream (pid N)`); None when idle."""
    run = active_lake_run(instance)
    if run is not None:
        return f"run {run}"
    pid = running_stream(home)
    return None if pid is None else f"seclake stream (pid {pid})"


def file_versions(landing: Path) -> dict[str, str]:
    """Every complete file under `landing` as {relative path: "size:mtime_ns"}.

    Temp files and folders are ignored as Spark's file source ignores them (`etl.visible_files`).

    >>> file_versions(Path("/nonexistent"))
    {}
    """
    found: dict[str, str] = {}
    for path in visible_files(landing):
        try:
            st = path.stat()
        except FileNotFoundError:  # renamed or removed while we looked
            continue
        found[path.relative_to(landing).as_posix()] = f"{st.st_size}:{st.st_mtime_ns}"
    return found


def new_files(current: dict[str, str], seen: dict[str, str]) -> dict[str, str]:
    """Files that are new or changed (size or mtime) since `seen`.

    >>> new_files({"zeek/a.log": "1:1", "zeek/b.log": "2:2"}, {"zeek/a.log": "1:1"})
    {'zeek/b.log': '2:2'}
    """
    return {path: stamp for path, stamp in current.items() if seen.get(path) != stamp}


def run_key_for(files: dict[str, str]) -> str:
    """A stable key for a set of (name, size, mtime): the same new files never request two runs."""
    digest = hashlib.sha256("\n".join(f"{p}|{s}" for p, s in sorted(files.items())).encode()).hexdigest()
    return f"landing-{digest[:32]}"


@sensor(name="landing_sensor", job_name=RUN_ONCE_JOB, minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="Requests a run of run_once_job when new files appear under <home>/landing/")
def landing_sensor(context: SensorEvaluationContext, lake: LakeResource):
    landing = lake.lake.home.landing
    current = file_versions(landing)
    if context.cursor:
        seen = json.loads(context.cursor)
    else:
        # The first tick (the sensor just turned on): only what the ETL has yet to read is new, or a
        # home whose landing folder was processed before would get a run that finds nothing.
        waiting = unprocessed_files(lake.lake)
        seen = {path: stamp for path, stamp in current.items() if str(landing / path) not in waiting}
    fresh = new_files(current, seen)
    if not fresh:
        skip = SkipReason(f"no new files under {landing}")
        return SensorResult(skip_reason=skip, cursor=_cursor(current)) if not context.cursor else skip
    busy = lake_writer(context.instance, lake.lake.home)
    if busy:
        # Keep the cursor: the files are looked at again once it has finished (a stream reads them itself).
        return SkipReason(f"{len(fresh)} new file(s) wait for {busy} to finish")
    request = RunRequest(run_key=run_key_for(fresh),
                         tags={"seclake/trigger": "landing_sensor", "seclake/new_files": str(len(fresh))})
    # The cursor is what exists now, so files removed from landing/ (retention) drop out of it.
    return SensorResult(run_requests=[request], cursor=_cursor(current))


def _cursor(files: dict[str, str]) -> str:
    return json.dumps(files, sort_keys=True, separators=(",", ":"))


@sensor(name="kafka_lag_sensor", job_name=RUN_ONCE_JOB, minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="Shows the ETL's consumer lag on the sensors' Kafka topics ($SECLAKE_KAFKA) in each tick, "
                    "and requests a run of run_once_job when messages wait")
def kafka_lag_sensor(context: SensorEvaluationContext, lake: LakeResource):
    from pipelines.etl import KAFKA_QUERY_NAME
    from pipelines.kafka.lag import committed_offsets, consumer_lag

    bootstrap = environment.kafka()
    if not bootstrap:
        return SkipReason("SECLAKE_KAFKA is not set: the lake reads no Kafka topics")
    try:
        lag = consumer_lag(lake.lake.home, bootstrap)
    except ValueError as exc:
        return SkipReason(str(exc))
    waiting = sum(lag.values())
    summary = ", ".join(f"{name}={n:,}" for name, n in lag.items() if n) or "every topic read"
    context.log.info(f"consumer lag {waiting:,}: {summary}")
    if not waiting:
        return SkipReason(f"consumer lag 0 ({len(lag)} partition(s) read to their end)")
    busy = lake_writer(context.instance, lake.lake.home)
    if busy:
        return SkipReason(f"consumer lag {waiting:,} ({summary}); waits for {busy} to finish")
    # The offsets the ETL committed are in the key: the same lag after a run that caught up is new
    # messages, which a key of the lag alone made Dagster drop as a run already requested.
    done = committed_offsets(lake.lake.home.checkpoint(KAFKA_QUERY_NAME))
    key = hashlib.sha256(json.dumps([lag, sorted(f"{t}/{p}={o}" for (t, p), o in done.items())],
                                    sort_keys=True).encode()).hexdigest()[:16]
    return SensorResult(run_requests=[RunRequest(run_key=f"kafka-{key}", tags={
        "seclake/trigger": "kafka_lag_sensor", "seclake/kafka_lag": str(waiting)})])


def run_once_tick(instance: DagsterInstance, home: Home) -> RunRequest | SkipReason:
    """A tick of `run_once_schedule`: a run of run_once_job, unless something writes the lake."""
    busy = lake_writer(instance, home)
    if busy:
        return SkipReason(f"{busy} is still writing the lake")
    return RunRequest(tags={"seclake/trigger": "run_once_schedule"})


def run_once_schedule_def(cron: str | None = None) -> ScheduleDefinition:
    """`run_once_schedule`: run_once_job every 15 minutes (`$SECLAKE_RUN_ONCE_CRON` overrides); a
    cron that is not one names the variable (the code location then fails to load with that line).

    >>> run_once_schedule_def("every 5 minutes")
    Traceback (most recent call last):
    ...
    ValueError: SECLAKE_RUN_ONCE_CRON 'every 5 minutes' is not a cron schedule of 5 fields, e.g. '*/15 * * * *'
    """
    cron = cron or environment.run_once_cron() or DEFAULT_CRON

    def run_once_schedule(context: ScheduleEvaluationContext, lake: LakeResource):
        return run_once_tick(context.instance, lake.lake.home)

    try:
        return schedule(name="run_once_schedule", cron_schedule=cron, job_name=RUN_ONCE_JOB, execution_timezone="UTC",
                        default_status=DefaultScheduleStatus.STOPPED,
                        description=f"run_once_job on cron `{cron}` (UTC), skipped while another lake run or a "
                                    "seclake stream is active",
                        )(run_once_schedule)
    except DagsterInvalidDefinitionError:
        # Dagster's own error names the schedule, not the setting the cron came from.
        raise ValueError(f"SECLAKE_RUN_ONCE_CRON {cron!r} is not a cron schedule of 5 fields, "
                         f"e.g. {DEFAULT_CRON!r}") from None
