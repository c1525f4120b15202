"""Operator commands: rollback after a bad deploy ends equal to a clean run; checkpoint rewinds;
the stream marker; retention's dry run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines.checkpoint import newest
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.log import commits
from pipelines.lake.registry import Lake
from pipelines.operations.rollback import (
    RollbackPlan,
    TableStep,
    _history,
    _kept_batch,
    apply_plan,
    plan_rollback,
    rewind_checkpoint,
    rollback,
)
from pipelines.operations.running import (
    LOCK,
    PENDING,
    STREAM,
    HomeBusy,
    RollbackPending,
    running_stream,
    writer_lock,
)
from pipelines.settings import Settings
from pipelines.stages import stages

SETTINGS = Settings(max_files_per_trigger=2)  # several ETL batches from a small home
COMPARED = [n for n in Lake.names() if n != "late_events"]  # late_events logs per-batch drops: batching-dependent


def counts(spark, lake: Lake) -> dict[str, int]:
    return {name: lake.read(spark, name).count() for name in COMPARED if lake.exists(name)}


def alert_ids(spark, lake: Lake) -> list[str]:
    return sorted(r.alert_id for r in lake.read(spark, "alerts").select("alert_id").collect())


def processed_home(spark, tmp_path, hours: float = 0.5) -> tuple[Lake, dict[str, int], list[str]]:
    """`hours` (half an hour) of 5 hosts after one run-once: its lake, the tables' counts and the alert ids."""
    from sample_data.generator import generate

    home = Home.resolve(tmp_path / "home")
    generate(home.root, hours=hours, hosts=5, seed=23)
    lake = Lake(home.create())
    assert not any(r.error for r in run_once(spark, lake, SETTINGS))
    return lake, counts(spark, lake), alert_ids(spark, lake)


def test_rollback_cascade_after_a_bad_deploy_ends_equal_to_a_clean_run(spark, tmp_path):
    lake, clean, clean_alerts = processed_home(spark, tmp_path)

    # All of it on a copy of the processed home, the original gone: the ETL checkpoint's record of
    # the landing files it read follows the move (bronze would otherwise hold batch 0 twice).
    moved = Home.resolve(tmp_path / "moved")
    shutil.copytree(lake.home.root, moved.root)
    shutil.rmtree(lake.home.root)
    lake = Lake(moved)

    # The bad deploy: the ETL's last batch wrote wrong rows into silver_dns (as a parser bug would),
    # committed under the ETL's writer id, then read by enriched_dns and the DNS rules. That batch
    # held no DNS (two files per batch), so silver_dns has no commit of it yet.
    last = newest(lake.home.checkpoint("etl"), committed=True)
    dns_batches = [c["batch_id"] for c in commits(lake.path("silver_dns")) if c["app_id"] == "etl"]
    assert last is not None and max(dns_batches) < last
    wrong = (lake.read(spark, "silver_dns").limit(40)
             .withColumn("event_id", F.concat(F.lit("bad-"), F.col("event_id")))
             .withColumn("query", F.lit("x" * 60 + ".evil.example")))
    lake.sink("silver_dns", app_id="etl").write_batch(wrong, last)
    downstream = [s.name for s in stages() if "silver_dns" in s.reads or "enriched_dns" in s.reads]
    run_once(spark, lake, SETTINGS, only=downstream)
    assert lake.read(spark, "silver_dns").count() == clean["silver_dns"] + 40
    # Meanwhile seclake disabled a rule: its platform alert is not the rules' output, and stays.
    from pipelines.rules.status import append_platform_alerts, platform_alert, platform_alerts
    from pipelines.rules.tables import RULE_DISABLED_ID

    disabled = platform_alert("f" * 32, RULE_DISABLED_ID, "Rule disabled: dns_tunneling", "high", "s", "{}",
                              datetime(2026, 11, 20, 1, tzinfo=timezone.utc))
    append_platform_alerts(lake, platform_alerts(spark, lake, [disabled]))

    versions = {n: lake.read(spark, n).count() for n in ("silver_dns",)}
    plan = rollback(None, lake, "silver_dns", 0, cascade=True, dry_run=True)
    text = "\n".join(plan.lines())
    assert "checkpoint etl" in text and f"rewind to batch {last - 1}" in text and "enriched_dns" in text
    # late_events, written by attribution's four queries, is emptied by their resets: each named, not the last seen.
    assert "(dhcp_leases, enriched_conn, enriched_dns, enriched_ids_alerts are reset)" in text, text
    assert {n: lake.read(spark, n).count() for n in ("silver_dns",)} == versions  # the dry run changed nothing

    done: list[str] = []  # each step as it is done (the command's progress lines)
    rollback(spark, lake, "silver_dns", 0, cascade=True, on_step=lambda step: done.append(step.done()))
    assert len(done) == len(plan.steps()) and "silver_dns at version 0" in done
    assert f"checkpoint etl rewound to batch {last - 1}" in done and done.index("silver_dns at version 0") < done.index(
        f"checkpoint etl rewound to batch {last - 1}")  # tables first
    assert lake.read(spark, "silver_dns").where(F.col("event_id").startswith("bad-")).count() == 0
    reports = run_once(spark, lake, SETTINGS)
    assert not any(r.error for r in reports), [(r.name, r.error) for r in reports if r.error]

    assert {**counts(spark, lake), "alerts": counts(spark, lake)["alerts"] - 1} == clean
    alerts = lake.read(spark, "alerts")
    assert alert_ids(spark, lake) == sorted([*clean_alerts, "f" * 32])
    assert alerts.select("alert_id").distinct().count() == alerts.count()


