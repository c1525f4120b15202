"""Streaming reads through delta-spark's source: exactly once across restarts, read limits, start
positions, and the check that refuses checkpoints of seclake's earlier Python source."""
from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.lake import source
from pipelines.lake.maintenance import vacuum
from pipelines.lake.source import OldCheckpointError, caught_up, check_resumable, read_stream, replayable

UTC = dt.timezone.utc
EVENTS = "id BIGINT, ts TIMESTAMP, host STRING, event_date DATE"


def events(spark, first_id: int, count: int, day: int, host: str = "h1") -> DataFrame:
    """`count` rows with ids from `first_id`, one second apart on 2024-01-`day`."""
    rows = []
    for i in range(count):
        ts = dt.datetime(2024, 1, day, 8, tzinfo=UTC) + dt.timedelta(seconds=i)
        rows.append((first_id + i, ts, host, ts.date()))
    return spark.createDataFrame(rows, EVENTS)


def append(table: Path, *parts: DataFrame, **options: str) -> None:
    """One commit; one file per distinct event_date."""
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part, allowMissingColumns=True)
    frame.coalesce(1).write.format("delta").mode("append").partitionBy("event_date").options(**options) \
        .save(str(table))


def run_available_now(spark, table: Path, checkpoint: Path, on_batch: Callable[[int], None] | None = None,
                      **options) -> tuple[list[list], list[int]]:
    """Run the stream to the end of what is there now; return each batch's rows and the
    numInputRows Spark reported per batch. `on_batch(batch_id)` runs after each batch."""
    batches: list[list] = []

    def handle(df, batch_id):
        batches.append(df.collect())  # one action per batch keeps numInputRows exact
        if on_batch:
            on_batch(batch_id)

    query = (read_stream(spark, table, **options).writeStream
             .trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint))
             .foreachBatch(handle)
             .start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    return batches, [p["numInputRows"] for p in query.recentProgress]


def ids(batches: list[list]) -> list[int]:
    return [row.id for rows in batches for row in rows]


def test_each_row_exactly_once_across_restarts(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(spark, 0, 10, 1))
    append(table, events(spark, 10, 5, 2), events(spark, 15, 5, 3))
    first, _ = run_available_now(spark, table, checkpoint)

    append(table, events(spark, 20, 7, 3))
    append(table, events(spark, 27, 3, 4, host="h2"))
    second, _ = run_available_now(spark, table, checkpoint, max_files=1)
    third, progress = run_available_now(spark, table, checkpoint)

    assert sorted(ids(first)) == list(range(20))
    assert sorted(ids(second)) == list(range(20, 30))
    assert len([rows for rows in second if rows]) == 2  # one file per batch
    assert ids(third) == [] and sum(progress) == 0
    everything = ids(first) + ids(second) + ids(third)
    assert len(everything) == len(set(everything)) == 30
    check_resumable(checkpoint)  # delta-spark's own offsets resume


def test_a_batch_that_failed_is_replayed_with_the_same_files(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(spark, 0, 3, 1), events(spark, 3, 3, 2), events(spark, 6, 3, 3))
    handled: list[int] = []
    failed: list[list[int]] = []

    def fail_on_second_batch(df, batch_id):
        rows = [r.id for r in df.collect()]
        if batch_id == 1:
            failed.append(rows)
            raise RuntimeError("sink down")
        handled.extend(rows)

    def run(handler):
        query = (read_stream(spark, table, max_files=1).writeStream.trigger(availableNow=True)
                 .option("checkpointLocation", str(checkpoint)).foreachBatch(handler).start())
        query.awaitTermination(120)

    replayed: list[list[int]] = []

    def record(df, batch_id):
        rows = [r.id for r in df.collect()]
        if batch_id == 1:
            replayed.append(rows)
        handled.extend(rows)

    with pytest.raises(StreamingQueryException, match="sink down"):
        run(fail_on_second_batch)
    assert len(handled) == 3
    run(record)

    assert sorted(handled) == list(range(9))
    assert replayed == failed and len(failed[0]) == 3


