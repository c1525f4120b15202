"""Run config and resources of the code location refused before an op works on them: numbers out
of range, stream settings that do not apply, a home that was never written. None of these tests
starts Spark: each refusal comes before the first `spark.session`."""
from __future__ import annotations

import math

import pytest
from dagster import DagsterInstance, materialize
from pydantic import ValidationError

from assets.checks import ExpectationsConfig, QuarantineRatioConfig
from assets.definitions import build_definitions
from assets.intel import IntelConfig
from assets.jobs import StreamConfig
from assets.resources import LakeResource, SparkResource
from pipelines.home import Home
from pipelines.query import Stage
from pipelines.settings import MAX_DAYS


def resources(home) -> dict:
    return {"spark": SparkResource(ui=False), "lake": LakeResource(home=str(home))}


def events(result, kind: str) -> list:
    return [e for e in result.all_events if e.event_type_value == kind]


def error_text(result) -> str:
    """Every error message of the run's failure events, causes included."""
    text = []
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        while error is not None:
            text.append(error.message)
            error = error.cause
    return "\n".join(text)


@pytest.mark.parametrize(("config", "field", "bad", "good"), [
    (StreamConfig, "report_every_s", 0.0, 0.5), (StreamConfig, "report_every_s", -5.0, 0.5),
    (StreamConfig, "report_every_s", math.nan, 60.0), (StreamConfig, "report_every_s", math.inf, 60.0),
    (StreamConfig, "report_every_s", 86_401.0, 86_400.0),
    (StreamConfig, "cancel_poll_s", 0.0, 0.1), (StreamConfig, "cancel_poll_s", math.nan, 2.0),
    (StreamConfig, "cancel_poll_s", 3_601.0, 3_600.0),
    (QuarantineRatioConfig, "window_hours", 0.0, 0.25), (QuarantineRatioConfig, "window_hours", -24.0, None),
    (QuarantineRatioConfig, "window_hours", math.nan, 24.0),
    (QuarantineRatioConfig, "window_hours", MAX_DAYS * 24 + 1.0, MAX_DAYS * 24.0),
    (ExpectationsConfig, "window_days", -1, 0), (ExpectationsConfig, "window_days", MAX_DAYS + 1, None),
    (IntelConfig, "sweep_days", 0, 1), (IntelConfig, "sweep_days", -30, 30),
    (IntelConfig, "sweep_days", 1_000_000, MAX_DAYS),
])
def test_config_out_of_range_is_refused_naming_the_field(config, field, bad, good):
    required = {"file": "feed.csv"} if config is IntelConfig else {}
    with pytest.raises(ValidationError) as refused:
        config(**required, **{field: bad})
    assert [e["loc"] for e in refused.value.errors()] == [(field,)]
    assert getattr(config(**required, **{field: good}), field) == good  # the edge of the range, or None: all


def test_stream_job_refuses_a_report_interval_its_rules_process_would_refuse(tmp_path):
    # Before, the op started the streams; the rules' child (`--report-every 0.0`) was refused by argparse
    # and restarted for as long as the run ran.
    home = Home.resolve(tmp_path / "home").create()
    defs = build_definitions(rules_dir=tmp_path / "no-rules", resources=resources(home.root))
    result = defs.resolve_job_def("stream_job").execute_in_process(
        run_config={"ops": {"stream_queries": {"config": {"report_every_s": 0.0}}}},
        instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    assert events(result, "STEP_FAILURE")[0].step_key == "stream_queries"
    assert "report_every_s" in error_text(result) and "greater than 0" in error_text(result)


def test_a_stream_setting_that_does_not_apply_fails_the_run_before_any_op_and_is_not_retried(tmp_path):
    home = tmp_path / "home"
    stage = Stage("etl", (), ("silver_conn",), lambda *args, **kwargs: None)
    defs = build_definitions(rules_dir=tmp_path / "no-rules", stage_list=[stage], resources=resources(home))
    result = defs.resolve_job_def("run_once_job").execute_in_process(
        run_config={"resources": {"lake": {"config": {"home": str(home), "settings": {"state_partitions": "0"}}}}},
        instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    assert "setting state_partitions=0: must be 1 or more" in error_text(result)
    # Raised in the op, the ValueError came after its start had made the home, and was retried three times.
    assert not events(result, "STEP_UP_FOR_RETRY") and not events(result, "STEP_START")
    assert not home.exists()
    with pytest.raises(ValidationError, match="unknown setting trigger_intervl"):
        LakeResource(settings={"trigger_intervl": "5 seconds"})


@pytest.mark.parametrize("job", ["maintenance_job", "retention_job", "intel_load_job"])
def test_jobs_on_a_home_never_written_fail_naming_it_and_make_nothing(tmp_path, job):
    home = tmp_path / "mistyped"
    feed = tmp_path / "feed.txt"
    feed.write_text("203.0.113.7\n")
    config = {"ops": {"load_indicators": {"config": {"file": str(feed)}}}} if job == "intel_load_job" else {}
    defs = build_definitions(rules_dir=tmp_path / "no-rules", resources=resources(home))
    result = defs.resolve_job_def(job).execute_in_process(
        run_config=config, instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    failure = events(result, "STEP_FAILURE")[0].event_specific_data.error.message
    assert f"{home} is not a seclake home (no tables/ folder)" in failure, failure
    assert not home.exists()


def test_incidents_on_a_home_never_written_fail_naming_it_without_retries(tmp_path):
    from assets.triage import incidents

    home = tmp_path / "mistyped"
    result = materialize([incidents], resources=resources(home), instance=DagsterInstance.ephemeral(),
                         raise_on_error=False)
    assert not result.success
    failure = events(result, "STEP_FAILURE")[0].event_specific_data.error.message
    assert f"{home} is not a seclake home (no tables/ folder)" in failure, failure
    assert not events(result, "STEP_UP_FOR_RETRY")  # the asset's retry policy would fail the same way
    assert not home.exists()


def test_a_home_with_landing_only_is_one_for_intel_and_incidents_not_for_maintenance(tmp_path):
    home = Home.resolve(tmp_path / "home")
    home.landing.mkdir(parents=True)
    lake = LakeResource(home=str(home.root))
    assert lake.existing_lake(or_landing=True).home == home
    with pytest.raises(Exception, match="is not a seclake home") as refused:
        lake.existing_lake()
    assert refused.value.allow_retries is False


@pytest.mark.parametrize(("argv", "said"), [
    (["nope"], "argument job: invalid choice: 'nope'"),
    (["intel_load_job"], "argument job: invalid choice: 'intel_load_job'"),  # its feed file is op config
    (["run_once_job", "--tag", "owner"], "argument --tag: 'owner' is not KEY=VALUE"),
    (["run_once_job", "--tag", "=soc"], "argument --tag: '=soc' is not KEY=VALUE"),
])
def test_a_shell_launch_of_a_bad_job_or_tag_is_refused_in_one_line(argv, said, tmp_path, monkeypatch, capsys):
    from assets.launch import main as launch

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    with pytest.raises(SystemExit) as refused:
        launch(argv)
    assert refused.value.code == 2
    assert said in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "dagster").exists()  # refused before the instance or a run was made