def test_a_rollback_interrupted_after_its_first_restore_and_run_again_ends_equal_to_a_clean_run(
        spark, tmp_path, monkeypatch):
    # docs/operations.md: "Interrupted half way? Run the same command again." Planned afresh, once the
    # table named was restored the second plan found no batch of the ETL to undo: it rewound no
    # checkpoint and reset no other table, and the batches after version 0 were never read again.
    from pipelines.lake import admin

    lake, clean, clean_alerts = processed_home(spark, tmp_path)
    restore, restored = admin.restore, []

    def restore_then_die(*args, **kwargs):
        restore(*args, **kwargs)
        restored.append(args[1])
        raise KeyboardInterrupt("killed after the first restore")

    # The ETL table with the most batches, back to its first: the rest of the ETL's batches are undone.
    table = max(("bronze_zeek", "bronze_suricata", "silver_conn", "silver_dns"),
                key=lambda t: len(commits(lake.path(t))))
    assert len(commits(lake.path(table))) >= 2
    plan = rollback(None, lake, table, 0, cascade=True, dry_run=True)
    assert plan.checkpoints and len(plan.tables) > 1, plan.lines()
    monkeypatch.setattr(admin, "restore", restore_then_die)
    with pytest.raises(KeyboardInterrupt):
        rollback(spark, lake, table, 0, cascade=True)
    monkeypatch.setattr(admin, "restore", restore)
    assert len(restored) == 1
    # A run-once does not write into the half-rolled-back home; another rollback is refused naming this one.
    with pytest.raises(HomeBusy, match=f"`seclake rollback {table} --to-version 0 --cascade` finishes it"):
        run_once(spark, lake, SETTINGS)
    with pytest.raises(ValueError, match="a rollback was interrupted"):
        rollback(spark, lake, table, None, cascade=True)
    # While a rollback runs its plan is there too: the appends below are told it runs, not that it was interrupted.
    from pipelines.operations.running import ROLLBACK, refuse_while_rolling_back

    with writer_lock(lake.home, ROLLBACK):
        with pytest.raises(HomeBusy, match="seclake rollback .* is writing .*: wait for it to finish before x") as busy:
            refuse_while_rolling_back(lake.home, "x")
        assert not isinstance(busy.value, RollbackPending)
    # Nor do the appends to alerts that take no writer lock: the RESTORE of alerts, done again, would undo them.
    from pipelines.intel.store import load
    from pipelines.rules.backtest import write_missing
    from pipelines.rules.pack import default_rules_dir, scan_rules

    rule = next(r for r in scan_rules(default_rules_dir()).rules if r.slug == "dns_tunneling")
    with pytest.raises(RollbackPending, match="finishes it; then add dns_tunneling's missing alerts"):
        write_missing(spark, lake, rule)
    feed = tmp_path / "feed.txt"
    feed.write_text("evil.test\n")
    with pytest.raises(RollbackPending, match="finishes it; then intel load feed.txt"):
        load(spark, lake, feed)
    assert not lake.exists("indicators") or lake.read(spark, "indicators").count() == 0
    assert "resumed" in " ".join(rollback(spark, lake, table, 0, cascade=True).notes)
    assert not (lake.home.root / PENDING).exists()
    reports = run_once(spark, lake, SETTINGS)
    assert not any(r.error for r in reports), [(r.name, r.error) for r in reports if r.error]
    assert counts(spark, lake) == clean
    assert alert_ids(spark, lake) == clean_alerts


