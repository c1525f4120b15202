"""The one place a SparkSession is built."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from pathlib import Path

from pyspark.sql import SparkSession

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

# Why each setting: timestamps must be TIMESTAMP_MICROS or delta-rs marks tables as needing
# the timestampNanos reader feature (DESIGN.md); 2 cores gain nothing from 200 shuffle
# partitions; RocksDB with changelog checkpointing keeps join/dedup state off the JVM heap
# and makes state commits incremental.
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.sql.runSQLOnFiles": "false",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
    # Snapshot reads hand Spark the Delta log's exact file list; listing it again in a Spark job
    # (the default above 32 paths) only adds latency.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "10000",
}


def check_java() -> None:
    """Fail early with a clear message unless `java` 17+ is on PATH.

    >>> check_java()  # raises RuntimeError on a machine without Java 17+
    """
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java:
        raise RuntimeError("seclake needs Java 17 or newer: no `java` on PATH (install openjdk-17-jre-headless or set JAVA_HOME)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        version = out.split('"')[1]
        major = int(version.split(".")[0] if not version.startswith("1.") else version.split(".")[1])
    except (IndexError, ValueError):
        raise RuntimeError(f"could not read the Java version from `{java} -version`: {out.strip()!r}") from None
    if major < 17:
        raise RuntimeError(f"seclake needs Java 17 or newer; {java} is version {version}")


def get_spark(master: str | None = None, app_name: str = "seclake", ui: bool = True,
              conf: dict[str, str] | None = None) -> SparkSession:
    """Build (or return the active) SparkSession with seclake's settings.

    `master` defaults to `$SECLAKE_SPARK_MASTER`, else `local[*]`; `conf` overrides any setting,
    e.g. `{"spark.master": "spark://host:7077"}`.

    >>> spark = get_spark(ui=False)
    >>> spark.conf.get("spark.sql.parquet.outputTimestampType")
    'TIMESTAMP_MICROS'
    """
    check_java()
    # Python workers (data sources, pandas state processors) must run this interpreter, the one
    # with pyarrow; pyspark reads the variable only when the SparkContext starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = dict(BASE_CONF)
    settings["spark.ui.enabled"] = "true" if ui else "false"
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    settings.update(conf or {})
    master = settings.pop("spark.master", None) or master or os.environ.get("SECLAKE_SPARK_MASTER") or "local[*]"
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SECLAKE_SPARK_LOG_LEVEL", "ERROR"))
    return spark
