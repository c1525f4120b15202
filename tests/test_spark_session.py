"""The Spark session seclake builds (pipelines/spark.py): plans compiled once per JVM, the JIT's thresholds."""
from __future__ import annotations

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
