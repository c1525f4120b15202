"""Streaming read of a Delta table: the PySpark Python data source `seclake_delta`.

Spark has no native Delta source without the delta-spark jars, so this source reads the
Delta log itself, the way delta-spark's streaming source does: the commit files
`_delta_log/<version>.json` say which Parquet files each version added, and a micro-batch
is the files added by the versions in (start, end]. Rows are read with pyarrow and handed
to Spark as Arrow record batches.

Offsets. An offset is `{"version": v, "index": i, "snapshot": s}`:

- `snapshot: false`: every data file added by the versions before `v` (from where the
  stream began) and the first `i` data files added by version `v`, in commit order, have
  been read. Reading a whole version ends at `{"version": v + 1, "index": 0}`, so each
  position has exactly one spelling and an idle stream returns its start unchanged.
- `snapshot: true`: the first `i` files of the table's snapshot at version `v` (all its live
  files, ordered by modification time, then path) have been read. Used only for the
  initial snapshot; reading all of it ends at `{"version": v + 1, "index": 0}`.
- `{"version": -1, "index": 0, "snapshot": false}` is the origin of a stream that starts
  from the beginning: its first batches read the snapshot at the version current when
  they are planned (fixed in the offset log from then on), later batches read commits.

The file index lets a read limit split a big version (or the snapshot) across batches.
Only `add` actions with `dataChange: true` are data: compaction re-adds rows with
`dataChange: false` and is skipped. A commit that removes data (`remove` with
`dataChange: true`: a delete or an overwrite) fails the stream; sources must be append-only.
A table that does not exist yet is an error naming its path, not an empty stream: the
stream's schema comes from the table's log.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pipelines.lake.read import open_table
from pipelines.lake.schema import delta_to_spark, merge_schemas, spark_to_arrow

SOURCE_NAME = "seclake_delta"
OPTIONS = ("path", "startingVersion", "maxFilesPerTrigger", "maxBytesPerTrigger")
# One Spark task reads at most this much; smaller batches are spread over the cores.
MAX_PARTITION_BYTES = 128 * 1024 * 1024
ARROW_BATCH_ROWS = 64 * 1024
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class Offset:
    """A stream position; see the module docstring. Spark compares offsets as JSON text,
    so `to_dict` always spells one position the same way."""

    version: int
    index: int = 0
    snapshot: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "Offset":
        return cls(int(d["version"]), int(d["index"]), bool(d["snapshot"]))

    def to_dict(self) -> dict:
        return {"version": self.version, "index": self.index, "snapshot": self.snapshot}

    @property
    def is_origin(self) -> bool:
        return self.version < 0


ORIGIN = Offset(-1)


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of the table, with its partition values already typed."""

    path: str
    size: int
    partition_values: dict[str, Any]


class FileGroup(InputPartition):
    """The files one Spark task reads (pickled to the executor)."""

    def __init__(self, files: list[DataFile]) -> None:
        super().__init__(None)
        self.files = files

    def __repr__(self) -> str:
        return f"FileGroup({len(self.files)} files, {sum(f.size for f in self.files)} bytes)"


