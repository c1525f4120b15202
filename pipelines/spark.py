"""The one place a SparkSession is built."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from pyspark import SparkConf, SparkContext, accumulators
from pyspark.java_gateway import launch_gateway
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from pipelines import environment
from pipelines.objectstore import path as objectstore

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# .ci/setup fetches the Delta jars here from Maven Central (pinned in .ci/jars.pom.xml).
JARS_DIR = Path(__file__).resolve().parents[1] / ".jars"

# Why each setting: timestamps must be TIMESTAMP_MICROS or other Delta readers (delta-rs, the
# JVM-free listings) see tables as needing the timestampNanos reader feature (DESIGN.md); 2 cores
# gain nothing from 200 shuffle partitions; RocksDB with changelog checkpointing keeps join/dedup
# state off the JVM heap and makes state commits incremental.
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.shuffle.partitions": "4",
    # Spark keeps 100 compiled plans by default; the ETL over 4 files compiles 44-46, and with other
    # queries in between a third identical run in one JVM compiled them all again with Janino, as new
    # classes the JIT compiled from scratch (performance.md, "The JIT and the code-generation cache").
    "spark.sql.codegen.cache.maxEntries": "2000",
    "spark.default.parallelism": "4",
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    # VACUUM lists a table's files with this many tasks (default 10,000: ~45 s per small table here).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    "spark.sql.runSQLOnFiles": "false",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
    # PySpark records the Python call site of each DataFrame function for its error messages, with
    # 9 of the 13 JVM round trips an `F.col` costs. A one-file ETL micro-batch made ~7,000 round
    # trips with it and ~3,200 without, and took 2.7-2.9 s instead of 1.7-2.0 s (performance.md,
    # "Python's round trips"). Spark's errors still name the SQL, the column and the table.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Delta Lake (delta-spark): SQL commands (DESCRIBE HISTORY, RESTORE, OPTIMIZE, VACUUM, time
    # travel) and `USING delta` tables in the session catalog. The catalog stays in memory, one per
    # JVM, so any number of sessions (streams, `seclake sql`, notebooks) run side by side; each
    # registers the home's tables by path (Lake.register).
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.catalogImplementation": "in-memory",
    # Spark makes its warehouse folder at start wherever the command runs (`./spark-warehouse`);
    # nothing is written there (tables are registered by path), so out of the user's folder.
    "spark.sql.warehouse.dir": os.path.join(tempfile.gettempdir(), "seclake-spark-warehouse"),
    # A snapshot's log is small here; Delta's default of 50 partitions to rebuild it means 50
    # tasks on 2 cores for every table opened.
    "spark.databricks.delta.snapshotPartitions": "2",
    # seclake's maintenance chooses its own vacuum retention (pipelines/lake/maintenance.py).
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # A commit's checksum without the list of a small table's files. Delta reads that list only to
    # derive the next checksum's and to validate it, never for a query; for a table that did not
    # exist it first rebuilds the empty state with a Spark job (a new table: 322 -> 89 ms), and the
    # list grows with the table up to Delta's threshold (performance.md, "Tables created without
    # a state rebuild").
    "spark.databricks.delta.allFilesInCrc.enabled": "false",
}


# Hadoop's local file system without its native library (pip's pyspark ships none) forks `chmod`
# for every file it creates and `readlink` for both sides of every rename: each data file and its
# .crc, each Delta commit, each streaming checkpoint file. `jvm/localfs` does the same through
# java.nio (a Delta append's commit 107-153 ms -> 48-57 ms; performance.md, "Hadoop's forks").
# On the JVMs' class path, not `spark.jars`: Hadoop loads file systems before Spark adds those.
LOCAL_FS_JAR = JARS_DIR / "localfs" / "seclake-localfs.jar"
LOCAL_FS_CONF = {
    "spark.hadoop.fs.file.impl": "seclake.localfs.NioLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "seclake.localfs.NioLocalFs",
}
CLASS_PATHS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


# The throughput collector, not Java 17's default G1: seclake's JVM runs batch work on 2 cores,
# where G1's concurrent marking and write barriers cost time that short pauses do not earn back
# (`seclake run-once --only etl` on a day of the demo: 43.5 and 41.9 s -> 37.7 and 35.5 s). And a
# JVM out of memory exits at once, printing the cause in one line ("Terminating due to
# java.lang.OutOfMemoryError: Java heap space"), where Spark's own exit after an OutOfMemoryError
# printed its stream threads' stack traces and not the error. Run-once and the stream resume from
# the last commit; the rule that was running is charged (docs/rules.md).
# And C2, the JIT's optimising compiler, only for code ten times hotter than its defaults ask:
# Spark generates new classes for every plan it runs, and with the default thresholds C2 took
# 145 of the demo's 370 JVM CPU seconds on 2 cores, more than Spark's tasks (122); the
# first tier still compiles everything that runs (performance.md, "The JIT and the code-generation cache").
JVM_OPTIONS = ("-XX:+UseParallelGC -XX:+ExitOnOutOfMemoryError -XX:Tier4InvocationThreshold=50000 "
               "-XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 "
               "-XX:Tier4BackEdgeThreshold=400000")

# The driver JVM's class-data archive (CDS): the classes of Spark's class path that a run-once
# loaded, parsed and verified once, mapped at start instead of read from the jars
# (`pipelines/class_archive.py` records it at set-up; docs/performance.md, "JVM start"). Without
# it, or when it no longer matches the JVM or the class path (an upgrade), the JVM starts as
# before: the mismatch is not an error, so its warning is silenced.
CLASS_ARCHIVE = JARS_DIR / "seclake-classes.jsa"
_ARCHIVE_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def check_java() -> None:
    """Fail early with a clear message unless `java` 17+ is on PATH.

    >>> check_java()  # raises RuntimeError on a machine without Java 17+
    """
    java_home = environment.java_home()
    java = shutil.which("java", path=os.path.join(java_home, "bin")) if java_home else shutil.which("java")
    if not java:
        raise RuntimeError("seclake needs Java 17 or newer: no `java` on PATH "
                           "(install openjdk-17-jre-headless or set JAVA_HOME)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        version = out.split('"')[1]
        major = int(version.split(".")[0] if not version.startswith("1.") else version.split(".")[1])
    except (IndexError, ValueError):
        raise RuntimeError(f"could not read the Java version from `{java} -version`: {out.strip()!r}") from None
    if major < 17:
        raise RuntimeError(f"seclake needs Java 17 or newer; {java} is version {version}")


def delta_jars() -> list[Path]:
    """The Delta jars `.ci/setup` fetched; a RuntimeError saying what to run when they are missing.

    >>> any(p.name.startswith("delta-spark_") for p in delta_jars())
    True
    """
    jars = sorted(JARS_DIR.glob("*.jar"))
    if not any(p.name.startswith("delta-spark_") for p in jars):
        raise RuntimeError(f"the Delta Lake jars are missing from {JARS_DIR}; run `bash .ci/setup` once "
                           "(it fetches them from Maven Central)")
    return jars


def local_fs_conf() -> dict[str, str]:
    """The settings that put seclake's local file system in every JVM; a RuntimeError saying what to
    run when `.ci/setup` has not built it.

    >>> local_fs_conf()["spark.hadoop.fs.file.impl"]
    'seclake.localfs.NioLocalFileSystem'
    """
    if not LOCAL_FS_JAR.is_file():
        raise RuntimeError(f"seclake's local file system jar {LOCAL_FS_JAR} is missing; run `bash .ci/setup` once "
                           "(it compiles jvm/localfs)")
    return {**LOCAL_FS_CONF, **{key: str(LOCAL_FS_JAR) for key in CLASS_PATHS}}


def merged(settings: dict[str, str], more: dict[str, str]) -> dict[str, str]:
    """`settings` updated with `more`, class paths joined instead of replaced.

    >>> merged({"spark.driver.extraClassPath": "/a", "x": "1"}, {"spark.driver.extraClassPath": "/b", "x": "2"})
    {'spark.driver.extraClassPath': '/a:/b', 'x': '2'}
    """
    out = dict(settings)
    for key, value in more.items():
        out[key] = f"{out[key]}:{value}" if key in CLASS_PATHS and out.get(key) else value
    return out


def context_stopped() -> bool:
    """Whether this process's SparkContext is gone: stopped by Spark (an OutOfMemoryError can), or
    its JVM dead; False when none was made.

    >>> context_stopped()
    False
    """
    from py4j.protocol import Py4JNetworkError
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return False
    try:
        return bool(sc._jsc.sc().isStopped())
    except (ConnectionError, Py4JNetworkError):
        return True


def get_spark(master: str | None = None, app_name: str = "seclake", ui: bool = True,
              conf: dict[str, str] | None = None, ignore_ctrl_c: bool = False) -> SparkSession:
    """Build (or return the active) SparkSession with seclake's settings.

    `master` defaults to `$SECLAKE_SPARK_MASTER`, else `local[*]`; `conf` overrides any setting,
    e.g. `{"spark.master": "spark://host:7077"}`, and adds to the class paths. `ignore_ctrl_c`: the
    process ignores SIGINT after the session starts (`seclake stream`'s rules application, which its
    parent stops with SIGTERM), not PySpark's handler that cancels every job.

    >>> spark = get_spark(ui=False)
    >>> spark.conf.get("spark.sql.parquet.outputTimestampType")
    'TIMESTAMP_MICROS'
    >>> logging.getLogger("py4j").isEnabledFor(logging.ERROR)  # unless $SECLAKE_SPARK_LOG_LEVEL asks for it
    False
    >>> logging.getLogger("SQLQueryContextLogger").isEnabledFor(logging.ERROR)
    False
    """
    with BUILDING:
        return _build(master, app_name, ui, conf, ignore_ctrl_c)


# Held while a session is built: `assets/launch.py` builds the run's session in a thread while
# Dagster sets up its run, and the run's first step may ask for it before that thread is done.
BUILDING = threading.RLock()


def _build(master: str | None, app_name: str, ui: bool, conf: dict[str, str] | None,
           ignore_ctrl_c: bool) -> SparkSession:
    check_java()
    # Python workers (data sources, pandas state processors) must run this interpreter, the one
    # with pyarrow; pyspark reads the variable only when the SparkContext starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The lake's times are UTC, and pyspark turns a timestamp into a naive datetime (and a naive datetime
    # into a timestamp) in the Python process's zone: on a machine set to another zone, a suppression's
    # expiry read back and the times `alerts list` prints as UTC were local times.
    os.environ["TZ"] = "UTC"
    time.tzset()
    settings = dict(BASE_CONF)
    settings["spark.ui.enabled"] = "true" if ui else "false"
    settings["spark.driver.memory"] = environment.driver_memory() or settings["spark.driver.memory"]
    # FATAL by default: seclake reports a failed query or task in one line of its own, so Spark's
    # ERROR lines (a task's stack trace, "Aborted commit") would only repeat it as a JVM trace.
    log_level = environment.spark_log_level() or "FATAL"
    _quiet_python_side(log_level == "FATAL")
    settings["spark.driver.extraJavaOptions"] = driver_java_options(log_level)
    settings["spark.executor.extraJavaOptions"] = JVM_OPTIONS
    settings["spark.jars"] = ",".join(str(p) for p in delta_jars())
    s3a = objectstore.spark_conf()
    for more in (local_fs_conf(), s3a, conf or {}):
        settings = merged(settings, more)
    master = settings.pop("spark.master", None) or master or environment.spark_master() or "local[*]"
    check_master(master)
    if on_this_machine(master):
        # No executor elsewhere needs the driver: its RPC, block manager and UI ports listen on the
        # loopback only, not on every address of the machine (the block manager serves table data).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started = SparkContext._active_spark_context is None  # else getOrCreate returns the running session
    _start_jvm(master, app_name, settings)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if ignore_ctrl_c and threading.current_thread() is threading.main_thread():
        # The SparkContext installs a Ctrl-C handler that cancels every job and raises KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    spark.sparkContext.setLogLevel(log_level)
    if log_level == "FATAL" and s3a:
        _quiet_sdk_logging(spark)
    if started and master.startswith("spark://"):
        threading.Thread(target=_warn_without_executors, args=(spark, master), daemon=True,
                         name="seclake-executors").start()
    return spark


def on_this_machine(master: str) -> bool:
    """Whether every executor of `master` runs on this machine: local mode, or standalone masters
    all on the loopback (`seclake cluster`). Not YARN, Kubernetes or another host.

    >>> [on_this_machine(m) for m in ("local[*]", "spark://127.0.0.1:7077", "spark://127.0.0.1:7077,h2:7077", "yarn")]
    [True, True, False, False]
    """
    if master.startswith("local"):
        return True
    hosts = [urlsplit(f"spark://{part}").hostname for part in master.removeprefix("spark://").split(",")]
    return master.startswith("spark://") and all(host in ("127.0.0.1", "localhost") for host in hosts)


def check_master(master: str) -> None:
    """A RuntimeError naming the master when a standalone master (`spark://host:port`, or several
    for a master with standbys) refuses connections (`servers.refused`): Spark itself would retry
    for a minute, then fail with an error that names neither. Other masters (local, yarn, k8s) are
    not checked.

    >>> check_master("local[*]")
    >>> try:
    ...     check_master("spark://127.0.0.1:1")
    ... except RuntimeError as exc:
    ...     print(str(exc).removesuffix(" is the cluster up? (seclake cluster status)"))
    no Spark master answers at spark://127.0.0.1:1 (SECLAKE_SPARK_MASTER): 127.0.0.1:1: connection refused;
    """
    from pipelines.servers import refused

    why = refused(master.removeprefix("spark://"), MASTER_CONNECT_TIMEOUT_S) if master.startswith("spark://") else None
    if why:
        raise RuntimeError(f"no Spark master answers at {master} (SECLAKE_SPARK_MASTER): {why}; is the cluster up? "
                           "(seclake cluster status)")


# How long a session on a cluster may wait for its first executor before seclake says why nothing runs.
EXECUTOR_WAIT_S = 60.0
MASTER_CONNECT_TIMEOUT_S = 5.0


def _warn_without_executors(spark: SparkSession, master: str) -> None:
    """Say once, in one line, when the application still has no executor after EXECUTOR_WAIT_S: its
    jobs wait without a word otherwise (no live worker, or other applications hold every core)."""
    time.sleep(EXECUTOR_WAIT_S)
    try:
        # The driver is in the list too.
        if spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() > 1:  # type: ignore[union-attr]
            return
    except Exception:  # the session stopped meanwhile: nothing to say
        return
    logging.getLogger("seclake").warning(
        "%s has had no executor for %.0f s: no worker of %s has a free core (workers dead, or other "
        "applications hold them all: cap each with spark.cores.max, docs/deploy.md); its jobs wait until one does",
        spark.sparkContext.appName, EXECUTOR_WAIT_S, master)


def _quiet_sdk_logging(spark: SparkSession) -> None:
    """Start the AWS SDK's own SLF4J (1.x, shaded in its bundle) with the JVM's stderr muted.

    It looks for an SLF4J 1.x binding, finds Spark's SLF4J 2 instead, and prints three
    "SLF4J: Failed to load class" lines the first time S3A logs; it then keeps its no-op logger,
    so started once here, every later use is quiet.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a live session
    system = jvm.java.lang.System
    stderr = system.err
    system.setErr(jvm.java.io.PrintStream(jvm.java.io.OutputStream.nullOutputStream()))
    try:
        jvm.software.amazon.awssdk.thirdparty.org.slf4j.LoggerFactory.getILoggerFactory()
    finally:
        system.setErr(stderr)


