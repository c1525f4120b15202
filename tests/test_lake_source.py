"""The seclake_delta streaming source: exactly once across restarts, read limits, start positions."""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.errors import StreamingQueryException


from pipelines.lake.source import read_stream  # noqa: E402

UTC = dt.timezone.utc


def events(first_id: int, count: int, day: int, host: str = "h1") -> pa.Table:
    """`count` rows with ids from `first_id`, one second apart on 2024-01-`day`."""
    ts = [dt.datetime(2024, 1, day, 8, tzinfo=UTC) + dt.timedelta(seconds=i) for i in range(count)]
    return pa.table({
        "id": pa.array(range(first_id, first_id + count), pa.int64()),
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "host": pa.array([host] * count, pa.string()),
        "event_date": pa.array([t.date() for t in ts], pa.date32()),
    })


def append(table: Path, *parts: pa.Table) -> None:
    """One commit; one file per distinct event_date."""
    write_deltalake(str(table), pa.concat_tables(parts), partition_by=["event_date"], mode="append")


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
    query.awaitTermination(120)
    return batches, [p["numInputRows"] for p in query.recentProgress]


def ids(batches: list[list]) -> list[int]:
    return [row.id for rows in batches for row in rows]


def test_each_row_exactly_once_across_restarts(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(0, 10, 1))
    append(table, events(10, 5, 2), events(15, 5, 3))
    first, _ = run_available_now(spark, table, checkpoint)

    append(table, events(20, 7, 3))
    append(table, events(27, 3, 4, host="h2"))
    second, _ = run_available_now(spark, table, checkpoint, max_files=1)
    third, progress = run_available_now(spark, table, checkpoint)

    assert sorted(ids(first)) == list(range(20))
    assert sorted(ids(second)) == list(range(20, 30))
    assert ids(third) == [] and sum(progress) == 0
    everything = ids(first) + ids(second) + ids(third)
    assert len(everything) == len(set(everything)) == 30


def test_a_batch_that_failed_is_replayed_with_the_same_files(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(0, 3, 1), events(3, 3, 2), events(6, 3, 3))
    handled: list[int] = []

    def fail_on_second_batch(df, batch_id):
        rows = df.collect()
        if batch_id == 1:
            raise RuntimeError("sink down")
        handled.extend(r.id for r in rows)

    def run(handler):
        query = (read_stream(spark, table, max_files=1).writeStream.trigger(availableNow=True)
                 .option("checkpointLocation", str(checkpoint)).foreachBatch(handler).start())
        query.awaitTermination(120)

    with pytest.raises(StreamingQueryException, match="sink down"):
        run(fail_on_second_batch)
    assert len(handled) == 3
    run(lambda df, _: handled.extend(r.id for r in df.collect()))

    assert sorted(handled) == list(range(9))


def test_read_limit_splits_one_commit_and_available_now_stops_at_its_start(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(0, 2, 1))
    run_available_now(spark, table, checkpoint)
    append(table, events(100, 3, 2), events(200, 5, 3), events(300, 7, 4))  # one commit, 3 files

    def commit_while_running(batch_id):
        if batch_id == 1:
            append(table, events(900, 1, 5))
    batches, progress = run_available_now(spark, table, checkpoint, on_batch=commit_while_running, max_files=1)
    later, _ = run_available_now(spark, table, checkpoint, max_files=1)

    assert sorted(n for n in progress if n) == [3, 5, 7]
    assert [len({r.event_date for r in rows}) for rows in batches if rows] == [1, 1, 1]
    assert sorted(ids(batches)) == [*range(100, 103), *range(200, 205), *range(300, 307)]
    assert ids(later) == [900]


def test_byte_limit_admits_at_least_one_file(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(0, 3, 1), events(3, 3, 2))
    append(table, events(6, 3, 3))

    batches, progress = run_available_now(spark, table, tmp_path / "ck", max_bytes=1)

    assert [n for n in progress if n] == [3, 3, 3]
    assert sorted(ids(batches)) == list(range(9))


def test_starting_version(spark, tmp_path):
    table = tmp_path / "t"
    for version in range(3):
        append(table, events(version * 10, 2, version + 1))

    from_one, _ = run_available_now(spark, table, tmp_path / "ck1", starting_version=1)
    from_latest, _ = run_available_now(spark, table, tmp_path / "ck2", starting_version="latest")

    assert sorted(ids(from_one)) == [10, 11, 20, 21]
    assert ids(from_latest) == []
    with pytest.raises(ValueError, match="startingVersion 7 is after the latest version 2"):
        read_stream(spark, table, starting_version=7)
    with pytest.raises(ValueError, match="startingVersion must be .* not 'first'"):
        read_stream(spark, table, starting_version="first")


def test_processing_time_trigger_picks_up_a_new_commit(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(0, 4, 1))
    seen: list[int] = []
    query = (read_stream(spark, table).writeStream
             .trigger(processingTime="200 milliseconds")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
             .start())
    try:
        _wait_for(lambda: len(seen) >= 4, query)
        append(table, events(4, 3, 2))
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
    data = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "sensor": pa.array(["zeek a/b:c%", None, "suricata"], pa.string()),
        "port": pa.array([53, 443, 53], pa.int32()),
        "event_date": pa.array([dt.date(2024, 3, 1), dt.date(2024, 3, 2), None], pa.date32()),
    })
    write_deltalake(str(table), data, partition_by=["event_date", "sensor", "port"])

    batches, _ = run_available_now(spark, table, tmp_path / "ck", starting_version=0)

    got = sorted((r.asDict() for rows in batches for r in rows), key=lambda r: r["id"])
    expected = data.to_pylist()
    assert [(r["id"], r["sensor"], r["port"], r["event_date"]) for r in got] == \
        [(r["id"], r["sensor"], r["port"], r["event_date"]) for r in expected]
    # Spark hands timestamps back in the session time zone (UTC), naive.
    assert [r["ts"] for r in got] == [t.replace(tzinfo=None) if t else None for t in ts]


def test_added_column_reads_as_null_in_older_files(spark, tmp_path):
    table = tmp_path / "t"
    append(table, events(0, 2, 1))
    wider = events(2, 2, 1).append_column("user", pa.array(["alice", "bob"], pa.string()))
    write_deltalake(str(table), wider, partition_by=["event_date"], mode="append", schema_mode="merge")

    batches, _ = run_available_now(spark, table, tmp_path / "ck", starting_version=0)

    assert sorted((r.id, r.user) for rows in batches for r in rows) == \
        [(0, None), (1, None), (2, "alice"), (3, "bob")]


def test_a_commit_that_removes_data_fails_the_stream(spark, tmp_path):
    table, checkpoint = tmp_path / "t", tmp_path / "ck"
    append(table, events(0, 2, 1))
    run_available_now(spark, table, checkpoint)
    write_deltalake(str(table), events(5, 1, 1), partition_by=["event_date"], mode="overwrite")

    with pytest.raises(StreamingQueryException, match="append-only"):
        run_available_now(spark, table, checkpoint)


def test_missing_table_and_bad_options_are_value_errors(spark, tmp_path):
    (tmp_path / "plain").mkdir()
    for missing in (tmp_path / "nope", tmp_path / "plain"):  # no folder; a folder without a log
        with pytest.raises(ValueError, match=f"no Delta table at {missing}; create it"):
            read_stream(spark, missing)
    append(tmp_path / "t", events(0, 1, 1))
    with pytest.raises(ValueError, match="maxFilesPerTrigger must be a positive integer, not '0'"):
        read_stream(spark, tmp_path / "t", max_files=0)
