"""Batch reads through delta-spark: one committed snapshot, the latest or one time-travelled to."""
from __future__ import annotations

import os
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession

from pipelines.lake.sink import table_uri

# Conditions Spark and Delta raise when a path holds no table (no folder, or no commit in its log).
_NO_TABLE = ("PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE")


def is_table(spark: SparkSession, path: str | os.PathLike) -> bool:
    """True when a Delta table (a `_delta_log` with a commit) is at `path`."""
    try:
        read_table(spark, path)
    except ValueError:
        return False
    return True


def read_table(spark: SparkSession, path: str | os.PathLike, *, version: int | None = None,
               timestamp: str | datetime | None = None) -> DataFrame:
    """One committed snapshot of the Delta table at `path`: the latest, a `version`, or the one current at `timestamp`.

    Raises ValueError naming the table when there is no table there, or no such version.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for n in (10, 20): spark.range(n).write.format("delta").mode("append").save(tmp)
    ...     read_table(spark, tmp).count(), read_table(spark, tmp, version=0).count()
    (30, 10)
    """
    from pyspark.errors import PySparkException

    if version is not None and timestamp is not None:
        raise ValueError("give either version= or timestamp=, not both")
    uri = table_uri(path)
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    if timestamp is not None:
        reader = reader.option("timestampAsOf", _utc_text(timestamp))
    # Loading, not DeltaTable.isDeltaTable, decides whether the table exists: the latter asks the
    # JVM's cached log, which another thread's first commit can leave stale for a moment.
    try:
        return reader.load(uri)
    except PySparkException as exc:
        condition = exc.getCondition() or ""
        if condition in _NO_TABLE:
            raise ValueError(f"no Delta table at {uri}") from None
        if "VERSION" in condition or "TIMESTAMP" in condition:
            when = f"version {version}" if version is not None else f"version at or before {timestamp}"
            raise ValueError(f"{name} has no {when}: {str(exc).splitlines()[0]}") from None
        raise


def _utc_text(timestamp: str | datetime) -> str:
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00")) if isinstance(timestamp, str) else timestamp
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    return when.isoformat(sep=" ")
