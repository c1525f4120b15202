"""Batch reads through delta-spark: one committed snapshot, the latest or one time-travelled to."""
from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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


def existing_table(spark: SparkSession, path: str | os.PathLike) -> str:
    """The URI of the Delta table at `path`; ValueError naming it when there is none (a command's
    RESTORE, DELETE, OPTIMIZE or VACUUM then says which table, not Delta's own error)."""
    uri = table_uri(path)
    if not is_table(spark, uri):
        raise ValueError(f"no Delta table at {uri}")
    return uri


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
            # Delta's message breaks its sentence over lines; one line, without the plan if any.
            reason = " ".join(str(exc).split("\n\n", 1)[0].split())
            raise ValueError(f"{name} has no {when}: {reason}") from None
        raise


def read_in_range(spark: SparkSession, path: str | os.PathLike, column: str, lo: datetime, hi: datetime
                  ) -> DataFrame:
    """The rows of the latest snapshot of the table at `path` whose timestamp `column` is in [lo, hi]
    (naive times are local, as PySpark's), reading only the data files whose statistics allow it.

    Delta's own scan picks the same files, but first rebuilds the snapshot's whole state with a
    Spark job, and compiles its statistics filter with the range's times as constants, so again
    for every range: 0.5-1 s on 2 cores per look-up after each commit, where this takes the file
    list from the log through delta-rs (docs/performance.md, "De-duplication from the log").
    A table with deletion vectors or column mapping, or a log delta-rs cannot read, takes Delta's
    scan: files alone do not say which rows those hold, or under which names.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for day in (1, 2, 3):
    ...         row = spark.sql(f"SELECT timestamp'2026-11-0{day} 10:00' AS t, {day} AS n")
    ...         row.write.format("delta").mode("append").save(tmp)
    ...     found = read_in_range(spark, tmp, "t", datetime(2026, 11, 2), datetime(2026, 11, 3, 10))
    ...     sorted(r.n for r in found.collect())
    [2, 3]
    """
    from pipelines.lake.log import files_in_range

    uri = table_uri(path)
    table = read_table(spark, path)
    try:
        files = files_in_range(path, column, lo, hi)
    except (LookupError, OSError):
        files = None  # Delta's scan answers
    if files is not None:
        # The table's schema, not the files': a file written before a column was added has none.
        reader = spark.read.schema(table.schema).option("basePath", uri)
        table = (reader.parquet(*(_data_file(uri, f) for f in files)) if files
                 else spark.createDataFrame([], table.schema))
    return table.where(F.col(column).between(F.lit(lo), F.lit(hi)))


def _data_file(uri: str, path: str) -> str:
    """A data file's location from its `add` action's path: URI-encoded, relative to the table unless absolute.

    >>> _data_file("/lake/t", "event_date=2026-11-20/part-0%20a.parquet"), _data_file("/lake/t", "s3a://b/x.parquet")
    ('/lake/t/event_date=2026-11-20/part-0 a.parquet', 's3a://b/x.parquet')
    """
    decoded = unquote(path)
    return decoded if "://" in path or path.startswith(("/", "file:")) else f"{uri}/{decoded}"


def _utc_text(timestamp: str | datetime) -> str:
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00")) if isinstance(timestamp, str) else timestamp
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    return when.isoformat(sep=" ")


def value_counts(spark: Callable[[], SparkSession], path: str | os.PathLike, columns: list[str]
                 ) -> tuple[int, dict[str, dict[str, int]]]:
    """The rows of the table at `path`, and per column of `columns` its rows per value (as text).

    Read by delta-rs, `columns` only: a Spark read first rebuilt the table's state, about 2 s of
    `seclake demo` per table counted (docs/performance.md, "Shared tables"). A table delta-rs cannot
    read alone (`log.read_columns`) is counted by Spark, `spark` making the session.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.sql("SELECT * FROM VALUES ('b', 1), ('a', 2), ('b', 3) AS t(k, v)").write.format("delta").save(tmp)
    ...     value_counts(lambda: spark, tmp, ["k"])
    (3, {'k': {'a': 1, 'b': 2}})
    """
    from pipelines.lake.log import read_columns, tally

    try:
        rows = read_columns(path, sorted(set(columns)))
        return rows.num_rows, {c: {str(value): n for value, n in tally(rows, [c])} for c in columns}
    except LookupError:
        df = read_table(spark(), path)
        return df.count(), {c: {str(r[c]): r["count"] for r in df.groupBy(c).count().collect()} for c in columns}
