"""Run-time isolation of rules: a rule that fails, runs over its batch budget or dies with the
Spark application is counted in `rule_status`, backed off, disabled with a platform alert, and
re-enabled by one command; the other rules' alerts are untouched."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, build_asset_check_context

from assets.resources import LakeResource, SparkResource
from assets.rules import rule_enabled_checks, rule_key
from conftest import waits_for_lock
from pipelines.cli import main
from pipelines.home import Home
from pipelines.jobs import RULES_START_MAX_WAIT_SECONDS, RulesApp, tables_up
from pipelines.lake.registry import Lake
from pipelines.query import RunningQuery, StoppedQuery
from pipelines.rules.engine import (
    DIED,
    RUNNING_MARKER,
    IdleWriter,
    RuleManager,
    failure,
    prepare_rules,
    stop_rule,
)
from pipelines.rules.health import DISABLED, FAILING, INVALID, OK
from pipelines.rules.pack import default_rules_dir, scan_rules
from pipelines.rules.spec import validate_rule
from pipelines.rules.status import RULE_STATUS_TABLE, RuleStatus, utc_now
from pipelines.rules.tables import RULE_DISABLED_ID
from pipelines.settings import Settings
from test_rules_engine import DGA, HOST_A, append, dga_burst, run_all, wait_for

QUICK = Settings().with_overrides({"rule_retry": "30 seconds", "rule_max_failures": "2"})


def casting_rule(tmp_path: Path) -> Path:
    """The DGA rule turned into one that fails at run time (ANSI CAST of a domain name to INT)."""
    path = tmp_path / "rules" / "casts_names_to_int.sql"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = DGA.read_text().replace("f6097087-51a0-4890-829e-23f828e73b08", "0f6d1b7a-5c6e-4b8a-9a62-0c4a5e0f1d21")
    path.write_text(text.replace("lower(query) AS name,", "CAST(query AS INT) AS name,"))
    return path


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(Home.resolve(tmp_path / "home").create())
    return lake


def states(spark, lake: Lake, rule: str) -> list[str]:
    rows = lake.read(spark, RULE_STATUS_TABLE).where(f"rule = '{rule}'").orderBy("changed_at").collect()
    return [r.state for r in rows]


def test_a_rule_failing_at_run_time_backs_off_is_disabled_with_an_alert_and_re_enabled(spark, tmp_path, lake,
                                                                                        monkeypatch):
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}], HOST_A)
    bad_file = casting_rule(tmp_path)
    bad, good = validate_rule(bad_file), validate_rule(DGA)

    first = {r.name: r for r in run_all(spark, lake, [bad, good], QUICK)}
    assert "CAST_INVALID_INPUT" in (first["rule_casts_names_to_int"].error or "")
    assert first["rule_dga_nxdomain_burst"].rows_out == {"alerts": 1}
    assert RuleStatus(spark, lake).get(bad.slug, bad.content_hash).state == FAILING
    # Dagster's `rule_enabled` check warns while it backs off (the run's rules op materialises it held back).
    failing = {r.asset_key: r for r in rule_enabled_checks([good, bad])(
        build_asset_check_context(), spark=SparkResource(ui=False), lake=LakeResource(home=str(lake.home.root)))}
    assert not failing[rule_key(bad.slug)].passed and failing[rule_key(bad.slug)].severity == AssetCheckSeverity.WARN
    assert "failing" in failing[rule_key(bad.slug)].description and failing[rule_key(good.slug)].passed

    # Within its back-off the rule is held back, with the reason; after it, retried and disabled.
    held = run_all(spark, lake, [bad], QUICK)[0]
    assert held.error is None and held.note.startswith("backing off after 1 failure(s) in a row"), held.line()
    retry_at = RuleStatus(spark, lake).get(bad.slug, bad.content_hash).retry_at
    time.sleep(max(0.0, (retry_at - utc_now()).total_seconds()) + 0.5)
    second = run_all(spark, lake, [bad], QUICK)[0]
    assert "CAST_INVALID_INPUT" in (second.error or "")
    health = RuleStatus(spark, lake).get(bad.slug, bad.content_hash)
    assert (health.state, health.failures) == (DISABLED, 2) and "CAST_INVALID_INPUT" in health.reason
    assert states(spark, lake, bad.slug) == [FAILING, DISABLED]
    disabled = run_all(spark, lake, [bad], QUICK)[0]
    assert disabled.error is None and disabled.note.startswith("disabled after 2 failure(s) in a row"), disabled.line()
    # run-once exits 1 on every run while it stays disabled, not only on the run that disabled it.
    home = ["--home", str(lake.home.root), "--rules", str(bad_file.parent)]
    monkeypatch.setenv("SECLAKE_RULES", str(bad_file.parent))  # run-once sets it; undone after the test
    assert disabled.disabled and main(["run-once", *home, "--only", bad.query_name]) == 1

    # One platform alert says which rule stopped detecting; the DGA alert is still the only other one.
    rows = lake.read(spark, "alerts").collect()
    platform = [a for a in rows if a.rule_id == RULE_DISABLED_ID]
    assert len(platform) == 1 and platform[0].rule_name == "Rule disabled: casts_names_to_int"
    assert platform[0].severity == "high" and "CAST_INVALID_INPUT" in platform[0].evidence
    assert [a.rule_id for a in rows if a.rule_id != RULE_DISABLED_ID] == [good.id]

    # Dagster's `rule_enabled` check on the rule's asset fails, naming the reason.
    checks = rule_enabled_checks([good, bad])
    results = {r.asset_key: r for r in checks(build_asset_check_context(), spark=SparkResource(ui=False),
                                                lake=LakeResource(home=str(lake.home.root)))}
    check = results[rule_key(bad.slug)]
    assert not check.passed and check.metadata["state"].value == DISABLED and "CAST_INVALID_INPUT" in check.description
    assert check.severity == AssetCheckSeverity.ERROR
    assert results[rule_key(good.slug)].passed and len(results) == 2

    # `seclake rules status` exits 1 while a rule is disabled; `enable` brings it back, once.
    assert main(["rules", "status", *home]) == 1
    assert main(["rules", "enable", bad.slug, *home]) == 0
    assert RuleStatus(spark, lake).get(bad.slug, bad.content_hash).state == OK
    assert main(["rules", "status", *home]) == 0
    again = run_all(spark, lake, [bad], QUICK)[0]
    assert "CAST_INVALID_INPUT" in (again.error or "")  # it runs (and fails) again

    # Editing the file is a new deploy: whatever the old content did, the new one starts fresh.
    bad_file.write_text(bad_file.read_text().replace("version: 2", "version: 3"))
    assert RuleStatus(spark, lake).get(bad.slug, validate_rule(bad_file).content_hash).state == OK


def test_a_status_row_waits_while_another_process_commits_to_rule_status(spark, lake):
    # On object storage two drivers committing rule_status at one moment can lose a commit, and
    # `seclake rules enable` appends beside the stream's rules application: each takes the home's lock.
    status = RuleStatus(spark, lake)
    status.update("r", "hash", lambda h: h.failed("boom", utc_now(), max_failures=1, retry_s=0))
    log = lake.path(RULE_STATUS_TABLE) / "_delta_log"
    waits_for_lock(lake.home.root / "locks" / f"{RULE_STATUS_TABLE}.lock",
                   lambda: status.update("r", "hash", lambda h: h.enabled()), lambda: len(list(log.glob("*.json"))))
    assert RuleStatus(spark, lake).get("r", "hash").state == OK


def test_a_failure_counted_after_an_enable_from_another_process_starts_from_the_enable(spark, lake):
    stream = RuleStatus(spark, lake)  # the stream's rules application
    for _ in range(2):
        stream.update("r", "hash", failure(QUICK, "boom"))
    assert stream.get("r", "hash").state == DISABLED
    RuleStatus(spark, lake).update("r", "hash", lambda h: h.enabled())  # `seclake rules enable` in its process
    counted = stream.update("r", "hash", failure(QUICK, "boom again"))
    assert (counted.state, counted.failures) == (FAILING, 1)  # not a third failure of the disabled run


def test_a_batch_over_its_budget_is_stopped_and_counted(spark, tmp_path, lake):
    append(spark, lake, "enriched_dns", 0, [{"event_time": "2026-11-20 12:00:00", "repeat": 400, "every": "1 second",
                                             "query": "host{i}.example.com"}], HOST_A)
    # Valid under the static limits (one literal sequence of 100,000), but 100,000 SHA-512s per row.
    slow = validate_rule(DGA.read_text().replace("f6097087-51a0-4890-829e-23f828e73b08",
                                                 "5a0b7c1e-2d3f-4e5a-8b9c-0d1e2f3a4b5c")
                         .replace("AND query LIKE '%.%'",
                                  "AND aggregate(sequence(1, 100000), 0L, "
                                  "(acc, x) -> acc + length(sha2(concat(query, x), 512))) > 0"),
                         slug="slow_rule")
    settings = QUICK.with_overrides({"rule_batch_budget": "3 seconds"})
    started = time.monotonic()
    rep = run_all(spark, lake, [slow], settings)[0]
    assert time.monotonic() - started < 120
    health = RuleStatus(spark, lake).get(slow.slug, slow.content_hash)
    assert health.state == FAILING and "ran over its budget of 3 seconds" in health.reason, rep.line()
    # Its report fails too (run-once prints FAILED and exits 1), not only "nothing written".
    assert rep.error and "slow_rule: a micro-batch ran over its budget of 3 seconds" in rep.error, rep.line()


def test_a_rule_the_application_died_in_is_charged_at_its_next_start(spark, tmp_path, lake):
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    rule = validate_rule(DGA)
    checkpoint = lake.home.checkpoint(rule.checkpoint_name)
    checkpoint.mkdir(parents=True)
    (checkpoint / RUNNING_MARKER).write_text("once")  # what a run-once killed inside this rule leaves behind
    rep = run_all(spark, lake, [rule], QUICK)[0]
    health = RuleStatus(spark, lake).get(rule.slug, rule.content_hash)
    assert (health.state, health.reason) == (FAILING, DIED) and rep.note.startswith("backing off")
    assert not (checkpoint / RUNNING_MARKER).exists()
    time.sleep(max(0.0, (health.retry_at - utc_now()).total_seconds()) + 0.5)
    rep = run_all(spark, lake, [rule])[0]
    assert rep.rows_out == {"alerts": 1} and not (checkpoint / RUNNING_MARKER).exists()
    assert RuleStatus(spark, lake).get(rule.slug, rule.content_hash).state == OK  # a good batch clears it


def test_a_death_left_in_a_version_no_longer_deployed_is_cleared_not_looked_at_for_ever(spark, lake):
    # The marker of a rule bumped (or removed) after the run-once that died in it stayed: every
    # run-once after it started a JVM to charge it, and charged nothing.
    from pipelines.rules.engine import charge_in_flight, in_flight

    old = lake.home.checkpoint("rule_dga_nxdomain_burst") / "v0-plan1"
    old.mkdir(parents=True)
    (old / RUNNING_MARKER).write_text("once")
    assert in_flight(lake, "once") == [old / RUNNING_MARKER]
    assert charge_in_flight(spark, lake, QUICK, kind="once") == []
    assert in_flight(lake, "once") == []


def test_a_run_once_death_among_several_rules_makes_suspects_probed_alone_and_a_lone_one_is_charged(spark, lake):
    """Run-once runs the rules side by side (`stages.waves`): the rules a dead run left in a batch
    become suspects, not backed off and never disabled by that death, which the next run-once
    runs alone first (`prepare_rules`); a rule left alone in a batch is charged in full."""
    pack = {rule.slug: rule for rule in scan_rules(default_rules_dir()).rules}
    a, b = pack["dga_nxdomain_burst"], pack["dns_tunneling"]
    for rule in (a, b):
        checkpoint = lake.home.checkpoint(rule.checkpoint_name)
        checkpoint.mkdir(parents=True)
        (checkpoint / RUNNING_MARKER).write_text("once")
    settings = Settings().with_overrides({"rule_max_failures": "1"})
    assert prepare_rules(spark, lake, settings) == {a.query_name, b.query_name}
    for rule in (a, b):
        health = RuleStatus(spark, lake).get(rule.slug, rule.content_hash)
        assert (health.state, health.reason) == (FAILING, DIED) and health.may_start(utc_now()), health
        assert not (lake.home.checkpoint(rule.checkpoint_name) / RUNNING_MARKER).exists()
    assert lake.exists("alerts") and lake.exists(RULE_STATUS_TABLE)

    # The probe of `a` died: only its marker is left, so it is the culprit.
    (lake.home.checkpoint(a.checkpoint_name) / RUNNING_MARKER).write_text("once")
    assert prepare_rules(spark, lake, settings) == {b.query_name}
    assert RuleStatus(spark, lake).get(a.slug, a.content_hash).state == DISABLED
    # The probe of `b` ends cleanly, with nothing to raise: cleared.
    append(spark, lake, "enriched_dns", 0, [{"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}], HOST_A)
    assert run_all(spark, lake, [b], settings)[0].error is None
    assert RuleStatus(spark, lake).get(b.slug, b.content_hash).state == OK
    assert prepare_rules(spark, lake, settings) == set()


def test_the_rules_application_starts_once_the_tables_are_up_or_after_the_wait(tmp_path, lake, monkeypatch):
    """The alert path first: `seclake stream` starts the rules' JVM after the table queries' first
    trigger, and no later than RULES_START_MAX_WAIT_SECONDS, `rules_niceness` nicer than itself. (The
    child here is a stand-in process: what is checked is when and how the parent starts and stops it.)"""
    monkeypatch.setattr(RulesApp, "command", lambda self: [sys.executable, "-c", "import time; time.sleep(120)"])
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    with RulesApp(lake, Settings().with_overrides({"rules_niceness": "7"}), 60.0) as app:
        entered = time.monotonic()
        app.check(None, entered + 1, lambda: False)
        assert app.proc is None, "started before the tables were up"
        app.check(None, entered + 2, lambda: True)
        assert app.proc is not None and app.proc.poll() is None
        assert os.getpriority(os.PRIO_PROCESS, app.proc.pid) == min(ours + 7, 19)
        child = app.proc
        app.check(None, entered + 3, lambda: True)
        assert app.proc is child, "started twice"
    assert child.poll() is not None, "still running after the stream stopped"
    with RulesApp(lake, Settings(), 60.0) as app:
        app.check(None, time.monotonic() + RULES_START_MAX_WAIT_SECONDS - 5, lambda: False)
        assert app.proc is None
        app.check(None, time.monotonic() + RULES_START_MAX_WAIT_SECONDS + 1, lambda: False)
        assert app.proc is not None and app.proc.poll() is None, "tables never up: not started after the wait"
        assert os.getpriority(os.PRIO_PROCESS, app.proc.pid) == min(ours + Settings().rules_niceness, 19)


def test_the_rules_application_is_given_the_settings_it_reads_and_takes_them(lake):
    """A Dagster run's config may change another command's setting (notify_min_severity): passed on
    as `--set`, the child would refuse it and the rules would never start."""
    from pipelines.settings import command_settings

    settings = Settings().with_overrides({"trigger_interval": "5 seconds", "notify_min_severity": "critical"})
    command = RulesApp(lake, settings, 60.0).command()
    items = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    assert items == ["trigger_interval=5 seconds"], command
    assert command_settings("stream", items).trigger_interval == "5 seconds"


def test_the_tables_are_up_once_every_running_query_has_finished_a_trigger(spark, tmp_path):
    """What the rules' application waits for: a stage without a query (the stream's end_of_input)
    must not hold it back for the whole RULES_START_MAX_WAIT_SECONDS."""
    release = threading.Event()
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
             .foreachBatch(lambda rows, batch_id: release.wait(60))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="1 second").start())
    try:
        running = [RunningQuery("end_of_input", StoppedQuery("end_of_input"), IdleWriter(None, ""), ()),
                   RunningQuery("etl", query, IdleWriter(None, ""), ())]
        assert not tables_up(running), "up before its first trigger ended"
        release.set()
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tables_up(running)
    finally:
        release.set()
        query.stop()


def test_the_stream_retries_a_failing_rule_then_disables_it_and_records_invalid_files(spark, tmp_path, lake):
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}], HOST_A)
    bad_file = casting_rule(tmp_path)
    (bad_file.parent / DGA.name).write_text(DGA.read_text())
    (bad_file.parent / "bomb.sql").write_text(DGA.read_text().replace("lower(query) AS name,",
                                                                      "sequence(1, 2000000000) AS name,"))
    manager = RuleManager(bad_file.parent)
    trigger = {"processingTime": "1 second"}
    running: list = []
    failed: list[str] = []
    try:
        first = manager.sync(spark, lake, QUICK, trigger, running)
        assert sorted(first.started) == ["rule_casts_names_to_int", "rule_dga_nxdomain_burst"]
        assert "sequence" in first.invalid["rule_bomb"]

        def disabled() -> bool:
            failed.extend(manager.sync(spark, lake, QUICK, trigger, running).failed)
            return RuleStatus(spark, lake).get("casts_names_to_int", validate_rule(bad_file).content_hash).state \
                == DISABLED

        assert wait_for(disabled, 180)
        assert failed.count("rule_casts_names_to_int") == 2
        entry = next(r for r in running if r.name == "rule_casts_names_to_int")
        assert isinstance(entry.query, StoppedQuery) and entry.query.note.startswith("disabled")
        good = next(r for r in running if r.name == "rule_dga_nxdomain_burst")
        assert good.query.isActive
        assert states(spark, lake, "bomb") == [INVALID]
        assert wait_for(lambda: any(a.rule_name.startswith("DGA") for a in lake.read(spark, "alerts").collect()))
    finally:
        for r in running:
            stop_rule(r)


def test_the_stream_retries_a_rule_whose_start_fails_and_keeps_a_rule_edited_under_its_version(
        spark, tmp_path, lake, caplog):
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}], HOST_A)
    folder = tmp_path / "rules"
    folder.mkdir()
    # Valid to the validator, refused by Spark's analysis when the query starts.
    broken = folder / "unknown_function.sql"
    broken.write_text(DGA.read_text().replace("f6097087-51a0-4890-829e-23f828e73b08",
                                              "7d0c3e52-61a4-4f0b-8d7e-2b9a51c4e6f3")
                      .replace("lower(query) AS name,", "lower_case(query) AS name,"))
    good = folder / DGA.name
    good.write_text(DGA.read_text())
    manager = RuleManager(folder)
    trigger = {"processingTime": "1 second"}
    running: list = []
    try:
        first = manager.sync(spark, lake, QUICK, trigger, running)
        assert first.summary == "started rule_dga_nxdomain_burst", first.summary  # the other did not start

        def disabled() -> bool:
            manager.sync(spark, lake, QUICK, trigger, running)
            return RuleStatus(spark, lake).get("unknown_function", validate_rule(broken).content_hash).state \
                == DISABLED

        # Retried after its back-off (a start that fails counts like a failure at run time), then disabled.
        assert wait_for(disabled, 180)
        platform = [a for a in lake.read(spark, "alerts").collect() if a.rule_id == RULE_DISABLED_ID]
        assert [a.rule_name for a in platform] == ["Rule disabled: unknown_function"], platform
        assert "UNRESOLVED_ROUTINE" in platform[0].evidence

        # The DGA rule has planned batches; its SQL edited without a new version cannot take its
        # checkpoint: the running query is kept, and the reason logged once.
        assert wait_for(lambda: any(a.rule_name.startswith("DGA") for a in lake.read(spark, "alerts").collect()))
        entry = next(r for r in running if r.name == "rule_dga_nxdomain_burst")
        good.write_text(good.read_text().replace("WHERE domains >= 20", "WHERE domains >= 25"))
        caplog.clear()
        for _ in range(2):
            assert not manager.sync(spark, lake, QUICK, trigger, running).restarted
        assert next(r for r in running if r.name == "rule_dga_nxdomain_burst") is entry and entry.query.isActive
        kept = [r.getMessage() for r in caplog.records if "keeps running" in r.getMessage()]
        assert len(kept) == 1 and "bump `version`" in kept[0], kept

        # A new version that Spark's analysis refuses is not deployed either: the running query is
        # kept (stopping it first would leave the rule detecting nothing), the error logged once.
        caplog.clear()
        v3 = DGA.read_text().replace("version: 2", "version: 3")
        good.write_text(v3.replace("lower(query) AS name,", "lower_case(query) AS name,"))
        for _ in range(2):
            assert not manager.sync(spark, lake, QUICK, trigger, running).restarted
        assert next(r for r in running if r.name == "rule_dga_nxdomain_burst") is entry and entry.query.isActive
        kept = [r.getMessage() for r in caplog.records if "keeps running" in r.getMessage()]
        assert len(kept) == 1 and "UNRESOLVED_ROUTINE" in kept[0] and "lower" in kept[0], kept
        # Its fix is deployed.
        good.write_text(v3)
        assert manager.sync(spark, lake, QUICK, trigger, running).restarted == ["rule_dga_nxdomain_burst"]
        assert next(r for r in running if r.name == "rule_dga_nxdomain_burst").query.isActive
    finally:
        for r in running:
            stop_rule(r)