class DeltaStreamSource(DataSource):
    """`spark.readStream.format("seclake_delta")`: the rows appended to a Delta table.

    Options: `path` (required), `startingVersion` (`earliest` (default), `latest` or a
    version number), `maxFilesPerTrigger`, `maxBytesPerTrigger`. Use `read_stream()`.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        known = {o.lower() for o in OPTIONS}
        unknown = sorted(k for k in options if k.lower() not in known)
        if unknown:
            raise ValueError(f"seclake_delta: unknown option(s) {unknown}; known: {list(OPTIONS)}")
        if not options.get("path"):
            raise ValueError("seclake_delta: option 'path' (the Delta table folder) is required")
        self.path = str(Path(options["path"]).expanduser().resolve())
        self.starting_version = _starting_version(options.get("startingVersion"))
        self.max_files = _positive_int(options, "maxFilesPerTrigger")
        self.max_bytes = _positive_int(options, "maxBytesPerTrigger")

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        if not DeltaTable.is_deltatable(self.path):
            # Not an empty stream: the schema comes from the table's log, so it must exist first.
            raise ValueError(f"no Delta table at {self.path}; create it (run its upstream job once) "
                             "before streaming from it")
        table = open_table(self.path)
        if isinstance(self.starting_version, int):
            if self.starting_version > table.version():
                raise ValueError(f"startingVersion {self.starting_version} is after the latest version "
                                 f"{table.version()} of {self.path!r}")
            kept = _commit_versions(Path(self.path) / "_delta_log")
            if self.starting_version not in kept:
                raise ValueError(f"startingVersion {self.starting_version}: that commit of {self.path!r} was "
                                 f"removed by log cleanup; the oldest commit in the log is {min(kept)}")
        return delta_to_spark(table.schema())

    def streamReader(self, schema: StructType) -> "DeltaStreamReader":
        return DeltaStreamReader(self.path, schema, self.starting_version, self.max_files, self.max_bytes)


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from the Delta log (on the driver) and reads files (on executors).

    The driver-side instance lives as long as the query, so it caches parsed commits and the
    initial snapshot; executors get a fresh, pickled instance and only call `read`.
    """

    def __init__(self, path: str, schema: StructType, starting_version: int | str,
                 max_files: int | None, max_bytes: int | None) -> None:
        self.path = path
        self.schema = schema
        self.starting_version = starting_version
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._log = Path(path) / "_delta_log"
        self._latest: int | None = None
        self._target: int | None = None  # set by Trigger.AvailableNow: never read past it
        self._commits: dict[int, list[DataFile]] = {}
        self._snapshots: dict[int, list[DataFile]] = {}
        self._partition_types: dict[str, pa.DataType] | None = None

    # ---- planning (driver) ----

    def initialOffset(self) -> dict:
        if self.starting_version == "earliest":
            return ORIGIN.to_dict()
        if self.starting_version == "latest":
            return Offset(self._latest_version() + 1).to_dict()
        self._commit(self.starting_version)  # fails now, with a clear message, if it is gone
        return Offset(self.starting_version).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_version()

    def reportLatestOffset(self) -> dict:
        return Offset(self._end_version() + 1).to_dict()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = Offset.from_dict(start)
        budget = _Budget(limit, self.max_files, self.max_bytes)
        last = self._end_version()
        if begin.is_origin or begin.snapshot:
            version = last if begin.is_origin else begin.version
            files = self._snapshot(version)
            end = begin.index + budget.take(files[begin.index:])
            return (Offset(version + 1) if end == len(files) else Offset(version, end, True)).to_dict()
        version, index = begin.version, begin.index
        while version <= last:
            files = self._commit(version)[index:]
            taken = budget.take(files)
            if taken < len(files):
                return Offset(version, index + taken).to_dict()
            version, index = version + 1, 0
        return Offset(version, index).to_dict()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _group(self._files_between(Offset.from_dict(start), Offset.from_dict(end)))

    def commit(self, end: dict) -> None:
        done = Offset.from_dict(end)
        self._commits = {v: f for v, f in self._commits.items() if v >= done.version}
        self._snapshots = {v: f for v, f in self._snapshots.items() if done.snapshot and v == done.version}

    def _files_between(self, start: Offset, end: Offset) -> list[DataFile]:
        if start == end:
            return []
        if start.is_origin or start.snapshot:
            # A batch never spans the snapshot and later commits (latestOffset stops at its end).
            version = end.version if end.snapshot else end.version - 1
            files = self._snapshot(version)
            return files[start.index:end.index] if end.snapshot else files[start.index:]
        files: list[DataFile] = []
        for version in range(start.version, end.version + 1):
            if version == end.version and end.index == 0:
                break  # end.version itself may not exist yet
            lo = start.index if version == start.version else 0
            hi = end.index if version == end.version else None
            files.extend(self._commit(version)[lo:hi])
        return files

    def _end_version(self) -> int:
        return self._target if self._target is not None else self._latest_version()

    def _latest_version(self) -> int:
        if self._latest is None:
            self._latest = max(_commit_versions(self._log))
        # Commit files appear atomically and in order, so probing forward finds new ones
        # without listing a log that grows by one file per sink batch.
        while self._commit_file(self._latest + 1).exists():
            self._latest += 1
        return self._latest

    def _commit_file(self, version: int) -> Path:
        return self._log / f"{version:020d}.json"

    def _commit(self, version: int) -> list[DataFile]:
        """The data files added by one commit, in commit order (cached)."""
        if version not in self._commits:
            self._commits[version] = self._parse_commit(version)
        return self._commits[version]

    def _parse_commit(self, version: int) -> list[DataFile]:
        where = f"version {version} of Delta table {self.path!r}"
        try:
            text = self._commit_file(version).read_text()
        except FileNotFoundError:
            raise ValueError(
                f"{where} is no longer in the log (removed by log cleanup): this stream fell behind "
                "the table's log retention; restart it with a new checkpoint and a later "
                "startingVersion") from None
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        operation = next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), "unknown")
        files = []
        for action in actions:
            if "metaData" in action:
                self._check_metadata(action["metaData"], where)
            elif "remove" in action and action["remove"].get("dataChange", True):
                raise ValueError(
                    f"{where} removes data (operation {operation}, file {action['remove']['path']!r}); "
                    "seclake_delta streams only append-only tables, so deletes and overwrites are not supported")
            elif "add" in action and action["add"].get("dataChange", True):
                add = action["add"]
                if add.get("deletionVector"):
                    raise ValueError(f"{where} adds a file with a deletion vector, which seclake_delta cannot read")
                files.append(DataFile(self._file_path(add["path"]), int(add["size"]),
                                      self._typed_partition_values(add.get("partitionValues") or {})))
        return files

    def _check_metadata(self, metadata: dict, where: str) -> None:
        if metadata.get("configuration", {}).get("delta.columnMapping.mode", "none") != "none":
            raise ValueError(f"{where} enables column mapping, which seclake_delta cannot read")
        schema = delta_to_spark(DeltaSchema.from_json(metadata["schemaString"]))
        # Older commits may lack columns added since (they read as nulls); a commit that adds
        # columns this query does not know would lose them silently, so stop instead.
        if merge_schemas(self.schema, schema, self.path) is not None:
            new = sorted(set(schema.fieldNames()) - set(self.schema.fieldNames()))
            raise ValueError(f"{where} adds column(s) {new} to the table; restart the query "
                             "to stream with the new schema")

    def _snapshot(self, version: int) -> list[DataFile]:
        """All live files of the table at `version`, oldest first (cached)."""
        if version not in self._snapshots:
            table = open_table(self.path, version=version)
            adds = pa.table(table.get_add_actions(flatten=True))
            parts = [c for c in adds.column_names if c.startswith("partition.")]
            rows = sorted(adds.select(["path", "size_bytes", "modification_time", *parts]).to_pylist(),
                          key=lambda r: (r["modification_time"], r["path"]))
            self._snapshots[version] = [
                DataFile(self._file_path(r["path"]), r["size_bytes"],
                         {c.removeprefix("partition."): r[c] for c in parts})
                for r in rows]
        return self._snapshots[version]

    def _file_path(self, path: str) -> str:
        # Delta paths are URL-encoded, relative to the table or absolute URIs.
        parsed = urlparse(path)
        if not parsed.scheme:
            return os.path.join(self.path, unquote(path))
        if parsed.scheme != "file":
            raise ValueError(f"Delta table {self.path!r} references {path!r}; seclake_delta reads local files only")
        return unquote(parsed.path)

    def _typed_partition_values(self, raw: dict[str, str | None]) -> dict[str, Any]:
        if self._partition_types is None:
            arrow = spark_to_arrow(self.schema)
            self._partition_types = {name: arrow.field(name).type for name in arrow.names}
        return {name: _parse_partition_value(value, self._partition_types[name]) for name, value in raw.items()}

    # ---- reading (executors) ----

    def read(self, partition: FileGroup) -> Iterator[pa.RecordBatch]:
        target = spark_to_arrow(self.schema)
        for data_file in partition.files:
            yield from _read_file(data_file, target)