def test_read_limit_splits_one_commit_and_available_now_stops_at_its_start(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(spark, 0, 2, 1))
    run_available_now(spark, table, checkpoint)
    append(table, events(spark, 100, 3, 2), events(spark, 200, 5, 3), events(spark, 300, 7, 4))  # 3 files

    def commit_while_running(batch_id):
        if batch_id == 1:
            append(table, events(spark, 900, 1, 5))
    batches, progress = run_available_now(spark, table, checkpoint, on_batch=commit_while_running, max_files=1)
    later, _ = run_available_now(spark, table, checkpoint, max_files=1)

    assert sorted(n for n in progress if n) == [3, 5, 7]
    assert [len({r.event_date for r in rows}) for rows in batches if rows] == [1, 1, 1]
    assert sorted(ids(batches)) == [*range(100, 103), *range(200, 205), *range(300, 307)]
    assert ids(later) == [900]


def test_without_a_limit_commits_of_more_than_a_thousand_files_are_one_batch(spark, tmp_path):
    # Delta's default cap (1,000 files) split them: a rebuild's first batch took part of the files and
    # every end-of-input mark, and the rest of the rows came after the watermark had moved to the marks.
    table = tmp_path / "t"
    for _ in range(2):
        spark.range(1005).repartition(1005).write.format("delta").mode("append").save(str(table))

    batches, progress = run_available_now(spark, table, tmp_path / "ck")

    assert [n for n in progress if n] == [2010]
    assert len(batches) == 1


def test_byte_limit_admits_at_least_one_file(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(spark, 0, 3, 1), events(spark, 3, 3, 2))
    append(table, events(spark, 6, 3, 3))

    batches, progress = run_available_now(spark, table, tmp_path / "ck", max_bytes=1)

    assert [n for n in progress if n] == [3, 3, 3]
    assert sorted(ids(batches)) == list(range(9))


def test_starting_version(spark, tmp_path):
    table = tmp_path / "t"
    for version in range(3):
        append(table, events(spark, version * 10, 2, version + 1))

    from_one, _ = run_available_now(spark, table, tmp_path / "ck1", starting_version=1)
    from_latest, _ = run_available_now(spark, table, tmp_path / "ck2", starting_version="latest")
    earliest, _ = run_available_now(spark, table, tmp_path / "ck3", starting_version="earliest")

    assert sorted(ids(from_one)) == [10, 11, 20, 21]
    assert ids(from_latest) == []
    assert sorted(ids(earliest)) == [0, 1, 10, 11, 20, 21]
    for bad in ("first", -1, 1.5):
        with pytest.raises(ValueError, match=f"startingVersion must be .* not {bad!r}"):
            read_stream(spark, table, starting_version=bad)


def test_processing_time_trigger_picks_up_a_new_commit(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(spark, 0, 4, 1))
    seen: list[int] = []
    query = (read_stream(spark, table).writeStream
             .trigger(processingTime="200 milliseconds")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
             .start())
    try:
        _wait_for(lambda: len(seen) >= 4, query)
        append(table, events(spark, 4, 3, 2))
        _wait_for(lambda: len(seen) >= 7, query)
    finally:
        query.stop()
    assert sorted(seen) == list(range(7))