def test_a_checkpoint_deleted_alone_is_refused_and_an_empty_rollback_rebuilds_the_stage(spark, tmp_path):
    lake, clean, clean_alerts = processed_home(spark, tmp_path)
    assert clean["enriched_conn"] > 0

    # "Starting enriched_conn afresh" by deleting its checkpoint alone: from a new checkpoint its
    # batch ids restart at 0, which the table's txn already holds, so its sink would skip them.
    shutil.rmtree(lake.home.checkpoint("enriched_conn"))
    refused = {r.name: r for r in run_once(spark, lake, SETTINGS)}["enriched_conn"]
    assert refused.error and "is new, but enriched_conn already holds" in refused.error
    assert "seclake rollback enriched_conn --empty --cascade" in refused.error
    assert counts(spark, lake) == clean

    plan = rollback(spark, lake, "enriched_conn", None, cascade=True)
    assert plan.lines()[0] == "rollback enriched_conn to empty with --cascade:"
    assert lake.read(spark, "enriched_conn").count() == 0 and lake.read(spark, "alerts").count() == 0
    assert not any(r.error for r in run_once(spark, lake, SETTINGS))
    assert counts(spark, lake) == clean
    assert alert_ids(spark, lake) == clean_alerts


def test_rollback_after_a_compaction_and_after_a_rollback_keeps_what_it_can(spark, tmp_path):
    from pipelines.lake.maintenance import compact

    lake, clean, clean_alerts = processed_home(spark, tmp_path, hours=1.5)  # two hourly DNS files
    writes = [c for c in commits(lake.path("silver_dns")) if c["operation"] == "WRITE"]
    assert len(writes) >= 2
    last, first = max(c["version"] for c in writes), min(c["version"] for c in writes)
    run_once(spark, lake, SETTINGS)  # the stateful queries' last batch without data
    for name in (n for n in Lake.names() if lake.exists(n)):
        compact(spark, lake.path(name))
    # A compaction is no new input: the next run-once starts no stage (it started all 17).
    reports = run_once(spark, lake, SETTINGS)
    assert [r.name for r in reports if not r.skipped] == []
    # The last append holds the rows the compaction kept: nothing to do (it reset every ETL table).
    plan = plan_rollback(lake, "silver_dns", last, cascade=True)
    assert plan.lines()[1:] == ["  nothing to do", f"  note: version {last} holds the same rows as version "
                                f"{last + 1}: the commits after it (OPTIMIZE) change no data"]
    # Without --cascade, a rollback that changes what other queries stream from is refused by name.
    with pytest.raises(ValueError, match="enriched_dns.* stream from: add --cascade"):
        plan_rollback(lake, "silver_dns", first)

    rollback(spark, lake, "silver_dns", first, cascade=True)
    assert not any(r.error for r in run_once(spark, lake, SETTINGS))
    assert counts(spark, lake) == clean and alert_ids(spark, lake) == clean_alerts
    # The RESTORE's version holds the ETL's first batch again, later batches reprocessed since: the
    # ETL is cut back to that batch (it was reset, as if the version held batches now gone).
    restored = next(c["version"] for c in commits(lake.path("silver_dns")) if c["operation"] == "RESTORE")
    kept = _kept_batch(_history(lake, "silver_dns"), "etl", first)
    lines = "\n".join(plan_rollback(lake, "silver_dns", restored, cascade=True).lines())
    assert f"checkpoint etl             rewind to batch {kept}" in lines and "etl is reset" not in lines, lines
    # The RESTORE's version and the txn reset right after it hold the same rows: alerts go back to the
    # same version for both. From the RESTORE's, alerts went back to before that first rollback, its
    # undone batches' alerts included (the reset, committed before alerts were restored, was the cut).
    reset = next(c for c in commits(lake.path("silver_dns")) if c["version"] == restored + 1)
    assert reset["operation"] != "WRITE" and not reset["changes_data"], reset

    def alerts_target(version: int) -> int | None:
        return next(t.target for t in plan_rollback(lake, "silver_dns", version, cascade=True).tables
                    if t.table == "alerts")

    assert alerts_target(restored) == alerts_target(restored + 1)
    # A batch Spark no longer keeps (it keeps a checkpoint's last 100): refused in the plan, before any
    # change; the tables were restored first, then the rewind failed, on every try.
    (lake.home.checkpoint("etl") / "offsets" / str(kept)).unlink()
    with pytest.raises(ValueError, match=rf"holds etl's batches <= {kept}, but its checkpoint keeps batches "
                                         r"\d+-\d+ only \(Spark keeps the last 100\)"):
        plan_rollback(lake, "silver_dns", restored, cascade=True)


