"""The lake on an S3-compatible server: S3Proxy from Maven Central, started by the tests on
localhost (`s3_server` in conftest.py), reached through Hadoop's S3A by Spark and Delta, through
pyarrow by seclake's own file operations, through delta-rs by the listings and these checks.

Run with `bash .ci/test -m "s3 or cluster"` (CI does). The SIGKILL test is the fault suite's
(tests/test_faults.py) with fewer kills: SECLAKE_S3_RESTARTS (default 3, one kill per kill point).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import uuid

import pytest

from pipelines import etl
from pipelines.home import Home
from pipelines.lake import log as lake_log
from pipelines.objectstore.path import ObjectPath, remove_tree
from test_faults import (
    KILL_WATERMARKS,
    REPO,
    Deliverer,
    assert_no_duplicates,
    assert_nothing_late,
    commit_files,
    compare_with_reference,
    kill_group,
    landing_files,
    read_columns,
    row_keys,
    seclake,
    wait_to_kill,
)

pytestmark = [pytest.mark.s3, pytest.mark.timeout(1800)]

RESTARTS = int(os.environ.get("SECLAKE_S3_RESTARTS", "3"))


def lake_env(server, lake: ObjectPath, **extra: str) -> dict[str, str]:
    """The environment of a seclake process whose lake is `lake` on `server`."""
    return {**os.environ, **server.environment(), "SECLAKE_LAKE": str(lake), **extra}


def test_object_paths_read_write_list_move_and_delete_on_the_server(on_server):
    root = ObjectPath.from_uri(f"s3a://lake/paths-{uuid.uuid4().hex[:8]}")
    assert not root.exists()
    (root / "log" / "00.json").write_text("zero")
    (root / "log" / "01.json").write_text("one")
    (root / "log" / "deeper" / "02.json").write_text("two")
    assert root.is_dir() and (root / "log" / "00.json").is_file() and not (root / "log").is_file()
    assert sorted(p.name for p in (root / "log").glob("*.json")) == ["00.json", "01.json"]
    assert sorted(p.name for p in root.glob("**/*.json")) == ["00.json", "01.json", "02.json"]
    assert sorted(p.name for p in (root / "log").iterdir()) == ["00.json", "01.json", "deeper"]
    moving = root / ".marker.tmp"
    moving.write_text("claimed")
    moving.replace(root / "marker")
    assert (root / "marker").read_text() == "claimed" and not moving.exists()
    with pytest.raises(FileNotFoundError):
        (root / "missing").read_text()
    (root / "marker").unlink()
    (root / "marker").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError):
        (root / "marker").unlink()
    # A location on the store never reaches the local file system by mistake.
    with pytest.raises(TypeError, match="object storage"):
        os.fspath(root)
    remove_tree(root)
    assert not root.exists()


def test_the_s3_commands_name_the_running_servers_port_not_the_default(s3_server, capsys):
    # `s3 start` on a running server printed the --port it was given (here the default) as the endpoint.
    from pipelines.cli import main

    home = str(s3_server.home.root)
    assert main(["s3", "start", "--home", home]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"s3 server already running: {s3_server.endpoint}, pid {s3_server.pid()}"), out
    assert f"export SECLAKE_S3_ENDPOINT={s3_server.endpoint}\n" in out
    assert main(["s3", "status", "--home", home]) == 0
    assert capsys.readouterr().out.strip() == f"s3 server running: {s3_server.endpoint}, pid {s3_server.pid()}"


def test_a_home_on_the_store_keeps_its_state_schema_paths(on_server, tmp_path, monkeypatch):
    # Compared with "file:s3a://...", every run "followed a move" of a home that never moved: the
    # paths were rewritten to file:s3a://..., where no schema file is, and a warning said so each run.
    import json

    from pipelines.operations.relocate import follow_move

    lake = f"s3a://lake/schemas-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SECLAKE_LAKE", lake)
    home = Home.resolve(tmp_path).create()
    recorded = f"{lake}/checkpoints/dhcp_leases/state/0/_stateSchema/default/0_abc"
    metadata = home.checkpoints / "dhcp_leases" / "state" / "0" / "_metadata" / "v2" / "0"
    line = json.dumps({"stateStoreInfo": [{"stateSchemaFilePaths": [recorded]}]})
    metadata.write_text(f"v2\n{line}")
    try:
        assert follow_move(home) == 0
        assert metadata.read_text() == f"v2\n{line}"
    finally:
        remove_tree(ObjectPath.from_uri(lake))


def test_a_home_refuses_another_lake_than_the_one_it_recorded(on_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SECLAKE_LAKE", "s3a://lake/first")
    Home.resolve(tmp_path).create()
    assert (tmp_path / "lake").read_text().strip() == "s3a://lake/first"
    assert not (tmp_path / "tables").exists(), "a lake on the store must not leave local table folders"
    monkeypatch.setenv("SECLAKE_LAKE", "s3a://lake/second")
    with pytest.raises(ValueError, match="s3a://lake/first"):
        Home.resolve(tmp_path)
    monkeypatch.delenv("SECLAKE_LAKE")
    with pytest.raises(ValueError, match="set SECLAKE_LAKE=s3a://lake/first"):
        Home.resolve(tmp_path)
    # A home whose tables are local does not silently start an empty lake on the store.
    (tmp_path / "local" / "tables" / "silver_dns").mkdir(parents=True)
    monkeypatch.setenv("SECLAKE_LAKE", "s3a://lake/other")
    with pytest.raises(ValueError, match="would start another, empty lake"):
        Home.resolve(tmp_path / "local")


def test_a_second_home_is_refused_the_lake_of_another(on_server, tmp_path, monkeypatch):
    # It shared the first home's checkpoints: a run-once of its own logs (the generator's file names)
    # said "nothing new", exit 0, and never read them.
    lake = f"s3a://lake/shared-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SECLAKE_LAKE", lake)
    first = Home.resolve(tmp_path / "first").create()
    with pytest.raises(ValueError, match=f"the lake {lake} belongs to the home {first.root}: ") as refused:
        Home.resolve(tmp_path / "second").create()
    assert not (tmp_path / "second").exists()
    # The first home moved (its lake file with it), or made again where it was: still its lake.
    shutil.copytree(first.root, tmp_path / "moved")
    Home.resolve(tmp_path / "moved").create()
    shutil.rmtree(first.root)
    Home.resolve(first.root).create()
    # A home that replaces the first records the lake itself, with the command the refusal gives.
    command = str(refused.value).split("record the lake in it: ", 1)[1]
    subprocess.run(command, shell=True, check=True)
    Home.resolve(tmp_path / "second").create()
    # A lake recorded before lakes named their home is claimed by its home's next command.
    (ObjectPath.from_uri(lake) / "home").unlink()
    Home.resolve(first.root).create()
    assert (ObjectPath.from_uri(lake) / "home").read_text().strip() == str(first.root)


def test_a_lake_that_cannot_be_reached_is_one_line_and_never_recorded(on_server, tmp_path, monkeypatch, capsys):
    from pipelines.cli import main
    from pipelines.servers import free_port

    home = tmp_path / "home"
    monkeypatch.setenv("SECLAKE_LAKE", "s3a://nolake/seclake")
    with pytest.raises(ValueError, match="bucket 'nolake' does not exist at http://"):
        Home.resolve(home).create()
    assert not (home / "lake").exists()  # the mistyped lake is not the home's from now on
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    monkeypatch.setenv("SECLAKE_LAKE", "s3a://lake/seclake")
    with pytest.raises(ValueError, match=r"cannot reach the lake s3a://lake/seclake .*ACCESS_DENIED.*check SECLAKE_S3"):
        Home.resolve(home).create()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", on_server.environment()["AWS_SECRET_ACCESS_KEY"])
    # An endpoint without its http:// fails as a TLS handshake, which names no scheme.
    endpoint = on_server.environment()["SECLAKE_S3_ENDPOINT"]
    monkeypatch.setenv("SECLAKE_S3_ENDPOINT", endpoint.removeprefix("http://"))
    with pytest.raises(ValueError, match="; https is assumed without a scheme: http://... for a store on plain HTTP$"):
        Home.resolve(home).create()
    monkeypatch.setenv("SECLAKE_S3_ENDPOINT", endpoint)
    Home.resolve(home).create()  # the corrected settings are taken and recorded
    assert (home / "lake").read_text().strip() == "s3a://lake/seclake"
    # A store that does not answer: one line, not pyarrow's traceback.
    monkeypatch.setenv("SECLAKE_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert main(["tables", "--home", str(home)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("seclake tables: ") and "check SECLAKE_S3_ENDPOINT" in err and "\n" not in err, err


def _start(cmd: list[str], log, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def test_sigkill_with_the_lake_on_s3_loses_and_duplicates_nothing(on_server, small_input, local_reference,
                                                                   tmp_path):
    gen, manifest = small_input
    rng = random.Random(18)
    lake = ObjectPath.from_uri(f"s3a://lake/kills-{uuid.uuid4().hex[:8]}")
    home = Home(tmp_path / "home", lake).create()
    env = lake_env(on_server, lake)
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    feed = Deliverer(landing_files(gen, manifest), home.landing, rng)
    feed.deliver_next(2)
    cmd = seclake("stream", "--home", str(home.root), "--set", "trigger_interval=1 second",
                  "--set", "max_files_per_trigger=1", *KILL_WATERMARKS, "--report-every", "5")
    kills = []
    for restart in range(RESTARTS):
        # Kill points, in a cycle: while Spark starts and the queries resume from their
        # checkpoints on the store; 2-15 s after the session is up (replay, batches, commits);
        # 0-3 s after the first ETL commit of this run (so every cycle makes progress).
        mode = ("after a commit", "from start", "after Spark up")[restart % 3]
        log = tmp_path / f"stream-{restart}.log"
        before = {t: commit_files(home.table(t)) for t in etl.etl_tables()}
        proc = _start(cmd, log, env)
        stop = threading.Event()
        thread = feed.during(stop, [rng.uniform(0.5, 6) for _ in range(2)])
        try:
            wait_to_kill(mode, proc, log, home, before, rng, up_line="seclake stream: home", after_up_s=(2, 15))
            kill_group(proc, log)
        finally:
            stop.set()
            thread.join()
            kill_group(proc)
        assert_no_duplicates(home, f"restart {restart} ({mode})")
        kills.append((mode, sum(commit_files(home.table(t)) - n for t, n in before.items())))
    assert sum(n for _, n in kills) >= 1, f"no ETL commit during the kill phase: {kills}"
    feed.deliver_next(len(feed.files))
    drained = subprocess.run(seclake("run-once", "--home", str(home.root), *KILL_WATERMARKS), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=1800)
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
    assert "SLF4J" not in drained.stderr, drained.stderr[-3000:]  # the AWS SDK's own SLF4J kept quiet
    assert_nothing_late(home)
    assert row_keys(local_reference.table("alerts"), "alerts"), "the reference raised no alert: a vacuous check"
    compare_with_reference(home, local_reference, manifest, exact=(*etl.etl_tables(), "alerts"))
    assert not (home.root / "tables").exists() and not (home.root / "checkpoints").exists()

    # The JVM-free listing reads the tables on the store; a command without the lake is refused.
    listed = subprocess.run(seclake("tables", "--home", str(home.root), "--format", "csv"), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split(",")[0]: line.split(",") for line in listed.stdout.splitlines()[1:]}
    header = listed.stdout.splitlines()[0].split(",")
    written = read_columns(home.table("alerts"), ["alert_id"])["alert_id"]
    assert int(rows["alerts"][header.index("rows")]) == len(written)
    # A time window read by delta-rs on the store (the quarantine check's counts) keeps its rows only.
    times = sorted(read_columns(home.table("silver_dns"), ["event_time"])["event_time"])
    middle, last = times[len(times) // 2], times[-1]
    inside = lake_log.read_columns(home.table("silver_dns"), ["event_time"], ("event_time", middle, last))
    assert 0 < inside.num_rows == sum(t >= middle for t in times) < len(times)
    without = {k: v for k, v in env.items() if k != "SECLAKE_LAKE"}
    refused = subprocess.run(seclake("tables", "--home", str(home.root)), cwd=REPO, env=without,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert f"SECLAKE_LAKE={lake}" in refused.stderr
    print("\nS3 kills (mode, ETL commits):", kills)