def _wait_for(condition, query, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if query.exception():
            raise query.exception()
        assert time.monotonic() < deadline, "stream did not deliver the rows in time"
        time.sleep(0.1)


def test_partition_and_timestamp_values_round_trip(spark, tmp_path):
    table = tmp_path / "t"
    ts = [dt.datetime(2024, 3, 1, 23, 59, 59, 123456, tzinfo=UTC), dt.datetime(2024, 3, 2, tzinfo=UTC), None]
    rows = [(1, ts[0], "zeek a/b:c%", 53, dt.date(2024, 3, 1)),
            (2, ts[1], None, 443, dt.date(2024, 3, 2)),
            (3, ts[2], "suricata", 53, None)]
    spark.createDataFrame(rows, "id BIGINT, ts TIMESTAMP, sensor STRING, port INT, event_date DATE") \
        .write.format("delta").partitionBy("event_date", "sensor", "port").save(str(table))

    batches, _ = run_available_now(spark, table, tmp_path / "ck", starting_version=0)

    got = sorted((r.asDict() for rows in batches for r in rows), key=lambda r: r["id"])
    assert [(r["id"], r["sensor"], r["port"], r["event_date"]) for r in got] == [r[:1] + r[2:] for r in rows]
    # Spark hands timestamps back in the session time zone (UTC), naive.
    assert [r["ts"] for r in got] == [t.replace(tzinfo=None) if t else None for t in ts]


def test_added_column_reads_as_null_in_older_files(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(spark, 0, 2, 1))
    wider = events(spark, 2, 2, 1).withColumn("user", F.when(F.col("id") == 2, "alice").otherwise("bob"))
    append(table, wider, mergeSchema="true")

    batches, _ = run_available_now(spark, table, tmp_path / "ck", starting_version=0)

    assert sorted((r.id, r.user) for rows in batches for r in rows) == \
        [(0, None), (1, None), (2, "alice"), (3, "bob")]


def test_a_commit_that_removes_data_fails_the_stream(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(spark, 0, 2, 1))
    run_available_now(spark, table, checkpoint)
    events(spark, 5, 1, 1).write.format("delta").mode("overwrite").partitionBy("event_date").save(str(table))

    with pytest.raises(StreamingQueryException, match="DELTA_SOURCE_TABLE_IGNORE_CHANGES"):
        run_available_now(spark, table, checkpoint)


def test_a_young_append_only_table_is_read_from_its_commits_with_the_same_rows(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    for day in (1, 2, 3):
        append(table, events(spark, day * 10, 2, day))

    batches, progress = run_available_now(spark, table, checkpoint, max_files=1)

    assert replayable(table)
    first = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[-1])
    # Delta's offset inside its snapshot start would be (version 2, isStartingVersion true).
    assert (first["reservoirVersion"], first["isStartingVersion"]) == (1, False)
    assert [n for n in progress if n] == [2, 2, 2]
    assert sorted(ids(batches)) == [10, 11, 20, 21, 30, 31]


def test_a_table_whose_rows_were_removed_is_read_from_its_snapshot(spark, tmp_path, monkeypatch):
    from delta.tables import DeltaTable

    restored, overwritten, compacted = tmp_path / "restored", tmp_path / "overwritten", tmp_path / "compacted"
    long_log = tmp_path / "long"
    append(restored, events(spark, 0, 2, 1))
    append(restored, events(spark, 2, 2, 2))
    DeltaTable.forPath(spark, str(restored)).restoreToVersion(0)
    append(overwritten, events(spark, 0, 2, 1))
    events(spark, 5, 1, 1).write.format("delta").mode("overwrite").partitionBy("event_date").save(str(overwritten))
    append(compacted, events(spark, 0, 1, 1))
    append(compacted, events(spark, 1, 1, 1))
    DeltaTable.forPath(spark, str(compacted)).optimize().executeCompaction()
    vacuum(spark, compacted, retention_hours=0)  # the two files a replay would read are gone
    for day in (1, 2, 3):
        append(long_log, events(spark, day * 10, 1, day))

    got = {}
    for table in (restored, overwritten, compacted):
        batches, _ = run_available_now(spark, table, tmp_path / f"ck-{table.name}")
        got[table.name] = sorted(ids(batches))
        assert not replayable(table)

    assert got == {"restored": [0, 1], "overwritten": [5], "compacted": [0, 1]}  # a replay would fail or add rows
    assert replayable(long_log)
    monkeypatch.setattr(source, "REPLAY_MAX_COMMITS", 2)
    assert not replayable(long_log)  # a long log: the snapshot, from Delta's log checkpoint
    assert not replayable(tmp_path / "nope")


def test_missing_table_and_bad_options_are_value_errors(spark, tmp_path):
    (tmp_path / "plain").mkdir()
    for missing in (tmp_path / "nope", tmp_path / "plain"):  # no folder; a folder without a log
        with pytest.raises(ValueError, match=f"no Delta table at {missing}$"):
            read_stream(spark, missing)
    # The miss leaves no stale answer in the JVM: a table another process writes there next is read.
    write_deltalake(str(tmp_path / "nope"), pa.table({"a": [1]}))
    assert read_stream(spark, tmp_path / "nope").columns == ["a"]
    append(tmp_path / "t", events(spark, 0, 1, 1))
    for bad in (0, -3, True, "5"):
        with pytest.raises(ValueError, match=f"maxFilesPerTrigger must be a positive integer, not {bad!r}"):
            read_stream(spark, tmp_path / "t", max_files=bad)
    with pytest.raises(ValueError, match="maxBytesPerTrigger must be a positive integer, not 0"):
        read_stream(spark, tmp_path / "t", max_bytes=0)


def _offsets(checkpoint: Path, batch: int, *lines: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


METADATA = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1700000000000, "conf": {}})