def test_streams_go_on_after_retention_deletes_old_partitions(spark, tmp_path):
    from pipelines.operations.retention import apply_retention
    from sample_data.generator import generate

    lake, clean, _ = processed_home(spark, tmp_path)
    # On a copy, the original gone: its checkpoint names the original's landing files until a run.
    shutil.copytree(lake.home.root, tmp_path / "copy")
    shutil.rmtree(lake.home.root)
    lake = Lake(Home.resolve(tmp_path / "copy"))
    old = {n: lake.read(spark, n).count() for n in ("silver_dns", "enriched_dns")}
    days = sorted(r.event_date for r in lake.read(spark, "silver_dns").select("event_date").distinct().collect())
    landed = [p for p in lake.home.landing.rglob("*.*") if p.is_file()]
    for path in landed:  # landed on the day of their events
        os.utime(path, (time.mktime(days[-1].timetuple()),) * 2)
    short = Settings(retention_bronze_days=1, retention_silver_days=1, retention_enriched_days=1,
                     retention_landing_days=1)
    steps = {s.target: s for s in apply_retention(spark, lake, short, today=days[-1] + timedelta(days=2))}
    assert steps["silver_dns"].removed == old["silver_dns"] and lake.read(spark, "silver_dns").count() == 0
    assert steps["landing"].removed == len(landed) and "not yet processed" not in steps["landing"].note
    # A later day lands: every stream reads on past the deletes (Delta's source stopped at them).
    later = tmp_path / "later"
    generate(later, hours=0.25, hosts=5, seed=23, start=f"{days[-1] + timedelta(days=3)}T00:00:00Z")
    for file in (later / "landing").rglob("*.*"):
        file.rename(lake.home.landing / file.relative_to(later / "landing"))
    reports = run_once(spark, lake, SETTINGS)
    assert not any(r.error for r in reports), [(r.name, r.error) for r in reports if r.error]
    assert lake.read(spark, "silver_dns").count() > 0
    assert lake.read(spark, "enriched_dns").where(F.col("event_date") > days[-1]).count() > 0


def test_kept_batch_spans_the_batches_that_wrote_nothing_to_the_table():
    # The ETL commits nothing to a table its batch has no row for: version 1 holds batches 0-2.
    history = [{"version": v, "operation": "WRITE", "app_id": "etl", "batch_id": b}
               for v, b in ((0, 0), (1, 1), (2, 3), (3, 4))]
    assert _kept_batch(history, "etl", 0) == 0
    assert _kept_batch(history, "etl", 1) == 2
    assert _kept_batch(history, "etl", 3) is None  # nothing appended after it: nothing to rewind
    assert _kept_batch(history, "other", 1) is None


def test_a_version_holding_a_batch_a_rollback_undid_is_refused_though_the_batch_ran_again():
    # A platform engineer's walkthrough: batch 1 rolled back (RESTORE of version 1), run again as
    # version 5 under the same batch id. Version 2 holds the undone rows: planned as "nothing of the
    # ETL after it", it would have put them back into silver_dns alone, the ETL's checkpoint untouched.
    history = [{"version": 0, "operation": "WRITE", "app_id": "etl", "batch_id": 0},
               {"version": 1, "operation": "OPTIMIZE", "app_id": None, "batch_id": None},
               {"version": 2, "operation": "WRITE", "app_id": "etl", "batch_id": 1},
               {"version": 3, "operation": "RESTORE", "parameters": {"version": 1}, "app_id": None, "batch_id": None},
               {"version": 4, "operation": "Manual Update", "app_id": "etl", "batch_id": 0},
               {"version": 5, "operation": "WRITE", "app_id": "etl", "batch_id": 1}]
    with pytest.raises(ValueError, match="version 2 holds batches of etl that a later rollback or reset removed"):
        _kept_batch(history, "etl", 2)
    assert _kept_batch(history, "etl", 3) == 0 and _kept_batch(history, "etl", 1) == 0  # batch 1 undone again
    assert _kept_batch(history, "etl", 5) is None


