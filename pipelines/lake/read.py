"""Batch read: the snapshot's file list and schema from the Delta log, the rows from Spark's Parquet reader."""
from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession

from pipelines.lake.schema import delta_to_spark

# Reader features whose meaning lives outside the Parquet files: reading the files alone would be wrong.
_UNSUPPORTED_FEATURES = {"deletionVectors": "deletion vectors", "columnMapping": "column mapping"}


class UnsupportedTableError(ValueError):
    """A Delta table whose reader features this read path cannot honour."""


def open_table(path: str | os.PathLike, *, version: int | None = None,
               timestamp: str | datetime | None = None) -> DeltaTable:
    """Open the Delta table at `path` at its latest, a given `version`, or the version current at `timestamp`.

    Raises ValueError naming the path when there is no Delta table there.

    >>> open_table("/tmp/lake/silver_dns", version=3).version()  # doctest: +SKIP
    3
    """
    if version is not None and timestamp is not None:
        raise ValueError("give either version= or timestamp=, not both")
    location = str(Path(path).resolve())
    try:
        table = DeltaTable(location, version=version) if version is not None else DeltaTable(location)
    except TableNotFoundError:
        raise ValueError(f"no Delta table at {location}") from None
    except Exception as exc:  # delta-rs reports a missing version as a generic error
        if version is not None and "version" in str(exc).lower():
            raise ValueError(f"{Path(location).name} has no version {version}: {exc}") from None
        raise
    if timestamp is not None:
        try:
            table.load_as_version(timestamp)
        except Exception as exc:
            raise ValueError(f"{Path(location).name} has no version at or before {timestamp}: {exc}") from None
        if table.version() == 0 and _before_first_commit(table, timestamp):
            # delta-rs answers version 0 for any earlier time; the table did not exist then.
            raise ValueError(f"{Path(location).name} has no version at or before {timestamp} (created later)")
    _check_readable(table, location)
    return table


def read_table(spark: SparkSession, path: str | os.PathLike, *, version: int | None = None,
               timestamp: str | datetime | None = None) -> DataFrame:
    """Read one committed snapshot of a Delta table with Spark's native Parquet reader.

    >>> read_table(spark, "/tmp/lake/silver_dns", version=0).count()  # doctest: +SKIP
    1200
    """
    return snapshot_frame(spark, open_table(path, version=version, timestamp=timestamp))


def snapshot_frame(spark: SparkSession, table: DeltaTable) -> DataFrame:
    """The rows of an already opened snapshot (the file list is fixed now, so later commits are not seen)."""
    schema = delta_to_spark(table.schema())
    partition_columns = list(table.metadata().partition_columns)
    files = table.file_uris()
    if not files:
        return spark.createDataFrame([], schema)
    root = table.table_uri.rstrip("/")
    for uri in files[:1]:
        _check_hive_layout(uri, root, partition_columns)
    frame = spark.read.schema(schema).option("basePath", root).parquet(*files)
    return frame.select(*schema.fieldNames())


def _before_first_commit(table: DeltaTable, timestamp: str | datetime) -> bool:
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00")) if isinstance(timestamp, str) else timestamp
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    first = table.history()[-1]["timestamp"]  # newest first; epoch milliseconds
    return when.timestamp() * 1000 < first


def _check_readable(table: DeltaTable, location: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    bad = [label for key, label in _UNSUPPORTED_FEATURES.items() if key in features]
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none" and "column mapping" not in bad:
        bad.append("column mapping")
    if bad:
        raise UnsupportedTableError(
            f"{location} uses {' and '.join(bad)}, which seclake's Parquet read path cannot apply; "
            "rewrite it without them (e.g. REORG/disable the feature in the engine that wrote it)")


def _check_hive_layout(uri: str, root: str, partition_columns: list[str]) -> None:
    # Spark takes partition values from the path, so the path must say them (delta-rs and our sink do).
    rel = uri[len(root):].lstrip("/") if uri.startswith(root) else uri
    missing = [c for c in partition_columns if f"{c}=" not in rel]
    if missing:
        raise UnsupportedTableError(
            f"{root}: data file {rel} does not carry partition value(s) {missing} in its path")
