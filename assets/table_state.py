"""`table_state_sensor`: the asset catalog shows each table as its Delta log does, whoever wrote it.

`seclake run-once`, `demo` and `stream` commit to the tables without Dagster, so the catalog
would say "Never materialized" about tables full of rows. Every 30 s this sensor reads each
table's log (delta-rs, no JVM, no Spark) and, for a table whose Delta version differs from the
one its latest materialisation records, reports a materialisation (runless, attributed to the
sensor) with the table's version, row count, last commit time and writer. A Dagster run's own
materialisations already carry that state, so the sensor adds nothing for those tables, and waits
while a run is active (`stream_job`'s reports carry it too); it does report what runs change
without materialising (the state tables their ops keep, the tables maintenance and retention rewrite).
"""
from dagster import (
    AssetMaterialization,
    DefaultSensorStatus,
    EventLogEntry,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.automation import active_lake_run
from assets.jobs import STREAM_JOB
from assets.resources import LakeResource
from assets.tables import table_key, table_state
from pipelines.lake.registry import Lake


def recorded_version(entry: EventLogEntry | None) -> int | None:
    """The `table_version` a materialisation recorded (None: no materialisation, or one without it).

    >>> recorded_version(None) is None
    True
    """
    materialization = entry.asset_materialization if entry is not None else None
    value = materialization.metadata.get("table_version") if materialization is not None else None
    return getattr(value, "value", None)


def changed_tables(lake: Lake, recorded: dict[str, int | None]) -> list[AssetMaterialization]:
    """A materialisation for each existing table whose current version is not `recorded[table]`."""
    reports = []
    for table in Lake.names():
        state = table_state(lake, table)
        if not state or recorded.get(table) == state["table_version"]:
            continue
        reports.append(AssetMaterialization(
            asset_key=table_key(table),
            description=f"Delta version {state['table_version']} of {table}, last written by "
                        f"{state['last_writer']} (read from the table's log by table_state_sensor)",
            metadata={**state, "path": str(lake.path(table))}))
    return reports


@sensor(name="table_state_sensor", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Reports a materialisation of each table whose Delta version is not the one its latest "
                    "materialisation records (written by seclake run-once, demo, stream, or by a run without "
                    "materialising it), with its version, row count and last commit")
def table_state_sensor(context: SensorEvaluationContext, lake: LakeResource):
    # A run records the tables it writes as it finishes each step: until then, its versions would be
    # reported here too, as written by this sensor. `stream_job` never finishes; it records the state.
    busy = active_lake_run(context.instance, besides=(STREAM_JOB,))
    if busy:
        return SkipReason(f"run {busy} writes the lake and records the tables it writes; looked at once it ends")
    keys = {table: table_key(table) for table in Lake.names()}
    latest = context.instance.get_latest_materialization_events(list(keys.values()))
    reports = changed_tables(lake.lake, {table: recorded_version(latest.get(key)) for table, key in keys.items()})
    if not reports:
        if not any(lake.lake.exists(table) for table in keys):
            return SkipReason(f"no table written in {lake.lake.home.root} yet")
        return SkipReason("every table's latest materialisation shows its current Delta version")
    # A tick that requests no run is logged as skipped: its reason says what it reported instead.
    names = ", ".join(event.asset_key.to_user_string() for event in reports)
    return SensorResult(asset_events=reports, skip_reason=f"reported the Delta state of {len(reports)} table(s) "
                                                          f"changed since their latest materialisation: {names}")
