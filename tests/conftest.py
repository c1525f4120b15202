"""One SparkSession for the whole test session; every test writes under its own tmp_path."""
from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pytest_timeout import PYTEST_FAILURE_MESSAGE

from pipelines.spark import get_spark

REAL_LOGS = Path(__file__).resolve().parents[1].parent / "shared" / "real-logs"


@pytest.fixture(scope="session")
def spark():
    # A finite stop timeout: a query that cannot stop makes its test fail after two minutes
    # instead of holding its pytest worker (pytest-timeout fires once, not again in clean-up).
    # One JVM serves every test of a worker, and what it keeps grows with the tests: at 3g, then at
    # 4g (2026-12-06), a clean-clone CI run's worker died of heap exhaustion in
    # test_real_logs_lose_no_line (which passes alone in 27 s), failing every later test; at 5g it
    # passed one clean-clone CI and failed the next the same way (2026-12-06, another test order,
    # other Spark work on the machine). The cause, found in the 41st session with heap histograms
    # of a CI's workers: every stopped rule and attribution query stayed in the JVM, held through
    # its writer (fixed: `pipelines.query.OwnQuery`). Kept from before that: 6g; Spark's status
    # store keeps a few executions, jobs and queries instead of its defaults (1,000 executions with
    # their plans, 100,000 tasks); Delta's cached logs and Spark's cached frames go after each test;
    # and Spark's cleaner asks for a GC every 3 minutes (not 30), so blocks and broadcasts of tests
    # that are gone are freed before a full heap is found.
    session = get_spark(app_name="seclake-tests", ui=False, conf={
        "spark.driver.memory": "6g", "spark.sql.streaming.stopTimeout": "120s",
        "spark.cleaner.periodicGC.interval": "3min",
        "spark.sql.ui.retainedExecutions": "20", "spark.ui.retainedJobs": "50", "spark.ui.retainedStages": "50",
        "spark.ui.retainedTasks": "2000", "spark.sql.streaming.ui.retainedQueries": "20",
        "spark.sql.streaming.ui.retainedProgressUpdates": "20"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def forget_delta_logs():
    """After each test, Delta's cache of table logs and their snapshots and Spark's cache of
    persisted frames are emptied: each test's tables are its own, and the caches otherwise hold
    every table the worker ever opened and every frame a failed test left persisted."""
    yield
    context = SparkContext._active_spark_context
    if context is not None and context._jvm is not None:
        try:
            context._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
            active = SparkSession.getActiveSession()
            if active is not None:
                active.catalog.clearCache()
        except Exception:  # a JVM already gone: the next test that needs it says so
            pass


def resync_after_timeout() -> None:
    """Make the session usable again after pytest-timeout interrupted a JVM call.

    The timeout (SIGALRM) raises inside py4j while the call's answer is still to come; the next
    call on that connection would read it as its own, and every later test of the worker fails
    with nonsense (CI once lost 38 tests to one timeout). The connection is dropped (py4j opens a
    new one), and the timed-out test's queries and jobs stopped so they do not run under the next.
    """
    context = SparkContext._active_spark_context
    if context is None:
        return
    connection = context._gateway._gateway_client.get_thread_connection()
    if connection is not None:
        connection.close(reset=True)
    session = SparkSession.getActiveSession()
    for query in session.streams.active if session else []:
        query.stop()
    context.cancelAllJobs()


# The longest test scopes (a file, or a class of one), longest first (from CI's --durations). CI
# hands whole scopes to two workers in collection order (--dist loadscope --no-loadscope-reorder):
# a long scope sent last would run alone at the end while the other worker idles, so these go
# first and the short files fill in. xdist gives each worker its first scope and, to a worker with
# at most two tests waiting, the next one at once: the one-test SIGKILL file first builds
# `local_reference` on its worker while the other runs the browser file, so no later user of it
# (S3, Kafka, cluster) waits on the lock.
LONGEST_FIRST = ("test_sigkill", "test_browser", "test_faults::TestBadRulesInAStream",
                 "test_faults::TestBadRulesInRunOnce", "test_kafka", "test_s3", "test_rules_e2e", "test_cluster",
                 "test_operations", "test_faults", "test_cli_output", "test_assets", "test_table_state")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        cls = getattr(item, "cls", None)  # doctests have none
        for name in (f"{item.path.stem}::{cls.__name__}" if cls else "", item.path.stem):
            if name in LONGEST_FIRST:
                return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order


TIMEOUT_PREFIX = PYTEST_FAILURE_MESSAGE.split("%")[0]  # "Timeout (>"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and str(call.excinfo.value).startswith(TIMEOUT_PREFIX):
        try:
            resync_after_timeout()
        except Exception as exc:  # e.g. a query that does not stop: said in the report, not an INTERNALERROR
            report.sections.append(("resync after timeout", f"{type(exc).__name__}: {exc}"))
    return report


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The development S3 server (S3Proxy) on a free port, its buckets in a temporary folder;
    `server.environment()` points a seclake process at it (tests/test_s3.py, test_cluster.py)."""
    from pipelines.home import Home
    from pipelines.objectstore.server import S3Server
    from pipelines.servers import free_port

    server = S3Server(Home(tmp_path_factory.mktemp("s3")), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def on_server(s3_server, monkeypatch):
    """`s3_server`, with this process's S3 clients (pyarrow, delta-rs) pointed at it."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def small_input(tmp_path_factory):
    """Three generated hours of 8 devices (~10k events, 12 files) and their manifest: the input of
    the object-storage and cluster tests."""
    from sample_data.generator import generate

    out = tmp_path_factory.mktemp("small-input")
    return out, generate(out, hours=3, hosts=8, seed=18, start="2026-11-20T00:00:00Z")


def session_folder(tmp_path_factory, worker_id: str) -> Path:
    """A folder of this pytest session that every xdist worker sees (the workers' temporary folders
    sit side by side in it); the session's own temporary folder without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def local_reference(spark, small_input, tmp_path_factory, worker_id):
    """`small_input` through the whole pipeline once, in one process, with a local lake: what a run
    on object storage or on a cluster must equal. Built once per test session: the first worker
    that needs it builds it under a lock while any other waits, then every worker reads it (the
    tests only read it), which saves a whole run-once on a 2-core CI machine."""
    import fcntl
    import shutil

    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

    gen, manifest = small_input  # generate() is deterministic: every worker's input is the same
    root = session_folder(tmp_path_factory, worker_id) / "local-reference"
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build fails
        built = root / ".built"
        if not built.exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed half-way
            home = Home(root).create()
            shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
            for f in manifest["files"]:
                target = home.landing / f["sensor"] / Path(f["path"]).name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(gen / f["path"], target)
            reports = run_once(spark, Lake(home), Settings())
            assert all(r.error is None for r in reports), [r.line() for r in reports]
            built.touch()
    return Home(root)


@pytest.fixture
def real_logs() -> Path:
    if not REAL_LOGS.is_dir():
        pytest.skip(f"real logs not present at {REAL_LOGS} "
                    "(they live beside the repo in ../shared, not in a user's checkout)")
    return REAL_LOGS


def state_partitions(lake, query: str) -> set[str]:
    """The shuffle (state) partitions every micro-batch in `query`'s checkpoint ran with."""
    from pipelines.checkpoint import read_batch

    checkpoint = lake.home.checkpoint(query)
    return {read_batch(checkpoint, int(f.name)).metadata["conf"]["spark.sql.shuffle.partitions"]
            for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()}


def spark_jobs(spark, call):
    """`call()`'s result and the number of Spark jobs it ran."""
    group = f"counted-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "jobs counted by a test")
    try:
        result = call()
    finally:
        spark.sparkContext.setJobGroup("", "")
    return result, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


@contextmanager
def held_elsewhere(lock: Path) -> Iterator[None]:
    """The file lock `lock` (a home's `commit_lock`) held by another process until the block ends."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def waits_for_lock(lock: Path, call: Callable[[], object], commits: Callable[[], int]) -> object:
    """Run `call` while another process holds `lock`: assert it commits nothing until the lock is
    released, then that it ends with one more commit; its result."""
    before = commits()
    result: list[object] = []
    with held_elsewhere(lock):
        worker = threading.Thread(target=lambda: result.append(call()))
        worker.start()
        worker.join(4)
        assert worker.is_alive() and commits() == before  # waiting for the lock, nothing committed
    worker.join(60)
    assert not worker.is_alive() and result and commits() == before + 1
    return result[0]
