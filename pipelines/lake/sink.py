"""Streaming sink: Spark writes a micro-batch as Parquet, delta-rs commits it with txn(app_id, batch_id)."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.transaction import AddAction, create_table_with_add_actions
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pipelines.lake.schema import SchemaMismatchError, as_nullable, delta_to_spark, merge_schemas, spark_to_delta

DEFAULT_CHECKPOINT_INTERVAL = 100
# Where Spark writes a batch before its files move into the table; delta-rs vacuum skips `_` names,
# so maintenance.vacuum clears stale ones itself.
STAGING_PREFIX = "_staging-"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class ConcurrentWriterError(RuntimeError):
    """Another live writer already owns this (table, app_id)."""


@dataclass(frozen=True)
class CommitResult:
    """What one `write_batch` call did; `version` is None when the batch was skipped."""

    table: str
    batch_id: int
    version: int | None
    rows: int = 0
    files: int = 0
    bytes: int = 0
    skipped: bool = False
    schema_evolved: list[str] = field(default_factory=list)


class DeltaSink:
    """An exactly-once Delta sink for `foreachBatch`.

    One sink owns one (table, app_id); a replayed batch id (after a crash) commits nothing.

    >>> sink = DeltaSink("/tmp/lake/silver_dns", app_id="silver_dns", partition_by=["event_date"])
    >>> query = df.writeStream.foreachBatch(sink).option("checkpointLocation", "/tmp/ck").start()  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, *, app_id: str, partition_by: list[str] | tuple[str, ...] = (),
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> None:
        if not app_id:
            raise ValueError("app_id must be a non-empty string")
        if checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")
        self.path = Path(path).resolve()
        self.name = self.path.name
        self.app_id = app_id
        self.partition_by = list(partition_by)
        self.checkpoint_interval = checkpoint_interval
        self._lock_fd: int | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: DataFrame, batch_id: int) -> CommitResult:
        """Write `df` as batch `batch_id`; a batch id already committed for this app_id is skipped."""
        self._acquire_lock()
        table = DeltaTable(str(self.path)) if DeltaTable.is_deltatable(str(self.path)) else None
        if table is not None:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= batch_id:
                return CommitResult(self.name, batch_id, None, skipped=True)
        schema, evolved = self._target_schema(table, as_nullable(df.schema))
        actions, rows, size = self._write_parquet(df, batch_id)
        if table is not None and not actions:
            return CommitResult(self.name, batch_id, None)  # empty batch on an existing table: nothing to commit
        version = self._commit(table, schema, actions, batch_id, evolved)
        return CommitResult(self.name, batch_id, version, rows, len(actions), size, schema_evolved=evolved)

    def close(self) -> None:
        """Release the writer lock (also released when the process dies)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _acquire_lock(self) -> None:
        # The OS drops a flock when its holder dies, so a SIGKILLed writer never blocks its restart,
        # while a second live writer with the same app_id fails instead of double-committing.
        if self._lock_fd is not None:
            return
        lock_dir = self.path.parent / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{self.name}.{quote(self.app_id, safe='')}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConcurrentWriterError(
                f"table {self.name}: another writer with app_id {self.app_id!r} is running; "
                "one streaming query writes a table") from None
        self._lock_fd = fd

    def _target_schema(self, table: DeltaTable | None, incoming: StructType) -> tuple[StructType, list[str]]:
        if table is None:
            missing = [c for c in self.partition_by if c not in incoming.fieldNames()]
            if missing:
                raise ValueError(f"table {self.name}: partition column(s) {missing} not in the written columns")
            return incoming, []
        existing_parts = list(table.metadata().partition_columns)
        if existing_parts != self.partition_by:
            raise SchemaMismatchError(
                f"table {self.name} is partitioned by {existing_parts}, the writer asks for {self.partition_by}")
        current = delta_to_spark(table.schema())
        evolved = merge_schemas(current, incoming, self.name)
        if evolved is None:
            return current, []
        return evolved, [f.name for f in evolved.fields[len(current.fields):]]

    def _write_parquet(self, df: DataFrame, batch_id: int) -> tuple[list[AddAction], int, int]:
        staging = self.path / f"{STAGING_PREFIX}{batch_id}-{uuid.uuid4().hex}"
        df.write.mode("overwrite").partitionBy(*self.partition_by).parquet(str(staging))
        actions, rows, size = [], 0, 0
        for src in sorted(staging.rglob("*.parquet")):
            rel = src.relative_to(staging)
            meta = pq.read_metadata(src)
            if meta.num_rows == 0:
                continue
            dest = self.path / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
            stat = dest.stat()
            actions.append(AddAction(
                path=quote(rel.as_posix(), safe="/="),
                size=stat.st_size,
                partition_values=_partition_values(rel),
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps(_stats(meta)),
            ))
            rows += meta.num_rows
            size += stat.st_size
        shutil.rmtree(staging, ignore_errors=True)
        return actions, rows, size

    def _commit(self, table: DeltaTable | None, schema: StructType, actions: list[AddAction], batch_id: int,
                evolved: list[str]) -> int:
        props = CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)],
                                 custom_metadata={"seclake.batch_id": str(batch_id)})
        hooks = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
        if table is not None and evolved:
            # A separate metadata commit: if we die right after it, the replayed batch finds the column there.
            added = spark_to_delta(StructType([f for f in schema.fields if f.name in evolved]))
            table.alter.add_columns(list(added.fields))
        if table is None:
            create_table_with_add_actions(
                str(self.path), spark_to_delta(schema), actions, mode="error", partition_by=self.partition_by or None,
                name=self.name, configuration={"delta.checkpointInterval": str(self.checkpoint_interval)},
                commit_properties=props, post_commithook_properties=hooks)
            return 0
        table.create_write_transaction(actions, mode="append", schema=spark_to_delta(schema),
                                       partition_by=self.partition_by or None, commit_properties=props,
                                       post_commithook_properties=hooks)
        table.update_incremental()
        return table.version()


def create_empty(path: str | os.PathLike, schema: StructType, partition_by: list[str],
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> bool:
    """Create an empty Delta table at `path` unless one exists; True if this call created it.

    Streams read their input tables from the start, so a downstream query can start before its
    upstream has committed anything. Creation happens under a file lock: concurrent callers
    (rule queries, a second process) never race.

    >>> create_empty("/tmp/lake/t", StructType([StructField("a", LongType())]), [])  # doctest: +SKIP
    True
    """
    path = Path(path)
    if DeltaTable.is_deltatable(str(path)):
        return False
    lock_dir = path.parent / ".locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{path.name}.create.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if DeltaTable.is_deltatable(str(path)):
            return False
        DeltaTable.create(str(path), spark_to_delta(as_nullable(schema)), mode="ignore",
                          partition_by=partition_by or None, name=path.name,
                          configuration={"delta.checkpointInterval": str(checkpoint_interval)})
        return True


def _partition_values(rel: Path) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for part in rel.parts[:-1]:
        key, _, raw = part.partition("=")
        value = unquote(raw)
        values[unquote(key)] = None if value == _HIVE_NULL else value
    return values


def _stats(meta: pq.FileMetaData) -> dict:
    """Delta file stats (numRecords, min/max/nullCount for flat columns) from the Parquet footer."""
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    schema = meta.schema
    for i in range(meta.num_columns):
        column = schema.column(i)
        if "." in column.path:  # nested or repeated: Delta stats are optional, skip
            continue
        lo = hi = None
        null_count = 0
        complete = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(i).statistics
            if st is None or not st.has_null_count:
                complete = False
                break
            null_count += st.null_count
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not complete:
            continue
        nulls[column.name] = null_count
        if lo is not None and not isinstance(lo, (bytes, bool)):
            if isinstance(lo, str) and (len(lo) > 32 or len(hi) > 32):
                continue
            mins[column.name] = _json_value(lo)
            maxs[column.name] = _json_value(hi)
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _json_value(value):
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, date):
        return value.isoformat()
    return value