def test_a_version_older_than_the_log_keeps_is_refused_in_one_line(spark, tmp_path):
    # Delta's log clean-up removes commits older than 30 days: planning to one raised a KeyError.
    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, "alert_triage")
    row = spark.createDataFrame([("a1", "open", None, [], "ana", None)], lake.spec("alert_triage").schema)
    for _ in range(2):
        row.write.format("delta").mode("append").save(str(lake.path("alert_triage")))
    (lake.path("alert_triage") / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(ValueError, match=r"--to-version must be between 1 and 2 \(the versions of alert_triage "
                                         r"its log keeps\), not 0"):
        plan_rollback(lake, "alert_triage", 0)
    with pytest.raises(ValueError, match=r"^no query writes alert_triage \(seclake's commands keep it\)"):
        plan_rollback(lake, "alert_triage", 1)  # it said "is written by 0 stages ()"


def test_rollback_refuses_while_a_stream_runs_and_names_bad_input(tmp_path, monkeypatch):
    lake = Lake(Home.resolve(tmp_path / "home").create())
    with writer_lock(lake.home, STREAM):  # this process stands for a live `seclake stream`
        assert running_stream(lake.home) == os.getpid()
        with pytest.raises(RuntimeError, match="stream .* is running"):
            rollback(None, lake, "silver_dns", 0)
        with pytest.raises(ValueError, match="does not exist"):  # a dry run only reads: it plans
            rollback(None, lake, "silver_dns", 0, dry_run=True)
    assert running_stream(lake.home) is None
    # What a stream killed without clean-up leaves: its line, the lock released by the kernel.
    (lake.home.root / LOCK).write_text(f"{STREAM} (pid 999999999, since 03:00:01 UTC)")
    assert running_stream(lake.home) is None
    # ... and after it the kernel may give its pid to another live process: still no stream.
    (lake.home.root / LOCK).write_text(f"{STREAM} (pid {os.getpid()}, since 03:00:01 UTC)")
    assert running_stream(lake.home) is None
    with pytest.raises(ValueError, match="unknown table"):
        plan_rollback(lake, "silver_nope", 0)
    # A home whose ETL also reads Kafka, rolled back from a shell without SECLAKE_KAFKA: the Kafka
    # stage's rows were undone and its checkpoint left past them (those messages never read again).
    monkeypatch.delenv("SECLAKE_KAFKA", raising=False)
    lake.home.checkpoint("etl_kafka").mkdir(parents=True)
    with pytest.raises(ValueError, match="also reads Kafka .*set SECLAKE_KAFKA as its stream runs with"):
        plan_rollback(lake, "silver_dns", 0)
    lake.home.checkpoint("etl_kafka").rmdir()
    with pytest.raises(ValueError, match="unknown table 'silver_dnss'; did you mean 'silver_dns'?"):
        plan_rollback(lake, "silver_dnss", 0)
    with pytest.raises(ValueError, match="does not exist"):
        plan_rollback(lake, "silver_dns", 0)


def test_run_once_refuses_while_a_stream_runs_on_the_home(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path / "home").create())
    with writer_lock(lake.home, STREAM):  # this process stands for a live `seclake stream`
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()}.*stop it before a run-once"):
            run_once(spark, lake, SETTINGS)
        assert not lake.exists("silver_dns")
    assert run_once(spark, lake, SETTINGS, only=["etl"])[0].error is None


def test_a_rollback_stopped_by_ctrl_c_says_the_command_that_finishes_it(tmp_path, monkeypatch, capsys):
    # It printed only "interrupted"; the next run-once named the command, the rollback itself did not.
    from pipelines import cli
    from pipelines.operations import rollback

    home = Home.resolve(tmp_path / "home").create()

    def stopped_half_way(*args, **kwargs):
        (home.root / PENDING).write_text(json.dumps({"command": "seclake rollback silver_dns --to-version 3"}))
        raise KeyboardInterrupt

    monkeypatch.setattr(rollback, "rollback", stopped_half_way)
    assert cli.main(["rollback", "silver_dns", "--to-version", "3", "--home", str(home.root)]) == 130
    assert capsys.readouterr().err == ("seclake rollback: interrupted; `seclake rollback silver_dns --to-version 3` "
                                       "finishes it\n")


