"""Table maintenance through delta-rs: compaction, vacuum, log checkpoints.

All three are safe while a sink writes and a `seclake_delta` stream reads the table:
compaction commits with `dataChange: false` (streams skip it), vacuum keeps every file
younger than the retention, and a checkpoint only adds a file to the log.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pipelines.lake.read import open_table
from pipelines.lake.sink import STAGING_PREFIX

DEFAULT_TARGET_SIZE = 128 * 1024 * 1024  # one Spark read task's worth (spark.sql.files.maxPartitionBytes)


def compact(path: str | os.PathLike, target_size: int = DEFAULT_TARGET_SIZE) -> dict[str, Any]:
    """Rewrite the table's small files into files of about `target_size` bytes.

    Returns delta-rs's metrics (`numFilesAdded`, `numFilesRemoved`, `filesAdded` and
    `filesRemoved` as size summaries, ...). The rewritten rows are committed with
    `dataChange: false`, so streams reading the table do not see them again. The replaced
    files stay on disk until `vacuum` removes them after the retention.

    >>> compact(home.table("silver_dns"))["numFilesRemoved"]
    96
    """
    if target_size <= 0:
        raise ValueError(f"target_size must be a positive number of bytes, not {target_size!r}")
    metrics = open_table(path).optimize.compact(target_size=target_size)
    # delta-rs reports the two size summaries as JSON text.
    return {key: json.loads(value) if key in ("filesAdded", "filesRemoved") else value
            for key, value in metrics.items()}


def vacuum(path: str | os.PathLike, retention_hours: int = 168, dry_run: bool = False) -> list[str]:
    """Delete files the table no longer needs that are older than `retention_hours`;
    return their paths, relative to the table (only list them if `dry_run`).

    Three kinds go: files compaction replaced (removed from the log longer ago than the
    retention); orphans that no commit references, such as the Parquet files of a sink
    batch that crashed before committing (judged by modification time); and the sink's
    staging folders (`_staging-*/`) such a crash left behind. Other names starting with `_`
    or `.` are kept. Keep the retention above the longest micro-batch (a batch's files are
    orphans until its commit) and above the longest a stream may lag behind the table (it
    still reads the files compaction replaced).

    >>> vacuum(home.table("silver_dns"), dry_run=True)
    ['event_date=2024-05-01/part-00000-3f2c...-c000.snappy.parquet', '_staging-17-9e1d.../']
    """
    if retention_hours < 0:
        raise ValueError(f"retention_hours must be >= 0, not {retention_hours!r}")
    table = open_table(path)
    # full=True: without it delta-rs only considers files removed through the log and never
    # finds orphans. The retention asked for here is the safety margin, so delta-rs's own
    # minimum (delta.deletedFileRetentionDuration) does not override it.
    deleted = table.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                           enforce_retention_duration=False, full=True)
    # delta-rs skips names starting with `_`, so the sink's staging folders are ours to clear.
    root = Path(path).resolve()
    cutoff = time.time() - retention_hours * 3600
    for staging in sorted(root.glob(f"{STAGING_PREFIX}*/")):
        if _newest_mtime(staging) < cutoff:
            deleted.append(f"{staging.name}/")
            if not dry_run:
                shutil.rmtree(staging)
    return deleted


def _newest_mtime(folder: Path) -> float:
    return max([folder.stat().st_mtime, *(p.stat().st_mtime for p in folder.rglob("*"))])


def checkpoint(path: str | os.PathLike, cleanup: bool = False) -> int:
    """Write a Parquet checkpoint of the log at the current version and return that version.

    Opening a table then reads the checkpoint and the commits after it instead of every
    commit since the table was created. With `cleanup`, also delete the commit files
    older than `delta.logRetentionDuration` (30 days unless the table sets it) that the
    checkpoint made unnecessary; a stream further behind than that fails with a message
    saying so, and time travel to those versions is no longer possible.

    >>> checkpoint(home.table("silver_dns"), cleanup=True)
    1440
    """
    table = open_table(path)
    table.create_checkpoint()
    if cleanup:
        table.cleanup_metadata()
    return table.version()
