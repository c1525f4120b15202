"""Streaming reads of Delta tables through delta-spark's own source (`readStream.format("delta")`).

A micro-batch is the rows the table's commits appended since the previous one, each exactly once
per checkpoint; `startingVersion` and the read limits are Delta's. Commits with
`dataChange: false` (compaction) are not read again. Checkpoints written by seclake's earlier
Python source (before delta-spark) cannot be resumed: `check_resumable` says so in one line.
"""
from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession

from pipelines.checkpoint import newest, next_watermark_ms, read_batch
from pipelines.lake.log import open_log
from pipelines.lake.read import is_table
from pipelines.lake.sink import table_uri


class OldCheckpointError(RuntimeError):
    """A checkpoint written by the pre-delta-spark Python source, whose offsets Delta cannot read."""


def read_stream(spark: SparkSession, path: str | os.PathLike, *, starting_version: int | str | None = None,
                max_files: int | None = None, max_bytes: int | None = None) -> DataFrame:
    """Stream the rows appended to the Delta table at `path`.

    `starting_version`: None or "earliest" reads the table's current snapshot, then every later
    commit; "latest" only commits made after the query starts; a number, every commit from that
    version on. `max_files` / `max_bytes` cap each micro-batch (also under Trigger.AvailableNow,
    which then runs several batches).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3).write.format("delta").save(tmp)
    ...     read_stream(spark, tmp, max_files=100).isStreaming
    True
    """
    uri = table_uri(path)
    options: dict[str, str] = {}
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
    # Checked here so a missing table is a plain ValueError naming it, not an error at query start.
    if not is_table(spark, uri):
        raise ValueError(f"no Delta table at {uri}")
    return spark.readStream.format("delta").options(**options).load(uri)


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
    """True when the query of `checkpoint`, which streams from the Delta `tables`, has read every
    commit they hold and committed its last batch with nothing left to do: running it now would
    process nothing. Anything else, or anything unexpected, is False (run the query).

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
    if None in by_table or len(by_table) != len(tables):
        return False
    for path in tables:
        table = open_log(path)
        position = by_table.get(table.metadata().id)
        if position is None or position.get("index") != -1 or position.get("reservoirVersion", -1) <= table.version():
            return False
    return True