def test_a_second_writer_of_a_home_is_refused_naming_the_first_and_a_killed_one_leaves_no_lock(tmp_path, capsys):
    """An hourly run-once from cron that outlasts its hour would run the same queries on the same
    checkpoints as the next one."""
    import sys

    from pipelines.cli import main
    from pipelines.operations.running import HomeBusy, writer_lock

    home = Home.resolve(tmp_path / "home").create()
    lake = Lake(home)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pipelines.home import Home; from pipelines.operations.running import writer_lock\n"
        f"lock = writer_lock(Home.resolve({str(home.root)!r}), 'seclake run-once'); print('held', flush=True)\n"
        "time.sleep(120)")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(HomeBusy, match=rf"seclake run-once \(pid {holder.pid}, since .* UTC\) is writing "
                                           rf".*: wait for it to finish before seclake run-once"):
            run_once(lambda: pytest.fail("no Spark for a refused run"), lake, SETTINGS)  # type: ignore[arg-type]
        assert main(["maintain", "--home", str(home.root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {holder.pid}" in err[0] and "before seclake maintain" in err[0], err
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    with writer_lock(home, "seclake maintain"):  # the kernel released the dead holder's lock
        pass


def test_a_dagster_job_launched_from_a_shell_refuses_at_once_while_a_stream_runs(tmp_path, monkeypatch, capsys):
    from assets.launch import main as launch

    home = Home.resolve(tmp_path / "home").create()
    monkeypatch.setenv("SECLAKE_HOME", str(home.root))
    with writer_lock(home, STREAM):  # this process stands for a live `seclake stream`
        assert launch(["maintenance_job"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"maintenance_job: a seclake stream (pid {os.getpid()}) is running on {home.root}: "
                   "stop it before a maintenance_job run"], err
    assert not (home.root / "dagster").exists()  # no run was made, no Spark started


@pytest.mark.parametrize(("job", "variable", "value", "said"), [
    # It ran the ETL, then failed its quarantine check on the variable.
    ("run_once_job", "SECLAKE_MAX_QUARANTINE_RATIO", "abc", "must be a number, not 'abc'"),
    # The run's first step said these, after Dagster had set the run up.
    ("maintenance_job", "SECLAKE_DRIVER_MEMORY", "4096", "must be a size such as 4g or 512m, not '4096'"),
    ("retention_job", "SECLAKE_SPARK_MASTER", "bogus://x", "must be a Spark master such as local[*]"),
])
def test_a_dagster_job_launched_with_a_bad_variable_is_refused_before_it_runs(job, variable, value, said, tmp_path,
                                                                              monkeypatch, capsys):
    from assets.launch import main as launch

    home = Home.resolve(tmp_path / "home").create()
    monkeypatch.setenv("SECLAKE_HOME", str(home.root))
    monkeypatch.setenv(variable, value)
    assert launch([job]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{job}: {variable} {said}"), err
    assert not (home.root / "dagster").exists()  # no run was made, no Spark started


def test_a_job_launched_from_a_shell_without_dagster_home_is_recorded_in_the_homes_instance(tmp_path):
    """Dagster itself refuses a run without DAGSTER_HOME, in a screenful; the home's instance is
    where `seclake demo` records its run and docs/dagster.md starts the UI."""
    import sys

    from dagster import DagsterInstance

    home = Home.resolve(tmp_path / "home").create()
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"} | {"SECLAKE_HOME": str(home.root)}
    done = subprocess.run([sys.executable, "-m", "assets.launch", "retention_job"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with DagsterInstance.from_config(str(home.dagster)) as instance:
        assert [(r.job_name, r.status.value) for r in instance.get_runs()] == [("retention_job", "SUCCESS")]


def test_a_rollback_applies_and_counts_the_steps_its_plan_shows_and_no_other(tmp_path):
    # A shared table its reset writers never wrote a row to stays as it is: the dry run did not show
    # it, and the real run counted it as a step ("[2/22] late_events at version 0").
    kept = TableStep("late_events", 0, 0, {}, "enriched_dns is reset")
    moved = TableStep("enriched_dns", 3, 3, {"enriched_dns": -1}, "enriched_dns is reset")
    assert RollbackPlan("dhcp_leases", None, True, tables=[kept, moved]).steps() == [moved.line()]
    plan = RollbackPlan("dhcp_leases", None, True, tables=[kept])
    done: list = []
    apply_plan(None, Lake(Home.resolve(tmp_path).create()), plan, on_step=done.append)  # type: ignore[arg-type]
    assert plan.steps() == [] and done == []


def test_rewind_checkpoint_cuts_offsets_and_rebuilds_compacted_source_logs(tmp_path):
    ck = tmp_path / "ck"
    for sub in ("offsets", "commits", "sources/0"):
        (ck / sub).mkdir(parents=True)
    for batch in range(12):
        (ck / "offsets" / str(batch)).write_text(f'v1\n{{}}\n{{"logOffset":{batch}}}\n{{"logOffset":{batch}}}\n')
        (ck / "commits" / str(batch)).write_text("v1\n{}\n")
    entry = lambda n: json.dumps({"path": f"file:///l/f{n}", "timestamp": 1, "batchId": n})  # noqa: E731
    # Spark compacted log batches 0..9 into 9.compact and removed 0..8.
    (ck / "sources/0/9.compact").write_text("\n".join(["v1", *(entry(n) for n in range(10))]))
    for n in (10, 11):
        (ck / f"sources/0/{n}").write_text(f"v1\n{entry(n)}")

    rewind_checkpoint(ck, 4)

    assert sorted(int(p.name) for p in (ck / "offsets").iterdir()) == list(range(5))
    assert sorted(int(p.name) for p in (ck / "commits").iterdir()) == list(range(5))
    assert sorted(p.name for p in (ck / "sources/0").iterdir()) == [str(n) for n in range(5)]
    assert (ck / "sources/0/3").read_text().splitlines()[1] == entry(3)
    (ck / "state").mkdir()
    with pytest.raises(ValueError, match="streaming state"):
        rewind_checkpoint(ck, 2)


@pytest.mark.parametrize(("table", "column", "days"), [("quarantine", "ingest_time", "retention_bronze_days"),
                                                      ("late_events", "recorded_at", "retention_enriched_days")])
def test_retention_ages_a_table_without_event_date_by_its_own_time(spark, tmp_path, table, column, days):
    # A quarantined line never became an event, a late_events row records a batch: no event_date.
    from pipelines.operations.retention import apply_retention

    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, table)
    schema = lake.spec(table).schema
    row = {name: None for name in schema.fieldNames()}
    rows = [{**row, column: datetime(2026, month, day)} for month, day in ((1, 1), (2, 15))]
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path(table)))
    settings, today = Settings(**{days: 30}), date(2026, 3, 1)  # cutoff 2026-01-30
    dry = {s.target: s for s in apply_retention(spark, lake, settings, dry_run=True, today=today)}
    assert dry[table].removed == 1 and lake.read(spark, table).count() == 2
    done = {s.target: s for s in apply_retention(spark, lake, settings, today=today)}
    assert done[table].removed == 1
    assert [r[column].month for r in lake.read(spark, table).collect()] == [2]


def test_retention_keeps_raw_lines_the_quarantine_check_counts_and_ages_unparsed_ones_by_their_reading(
        spark, tmp_path):
    # A backfill of old logs lost its good lines at once, so the blocking quarantine check saw only the
    # bad ones (100%) and stopped Dagster's run; a line that did not parse (no event_date) was never deleted.
    from pipelines.operations.retention import apply_retention

    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, "bronze_zeek")
    schema = lake.spec("bronze_zeek").schema
    row = {name: None for name in schema.fieldNames()}
    today = date(2026, 3, 1)  # cutoff 2026-01-30 with 30 days
    utc = timezone.utc  # a naive time would be read in the machine's zone
    lines = {"old, read long ago": (date(2026, 1, 1), datetime(2026, 1, 2, tzinfo=utc)),
             "old, read yesterday": (date(2026, 1, 1), datetime(2026, 2, 28, 6, tzinfo=utc)),
             "unparsed, read long ago": (None, datetime(2026, 1, 2, tzinfo=utc)),
             "unparsed, read yesterday": (None, datetime(2026, 2, 28, 6, tzinfo=utc)),
             "new": (date(2026, 2, 27), datetime(2026, 2, 27, 6, tzinfo=utc))}
    rows = [{**row, "raw": name, "event_date": day, "ingest_time": read} for name, (day, read) in lines.items()]
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path("bronze_zeek")))
    done = {s.target: s for s in apply_retention(spark, lake, Settings(retention_bronze_days=30), today=today)}
    assert done["bronze_zeek"].removed == 2
    assert sorted(r.raw for r in lake.read(spark, "bronze_zeek").collect()) == [
        "new", "old, read yesterday", "unparsed, read yesterday"]


def test_retention_dry_run_counts_and_keeps(spark, tmp_path):
    from pipelines.operations.retention import apply_retention

    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, "silver_dns")
    (lake.home.landing / "zeek").mkdir(parents=True)
    old = lake.home.landing / "zeek" / "dns.log"
    old.write_text("x")
    os.utime(old, (0, 0))  # 1970: older than any retention, but the ETL never read it
    temp = lake.home.landing / "zeek" / ".dns.log.part"  # a sensor's file before its rename: not input
    temp.write_text("x")
    os.utime(temp, (0, 0))
    steps = {s.target: s for s in apply_retention(spark, lake, Settings(), dry_run=True, today=date(2026, 1, 1))}
    assert steps["silver_dns"].removed == 0 and str(steps["silver_dns"].cutoff) == "2025-01-01"
    assert steps["landing"].removed == 0 and "(1 older but not yet processed" in steps["landing"].line(True)
    assert old.exists()


