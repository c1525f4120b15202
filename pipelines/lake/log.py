"""Listings from a table's Delta log without a JVM (delta-rs): instant `seclake tables` and `history`,
a column's newest value from the files' statistics (`newest_in_stats`), the files whose statistics
overlap a time range (`files_in_range`), and a few columns of a table's rows (`read_columns`,
counted by `tally`/`count_by`) for the demo's summary, the shared tables' assets and the quality
checks, which fall back to Spark when delta-rs cannot read a table alone (`_plain_log`).

Every other read of rows, and every write, goes through delta-spark.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pipelines.objectstore.path import as_path, on_object_store, storage_options


@dataclass(frozen=True)
class TableSummary:
    """The latest snapshot of one table, from its log: `rows` is None when a file has no stats."""

    version: int
    rows: int | None
    files: int
    size_bytes: int
    last_commit: datetime
    partition_columns: list[str]


def summary(path: str | os.PathLike) -> TableSummary:
    """Version, rows (from file stats), files, bytes, last commit time and partitioning of a table.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3, numPartitions=1).write.format("delta").save(tmp)
    ...     found = summary(tmp)
    >>> found.version, found.rows, found.files, found.partition_columns
    (0, 3, 1, [])
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = open_log(path)
    adds = pa.table(table.get_add_actions(flatten=True))
    records = adds.column("num_records") if "num_records" in adds.column_names else None
    if adds.num_rows == 0:
        rows: int | None = 0
    elif records is None or records.null_count:
        rows = None
    else:
        rows = pc.sum(records).as_py()
    size = pc.sum(adds.column("size_bytes")).as_py() if adds.num_rows else 0
    return TableSummary(table.version(), rows, adds.num_rows, size or 0,
                        _commit_time(table.history(1)[0]["timestamp"]), list(table.metadata().partition_columns))


