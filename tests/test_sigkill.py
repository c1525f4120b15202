"""SIGKILL at random points while files keep arriving: `seclake stream` killed again and again,
then drained, must hold exactly the rows of a clean run (tests/test_faults.py's helpers and checks).

Part of the fault suite (`pytest -m faults`). In a file of its own so that CI (`--dist loadscope`,
.ci/run) runs it on one worker, first (tests/conftest.py, LONGEST_FIRST), while the other worker
runs the other long scopes.

Knobs (environment): SECLAKE_FAULT_RESTARTS (default 4, each kill point once) and SECLAKE_FAULT_SEED.
The input has 12 files and each run gets one or two: past 5 restarts they can run out, and a kill
"after a commit" then waits its whole 240 s for a commit that cannot come before it kills.
"""
from __future__ import annotations

import collections
import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from pipelines import etl
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake
from pipelines.settings import Settings
from test_faults import (
    KILL_WATERMARKS,
    REPO,
    SEED,
    Deliverer,
    _wait_for_line,
    assert_no_duplicates,
    assert_nothing_late,
    commit_files,
    compare_with_reference,
    complete,
    kill_group,
    landing_files,
    leftovers,
    referenced,
    row_keys,
    seclake,
    tables_in,
    version,
    wait_for_commit,
)

pytestmark = [pytest.mark.faults]

RESTARTS = int(os.environ.get("SECLAKE_FAULT_RESTARTS", "4"))


def _data_files(home: Home) -> set[str]:
    """Parquet files in the tables' partition folders (not the log), as absolute paths; a cheap
    listing, polled while the stream runs."""
    found = set()
    if not home.tables.is_dir():
        return found
    for table in os.scandir(home.tables):
        if not table.is_dir() or table.name.startswith("."):
            continue
        stack = [table.path]
        while stack:
            for entry in os.scandir(stack.pop()):
                if entry.is_dir():
                    if not entry.name.startswith(("_", ".")):
                        stack.append(entry.path)
                elif entry.name.endswith(".parquet"):
                    found.add(entry.path)
    return found


def _wait_for_sink_step(home: Home, known: set[str], nth: int, proc: subprocess.Popen,
                        timeout: float) -> tuple[float, bool]:
    """Poll (every ~10 ms) until a sink is seen in its write -> commit window for the `nth` time:
    the seconds waited, and whether it was seen (not: the timeout, or the process ended).

    delta-spark writes a batch's Parquet files straight into the table's partition folders, then
    commits them. The window is seen when a table has new data files (not in `known`) that are
    all complete Parquet files, that the latest version does not reference (checked with
    delta-rs), and that are still the same files with no new commit one poll later (so the
    write has stopped adding files and the commit has not landed). A batch whose files were
    already committed when first seen is missed and not counted."""
    started = time.monotonic()
    seen = 0
    pending: dict[str, tuple[frozenset, int]] = {}  # table -> (its new unreferenced files, its commit count)
    while time.monotonic() - started < timeout and proc.poll() is None:
        by_table: dict[str, set[str]] = collections.defaultdict(set)
        for f in _data_files(home) - known:
            by_table[Path(f).relative_to(home.tables).parts[0]].add(f)
        for table in set(pending) - set(by_table):
            del pending[table]
        for table, new in by_table.items():
            path = home.table(table)
            if not all(complete(Path(f)) for f in new):
                pending.pop(table, None)  # a task is still writing
                continue
            commits = commit_files(path)
            if table in pending:
                files, commits_then = pending.pop(table)
                if files == frozenset(new) and commits == commits_then:
                    seen += 1
                    known |= new
                    if seen >= nth:
                        return time.monotonic() - started, True
                continue
            try:
                unreferenced = {f for f in new if os.path.relpath(f, path) not in referenced(path)}
            except Exception:  # a log the writer is changing while we read it: look again
                continue
            if unreferenced != new:
                known |= new  # committed before we looked: missed
                continue
            pending[table] = (frozenset(new), commits)
        time.sleep(0.01)
    return time.monotonic() - started, False


def _commits(home: Home) -> dict[str, int]:
    """Commit files per table (a cheap directory listing: polled while the stream runs)."""
    if not home.tables.is_dir():
        return {}
    return {t.name: commit_files(Path(t.path)) for t in os.scandir(home.tables) if t.is_dir()}