def test_rolling_back_silver_dhcp_empties_the_dhcp_clock_a_stream_wrote(spark, tmp_path):
    # The clock was kept: the rebuilt dhcp_leases read it first, its watermark stood at the clock's
    # time, and the DHCP rows the ETL wrote again after the rollback were dropped as late.
    from pipelines.dhcp_clock import CLOCK_APP_ID, DHCP_CLOCK
    from pipelines.schemas import DHCP_CLOCK_SCHEMA

    lake, _, _ = processed_home(spark, tmp_path)
    # The ETL's last batch wrote DHCP too (as the bad deploy above wrote DNS), then the clock moved.
    last = newest(lake.home.checkpoint("etl"), committed=True)
    more = lake.read(spark, "silver_dhcp").limit(3).withColumn("event_id", F.concat(F.lit("x-"), "event_id"))
    lake.sink("silver_dhcp", app_id="etl").write_batch(more, last)
    at = datetime(2026, 11, 20, 1, tzinfo=timezone.utc)
    clock = spark.createDataFrame([(at, {"zeek": at}, at)], DHCP_CLOCK_SCHEMA)
    lake.sink(DHCP_CLOCK, app_id=CLOCK_APP_ID).write_batch(clock, int(at.timestamp() * 1000))
    dhcp = sorted(c["version"] for c in commits(lake.path("silver_dhcp")) if c["app_id"] == "etl")
    assert len(dhcp) >= 2, "a home whose silver_dhcp has one ETL commit: nothing to roll back"

    plan = rollback(None, lake, "silver_dhcp", dhcp[0], cascade=True, dry_run=True)

    [step] = [t for t in plan.tables if t.table == DHCP_CLOCK]
    assert (step.target, step.txn) == (None, {CLOCK_APP_ID: -1}), step
    assert "silver_dhcp changes" in "\n".join(plan.lines())