def _read_file(data_file: DataFile, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    try:
        parquet = pq.ParquetFile(data_file.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"data file {data_file.path!r} is in the Delta log but not on disk: it was vacuumed "
            "(or deleted) before this stream read it") from None
    present = set(parquet.schema_arrow.names)
    columns = [f.name for f in target if f.name in present and f.name not in data_file.partition_values]
    for batch in parquet.iter_batches(batch_size=ARROW_BATCH_ROWS, columns=columns):
        rows = batch.num_rows
        arrays = []
        for field in target:
            if field.name in data_file.partition_values:
                arrays.append(pa.repeat(pa.scalar(data_file.partition_values[field.name], field.type), rows))
            elif field.name in present:
                arrays.append(batch.column(field.name).cast(field.type))
            else:  # a column added to the table after this file was written
                arrays.append(pa.nulls(rows, field.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


def _commit_versions(log: Path) -> set[int]:
    """Versions whose commit file is in the log (a table always keeps its latest one)."""
    return {int(m.group(1)) for name in os.listdir(log) if (m := _COMMIT_FILE.match(name))}


def _parse_partition_value(value: str | None, arrow_type: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz and not re.search(r"(Z|[+-]\d\d:?\d\d)$", value):
        # Delta writes UTC partition timestamps without a zone: read them as naive, then UTC.
        return pa.scalar(value).cast(pa.timestamp("us")).cast(arrow_type).as_py()
    return pa.scalar(value).cast(arrow_type).as_py()


class _Budget:
    """How many more files the read limit admits into the batch being planned."""

    def __init__(self, limit: ReadLimit, max_files: int | None, max_bytes: int | None) -> None:
        if isinstance(limit, ReadAllAvailable):
            self.files, self.bytes = None, None
        elif isinstance(limit, ReadMaxFiles):
            self.files, self.bytes = limit.max_files, max_bytes
        elif isinstance(limit, ReadMaxBytes):
            self.files, self.bytes = max_files, limit.max_bytes
        else:
            raise ValueError(f"seclake_delta does not support the read limit {limit!r}")
        self.taken_files = 0
        self.taken_bytes = 0

    def take(self, files: list[DataFile]) -> int:
        """Admit a prefix of `files`; return its length. The first file of a batch is always
        admitted, even above the byte limit, so a stream never stalls on a big file."""
        count = 0
        for f in files:
            full = (self.files is not None and self.taken_files >= self.files) or (
                self.bytes is not None and self.taken_files > 0 and self.taken_bytes + f.size > self.bytes)
            if full:
                break
            self.taken_files += 1
            self.taken_bytes += f.size
            count += 1
        return count


def _group(files: list[DataFile]) -> list[FileGroup]:
    """Consecutive files packed into tasks: about one task per core, none over 128 MiB."""
    if not files:
        return []
    target = min(MAX_PARTITION_BYTES, max(1, sum(f.size for f in files) // (os.cpu_count() or 1)))
    groups: list[FileGroup] = []
    current: list[DataFile] = []
    size = 0
    for f in files:
        if current and size + f.size > target:
            groups.append(FileGroup(current))
            current, size = [], 0
        current.append(f)
        size += f.size
    groups.append(FileGroup(current))
    return groups


def _starting_version(value: str | None) -> int | str:
    if value is None or value.lower() == "earliest":
        return "earliest"
    if value.lower() == "latest":
        return "latest"
    try:
        version = int(value)
    except ValueError:
        version = -1
    if version < 0:
        raise ValueError(f"startingVersion must be 'earliest', 'latest' or a version number >= 0, not {value!r}")
    return version


def _positive_int(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return number


def register_source(spark: SparkSession) -> None:
    """Make `seclake_delta` known to `spark` (idempotent).

    Registrations live in a session's state and are copied into sessions cloned from it, so a
    clone may already have it and a root session may not: register per session, once.
    """
    try:
        spark.dataSource.register(DeltaStreamSource)
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def read_stream(spark: SparkSession, path: str | os.PathLike, *, starting_version: int | str | None = None,
                max_files: int | None = None, max_bytes: int | None = None) -> DataFrame:
    """Stream the rows appended to the Delta table at `path`, each exactly once per checkpoint.

    `starting_version`: None or "earliest" reads the table's current snapshot, then every
    later commit; "latest" only commits made after the query starts; a number, every
    commit from that version on. `max_files` / `max_bytes` cap each micro-batch (also under
    Trigger.AvailableNow, which then runs several batches).

    >>> events = read_stream(spark, home.table("silver_dns"), max_files=100)
    >>> (events.writeStream.trigger(availableNow=True)
    ...     .option("checkpointLocation", str(home.checkpoint("enriched_dns")))
    ...     .foreachBatch(write_batch).start().awaitTermination())
    """
    options = {"path": str(Path(path).expanduser().resolve())}
    if starting_version is not None:
        options["startingVersion"] = str(starting_version)
    if max_files is not None:
        options["maxFilesPerTrigger"] = str(max_files)
    if max_bytes is not None:
        options["maxBytesPerTrigger"] = str(max_bytes)
    # Validate here so a bad option or a missing table is a plain ValueError in the caller,
    # not an AnalysisException from a Spark worker; the schema then goes to Spark as given.
    schema = DeltaStreamSource(CaseInsensitiveDict(options)).schema()
    register_source(spark)
    return spark.readStream.format(SOURCE_NAME).options(**options).schema(schema).load()