def driver_java_options(log_level: str, record_archive: bool = False) -> str:
    """The driver JVM's options: seclake's log4j configuration at `log_level`, JVM_OPTIONS, and the
    class-data archive: mapped when it exists, or written at exit with `record_archive` (by
    `pipelines.class_archive`, to CLASS_ARCHIVE + ".tmp").

    >>> driver_java_options("FATAL").split()[2:4]
    ['-XX:+UseParallelGC', '-XX:+ExitOnOutOfMemoryError']
    >>> [o.endswith("seclake-classes.jsa.tmp") for o in driver_java_options("FATAL", record_archive=True).split()
    ...  if o.startswith("-XX:ArchiveClassesAtExit=")]
    [True]
    """
    options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} -Dseclake.log.level={log_level} {JVM_OPTIONS}"
    if record_archive:
        return f"{options} -XX:ArchiveClassesAtExit={CLASS_ARCHIVE}.tmp {_ARCHIVE_QUIET}"
    if CLASS_ARCHIVE.exists():
        return f"{options} -XX:SharedArchiveFile={CLASS_ARCHIVE} {_ARCHIVE_QUIET}"
    return options


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def _no_traceback(self: socketserver.BaseServer, request: object, client_address: object) -> None:
    """What PySpark's accumulator server does with a request that failed: nothing (`_quiet_python_side`)."""


