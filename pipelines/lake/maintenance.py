"""Table maintenance through delta-spark: compaction and vacuum (log checkpoints are Delta's own,
every `delta.checkpointInterval` commits).

Both are safe while a sink writes and a stream reads the table: compaction commits with
`dataChange: false` (streams skip it), and vacuum keeps every file younger than the retention.
"""
from __future__ import annotations

import os
from typing import Any

from pyspark.sql import SparkSession

from pipelines.lake.read import existing_table

DEFAULT_TARGET_SIZE = 128 * 1024 * 1024  # one Spark read task's worth (spark.sql.files.maxPartitionBytes)


def compact(spark: SparkSession, path: str | os.PathLike, target_size: int = DEFAULT_TARGET_SIZE) -> dict[str, Any]:
    """Rewrite the table's small files into files of about `target_size` bytes (Delta `OPTIMIZE`).

    Returns Delta's metrics (`numFilesAdded`, `numFilesRemoved`, ...). The replaced files stay on
    disk until `vacuum` removes them after the retention.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for n in range(2): spark.range(n, n + 1, numPartitions=1).write.format("delta").mode("append").save(tmp)
    ...     metrics = compact(spark, tmp)
    >>> metrics["numFilesRemoved"], metrics["numFilesAdded"]
    (2, 1)
    """
    from delta.tables import DeltaTable

    if target_size <= 0:
        raise ValueError(f"target_size must be a positive number of bytes, not {target_size!r}")
    uri = existing_table(spark, path)
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target_size))
    result = DeltaTable.forPath(spark, uri).optimize().executeCompaction().first()
    if result is None:  # OPTIMIZE always returns one row of metrics; None would be a Delta bug
        raise RuntimeError(f"OPTIMIZE of {uri} returned no metrics")
    return result.metrics.asDict(recursive=True)


def vacuum(spark: SparkSession, path: str | os.PathLike, retention_hours: float = 168,
           dry_run: bool = False) -> list[str]:
    """Delete files the table no longer needs that are older than `retention_hours` (Delta `VACUUM`);
    return their paths relative to the table (only list them if `dry_run`).

    Two kinds go: files compaction replaced, and files no commit references, such as the Parquet
    files of a batch that crashed before committing. Keep the retention above the longest
    micro-batch (a batch's files are unreferenced until its commit) and above the longest a stream
    may lag behind the table (it still reads the files compaction replaced).

    `vacuum(spark, lake.path("silver_dns"), dry_run=True)` lists what a real run would delete.
    (Not run as a doctest: even on a one-file table VACUUM runs some twenty Spark jobs, tens of
    seconds on 2 cores; tests/test_lake_maintenance.py covers it.)
    """
    if retention_hours < 0:
        raise ValueError(f"retention_hours must be >= 0, not {retention_hours!r}")
    uri = existing_table(spark, path)
    # `delta.`<path>`` names a table only with spark.sql.runSQLOnFiles on, which seclake's sessions
    # turn off: run VACUUM in a child session (same SparkContext and catalog, its own SQL conf).
    session = spark.newSession()
    session.conf.set("spark.sql.runSQLOnFiles", "true")
    statement = f"VACUUM delta.`{uri}` RETAIN {retention_hours} HOURS"
    listed = [row.path for row in session.sql(statement + " DRY RUN").collect()]
    if not dry_run and listed:
        session.sql(statement).collect()
    root = uri.rstrip("/") + "/"
    return sorted(p.removeprefix("file:").removeprefix(root) for p in listed)
