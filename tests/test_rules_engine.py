"""Rules as streaming queries: concurrent appends to one alerts table, stream == backtest,
no duplicates across re-runs and checkpoint resets, failure isolation, hot deploy."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import state_partitions
from pipelines.home import Home
from pipelines.lake.read import read_table
from pipelines.lake.registry import Lake
from pipelines.lake.sink import DeltaSink
from pipelines.query import StoppedQuery, report
from pipelines.rules.backtest import backtest, write_missing
from pipelines.rules.engine import (
    MissingInputError,
    RuleManager,
    claim_checkpoint,
    rule_stages,
    start_rule,
    stop_rule,
)
from pipelines.rules.spec import RuleError, query_name, validate_rule
from pipelines.rules.tables import ALERTS_TABLE, RULE_LATE_ROWS_ID, table_schema
from pipelines.rules.testing import expand_rows
from pipelines.settings import Settings

RULES = Path(__file__).resolve().parents[1] / "rules"
DGA = RULES / "dns" / "dga_nxdomain_burst.sql"
TUNNEL = RULES / "dns" / "dns_tunneling.sql"
AVAILABLE_NOW = {"availableNow": True}
HOST_A = {"src_ip": "10.0.1.14", "mac": "f4:8e:38:02:83:59", "device": "WS-SAL-412", "owner": "Raj Patel",
          "qtype_name": "A", "rcode_name": "NXDOMAIN"}
HOST_B = {"src_ip": "10.0.1.15", "mac": "f4:8e:38:6f:1e:4f", "device": "WS-FIN-101", "owner": "Ann Lee",
          "qtype_name": "TXT", "rcode_name": "NOERROR"}
LONG = "6a1f0e9c2b7d4e8f3a5c6b1d0e2f4a7c9b8d3e1f5a6c7b0d2e4f.9c2b7d4e8f3a5c6b1d0e.mind15.top"


def append(spark, lake: Lake, table: str, batch_id: int, items: list[dict], defaults: dict | None = None) -> None:
    rows = expand_rows(table, items, defaults)
    sink = DeltaSink(lake.home.table(table), app_id="test-input", partition_by=["event_date"])
    sink.write_batch(spark.createDataFrame(rows, table_schema(table)), batch_id)


def dga_burst(at: str, prefix: str) -> dict:
    return {"event_time": at, "repeat": 30, "every": "1 second", "query": f"{prefix}{{i}}qzx.biz"}


def tunnel(at: str) -> dict:
    return {"event_time": at, "repeat": 40, "every": "5 seconds", "query": "{i:04d}" + LONG}


def run_all(spark, lake: Lake, rules, settings: Settings = Settings()) -> list:
    """Start every rule at once (their commits race on the alerts table), wait, release."""
    started = time.monotonic()
    running = [start_rule(spark, lake, settings, AVAILABLE_NOW, rule) for rule in rules]
    for r in running:
        try:
            r.query.awaitTermination(300)
        except Exception:  # a failed query: its report carries the error (as in jobs.run_once)
            pass
    reports = [report(r, started) for r in running]
    for r in running:
        r.writer.close()
    return reports


def alerts(spark, lake: Lake) -> list:
    path = lake.home.table(ALERTS_TABLE)
    return read_table(spark, path).collect() if (path / "_delta_log").is_dir() else []


def wait_for(condition, timeout_s: float = 180.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(Home.resolve(tmp_path / "home").create())


def test_rules_stream_concurrently_match_the_backtest_and_never_duplicate(spark, lake):
    # The DGA rule as it would be without `emit: crossed`: its windows come out as the watermark
    # (2 hours; the rules declare none) closes them. The tunnel rule alerts when crossed.
    closing = re.sub(r"(?m)^emit: .*\n", "", DGA.read_text())
    rules = [validate_rule(closing, slug="dga_nxdomain_burst"), validate_rule(TUNNEL)]
    assert (rules[0].emit, rules[1].emit) == ("closed", "crossed")
    settings = Settings().with_overrides({"rule_watermark": "2 hours"})
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    append(spark, lake, "enriched_dns", 1, [tunnel("2026-11-20 10:00:00")], HOST_B)
    append(spark, lake, "enriched_dns", 2,
           [dga_burst("2026-11-20 11:10:00", "b"), dga_burst("2026-11-20 12:40:00", "c")], HOST_A)
    first = run_all(spark, lake, rules, settings)
    assert all(r.error is None for r in first), [r.line() for r in first]
    # Last event 12:40:29, watermark 2 h: the DGA window closed so far is 09:10; the tunnel crossed at 10:00.
    assert sum(r.rows_out.get(ALERTS_TABLE, 0) for r in first) == 2

    # Later data moves the watermark (2 h) past 12:45: the 12:40 burst's window closes now.
    append(spark, lake, "enriched_dns", 3, [{"event_time": "2026-11-20 15:00:00", "query": "www.example.com",
                                            "rcode_name": "NOERROR"}], HOST_A)
    second = run_all(spark, lake, rules, settings)
    assert all(r.error is None for r in second), [r.line() for r in second]
    streamed = alerts(spark, lake)
    assert sorted((a.rule_name.split()[0], str(a.window_start)) for a in streamed) == [
        ("DGA-like", "2026-11-20 09:10:00"), ("DGA-like", "2026-11-20 11:10:00"), ("DGA-like", "2026-11-20 12:40:00"),
        ("DNS", "2026-11-20 10:00:00")]

    # The backtest runs the same SQL over the tables' snapshot: the same alert ids, for every
    # window the stream's watermark (last event 15:00 - 2 h = 13:00) has closed.
    for rule in rules:
        batch = backtest(spark, lake, rule).alerts
        closed = {a["alert_id"] for a in batch if a["window_end"].strftime("%H:%M") <= "13:00"}
        assert closed == {a.alert_id for a in streamed if a.rule_id == rule.id}
    # A rule's state is in `state_partitions` (1) partitions, whatever the session's shuffle partitions (4).
    assert all(state_partitions(lake, rule.checkpoint_name) == {"1"} for rule in rules)

    # A re-run from scratch (checkpoint deleted, batch ids start again at 0) adds nothing: the
    # alerts already in the table are recognised by their ids.
    shutil.rmtree(lake.home.checkpoint(rules[0].checkpoint_name))
    third = run_all(spark, lake, rules[:1], settings)
    assert third[0].error is None and third[0].rows_out.get(ALERTS_TABLE, 0) == 0 and third[0].batches >= 1
    again = alerts(spark, lake)
    assert len(again) == len(streamed) == len({a.alert_id for a in again})
    assert all(a.event_date == a.window_start.date() and a.severity and a.mitre for a in again)


def test_a_crossed_rule_in_a_stream_runs_no_batch_without_input_interpreted_and_still_alerts(spark, lake):
    # A batch of no data after each input commit (the watermark moved) cost a rule ~0.3 CPU s on 2 cores.
    rule = validate_rule(TUNNEL)
    quiet = {"query": "www.example.com", "rcode_name": "NOERROR"}
    append(spark, lake, "enriched_dns", 0, [{"event_time": "2026-11-20 09:00:00", **quiet}], HOST_B)
    running = start_rule(spark, lake, Settings(), {"processingTime": "1 second"}, rule)
    started = datetime.now()  # local and naive, as PySpark returns a timestamp
    try:
        append(spark, lake, "enriched_dns", 1, [tunnel("2026-11-20 10:00:00")], HOST_B)
        assert wait_for(lambda: len(alerts(spark, lake)) == 1), "the crossed window raised no alert"
        # An hour later: the watermark passes the tunnel's window, which a batch of no data would evict.
        append(spark, lake, "enriched_dns", 2, [{"event_time": "2026-11-20 11:00:00", **quiet}], HOST_B)
        # Each row is read twice (itself and its attribution-watermark copy): past the first two commits' rows.
        assert wait_for(lambda: sum(p.numInputRows for p in running.query.recentProgress) > 2 * (1 + 40))
        time.sleep(4)  # a batch of no data would come right after
        inputs: dict[int, int] = {}
        for p in running.query.recentProgress:  # idle reports repeat a batch id with no input
            inputs[p.batchId] = max(inputs.get(p.batchId, 0), p.numInputRows)
        assert len(inputs) >= 2 and all(n > 0 for n in inputs.values()), inputs
        # Its batches run interpreted: Spark compiled each one's code anew, the watermark a constant in it.
        execution = running.query._jsq.streamingQuery().lastExecution()
        assert "*(" not in execution.executedPlan().toString()  # no whole-stage code (Spark marks it *(n))
        assert execution.sparkSession().conf().get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    finally:
        stop_rule(running)
        running.writer.close()
    [alert] = alerts(spark, lake)
    assert alert.rule_id == rule.id
    # Set by the writer when it committed (the streaming plan leaves it NULL: alerts.detected).
    assert alert.detected_at is not None and started <= alert.detected_at <= datetime.now(), alert.detected_at


def test_a_failing_rule_is_isolated_and_reported(spark, lake):
    good = validate_rule(DGA)
    text = DGA.read_text()
    breaks_at_run_time = validate_rule(
        text.replace("f6097087-51a0-4890-829e-23f828e73b08", "0f6d1b7a-5c6e-4b8a-9a62-0c4a5e0f1d21")
            .replace("lower(query) AS name,", "CAST(query AS INT) AS name,"), slug="casts_names_to_int")
    no_input = validate_rule((RULES / "conn" / "internal_port_scan.sql"))
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}], HOST_A)
    reports = {r.name: r for r in run_all(spark, lake, [breaks_at_run_time, no_input, good])}
    lines = [r.line() for r in reports.values()]
    assert reports["rule_dga_nxdomain_burst"].error is None, lines
    assert reports["rule_dga_nxdomain_burst"].rows_out == {ALERTS_TABLE: 1}, lines
    error = reports["rule_casts_names_to_int"].error or ""
    assert error.startswith("rule casts_names_to_int failed in batch ") and "CAST_INVALID_INPUT" in error, lines
    assert "input table(s) ['enriched_conn'] do not exist yet" in reports["rule_internal_port_scan"].error
    assert len(alerts(spark, lake)) == 1


def test_invalid_rules_become_failed_stages_and_checkpoints_refuse_changed_logic(spark, tmp_path, lake):
    (tmp_path / "rules" / "dns").mkdir(parents=True)
    shutil.copy(DGA, tmp_path / "rules" / "dns" / DGA.name)
    (tmp_path / "rules" / "dns" / "broken.sql").write_text("/* name: x */ SELECT 1")
    stages = {s.name: s.start for s in rule_stages(tmp_path / "rules")}
    assert list(stages) == ["rule_broken", "rule_dga_nxdomain_burst"]  # by name, the invalid file among them
    failed = stages["rule_broken"](spark, lake, Settings(), AVAILABLE_NOW)
    assert isinstance(failed.query, StoppedQuery) and "missing or empty" in str(failed.query.exception())
    assert "FAILED" in report(failed, time.monotonic()).line()

    rule = validate_rule(DGA)
    checkpoint = lake.home.checkpoint(rule.checkpoint_name)
    app_id = claim_checkpoint(checkpoint, rule)
    assert claim_checkpoint(checkpoint, rule) == app_id and app_id.startswith(f"rule:{rule.id}:v{rule.version}:")
    # An edit under the same version takes a checkpoint that never planned a batch (the first
    # text failed to start: nothing was written under its app id) ...
    edited = validate_rule(DGA.read_text().replace("domains >= 20", "domains >= 25"), slug=rule.slug)
    assert claim_checkpoint(checkpoint, edited) == app_id
    # ... and is refused once a batch was planned: its alerts came from the other text.
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text("v1\n")
    with pytest.raises(RuleError, match="bump `version`"):
        claim_checkpoint(checkpoint, rule)


def test_a_copy_with_the_deployed_rules_id_is_refused_and_a_stale_invalid_verdict_ends(spark, tmp_path, lake):
    from pipelines.rules.status import rule_status

    folder = tmp_path / "rules" / "dns"
    folder.mkdir(parents=True)
    shutil.copy(DGA, folder / DGA.name)
    copy = folder / "a_copy.sql"  # first in path order, made later: the newcomer
    shutil.copy(DGA, copy)
    os.utime(copy, (time.time() + 60, time.time() + 60))
    stages = {s.name: s.start for s in rule_stages(tmp_path / "rules")}
    refused = stages["rule_a_copy"](spark, lake, Settings(), AVAILABLE_NOW)
    assert "duplicate id" in str(refused.query.exception()) and DGA.name in str(refused.query.exception())
    # The deployed rule once judged invalid by such a pack (older seclake kept the copy) runs again
    # once it validates, instead of being held back until its file changes.
    rule = validate_rule(DGA)
    status = rule_status(spark, lake)
    status.update(rule.slug, rule.content_hash, lambda h: h.invalid("duplicate id (also in a_copy.sql)"))
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    [ran] = run_all(spark, lake, [rule])
    assert ran.error is None and ran.note is None and ran.batches >= 1, ran.line()
    assert rule_status(spark, lake).get(rule.slug, rule.content_hash).state == "ok"


def test_a_file_refused_for_its_duplicate_name_is_a_stage_of_its_own(spark, tmp_path, lake):
    # Both were stages named rule_dns_tunneling: run-once listed the name twice.
    from pipelines.rules.status import rule_status

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(TUNNEL, tmp_path / "a" / TUNNEL.name)
    other = re.sub(r"(?m)^id: .*$", "id: 11111111-2222-4333-8444-555555555555", TUNNEL.read_text())
    (tmp_path / "b" / TUNNEL.name).write_text(other)
    os.utime(tmp_path / "b" / TUNNEL.name, (time.time() + 60, time.time() + 60))
    stages = {s.name: s.start for s in rule_stages(tmp_path)}
    assert list(stages) == ["rule_b_dns_tunneling", "rule_dns_tunneling"]
    refused = stages["rule_b_dns_tunneling"](spark, lake, Settings(), AVAILABLE_NOW)
    assert refused.name == "rule_b_dns_tunneling" and "duplicate rule file name" in str(refused.query.exception())
    # Health is kept per file name: the refused file's would have been the deployed rule's.
    assert "dns_tunneling" not in rule_status(spark, lake).all()


@pytest.mark.parametrize("copy", ["dns/zz_draft.sql", "custom/dga_nxdomain_burst.sql"])
def test_a_running_rule_keeps_its_id_when_edited_after_a_copy_of_it_was_made(spark, tmp_path, lake, copy):
    # By file times alone the edited original was the newer file: refused, while the copy started
    # as a second query with the same rule id (or, under the same file name, took the rule's query).
    from pipelines.rules.status import rule_status

    folder = tmp_path / "rules" / "dns"
    folder.mkdir(parents=True)
    original = folder / DGA.name
    shutil.copy(DGA, original)
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    manager = RuleManager(tmp_path / "rules")
    running: list = []
    try:
        assert manager.sync(spark, lake, Settings(), {"processingTime": "2 seconds"}, running).started == [
            "rule_dga_nxdomain_burst"]
        (tmp_path / "rules" / copy).parent.mkdir(exist_ok=True)
        shutil.copy(original, tmp_path / "rules" / copy)
        original.write_text(original.read_text().replace("severity: medium", "severity: high"))
        os.utime(original, (time.time() + 60, time.time() + 60))
        synced = manager.sync(spark, lake, Settings(), {"processingTime": "2 seconds"}, running)
        assert synced.restarted == ["rule_dga_nxdomain_burst"] and not synced.started, synced
        refused = query_name(Path(copy).with_suffix("").as_posix() if Path(copy).stem == original.stem
                             else Path(copy).stem)
        assert synced.invalid[refused].endswith(
            f"the id of the running {original}: give this rule an id of its own "
            "(python -c 'import uuid; print(uuid.uuid4())')"), synced.invalid
        rule_id = validate_rule(DGA).id
        [deployed] = [r for r in running if getattr(r.writer, "rule", None) and r.writer.rule.id == rule_id]
        assert deployed.writer.rule.severity == "high" and deployed.writer.rule.path == original
        newest = rule_status(spark, lake).all().get("dga_nxdomain_burst")
        assert newest is None or newest.content_hash == deployed.writer.content_hash, newest
    finally:
        for r in running:
            stop_rule(r)


def test_a_backtest_that_writes_waits_for_the_rules_batch_between_its_look_and_its_commit(spark, lake, tmp_path,
                                                                                          monkeypatch):
    # A backtest (or the intel sweep) that committed an alert between a rule batch's look at `alerts`
    # and its commit had that alert appended a second time by the batch.
    import threading

    from pipelines.rules.backtest import _loader, run_batch
    from pipelines.rules.engine import AlertWriter
    from pipelines.rules.status import rule_status

    rule = validate_rule(DGA)
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    lake.ensure(spark, ALERTS_TABLE)
    batch = run_batch(spark, rule, _loader(lake, rule, None, None)).drop("match_key")
    writer = AlertWriter(lake, rule, "rule-test", rule_status(spark, lake), Settings(), tmp_path / "marker")
    own, looked, backtested = writer.sink.write_batch, threading.Event(), threading.Event()
    result: dict = {}

    def backtest_write() -> None:
        looked.wait(120)
        result["backtest"] = write_missing(spark, lake, rule)
        backtested.set()

    def commit_late(df, batch_id):
        looked.set()
        backtested.wait(15)  # the backtest's commit lands here unless it waits for this batch
        return own(df, batch_id)

    monkeypatch.setattr(writer.sink, "write_batch", commit_late)
    other = threading.Thread(target=backtest_write)
    other.start()
    writer(batch, 0)
    other.join(300)
    assert result["backtest"] == (1, 0)  # found, and already there: the batch committed it first
    assert [(r.rule_id, r.detected_at is not None) for r in alerts(spark, lake)] == [(rule.id, True)]


def test_the_running_rules_keep_running_while_their_folder_is_gone(spark, tmp_path, lake, caplog):
    # scan_rules' "rules folder ... does not exist" stopped the rules application, and its parent's
    # charge_in_flight raised the same: the whole stream stopped.
    from pipelines.rules.engine import charge_in_flight

    folder = tmp_path / "rules" / "dns"
    folder.mkdir(parents=True)
    shutil.copy(DGA, folder / DGA.name)
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    manager = RuleManager(tmp_path / "rules")
    trigger = {"processingTime": "2 seconds"}
    running: list = []
    try:
        assert manager.sync(spark, lake, Settings(), trigger, running).started == ["rule_dga_nxdomain_burst"]
        (tmp_path / "rules").rename(tmp_path / "moved")
        with caplog.at_level("ERROR", logger="seclake.rules"):
            for _ in range(2):
                gone = manager.sync(spark, lake, Settings(), trigger, running)
                assert not gone.stopped and not gone.started, gone
        assert [r.message for r in caplog.records] == [
            f"rules folder {tmp_path / 'rules'} does not exist: the running rules keep running as they are until it "
            "is back"]
        assert [r.query.isActive for r in running] == [True]
        assert charge_in_flight(spark, lake, Settings(), tmp_path / "rules") == []
        (tmp_path / "moved").rename(tmp_path / "rules")
        back = manager.sync(spark, lake, Settings(), trigger, running)
        assert not (back.started or back.restarted or back.stopped), back
    finally:
        for r in running:
            stop_rule(r)


def test_a_rule_edited_under_its_version_is_invalid_at_once_not_idle_and_not_failing(spark, lake):
    from pipelines.rules.engine import rule_stage
    from pipelines.rules.status import rule_status

    rule = validate_rule(DGA)
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    [ran] = run_all(spark, lake, [rule])
    assert ran.error is None and ran.batches >= 1, ran.line()
    edited = validate_rule(DGA.read_text().replace("domains >= 20", "domains >= 25"), slug=rule.slug)
    # With no new input the rule as it was is idle; the edited one is not: its start says why.
    assert rule_stage(rule).idle(lake, Settings()) and not rule_stage(edited).idle(lake, Settings())
    for _ in range(4):  # more than max_failures: an edit is not a run-time failure and never disables
        refused = start_rule(spark, lake, Settings(), AVAILABLE_NOW, edited)
        assert isinstance(refused.query, StoppedQuery) and "bump `version`" in str(refused.query.exception())
    health = rule_status(spark, lake).get(edited.slug, edited.content_hash)
    assert (health.state, health.failures) == ("invalid", 0) and "bump `version`" in (health.reason or "")


def test_rule_manager_deploys_changes_without_touching_other_queries(spark, tmp_path, lake):
    folder = tmp_path / "rules" / "dns"
    folder.mkdir(parents=True)
    shutil.copy(DGA, folder / DGA.name)
    shutil.copy(TUNNEL, folder / TUNNEL.name)
    manager = RuleManager(tmp_path / "rules")
    settings = Settings()
    trigger = {"processingTime": "2 seconds"}
    running: list = []
    try:
        # Nothing has written enriched_dns yet: both rules wait, and are retried on the next sync.
        first = manager.sync(spark, lake, settings, trigger, running)
        assert sorted(first.started) == ["rule_dga_nxdomain_burst", "rule_dns_tunneling"]
        assert all(isinstance(r.query.exception(), MissingInputError) for r in running)
        append(spark, lake, "enriched_dns", 0,
               [dga_burst("2026-11-20 09:10:00", "a"), {"event_time": "2026-11-20 12:00:00", "query": "x.example.com"}],
               HOST_A)
        retried = manager.sync(spark, lake, settings, trigger, running)
        assert sorted(retried.retried) == ["rule_dga_nxdomain_burst", "rule_dns_tunneling"] and not retried.restarted
        assert retried.summary.startswith("started now that their input tables exist rule_")
        assert all(r.query.isActive for r in running)
        assert not manager.sync(spark, lake, settings, trigger, running)  # nothing changed: nothing done
        tunnel_query = next(r for r in running if r.name == "rule_dns_tunneling").query

        # v3 of the DGA rule: restarted on its own checkpoint; the tunnelling query untouched.
        (folder / DGA.name).write_text(DGA.read_text().replace("version: 2", "version: 3"))
        second = manager.sync(spark, lake, settings, trigger, running)
        assert second.restarted == ["rule_dga_nxdomain_burst"] and not second.started and not second.stopped
        assert second.summary == "restarted rule_dga_nxdomain_burst"
        assert next(r for r in running if r.name == "rule_dns_tunneling").query is tunnel_query
        assert next(r for r in running if r.name == "rule_dga_nxdomain_burst").writer.rule.version == 3

        # An edit that breaks the file keeps the running version; a new invalid file starts nothing.
        (folder / TUNNEL.name).write_text("/* broken */ SELECT 1")
        (folder / "new_rule.sql").write_text("SELECT 1")
        third = manager.sync(spark, lake, settings, trigger, running)
        assert not third and sorted(third.invalid) == ["rule_dns_tunneling", "rule_new_rule"] and not third.summary
        assert next(r for r in running if r.name == "rule_dns_tunneling").query is tunnel_query
        assert tunnel_query.isActive

        # Removing a file stops its query.
        (folder / TUNNEL.name).unlink()
        (folder / "new_rule.sql").unlink()
        fourth = manager.sync(spark, lake, settings, trigger, running)
        assert fourth.stopped == ["rule_dns_tunneling"] and not tunnel_query.isActive
        assert fourth.summary == "stopped rule_dns_tunneling"
        assert [r.name for r in running] == ["rule_dga_nxdomain_burst"]

        # v3 reads the table from its own checkpoint: the burst is alerted again, as v3.
        assert wait_for(lambda: any(a.rule_version == 3 for a in alerts(spark, lake)))
    finally:
        for r in running:
            stop_rule(r)


def test_a_rule_holds_its_watermark_for_the_rows_attribution_has_still_to_write(spark, lake):
    # A backlog caught up: attribution commits the attributed rows of hours at once, and the
    # unattributed rows of the same hours a batch later, once its watermark passes them. Each
    # commit's rows carry that watermark; the rule must not drop the second commit's rows (as in
    # the late-events test below, where the rows carry none and are dropped).
    rule = validate_rule(DGA)
    settings = Settings().with_overrides({"rule_watermark": "10 minutes"})
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:40:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "www.example.com",
                                             "rcode_name": "NOERROR"}],
           {**HOST_A, "attribution_watermark": "2026-11-20 09:00:00"})
    [first] = run_all(spark, lake, [rule], settings)
    assert first.error is None and first.rows_out.get(ALERTS_TABLE) == 1
    assert first.watermark.startswith("2026-11-20T09:00:00"), first.watermark  # not 11:50: held
    unattributed = {**HOST_A, "src_ip": "10.0.1.11", "mac": None, "device": None, "owner": None,
                    "attribution_watermark": "2026-11-20 11:50:00"}
    append(spark, lake, "enriched_dns", 1, [dga_burst("2026-11-20 10:00:00", "u")], unattributed)
    [second] = run_all(spark, lake, [rule], settings)
    assert second.error is None and second.late_rows == 0 and second.rows_out.get(ALERTS_TABLE) == 1
    found = {a.src_ip: str(a.window_start) for a in alerts(spark, lake) if a.rule_id == rule.id}
    assert found == {"10.0.1.14": "2026-11-20 09:40:00", "10.0.1.11": "2026-11-20 10:00:00"}, found
    assert not [a for a in alerts(spark, lake) if a.rule_id == RULE_LATE_ROWS_ID]


def test_a_backtest_that_writes_stops_before_its_append_when_a_rollback_started_meanwhile(spark, lake,
                                                                                         monkeypatch):
    # It checked only at its start: a rollback begun while the backtest ran would RESTORE `alerts`
    # under its append.
    import pipelines.rules.backtest as backtest_module
    from pipelines.operations.running import PENDING, RollbackPending

    rule = validate_rule(DGA)
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    evaluate = backtest_module.run_batch

    def rollback_begins(*args, **kwargs):
        found = evaluate(*args, **kwargs)
        (lake.home.root / PENDING).write_text(json.dumps({"command": "seclake rollback alerts --to-version 0"}))
        return found

    monkeypatch.setattr(backtest_module, "run_batch", rollback_begins)
    with pytest.raises(RollbackPending, match="`seclake rollback alerts --to-version 0` finishes it; "
                                              "then add dga_nxdomain_burst's missing alerts"):
        write_missing(spark, lake, rule)
    assert not [a for a in alerts(spark, lake) if a.rule_id == rule.id]


def test_late_events_are_counted_and_a_backtest_that_writes_adds_their_alert_once(spark, lake):
    rule = validate_rule(DGA)
    settings = Settings().with_overrides({"rule_watermark": "10 minutes"})
    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a"),
                                            {"event_time": "2026-11-20 12:00:00", "query": "www.example.com",
                                             "rcode_name": "NOERROR"}], HOST_A)
    [first] = run_all(spark, lake, [rule], settings)
    assert first.error is None and first.rows_out.get(ALERTS_TABLE) == 1
    # A burst at 10:00 lands after the watermark (11:50) passed it: dropped by the query, counted
    # (as Spark counts them: rows reaching the state store, here its 30 rows pre-aggregated to 1).
    append(spark, lake, "enriched_dns", 1, [dga_burst("2026-11-20 10:00:00", "late")], HOST_A)
    [second] = run_all(spark, lake, [rule], settings)
    assert second.error is None and second.late_rows >= 1 and not second.rows_out.get(ALERTS_TABLE)
    # Not silent: a platform alert names the rule and the rows its watermark dropped.
    [notice] = [a for a in alerts(spark, lake) if a.rule_id == RULE_LATE_ROWS_ID]
    assert notice.rule_name == f"Rule dropped late rows: {rule.slug}", notice.rule_name
    assert json.loads(notice.details)["late_rows"] == second.late_rows
    assert "older than its watermark 2026-11-20 11:50:00 UTC" in notice.evidence, notice.evidence
    # Re-running its hour adds its alert, once; the 09:10 alert is already there.
    start, end = datetime(2026, 11, 20, 9, tzinfo=timezone.utc), datetime(2026, 11, 20, 11, tzinfo=timezone.utc)
    assert write_missing(spark, lake, rule, start, end) == (2, 1)
    assert write_missing(spark, lake, rule, start, end) == (2, 0)
    found = [a for a in alerts(spark, lake) if a.rule_id == rule.id]
    assert len({a.alert_id for a in found}) == len(found) == 2
    assert sorted(str(a.window_start) for a in found) == ["2026-11-20 09:10:00", "2026-11-20 10:00:00"]
    # A diff names its sides: a version needing 40 names a burst raises neither burst (30 names each),
    # so against it the deployed rule's two alerts are new, and the other way round removed.
    text = DGA.read_text()
    assert "WHERE domains >= 20 " in text and f"version: {rule.version}\n" in text
    stricter = validate_rule(text.replace("WHERE domains >= 20 ", "WHERE domains >= 40 ")
                             .replace(f"version: {rule.version}\n", f"version: {rule.version + 1}\n"),
                             slug="dga_nxdomain_burst")
    diff = backtest(spark, lake, rule, start=start, end=end, against=stricter)
    assert (len(diff.new), len(diff.removed)) == (2, 0)
    assert f"dga_nxdomain_burst.sql v{rule.version} against dga_nxdomain_burst v{rule.version + 1}: 2 new" in (
        "\n".join(diff.lines()))
    reverse = backtest(spark, lake, stricter, start=start, end=end, against=rule)
    assert (len(reverse.alerts), len(reverse.new), len(reverse.removed)) == (0, 0, 2)
    # A version compared with that Spark refuses is named, at its own line: "rule <the draft> fails" before.
    broken = validate_rule(text.replace("lower(query) AS name", "lowr(query) AS name", 1)
                           .replace(f"version: {rule.version}\n", f"version: {rule.version + 2}\n"),
                           slug="dga_nxdomain_burst")
    with pytest.raises(ValueError, match=rf"^the version compared with, dga_nxdomain_burst v{rule.version + 2}, "
                                         r"fails on the tables: .*LOWR.*did you mean lower\(\)\?"):
        backtest(spark, lake, stricter, start=start, end=end, against=broken)


def test_a_rule_whose_table_nothing_wrote_yet_waits_beside_the_end_of_input_mark(spark, tmp_path):
    """A home without IDS logs: run-once's end_of_input exists, enriched_ids_alerts never does.
    The IDS rule waits (a note, no error: run-once exits 0, Dagster's `rules` op succeeds)."""
    from pipelines.rules.engine import rule_stage
    from pipelines.rules.pack import scan_rules
    from pipelines.stages import run_unless_idle

    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, "end_of_input")
    rule = next(r for r in scan_rules(Path(__file__).resolve().parents[1] / "rules").rules
                if r.slug == "high_severity_ids_alert")
    stage = rule_stage(rule)
    assert "end_of_input" in stage.reads and not lake.exists("enriched_ids_alerts")
    rep = run_unless_idle(lambda: spark, lake, Settings(), stage)
    assert rep.error is None and rep.note == "waiting for input: no enriched_ids_alerts yet (not started)", rep.line()