def _quiet_python_side(quiet: bool) -> None:
    """Unless Spark's log was asked for, what the Python side of py4j and PySpark prints stays
    silent: py4j's own log prints a foreachBatch function's exception with its whole traceback (a
    micro-batch interrupted when a stream stops), a cause the query reports itself; and when the
    JVM dies (out of memory, killed), py4j logs every call in flight on the root logger with its
    traceback and PySpark's accumulator server prints its reader's EOFError, where seclake reports
    the death in one line of its own (`pipelines.jobs`)."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL if quiet else logging.NOTSET)
    # PySpark logs every SQL error it raises, as JSON with the whole plan and Java stack trace, on
    # loggers of its own class (a plain Logger under that name would break its call).
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL if quiet else logging.NOTSET)
    root = logging.getLogger()
    if quiet:
        root.addFilter(_not_from_py4j)  # a no-op when it is there already
    else:
        root.removeFilter(_not_from_py4j)
    for server in (accumulators.AccumulatorTCPServer, getattr(accumulators, "AccumulatorUnixServer", None)):
        if server is not None:
            server.handle_error = _no_traceback if quiet else socketserver.BaseServer.handle_error  # type: ignore[method-assign]


# Lines that say nothing to a seclake user, filtered out of the JVM's stderr: the start-up notice
# for the incubator module Spark 4 always adds (Java 17 has no switch to silence it), and what
# PySpark's transformWithStateInPandas driver worker prints (on stdout, which the JVM forwards) at
# every query start, each followed by a blank line (blank lines are dropped too).
_JVM_NOTICES = (b"WARNING: Using incubator modules", b"Starting Streaming TransformWithStateInPandas Python worker",
                b"Streaming TransformWithStateInPandas Python worker")


def _start_jvm(master: str, app_name: str, settings: dict[str, str]) -> None:
    """Launch Spark's JVM (once per process) with its stderr passed through a filter.

    The session built next reuses this JVM (PySpark keeps one gateway per process). Everything
    the JVM writes to stderr reaches ours, except `_JVM_NOTICES`.
    """
    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_forward, args=(gateway.proc.stderr,), name="seclake-jvm-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)


def _forward(stream: IO[bytes]) -> None:
    # fd 2, not sys.stderr: the JVM's lines stay outside Python's stream redirections, as before.
    for line in iter(stream.readline, b""):
        if line.strip() and not line.startswith(_JVM_NOTICES):
            os.write(2, line)