def commits(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's commits, newest first: version, timestamp, operation, parameters (its
    `operationParameters`), user_metadata (the writer's `userMetadata`), app_id/batch_id (txn),
    rows_added and files_added (None once log cleanup removed the entry), and changes_data (a file
    added or removed with `dataChange`, or a new schema or protocol; True once log cleanup removed
    the entry).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3, numPartitions=1).write.format("delta").save(tmp)
    ...     [(c["version"], c["operation"], c["rows_added"], c["files_added"]) for c in commits(tmp)]
    [(0, 'WRITE', 3, 1)]
    """
    log = as_path(path) / "_delta_log"
    return [{"version": c["version"], "timestamp": _commit_time(c["timestamp"]), "operation": c.get("operation"),
             "parameters": c.get("operationParameters") or {}, "user_metadata": c.get("userMetadata"),
             **_commit_actions(log / f"{c['version']:020d}.json")}
            for c in open_log(path).history(limit)]


def quiet_since(path: str | os.PathLike, version: int) -> bool:
    """True when no commit after `version` changes the table's rows, schema or protocol (only
    compactions and txn-only commits, if any): a reader that has read `version` has nothing to read.

    >>> import tempfile
    >>> from delta.tables import DeltaTable
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for _ in range(2):
    ...         spark.range(3, numPartitions=1).write.format("delta").mode("append").save(tmp)
    ...     _ = DeltaTable.forPath(spark, tmp).optimize().executeCompaction()
    ...     quiet_since(tmp, 1), quiet_since(tmp, 0)
    (True, False)
    """
    log = as_path(path) / "_delta_log"
    return not any(_commit_actions(log / f"{v:020d}.json")["changes_data"]
                   for v in range(version + 1, open_log(path).version() + 1))


def newer_version(path: str | os.PathLike, version: int) -> int | None:
    """The table's newest version, found from `version` by looking for each next commit file alone:
    a poll's cost stays one look per table however long its log (`CatalogWatch`). None when
    `version`'s own commit file is gone: the table was deleted, and perhaps made again.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for _ in range(3):
    ...         spark.range(3, numPartitions=1).write.format("delta").mode("append").save(tmp)
    ...     newer_version(tmp, 0), newer_version(tmp, 2), newer_version(tmp, 5)
    (2, 2, None)
    """
    log = as_path(path) / "_delta_log"
    if not (log / f"{version:020d}.json").exists():
        return None
    while (log / f"{version + 1:020d}.json").exists():
        version += 1
    return version


def newest_in_stats(path: str | os.PathLike, column: str) -> datetime | None:
    """The newest value of the timestamp `column` among the table's rows, from its files' statistics
    in the log (no data file is read; the cost grows with files, not rows). None when no file holds
    a value; LookupError when a file with rows has no statistics for `column`, or when the table
    has deletion vectors (the caller reads the rows instead).

    Delta keeps timestamp statistics to the millisecond, truncated: the true newest value is at or
    after the one returned and less than a millisecond past it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.sql("SELECT timestamp'2026-11-20 10:00:00.123456' AS t").write.format("delta").save(tmp)
    ...     newest_in_stats(tmp, "t").isoformat()
    '2026-11-20T10:00:00.123000+00:00'
    """
    import pyarrow.compute as pc

    adds = _plain_files(path)
    if adds.num_rows == 0:
        return None
    names = (f"max.{column}", f"null_count.{column}", "num_records")
    if any(name not in adds.column_names for name in names):
        raise LookupError(f"{as_path(path).name}: no statistics for {column}")
    newest, nulls, records = (adds.column(name) for name in names)
    # A file without a maximum is fine only when it is known to hold no value of the column.
    unknown = pc.and_(pc.is_null(newest), pc.invert(pc.fill_null(pc.equal(nulls, records), False)))
    if pc.any(unknown).as_py():
        raise LookupError(f"{as_path(path).name}: a file without statistics for {column}")
    return pc.max(newest).as_py()


def files_in_range(path: str | os.PathLike, column: str, lo: datetime, hi: datetime) -> list[str]:
    """The data files (paths as the log holds them) whose statistics of the timestamp `column` overlap
    [lo, hi] (naive times are local, as PySpark's); a file without them is included. LookupError when
    the files alone do not hold the table's rows under its column names (`_plain_files`), or when
    no file has statistics for `column`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for day in (1, 2):
    ...         spark.sql(f"SELECT timestamp'2026-11-0{day} 10:00' AS t").write.format("delta").mode("append").save(tmp)
    ...     [f.endswith(".parquet") for f in files_in_range(tmp, "t", datetime(2026, 11, 2), datetime(2026, 11, 3))]
    [True]
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    adds = _plain_files(path)
    if adds.num_rows == 0:
        return []
    if f"min.{column}" not in adds.column_names:
        raise LookupError(f"{as_path(path).name}: no statistics for {column}")
    utc = pa.timestamp("us", "UTC")
    # Delta keeps timestamp statistics to the millisecond, truncated: a file's true maximum may be
    # up to a millisecond past the one recorded.
    low = pa.scalar(lo.astimezone(timezone.utc) - timedelta(milliseconds=1), utc)
    high = pa.scalar(hi.astimezone(timezone.utc), utc)
    keep = pc.and_(pc.fill_null(pc.less_equal(adds.column(f"min.{column}").cast(utc), high), True),
                   pc.fill_null(pc.greater_equal(adds.column(f"max.{column}").cast(utc), low), True))
    return adds.filter(keep).column("path").to_pylist()


def _plain_files(path: str | os.PathLike) -> Any:
    """The table's add actions (flattened, with statistics) as a pyarrow Table; LookupError when its
    files do not hold exactly its rows under its column names (`_plain_log`)."""
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    table = _plain_log(path)
    try:
        return pa.table(table.get_add_actions(flatten=True))
    except DeltaError as exc:
        raise LookupError(f"{as_path(path).name}: delta-rs cannot read the log: {exc}") from None


def _plain_log(path: str | os.PathLike) -> Any:
    """delta-rs's view of the table at `path`; LookupError when its files do not hold exactly its rows
    under its column names: deletion vectors (a file's statistics still count the rows a vector
    removed), column mapping, or a log delta-rs cannot read."""
    from deltalake.exceptions import DeltaError

    name = as_path(path).name
    try:
        table = open_log(path)
        features = set(table.protocol().reader_features or [])
        mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    except DeltaError as exc:
        raise LookupError(f"{name}: delta-rs cannot read the log: {exc}") from None
    if "deletionVectors" in features:
        raise LookupError(f"{name}: deletion vectors, the statistics may count deleted rows")
    if "columnMapping" in features or mapping != "none":
        raise LookupError(f"{name}: column mapping, the files name the columns otherwise")
    return table


def read_columns(path: str | os.PathLike, columns: list[str],
                 within: tuple[str, datetime, datetime] | None = None) -> Any:
    """The current rows of the table at `path`, `columns` only, as a pyarrow Table read by delta-rs:
    the quality checks' frame without Delta's state rebuild in Spark (1-2 s per table, 8 s for the
    first in a JVM). `within` = (timestamp column, lo, hi) keeps the rows with that column in
    [lo, hi] (naive times are local, as PySpark's); pyarrow skips the row groups whose statistics
    rule them out. LookupError as `_plain_log`; a column the table lacks is a ValueError naming it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.sql("SELECT * FROM VALUES ('b', 1), ('a', 2) AS t(k, v)").write.format("delta").save(tmp)
    ...     sorted(read_columns(tmp, ["k"]).column("k").to_pylist())
    ['a', 'b']
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for day in (1, 2, 3):
    ...         row = spark.sql(f"SELECT timestamp'2026-11-0{day} 10:00' AS t, {day} AS n")
    ...         row.write.format("delta").mode("append").save(tmp)
    ...     found = read_columns(tmp, ["n"], ("t", datetime(2026, 11, 2), datetime(2026, 11, 3, 10)))
    ...     sorted(found.column("n").to_pylist())
    [2, 3]
    """
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake.exceptions import DeltaError

    table = _plain_log(path)
    missing = sorted(set(columns) - {field.name for field in table.schema().fields})
    if missing:
        raise ValueError(f"{as_path(path).name} has no column(s) {missing}")
    try:
        if within is None:
            return table.to_pyarrow_table(columns=columns)
        column, lo, hi = within
        utc = pa.timestamp("us", "UTC")
        time = ds.field(column)
        keep = ((time >= pa.scalar(lo.astimezone(timezone.utc), utc))
                & (time <= pa.scalar(hi.astimezone(timezone.utc), utc)))
        return table.to_pyarrow_dataset().to_table(columns=columns, filter=keep)
    except DeltaError as exc:
        raise LookupError(f"{as_path(path).name}: delta-rs cannot read the files: {exc}") from None


def count_by(path: str | os.PathLike, columns: list[str]) -> list[tuple[Any, ...]]:
    """Rows per distinct value of `columns` of the table at `path` (`tally` of `read_columns`):
    `seclake demo`'s alert count without starting a JVM (a Spark session for it cost the demo about
    12 s). Reads only those columns' data; LookupError as `read_columns`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.sql("SELECT * FROM VALUES ('b', 1), ('a', 2), ('b', 3) AS t(k, v)").write.format("delta").save(tmp)
    ...     count_by(tmp, ["k"])
    [('a', 1), ('b', 2)]
    """
    return tally(read_columns(path, columns), columns)


def tally(rows: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """Rows of the pyarrow Table `rows` per distinct value of `columns`, sorted, each `(*values, count)`.

    >>> import pyarrow as pa
    >>> tally(pa.table({"k": ["b", "a", "b"]}), ["k"])
    [('a', 1), ('b', 2)]
    """
    counted = rows.group_by(columns).aggregate([([], "count_all")])
    ordered = counted.sort_by([(column, "ascending") for column in columns])
    return [tuple(row[name] for name in [*columns, "count_all"]) for row in ordered.to_pylist()]


def commit_versions(log: Path) -> list[int]:
    """The versions of the commit files (`<20 digits>.json`) in a `_delta_log` folder (local, or an
    ObjectPath), ascending; OSError when a local folder cannot be listed. Log checkpoints, checksums
    and compacted logs are not commits.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3).write.format("delta").save(tmp)
    ...     spark.range(3).write.format("delta").mode("append").save(tmp)
    ...     commit_versions(Path(tmp) / "_delta_log")
    [0, 1]
    """
    names = (entry.name for entry in log.iterdir())
    return sorted(int(name[:20]) for name in names
                  if len(name) == 25 and name.endswith(".json") and name[:20].isdigit())


def open_log(path: str | os.PathLike) -> Any:
    """delta-rs's view of the table at `path`, local or on object storage (`s3a://`)."""
    from deltalake import DeltaTable

    if on_object_store(path):
        return DeltaTable(str(path), storage_options=storage_options())
    return DeltaTable(str(path))


def _commit_time(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=timezone.utc)


def _commit_actions(log_file: Path) -> dict[str, Any]:
    found: dict[str, Any] = {"app_id": None, "batch_id": None, "rows_added": None, "files_added": None,
                             "changes_data": True}
    try:
        lines = log_file.read_text().splitlines()
    except FileNotFoundError:
        return found
    rows, files, counted, changes = 0, 0, True, False
    for line in lines:
        action = json.loads(line) if line.strip() else {}
        if "txn" in action:
            found.update(app_id=action["txn"]["appId"], batch_id=action["txn"]["version"])
        file = action.get("add") or action.get("remove")
        changes = changes or bool(file and file.get("dataChange", True)) or "metaData" in action or "protocol" in action
        add = action.get("add")
        if add and add.get("dataChange", True):  # compaction re-adds rows it removed: not new data
            files += 1
            records = json.loads(add["stats"]).get("numRecords") if add.get("stats") else None
            counted = counted and records is not None
            rows += records or 0
    found.update(files_added=files, rows_added=rows if counted else None, changes_data=changes)
    return found
