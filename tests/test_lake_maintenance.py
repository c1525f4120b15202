"""Compaction and vacuum through delta-spark, and what streams reading the table see afterwards."""
from __future__ import annotations

import os
import time

import pytest
from delta.tables import DeltaTable

from pipelines.lake.maintenance import compact, vacuum
from pipelines.lake.read import read_table
from test_lake_source import append, events, ids, run_available_now


def small_files_table(spark, path, commits: int = 4) -> None:
    """`commits` commits of 2 rows each into partition 2024-01-01: one small file per commit."""
    for n in range(commits):
        append(path, events(spark, n * 2, 2, 1))


def referenced_files(spark, table) -> set[str]:
    """Absolute paths of the files the table's latest snapshot reads."""
    return {f.removeprefix("file:") for f in DeltaTable.forPath(spark, str(table)).toDF().inputFiles()}


def test_compaction_is_not_streamed_again(spark, tmp_path):
    table, checkpoint_dir = tmp_path / "t", tmp_path / "ck"
    small_files_table(spark, table)
    first, _ = run_available_now(spark, table, checkpoint_dir)

    metrics = compact(spark, table)
    append(table, events(spark, 100, 2, 2))
    second, _ = run_available_now(spark, table, checkpoint_dir)
    replay, _ = run_available_now(spark, table, tmp_path / "ck-v0", starting_version=0)
    snapshot, _ = run_available_now(spark, table, tmp_path / "ck-new")

    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 1
    assert metrics["filesRemoved"]["totalFiles"] == 4
    assert len(referenced_files(spark, table)) == 2  # the compacted file and the new commit's
    assert sorted(ids(first)) == list(range(8))
    assert sorted(ids(second)) == [100, 101]
    for everything in (ids(replay), ids(snapshot)):
        assert sorted(everything) == [*range(8), 100, 101]


def test_vacuum_removes_old_unreferenced_files_only(spark, tmp_path):
    table = tmp_path / "t"
    small_files_table(spark, table, commits=2)
    partition = table / "event_date=2024-01-01"
    # Retention 200 h: above Delta's default 168 h, which delta-spark 4.4 appears to apply to
    # unreferenced files whatever shorter RETAIN is given (only RETAIN 0 went below it in a probe).
    old, younger = time.time() - 300 * 3600, time.time() - 100 * 3600
    crashed = partition / "part-00000-crashed-batch.c000.snappy.parquet"  # a batch that never committed
    in_flight = partition / "part-00000-in-flight.c000.snappy.parquet"    # unreferenced, younger than retention
    for orphan in (crashed, in_flight):
        orphan.write_bytes(b"PAR1")
    os.utime(crashed, (old, old))
    os.utime(in_flight, (younger, younger))
    referenced = referenced_files(spark, table)
    assert len(referenced) == 2
    for f in referenced:
        os.utime(f, (old, old))  # old, but referenced: never a vacuum's

    listed = vacuum(spark, table, retention_hours=200, dry_run=True)
    assert crashed.exists()
    deleted = vacuum(spark, table, retention_hours=200)

    assert listed == deleted == [crashed.relative_to(table).as_posix()]
    assert not crashed.exists()
    assert in_flight.exists()
    assert all(os.path.exists(f) for f in referenced)
    assert read_table(spark, table).count() == 4

    compact(spark, table)
    compacted = referenced_files(spark, table)
    replaced = vacuum(spark, table, retention_hours=0)
    assert replaced == sorted([*(os.path.relpath(f, table) for f in referenced),
                               in_flight.relative_to(table).as_posix()])
    assert not any(os.path.exists(f) for f in referenced) and not in_flight.exists()
    assert all(os.path.exists(f) for f in compacted)
    assert vacuum(spark, table, retention_hours=0) == []
    batches, _ = run_available_now(spark, table, tmp_path / "ck")
    assert sorted(ids(batches)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="retention_hours must be >= 0, not -1"):
        vacuum(spark, table, retention_hours=-1)


def test_maintenance_on_a_missing_table_names_it(spark, tmp_path):
    for operation in (compact, vacuum):
        with pytest.raises(ValueError, match=f"no Delta table at {tmp_path / 'nope'}$"):
            operation(spark, tmp_path / "nope")
    with pytest.raises(ValueError, match="target_size must be a positive number of bytes, not 0"):
        compact(spark, tmp_path / "nope", target_size=0)