def test_check_resumable_refuses_the_old_python_source_offsets(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _offsets(old, 0, "v1", METADATA, '{"version":3,"index":0,"snapshot":false}')
    with pytest.raises(OldCheckpointError, match=f"checkpoint {old} was written by seclake's Python Delta source"):
        check_resumable(old)

    delta_offset = json.dumps({"sourceVersion": 1, "reservoirId": "0f3c-...", "reservoirVersion": 3,
                               "index": -1, "isStartingVersion": False})
    _offsets(new, 0, "v1", METADATA, delta_offset)
    check_resumable(new)
    # The newest offsets file decides: an old checkpoint that has since been written by Delta is fine,
    _offsets(old, 1, "v1", METADATA, delta_offset)
    check_resumable(old)
    # and one whose newest batch is the old format is not.
    _offsets(new, 10, "v1", METADATA, '{"version":7,"index":2,"snapshot":true}')
    with pytest.raises(OldCheckpointError):
        check_resumable(new)
    # No checkpoint yet, or one without offsets: nothing to refuse.
    check_resumable(tmp_path / "none")
    (tmp_path / "empty" / "offsets").mkdir(parents=True)
    check_resumable(tmp_path / "empty")


def test_caught_up_only_when_every_commit_was_read_and_committed(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "cp"
    append(table, events(spark, 0, 3, 1))
    append(table, events(spark, 3, 2, 2))
    assert not caught_up(checkpoint, [table])  # never ran
    batches, _ = run_available_now(spark, table, checkpoint)
    assert sorted(ids(batches)) == [0, 1, 2, 3, 4]
    assert caught_up(checkpoint, [table])
    # Judged by the tables its checkpoint reads: another table of the stage (a plan made before the
    # stage read it) does not count, and without the table it reads there is no telling.
    other = tmp_path / "other"
    append(other, events(spark, 100, 1, 1))
    assert caught_up(checkpoint, [other, table])
    assert not caught_up(checkpoint, [other])
    append(table, events(spark, 5, 1, 3))
    assert not caught_up(checkpoint, [table])  # a new commit to read
    batches, _ = run_available_now(spark, table, checkpoint)
    assert ids(batches) == [5] and caught_up(checkpoint, [table])
    # A table read by two sources (a rule's enriched input and its attribution-watermark copies)
    # is caught up only when both stand at its newest commit.
    offsets = checkpoint / "offsets" / str(max(int(p.name) for p in (checkpoint / "offsets").iterdir()
                                               if p.name.isdigit()))
    lines = offsets.read_text().splitlines()
    offsets.write_text("\n".join([*lines, lines[-1]]))
    assert caught_up(checkpoint, [table])
    behind = {**json.loads(lines[-1]), "reservoirVersion": json.loads(lines[-1])["reservoirVersion"] - 1}
    offsets.write_text("\n".join([*lines, json.dumps(behind)]))
    assert not caught_up(checkpoint, [table])
    offsets.write_text("\n".join(lines))
    # a batch planned but not committed (a crash mid-batch) must run again
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    assert not caught_up(checkpoint, [table])

