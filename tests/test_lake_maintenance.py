"""Compaction, vacuum and checkpoints, and what streams reading the table see afterwards."""
from __future__ import annotations

import os
import time

import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import StreamingQueryException


from pipelines.lake.maintenance import checkpoint, compact, vacuum  # noqa: E402
from pipelines.lake.source import read_stream  # noqa: E402
from test_lake_source import append, events, ids, run_available_now  # noqa: E402


def small_files_table(path, commits: int = 4, configuration: dict[str, str] | None = None) -> None:
    """`commits` commits of 2 rows each into partition 2024-01-01: one small file per commit."""
    write_deltalake(str(path), events(0, 2, 1), partition_by=["event_date"], configuration=configuration)
    for n in range(1, commits):
        append(path, events(n * 2, 2, 1))


def test_compaction_is_not_streamed_again(spark, tmp_path):
    table, checkpoint_dir = tmp_path / "t", tmp_path / "ck"
    small_files_table(table)
    first, _ = run_available_now(spark, table, checkpoint_dir)

    metrics = compact(table)
    append(table, events(100, 2, 2))
    second, _ = run_available_now(spark, table, checkpoint_dir)
    replay, _ = run_available_now(spark, table, tmp_path / "ck-v0", starting_version=0)
    snapshot, _ = run_available_now(spark, table, tmp_path / "ck-new")

    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 1
    assert metrics["filesRemoved"]["totalFiles"] == 4
    assert sorted(ids(first)) == list(range(8))
    assert sorted(ids(second)) == [100, 101]
    for everything in (ids(replay), ids(snapshot)):
        assert sorted(everything) == [*range(8), 100, 101]


def test_vacuum_removes_orphans_and_replaced_files_only(spark, tmp_path):
    table = tmp_path / "t"
    small_files_table(table, commits=2)
    partition = table / "event_date=2024-01-01"
    old = time.time() - 3 * 3600
    crashed = partition / "part-00000-crashed-batch.c000.snappy.parquet"  # a batch that never committed
    in_flight = partition / "part-00000-in-flight.c000.snappy.parquet"    # a batch still writing
    crashed_staging = table / "_staging-7-dead" / "event_date=2024-01-01" / "part-00000.c000.snappy.parquet"
    live_staging = table / "_staging-8-live" / "part-00000.c000.snappy.parquet"
    for orphan in (crashed, in_flight, crashed_staging, live_staging):
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"PAR1")
    for stale in (crashed, crashed_staging, crashed_staging.parent, crashed_staging.parent.parent):
        os.utime(stale, (old, old))
    referenced = {str(table / p) for p in DeltaTable(str(table)).file_uris()}
    for f in referenced:
        os.utime(f, (old, old))

    listed = vacuum(table, retention_hours=1, dry_run=True)
    assert crashed.exists()
    deleted = vacuum(table, retention_hours=1)

    assert listed == deleted == [str(crashed.relative_to(table)), "_staging-7-dead/"]
    assert not crashed.exists() and not (table / "_staging-7-dead").exists()
    assert in_flight.exists() and live_staging.exists()
    assert all(os.path.exists(f) for f in referenced)
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 4

    compact(table)
    replaced = vacuum(table, retention_hours=0)
    assert sorted(replaced) == sorted([*(os.path.relpath(f, table) for f in referenced),
                                       str(in_flight.relative_to(table)), "_staging-8-live/"])
    batches, _ = run_available_now(spark, table, tmp_path / "ck")
    assert sorted(ids(batches)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="retention_hours must be >= 0, not -1"):
        vacuum(table, retention_hours=-1)


def test_checkpoint_and_log_cleanup_keep_the_table_streamable(spark, tmp_path):
    table = tmp_path / "t"
    small_files_table(table, configuration={"delta.logRetentionDuration": "interval 0 seconds"})

    version = checkpoint(table, cleanup=True)

    log = table / "_delta_log"
    assert version == 3
    assert (log / f"{version:020d}.checkpoint.parquet").exists()
    assert not (log / f"{0:020d}.json").exists()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 8
    # From the beginning = the snapshot at the checkpoint, then later commits.
    append(table, events(50, 2, 2))
    batches, _ = run_available_now(spark, table, tmp_path / "ck")
    assert sorted(ids(batches)) == [*range(8), 50, 51]
    with pytest.raises(ValueError, match="removed by log cleanup; the oldest commit in the log is 3"):
        read_stream(spark, table, starting_version=1)


def test_stream_behind_log_cleanup_fails_clearly(spark, tmp_path):
    table, checkpoint_dir = tmp_path / "t", tmp_path / "ck"
    small_files_table(table, commits=1, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    run_available_now(spark, table, checkpoint_dir, starting_version=0)
    for n in range(3):
        append(table, events(10 + n, 1, 1))
    checkpoint(table, cleanup=True)

    with pytest.raises(StreamingQueryException, match="fell behind the table's log retention"):
        run_available_now(spark, table, checkpoint_dir)


def test_maintenance_on_a_missing_table_names_it(tmp_path):
    for operation in (compact, vacuum, checkpoint):
        with pytest.raises(ValueError, match=f"no Delta table at {tmp_path / 'nope'}$"):
            operation(tmp_path / "nope")
