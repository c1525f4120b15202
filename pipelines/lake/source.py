"""Streaming reads of Delta tables through delta-spark's own source (`readStream.format("delta")`).

A micro-batch is the rows the table's commits appended since the previous one, each exactly once
per checkpoint; `startingVersion` and the read limits are Delta's. Commits with
`dataChange: false` (compaction) are not read again. A query's first start reads a young,
append-only table from its commits rather than from its snapshot (`replayable`): the same rows,
without the Spark job that sorts the snapshot's files. Checkpoints written by seclake's earlier
Python source (before delta-spark) cannot be resumed: `check_resumable` says so in one line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from pipelines.checkpoint import newest, next_watermark_ms, read_batch
from pipelines.lake.log import commit_versions, open_log, quiet_since
from pipelines.lake.sink import table_uri

# Delta starts a new stream from the table's snapshot with Spark jobs that list and sort all its
# files: 1.0-1.1 s of a 1.3-1.5 s stream read of 60k rows in 6 commits, where reading the commits
# from version 0 took 0.05-0.27 s (performance.md, "Stream read: the first start"). So a young log
# is replayed; past one log checkpoint interval the snapshot is kept.
REPLAY_MAX_COMMITS = 100
# Actions a commit may hold for a replay from version 0 to give the current rows exactly. No
# `remove`: even a compaction's (no data change) lets VACUUM delete files the replay would read.
_APPEND_ACTIONS = frozenset({"commitInfo", "add", "txn"})
_TABLE_ACTIONS = frozenset({"metaData", "protocol", "domainMetadata"})
# What Delta's streaming source raises on a path with no table (or a log without a commit).
_NO_TABLE = ("DELTA_SCHEMA_NOT_SET", "PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE")


class OldCheckpointError(RuntimeError):
    """A checkpoint written by the pre-delta-spark Python source, whose offsets Delta cannot read."""


WHOLE_COMMITS = 1_000_000_000  # files per micro-batch: no cap a table reaches


def read_stream(spark: SparkSession, path: str | os.PathLike, *, starting_version: int | str | None = None,
                max_files: int | None = None, max_bytes: int | None = None) -> DataFrame:
    """Stream the rows appended to the Delta table at `path`.

    `starting_version`: None or "earliest" reads every row the table holds, then every later
    commit (from version 0 when `replayable`, else from the current snapshot); "latest" only
    commits made after the query starts; a number, every commit from that version on. (Like
    Delta's own, these apply only to a new checkpoint; a query resumes from its checkpoint.)
    `max_files` / `max_bytes` cap each micro-batch (also under Trigger.AvailableNow, which then
    runs several batches); with neither, a micro-batch takes every new commit whole (Delta's own
    default would cap it at 1,000 files). A commit that only removes files (retention's delete of old
    partitions) is skipped; one that rewrites rows stops the stream (Delta's error).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3).write.format("delta").save(tmp)
    ...     read_stream(spark, tmp, max_files=100).isStreaming
    True
    """
    uri = table_uri(path)
    # Retention deletes whole event_date partitions upstream; a reader keeps what it derived (it has
    # its own retention) instead of stopping for good. A rollback resets its readers (rollback.py).
    options: dict[str, str] = {"ignoreDeletes": "true"}
    if starting_version not in (None, "earliest"):
        if starting_version != "latest" and not (isinstance(starting_version, int) and starting_version >= 0):
            raise ValueError(f"startingVersion must be 'earliest', 'latest' or a version >= 0, "
                             f"not {starting_version!r}")
        options["startingVersion"] = str(starting_version)
    for option, value in (("maxFilesPerTrigger", max_files), ("maxBytesPerTrigger", max_bytes)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{option} must be a positive integer, not {value!r}")
            options[option] = str(value)
    if max_files is None and max_bytes is None:
        # Delta caps an unlimited read at 1,000 files: a rebuild's first batch would take 1,000 files
        # and every end-of-input mark, and the watermark, moved to the marks, would drop the rest as late.
        options["maxFilesPerTrigger"] = str(WHOLE_COMMITS)
    if starting_version in (None, "earliest") and replayable(uri):
        options["startingVersion"] = "0"
    # Delta reads the table's schema (its log, updated) here, so a missing table fails now, not at
    # the query's start; its error names no path, so a ValueError naming the table instead.
    try:
        return spark.readStream.format("delta").options(**options).load(uri)
    except PySparkException as exc:
        if (exc.getCondition() or "") in _NO_TABLE:
            raise ValueError(f"no Delta table at {uri}") from None
        raise


def replayable(path: str | os.PathLike) -> bool:
    """True when streaming the table's commits from version 0 gives exactly its current rows: a local
    table whose log holds every commit from version 0, at most REPLAY_MAX_COMMITS of them, each one
    after version 0 only adding files (no file removed, no schema change).

    Anything else (a RESTORE, a retention delete, a compaction, schema evolution, a cleaned-up
    log, object storage, an unreadable commit) is False: the stream starts from the snapshot, as
    Delta does.

    >>> import tempfile
    >>> from delta.tables import DeltaTable
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3).write.format("delta").save(tmp)
    ...     spark.range(3).write.format("delta").mode("append").save(tmp)
    ...     appended = replayable(tmp)
    ...     _ = DeltaTable.forPath(spark, tmp).restoreToVersion(0)
    ...     appended, replayable(tmp)
    (True, False)
    """
    text = str(path)
    if "://" in text and not text.startswith("file:"):
        return False
    log = Path(text.removeprefix("file:")) / "_delta_log"
    try:
        versions = commit_versions(log)
    except OSError:
        return False
    if not versions or len(versions) > REPLAY_MAX_COMMITS or versions != list(range(len(versions))):
        return False
    for version in versions:
        allowed = _APPEND_ACTIONS | (_TABLE_ACTIONS if version == 0 else frozenset())
        try:
            lines = (log / f"{version:020d}.json").read_text().splitlines()
        except OSError:
            return False
        for line in filter(str.strip, lines):
            try:
                action = json.loads(line)
            except ValueError:
                return False
            if not allowed.issuperset(action):
                return False
    return True


def check_resumable(checkpoint: str | os.PathLike) -> None:
    """Raise OldCheckpointError when `checkpoint` holds offsets of the pre-delta-spark source.

    >>> check_resumable("/tmp/no-such-checkpoint")
    """
    last = newest(checkpoint)
    if last is None:
        return
    for offset in read_batch(checkpoint, last).offsets:
        if isinstance(offset, dict) and "snapshot" in offset and "reservoirId" not in offset:
            raise OldCheckpointError(
                f"checkpoint {checkpoint} was written by seclake's Python Delta source (before delta-spark) "
                "and cannot be resumed: delete it and the tables its query writes, and they are rebuilt "
                "from their inputs on the next run")


def caught_up(checkpoint: str | os.PathLike, tables: list[str | os.PathLike]) -> bool:
    """True when the query of `checkpoint`, which streams from Delta tables among `tables`, has read
    every commit of each table its last batch read and committed that batch with nothing left to
    do: running it now would process nothing. Anything else, or anything unexpected, is False (run
    the query).

    The checkpoint says which tables it reads (each Delta offset names its table's id), so a plan
    made before a stage read one more table (dhcp_leases before the DHCP clock) is judged by the
    tables it does read; a table it reads that is not in `tables` makes it False.

    Reads the checkpoint's last offsets and commit files and each table's log (delta-rs, no JVM).
    Delta's offset after a whole version v is (reservoirVersion v + 1, index -1). A stateful query
    whose watermark moved in its last batch still owes a batch without data (timers, windows).

    >>> caught_up("/tmp/no-such-checkpoint", [])
    False
    """
    last = newest(checkpoint)
    if last is None or newest(checkpoint, committed=True) != last:
        return False
    try:
        batch = read_batch(checkpoint, last)
        if next_watermark_ms(checkpoint, last) != batch.metadata.get("batchWatermarkMs", 0):
            return False
    except ValueError:
        return False
    if not all(isinstance(p, dict) for p in batch.offsets):
        return False
    by_table: dict[str | None, dict] = {}
    for position in batch.offsets:
        # A table read by two sources (a rule's enriched input) is caught up only when both are.
        if by_table.setdefault(position.get("reservoirId"), position) != position:
            return False
    versions, paths = {}, {}
    for path in tables:
        table = open_log(path)
        versions[table.metadata().id], paths[table.metadata().id] = table.version(), path
    for reservoir, position in by_table.items():
        if reservoir not in versions or position.get("index") != -1:
            return False
        read = position.get("reservoirVersion", -1) - 1  # the last version it has read whole
        # A compaction (seclake maintain) since then gives a stream nothing to read.
        if read < versions[reservoir] and not (read >= 0 and quiet_since(paths[reservoir], read)):
            return False
    return bool(by_table)
