"""The Spark session seclake builds (pipelines/spark.py): plans compiled once per JVM, the JIT's thresholds,
the local file system without forks."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pipelines.spark import JVM_OPTIONS


def _compiles(spark) -> int:
    """Plans Janino compiled so far in this JVM (Spark counts each cache miss)."""
    return spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def test_a_plan_run_again_after_many_others_is_not_compiled_again(spark):
    # Spark's default cache holds 100 compiled plans: the ETL over 4 files compiles 44-46, and other
    # queries in between evicted them. Each query below inlines its own literal: its own class.
    first = spark.range(3).select((F.col("id") * 7919 + 1).alias("x"))
    assert first.collect()
    for i in range(120):
        spark.range(3).select((F.col("id") * 7919 + i + 2).alias("x")).collect()
    before = _compiles(spark)
    assert first.collect()
    assert _compiles(spark) == before


def test_the_session_jvm_runs_with_the_jit_thresholds_seclake_sets(spark):
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    wanted = dict(o.removeprefix("-XX:").split("=") for o in JVM_OPTIONS.split() if o.startswith("-XX:Tier4"))
    assert wanted, JVM_OPTIONS
    assert {name: bean.getVMOption(name).getValue() for name in wanted} == wanted


def _local_fs(spark):
    jvm = spark.sparkContext._jvm
    return jvm, jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())


def test_local_files_go_through_seclakes_file_system_in_both_hadoop_apis(spark):
    jvm, local = _local_fs(spark)
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(spark.sparkContext._jsc.hadoopConfiguration())
    assert local.getClass().getName() == "seclake.localfs.NioLocalFileSystem"
    assert local.getRawFileSystem().getClass().getName() == "seclake.localfs.NioRawLocalFileSystem"
    assert context.getDefaultFileSystem().getClass().getName() == "seclake.localfs.NioLocalFs"


def test_a_file_created_with_a_permission_has_that_mode(spark, tmp_path):
    jvm, local = _local_fs(spark)
    path = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "part-0.parquet"))
    mode = jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o640)
    local.create(path, mode, False, 4096, 1, 1 << 20, None).close()
    assert (tmp_path / "part-0.parquet").stat().st_mode & 0o7777 == 0o640
    local.setPermission(path, jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o604))
    assert (tmp_path / "part-0.parquet").stat().st_mode & 0o7777 == 0o604
    # A mode java.nio cannot set (the sticky bit) still goes through Hadoop's own chmod.
    folder = jvm.org.apache.hadoop.fs.Path(str(tmp_path))
    local.setPermission(folder, jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o1777))
    assert tmp_path.stat().st_mode & 0o7777 == 0o1777


def test_link_status_names_links_files_and_missing_paths_as_hadoop_does(spark, tmp_path):
    jvm, local = _local_fs(spark)
    (tmp_path / "commit.json").write_text("{}\n")
    (tmp_path / "link").symlink_to(tmp_path / "commit.json")
    status = local.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "commit.json")))
    assert (status.isFile(), status.isSymlink(), status.getLen()) == (True, False, 3)
    link = local.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "link")))
    assert link.isSymlink() and link.getSymlink().toUri().getPath() == str(tmp_path / "commit.json")
    with pytest.raises(Exception, match="FileNotFoundException"):
        local.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "missing")))


def test_a_rename_through_file_context_replaces_its_target_as_checkpoints_need(spark, tmp_path):
    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(spark.sparkContext._jsc.hadoopConfiguration())
    (tmp_path / "tmp-1").write_text("new")
    (tmp_path / "1").write_text("old")
    options = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    options[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
    path = jvm.org.apache.hadoop.fs.Path
    context.rename(path(str(tmp_path / "tmp-1")), path(str(tmp_path / "1")), options)
    assert (tmp_path / "1").read_text() == "new" and not (tmp_path / "tmp-1").exists()


def test_the_rules_application_keeps_ignoring_ctrl_c_once_its_session_starts():
    """`seclake stream`'s rules application is started ignoring SIGINT (its parent stops it); the
    SparkContext's own handler, which cancels every job and raises KeyboardInterrupt, must not undo that."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    code = ("import signal, sys; from pipelines.spark import get_spark; "
            "get_spark(ui=False, ignore_ctrl_c=sys.argv[1] == 'ignore'); "
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    for flag, ignored in (("ignore", "True"), ("library", "False")):  # a library user keeps PySpark's handler
        done = subprocess.run([sys.executable, "-c", code, flag], cwd=Path(__file__).resolve().parents[1],
                              capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        assert done.returncode == 0 and done.stdout.strip() == ignored, done.stdout + done.stderr[-2000:]


def test_collected_times_are_utc_on_a_machine_set_to_another_zone():
    # pyspark hands timestamps back as naive datetimes in the process's zone: a suppression expiring at
    # 18:00 UTC read back as 13:00 in New York, and `suppress list` called it expired two hours early.
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("from datetime import datetime; from pipelines.spark import get_spark; spark = get_spark(ui=False); "
            "back = spark.createDataFrame([(datetime(2026, 12, 31, 18),)], 'at timestamp')"
            ".selectExpr('at', 'cast(at AS string) AS text').first(); print(back.at.isoformat(), back.text)")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "TZ": "America/New_York"}, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "2026-12-31T18:00:00 2026-12-31 18:00:00", done.stdout + done.stderr[-2000:]


def _listening_addresses(pid: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* write them) of the TCP sockets process `pid` listens on."""
    import os

    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                    found.add(fields[1].rsplit(":", 1)[0])
    return found


def test_a_local_sessions_jvm_listens_on_the_loopback_only(spark):
    # The driver's RPC and block manager (which serves cached table data) answered on every address.
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    addresses = _listening_addresses(spark.sparkContext._gateway.proc.pid)
    assert len(addresses) >= 1 and addresses <= loopback, addresses
