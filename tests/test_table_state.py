"""The asset catalog tells the truth about tables written outside Dagster: `table_state_sensor`
reads each table's Delta log and reports its version, row count and last commit."""
from __future__ import annotations

import pytest
from dagster import AssetMaterialization, DagsterInstance, DefaultSensorStatus, SensorResult, build_sensor_context

from assets.definitions import build_definitions
from assets.resources import LakeResource
from assets.tables import table_key
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake


@pytest.fixture(scope="module")
def cli_home(spark, tmp_path_factory):
    """A home written the way `seclake run-once` writes it: no Dagster involved."""
    from sample_data.generator import generate

    root = tmp_path_factory.mktemp("table-state")
    generate(root, hours=0.25, hosts=5, seed=5)
    lake = Lake(Home.resolve(root))
    reports = run_once(spark, lake)
    assert not [r.error for r in reports if r.error]
    return lake


def evaluate(instance: DagsterInstance, lake: Lake):
    sensor = build_definitions().resolve_sensor_def("table_state_sensor")
    context = build_sensor_context(instance=instance, resources={"lake": LakeResource(home=str(lake.home.root))})
    return sensor(context)


def by_key(result: SensorResult) -> dict[str, AssetMaterialization]:
    return {event.asset_key.to_user_string(): event for event in result.asset_events}


def values(event: AssetMaterialization) -> dict:
    return {name: value.value for name, value in event.metadata.items()}


def test_sensor_is_on_by_default_and_reports_every_table_with_its_version_and_rows(spark, cli_home):
    from delta.tables import DeltaTable

    assert build_definitions().resolve_sensor_def("table_state_sensor").default_status == DefaultSensorStatus.RUNNING
    result = evaluate(DagsterInstance.ephemeral(), cli_home)
    assert isinstance(result, SensorResult)
    reported = by_key(result)
    # Dagster logs a tick that requests no run as skipped: the reason says what it reported.
    assert result.skip_reason.skip_message.startswith(f"reported the Delta state of {len(reported)} table(s)")
    written = [t for t in Lake.names() if cli_home.exists(t)]
    assert {"silver_dns", "enriched_dns", "alerts"} <= set(written)
    assert set(reported) == {table_key(t).to_user_string() for t in written}
    for table in written:
        meta = values(reported[table_key(table).to_user_string()])
        path = str(cli_home.path(table))
        assert meta["table_version"] == DeltaTable.forPath(spark, path).history(1).collect()[0].version, table
        assert meta["dagster/row_count"] == spark.read.format("delta").load(path).count(), table
        assert meta["last_writer"] != "-", table
    assert values(reported["silver/dns"])["dagster/row_count"] > 0


def test_sensor_reports_only_tables_whose_version_changed_since_their_latest_materialisation(spark, cli_home):
    instance = DagsterInstance.ephemeral()
    for event in evaluate(instance, cli_home).asset_events:
        instance.report_runless_asset_event(event)
    assert evaluate(instance, cli_home).skip_message.startswith("every table's latest materialisation")

    # a writer outside Dagster appends one row to quarantine: only that table is reported, with the new state
    path = str(cli_home.path("quarantine"))
    before = instance.get_latest_materialization_event(table_key("quarantine"))
    old = values(before.asset_materialization)
    spark.read.format("delta").load(path).limit(1).write.format("delta").mode("append").save(path)
    reported = by_key(evaluate(instance, cli_home))
    assert list(reported) == ["bronze/quarantine"]
    meta = values(reported["bronze/quarantine"])
    assert meta["table_version"] == old["table_version"] + 1
    assert meta["dagster/row_count"] == old["dagster/row_count"] + 1
    assert meta["dagster/last_updated_timestamp"] >= old["dagster/last_updated_timestamp"]


def test_on_a_home_with_no_table_the_sensor_says_so(tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    assert evaluate(DagsterInstance.ephemeral(), lake).skip_message == f"no table written in {tmp_path} yet"