# 4 stream start-ups (each kill point of the cycle once) and a drain; the reference is the session's
# `local_reference` (tests/conftest.py), which the Kafka SIGKILL test after this one on CI's worker
# compares with too. With 20 start-ups the test took 18-39 min in CI. Every kill waits for an
# observed event, so a slower machine only takes longer.
@pytest.mark.timeout(3000)
def test_sigkill_at_random_points_loses_and_duplicates_nothing(spark, small_input, local_reference, tmp_path):
    gen, manifest = small_input
    test_started = time.monotonic()
    timings = {}
    rng = random.Random(SEED)
    home = Home.resolve(tmp_path / "home").create()
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    files = landing_files(gen, manifest)
    feed = Deliverer(files, home.landing, rng)
    feed.deliver_next(2)
    # The first files go through the ETL once, so the kills start on a home that has data, as a
    # deployed one would.
    boot = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])
    assert boot[0].error is None, boot[0].line()
    timings["bootstrap_s"] = round(time.monotonic() - test_started)
    # One file per micro-batch: many batches, so many commit points to land a kill on.
    cmd = seclake("stream", "--home", str(home.root), "--set", "trigger_interval=1 second",
                  "--set", "max_files_per_trigger=1", *KILL_WATERMARKS, "--report-every", "5")
    kills = []
    seen_orphans: dict[str, set] = collections.defaultdict(set)
    for restart in range(RESTARTS):
        log = tmp_path / f"stream-{restart}.log"
        # Kill points, in a cycle of four:
        #   "from start": 2-25 s after the process starts: JVM start-up, query start, batches;
        #   "after Spark up": 2-25 s after the session is up: query start, replay, batches, commits;
        #   "in the write -> commit window": the k-th time (k = 1..4) a sink is seen between its
        #   Parquet write and its Delta commit: a table has new, complete Parquet files in its
        #   partition folders that no commit references yet (see _wait_for_sink_step).
        #   "after a commit": 0-3 s after the first ETL commit of this run, so that
        #   every cycle makes progress and later kills land on new batches, not the same replay.
        mode = ("after a commit", "from start", "in the write -> commit window", "after Spark up")[restart % 4]
        delay = rng.uniform(2, 25)
        nth_file = rng.randint(1, 4)
        arrivals = [rng.uniform(0.5, 8) for _ in range(rng.randint(1, 2))]
        known_files = _data_files(home)
        commits_before = _commits(home)
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        stop = threading.Event()
        thread = feed.during(stop, arrivals)
        up, window_seen = None, None
        try:
            if mode == "from start":
                time.sleep(delay)
            else:
                up = _wait_for_line(log, "seclake stream: home", proc, timeout=300)
                assert up is not None, f"seclake stream did not come up:\n{log.read_text(errors='replace')[-3000:]}"
                if mode == "after Spark up":
                    time.sleep(delay)
                elif mode == "after a commit":
                    extra = rng.uniform(0, 3)
                    # An ETL commit: the attribution catching up commits first, and a kill then
                    # would leave the ETL's batch to replay again.
                    etl_before = {t: commits_before.get(t, 0) for t in etl.etl_tables()}
                    delay = wait_for_commit(home, etl_before, proc, poll_s=0.05) + extra
                    time.sleep(extra)
                else:
                    delay, window_seen = _wait_for_sink_step(home, known_files, nth_file, proc, timeout=180)
            kill_group(proc, log)
        finally:
            stop.set()
            thread.join()
            kill_group(proc)
        # What did this kill leave behind? New Parquet files that no commit references: the kill
        # landed after (some of) a batch's Parquet files were written and before its commit. If
        # one of them is incomplete (no footer), a task was still writing: "during the write";
        # if all are complete Parquet files, "between write and commit" (as far as the files on
        # disk can tell: a task that had not opened its file yet leaves no trace).
        n_writing, n_written, orphan_files, where = 0, 0, 0, []
        for name in sorted(p.name for p in home.tables.iterdir() if p.is_dir() and p.name[0] != "."):
            path = home.table(name)
            new = leftovers(path) - seen_orphans[name]
            if new:
                partial = sum(1 for f in new if not complete(path / f))
                orphan_files += len(new)
                if partial:
                    n_writing += 1
                    where.append(f"{name}: writing ({partial} of {len(new)} new files incomplete)")
                else:
                    n_written += 1
                    where.append(f"{name}: {len(new)} file(s) written, not committed")
            seen_orphans[name] |= new
        # No duplicate may ever be visible, not even between restarts.
        assert_no_duplicates(home, f"restart {restart}")
        commits_after = _commits(home)
        kills.append({"restart": restart, "mode": mode, "delay_s": round(delay, 2), "window_seen": window_seen,
                      "commits": sum(n - commits_before.get(t, 0) for t, n in commits_after.items()),
                      # The ETL's own commits: rule queries commit to alerts even on empty input.
                      "etl_commits": sum(commits_after.get(t, 0) - commits_before.get(t, 0) for t in etl.etl_tables()),
                      "at_s": round(time.monotonic() - started, 1),
                      "startup_s": round(up - started, 1) if up else None,
                      "killed_during_write": n_writing, "killed_between_write_and_commit": n_written,
                      "unreferenced_files_left": orphan_files, "where": where,
                      "versions": {n: version(home.table(n)) for n in tables_in(home)}})
    timings["kill_phase_s"] = round(time.monotonic() - test_started - timings["bootstrap_s"])
    # Everything else arrives; one clean run drains it (the same CLI, run-once this time).
    feed.deliver_next(len(feed.files))
    # The kills must have hit a pipeline that was making progress, not the same replay 20 times.
    progressed = sum(k["etl_commits"] for k in kills)
    assert progressed >= max(1, RESTARTS // 4), f"only {progressed} ETL commits during the kill phase: {kills}"
    drained = subprocess.run(seclake("run-once", "--home", str(home.root), *KILL_WATERMARKS), cwd=REPO,
                             capture_output=True, text=True, timeout=1800)
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
    assert_nothing_late(home)

    timings["drain_s"] = round(time.monotonic() - test_started - timings["bootstrap_s"] - timings["kill_phase_s"])
    # The reference: the same files through the whole pipeline in one clean run. ETL tables and
    # alerts (a stable alert_id per rule, entity and window) must match exactly; attribution tables
    # are checked for uniqueness (see compare_with_reference).
    reference_alerts = row_keys(local_reference.table("alerts"), "alerts")
    assert reference_alerts, "the reference run raised no alert: the alert check would be vacuous"
    checked = compare_with_reference(home, local_reference, manifest, exact=(*etl.etl_tables(), "alerts"))

    # What the crashed batches left behind is unreferenced; vacuum removes it and no row changes.
    from pipelines.lake.maintenance import vacuum
    left = {}
    for name in tables_in(home):
        orphans = leftovers(home.table(name))
        if orphans:
            left[name] = len(orphans)
            keys = row_keys(home.table(name), name)
            removed = vacuum(spark, home.table(name), retention_hours=0)
            assert orphans <= {os.path.normpath(unquote(f)) for f in removed}, (name, orphans, removed)
            assert not leftovers(home.table(name)), name
            assert row_keys(home.table(name), name) == keys, name
    assert left or not any(k["where"] for k in kills), "kills left files behind, the final check found none"
    timings["total_s"] = round(time.monotonic() - test_started)

    between = sum(1 for k in kills if k["killed_between_write_and_commit"])
    during_write = sum(1 for k in kills if k["killed_during_write"])
    summary = {"restarts": len(kills), "commits_during_kill_phase": progressed,
               "kills_between_write_and_commit": between,
               "kills_during_parquet_write": during_write, "rows_checked": checked,
               "landing_files": len(files), "vacuumed_leftovers": left, "timings": timings, "kills": kills}
    (tmp_path / "kills.json").write_text(json.dumps(summary, indent=1))
    print("\nSIGKILL summary:", json.dumps({k: v for k, v in summary.items() if k != "kills"}))
    for k in kills:
        print("  ", k)
    # The kill point this test is for: each kill meant for the write -> commit window waited for it.
    assert all(k["window_seen"] for k in kills if k["mode"] == "in the write -> commit window"), kills