def test_rule_health_is_read_by_spark_from_a_status_table_delta_rs_cannot_read_alone(spark, lake):
    from delta.tables import DeltaTable

    from pipelines.lake.log import read_columns
    from pipelines.rules.status import RuleStatus, recorded_health, utc_now

    status = RuleStatus(spark, lake)
    status.update("r", "hash", lambda h: h.failed("boom", utc_now(), max_failures=3, retry_s=60))
    path = lake.path("rule_status")
    DeltaTable.forPath(spark, str(path)).addFeatureSupport("deletionVectors")
    with pytest.raises(LookupError, match="deletion vectors"):
        read_columns(path, ["rule"])
    health = recorded_health(lake, lambda: spark)["r"]
    assert (health.state, health.failures, health.reason) == ("failing", 1, "boom")
    assert health.retry_at is not None and health.retry_at.tzinfo is not None and health.retry_at > utc_now()


def test_a_stopped_rule_query_is_freed_in_the_jvm(spark, lake):
    """The JVM's query holds its writer (the foreachBatch function); a writer holding its query
    back kept every stopped query, with its plans, alive in the JVM: the test JVM's heap filled."""
    import gc

    append(spark, lake, "enriched_dns", 0, [dga_burst("2026-11-20 09:10:00", "a")], HOST_A)
    running = start_rule(spark, lake, Settings(), AVAILABLE_NOW, validate_rule(DGA))
    held = spark._jvm.java.lang.ref.WeakReference(running.query._jsq)
    running.query.awaitTermination(300)
    running.writer.close()
    del running

    def freed() -> bool:
        gc.collect()  # py4j lets go of a Java object once its Python proxy is collected
        spark._jvm.System.gc()
        return held.get() is None

    assert wait_for(freed, 30)
