"""The pipeline on a Spark standalone cluster on localhost (a master and two workers started by
`pipelines.cluster.LocalCluster`, pyspark's own daemons) with the lake on the S3 server: the same
tables and alerts as a local run. Run with `bash .ci/test -m "s3 or cluster"` (CI does)."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
import uuid

import pytest

from pipelines.cluster import LocalCluster
from pipelines.home import Home
from pipelines.objectstore.path import ObjectPath
from pipelines.servers import free_port
from test_faults import REPO, compare_with_reference, deliver, landing_files, row_keys, seclake, tables_in
from test_s3 import lake_env

pytestmark = [pytest.mark.cluster, pytest.mark.s3, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = LocalCluster(Home(tmp_path_factory.mktemp("cluster")), port=free_port()).start()
    yield started
    started.stop()


def test_cluster_start_on_the_running_cluster_says_it_was_running(cluster, capsys):
    # It printed "spark cluster up", as for a cluster it had just started.
    from pipelines.cli import main

    pids = cluster.pids()
    assert main(["cluster", "start", "--home", str(cluster.home.root), "--port", str(cluster.port)]) == 0
    assert capsys.readouterr().out.startswith("spark cluster already running: 2 worker(s)")
    assert cluster.pids() == pids
    # Without --port (or with another), the running master's: it printed the default port's URL to export.
    assert main(["cluster", "start", "--home", str(cluster.home.root)]) == 0
    assert capsys.readouterr().out.endswith(f"export SECLAKE_SPARK_MASTER={cluster.master_url}\n")
    assert main(["cluster", "status", "--home", str(cluster.home.root)]) == 0
    assert capsys.readouterr().out.startswith(f"spark cluster running: {cluster.master_url}, 2 worker(s) alive")
    assert cluster.pids() == pids


def test_run_once_on_a_standalone_cluster_with_the_lake_on_s3_equals_a_local_run(
        on_server, cluster, small_input, local_reference, tmp_path):
    gen, manifest = small_input
    assert cluster.alive_workers() == 2
    lake = ObjectPath.from_uri(f"s3a://lake/cluster-{uuid.uuid4().hex[:8]}")
    home = Home(tmp_path / "home", lake).create()
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    for src, sensor in landing_files(gen, manifest):
        deliver(src, home.landing, sensor)
    env = lake_env(on_server, lake, SECLAKE_SPARK_MASTER=cluster.master_url)
    run = subprocess.run(seclake("run-once", "--home", str(home.root)), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert row_keys(local_reference.table("alerts"), "alerts"), "the reference raised no alert: a vacuous check"
    # Every table, attribution included (the cluster cuts the input into the same batches), but
    # end_of_input, whose rows carry the wall-clock time they were written at.
    exact = tuple(t for t in tables_in(local_reference) if t != "end_of_input")
    checked = compare_with_reference(home, local_reference, manifest, exact=exact)
    assert checked["alerts"] > 0
    # The work ran on the cluster: each worker started executors for this run's applications.
    for worker in ("worker-1", "worker-2"):
        assert list((cluster.folder / worker).glob("app-*/*/stderr")), f"{worker} ran no executor"
    # The master's UI names the run by its home, so several homes' runs on one cluster are told apart.
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.ui_port()}/json/", timeout=10) as answer:
        apps = json.load(answer)
    names = [a["name"] for a in apps["activeapps"] + apps["completedapps"]]
    assert f"seclake-run-once {home.root}" in names, names