def test_rolling_back_an_enriched_table_to_before_its_first_batch_keeps_the_other_writers_late_records(
        spark, tmp_path):
    # late_events went back to before enriched_conn's first record, and enriched_dns's records after
    # it went with it, for good (enriched_dns is not reset: nothing writes them again).
    from pipelines.schemas import LATE_EVENTS_SCHEMA

    lake, _, _ = processed_home(spark, tmp_path)
    rollback(spark, lake, "enriched_conn", None, cascade=True)  # its versions from here start with an empty one
    emptied = max(c["version"] for c in commits(lake.path("enriched_conn")))
    assert not any(r.error for r in run_once(spark, lake, SETTINGS))
    at = datetime(2026, 11, 20, 1, tzinfo=timezone.utc)
    for query in ("enriched_conn", "enriched_dns"):  # records as a batch that dropped rows appends them
        lake.sink("late_events", app_id=query).write_batch(
            spark.createDataFrame([(query, 1000, at, 3, at)], LATE_EVENTS_SCHEMA), 1000)

    plan = plan_rollback(lake, "enriched_conn", emptied, cascade=True)

    [step] = [t for t in plan.tables if t.table == "late_events"]
    assert (step.target, step.txn) == (step.current, {"enriched_conn": -1}), step


def test_a_rollback_that_would_read_again_a_landing_file_retention_removed_is_refused(spark, tmp_path):
    # The rewind found the file gone: its rows, removed from the tables by the restore, were lost.
    from urllib.parse import unquote

    from pipelines.checkpoint import files_after

    lake, _, _ = processed_home(spark, tmp_path, hours=1.5)  # two hourly DNS files
    first = min(c["version"] for c in commits(lake.path("silver_dns")) if c["operation"] == "WRITE")
    plan = plan_rollback(lake, "silver_dns", first, cascade=True)
    [rewind] = [c for c in plan.checkpoints if c.stage == "etl" and c.rewind_to is not None]
    read_again = files_after(lake.home.checkpoint("etl"), rewind.rewind_to)
    assert read_again, "the rewind reads no file again: a vacuous check"
    gone = Path(unquote(read_again[0].removeprefix("file://")))
    gone.unlink()  # as retention does once the file is older than its cutoff and read

    with pytest.raises(ValueError, match=rf"etl would read again 1 landing file\(s\) that are gone .*{gone.name}"):
        plan_rollback(lake, "silver_dns", first, cascade=True)
