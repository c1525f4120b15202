"""The table layer: streaming sink (exactly-once commits), batch read, time travel, interop with delta-rs."""
from __future__ import annotations

import datetime as dt
import decimal
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DateType, DoubleType, IntegerType, LongType,
                               MapType, StringType, StructField, StructType, TimestampType)

from pipelines.lake.read import UnsupportedTableError, read_table
from pipelines.lake.schema import SchemaMismatchError
from pipelines.lake.sink import ConcurrentWriterError, DeltaSink

# Every Spark type the product's tables use.
ALL_TYPES = StructType([
    StructField("event_id", StringType()),
    StructField("event_time", TimestampType()),
    StructField("event_date", DateType()),
    StructField("src_port", IntegerType()),
    StructField("orig_bytes", LongType()),
    StructField("duration", DoubleType()),
    StructField("rejected", BooleanType()),
    StructField("answers", ArrayType(StringType())),
    StructField("ttls", ArrayType(DoubleType())),
    StructField("tags", MapType(StringType(), StringType())),
    StructField("flow", StructType([StructField("pkts", LongType()), StructField("state", StringType())])),
    StructField("raw", BinaryType()),
])


def _rows(n: int, offset: int = 0) -> list[tuple]:
    base = dt.datetime(2026, 11, 20, 23, 59, 0, 123456, tzinfo=dt.timezone.utc)
    out = []
    for i in range(offset, offset + n):
        ts = base + dt.timedelta(seconds=i)
        out.append((f"e{i}", ts, ts.date(), i % 65536, i * 1000, i / 7, i % 2 == 0,
                    [f"10.0.0.{i % 255}"] if i % 5 else None, [1.5, float(i)], {"k": str(i)},
                    (i, "SF"), bytes([i % 256, 0, 255])))
    return out


def _sink(path, app_id="q", **kw) -> DeltaSink:
    return DeltaSink(path, app_id=app_id, partition_by=["event_date"], **kw)


def test_round_trip_all_types(spark, tmp_path):
    frame = spark.createDataFrame(_rows(120), ALL_TYPES)
    sink = _sink(tmp_path / "t")
    result = sink.write_batch(frame, 0)
    sink.close()
    assert (result.version, result.rows) == (0, 120)
    back = read_table(spark, tmp_path / "t")
    assert back.schema == ALL_TYPES
    assert sorted(back.collect()) == sorted(frame.collect())
    # The commit carries the partition values the reader relies on: two dates.
    assert back.select("event_date").distinct().count() == 2


def test_replayed_batch_commits_nothing(spark, tmp_path):
    frame = spark.createDataFrame(_rows(10), ALL_TYPES)
    sink = _sink(tmp_path / "t")
    sink.write_batch(frame, 0)
    sink.write_batch(frame, 1)
    replay = sink.write_batch(frame, 1)
    older = sink.write_batch(frame, 0)
    sink.close()
    assert replay.skipped and older.skipped
    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == 1
    assert table.transaction_version("q") == 1
    assert read_table(spark, tmp_path / "t").count() == 20


class _CrashBeforeCommit(DeltaSink):
    """Dies after Spark wrote the batch's Parquet files, before delta-rs committed them."""

    def _commit(self, *args, **kwargs):
        raise RuntimeError("injected crash between Parquet write and commit")


def test_stream_killed_between_write_and_commit_is_exactly_once(spark, tmp_path):
    landing = tmp_path / "in"
    landing.mkdir()
    schema = "id BIGINT, event_date DATE"
    checkpoint = str(tmp_path / "ck")

    def add_file(name, ids):
        spark.createDataFrame([(i, dt.date(2026, 11, 20)) for i in ids], schema).coalesce(1) \
            .write.mode("overwrite").json(str(tmp_path / "stage" / name))
        part = next((tmp_path / "stage" / name).glob("part-*.json"))
        part.rename(landing / f"{name}.json")

    def run(sink):
        query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(landing))
                 .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        finally:
            sink.close()

    add_file("a", range(0, 100))
    run(_sink(tmp_path / "t", app_id="ingest"))
    add_file("b", range(100, 200))
    with pytest.raises(Exception, match="injected crash"):
        run(_CrashBeforeCommit(tmp_path / "t", app_id="ingest", partition_by=["event_date"]))
    # The crashed batch left Parquet files in the table folder that no commit references.
    referenced = {a for a in pa.table(DeltaTable(str(tmp_path / "t")).get_add_actions())["path"].to_pylist()}
    on_disk = {p.relative_to(tmp_path / "t").as_posix() for p in (tmp_path / "t").rglob("*.parquet")}
    assert on_disk - referenced, "the crash should leave orphan files behind"
    add_file("c", range(200, 300))
    run(_sink(tmp_path / "t", app_id="ingest"))
    ids = [r.id for r in read_table(spark, tmp_path / "t").select("id").collect()]
    assert sorted(ids) == list(range(300))


def test_two_writers_with_same_app_id_cannot_both_commit(spark, tmp_path):
    frame = spark.createDataFrame(_rows(5), ALL_TYPES)
    first, second = _sink(tmp_path / "t"), _sink(tmp_path / "t")
    first.write_batch(frame, 0)
    with pytest.raises(ConcurrentWriterError, match="app_id 'q'"):
        second.write_batch(frame, 1)
    first.close()
    # Once the first writer is gone (process death releases the lock the same way) the second may go on.
    assert second.write_batch(frame, 1).version == 1
    second.close()


def test_write_deltalake_tables_are_readable(spark, tmp_path):
    table = pa.table({
        "n": pa.array([1, 2, 3], pa.int64()),
        "ts": pa.array([dt.datetime(2026, 1, 1, i, tzinfo=dt.timezone.utc) for i in range(3)], pa.timestamp("us", "UTC")),
        "name": ["a", "b", None],
        "d": pa.array([dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 2)]),
    })
    write_deltalake(str(tmp_path / "w"), table, partition_by=["d"])
    write_deltalake(str(tmp_path / "w"), table.slice(0, 1), mode="append", partition_by=["d"])
    rows = read_table(spark, tmp_path / "w").orderBy("n", "d").collect()
    assert [(r.n, r.name, r.d.isoformat()) for r in rows] == [
        (1, "a", "2026-01-01"), (1, "a", "2026-01-01"), (2, "b", "2026-01-02"), (3, None, "2026-01-02")]
    assert rows[0].ts == dt.datetime(2026, 1, 1, 0, 0)  # session time zone is UTC


def test_our_tables_read_identically_by_delta_rs(spark, tmp_path):
    frame = spark.createDataFrame(_rows(50), ALL_TYPES).drop("tags", "flow", "raw")
    sink = _sink(tmp_path / "t")
    sink.write_batch(frame.where("src_port < 25"), 0)
    sink.write_batch(frame.where("src_port >= 25"), 1)
    sink.close()
    theirs = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    ours = [r.asDict() for r in read_table(spark, tmp_path / "t").collect()]
    key = lambda r: r["event_id"]  # noqa: E731
    for a, b in zip(sorted(theirs, key=key), sorted(ours, key=key)):
        assert a["event_time"].replace(tzinfo=None) == b["event_time"]
        a.pop("event_time"), b.pop("event_time")
        assert a == b
    assert len(theirs) == len(ours) == 50


def test_time_travel_by_version_and_timestamp(spark, tmp_path):
    sink = _sink(tmp_path / "t")
    sink.write_batch(spark.createDataFrame(_rows(10), ALL_TYPES), 0)
    time.sleep(1.1)
    between = dt.datetime.now(dt.timezone.utc)
    time.sleep(1.1)
    sink.write_batch(spark.createDataFrame(_rows(15, 10), ALL_TYPES), 1)
    sink.close()
    assert read_table(spark, tmp_path / "t").count() == 25
    assert read_table(spark, tmp_path / "t", version=0).count() == 10
    assert read_table(spark, tmp_path / "t", timestamp=between).count() == 10
    with pytest.raises(ValueError, match="no version 7"):
        read_table(spark, tmp_path / "t", version=7)


def test_additive_schema_evolution_and_type_change_error(spark, tmp_path):
    sink = _sink(tmp_path / "t")
    frame = spark.createDataFrame(_rows(4), ALL_TYPES).select("event_id", "event_date", "orig_bytes")
    sink.write_batch(frame, 0)
    result = sink.write_batch(frame.withColumn("severity", F.lit(3)), 1)
    assert result.schema_evolved == ["severity"]
    back = read_table(spark, tmp_path / "t")
    assert back.columns == ["event_id", "event_date", "orig_bytes", "severity"]
    assert back.where("severity IS NULL").count() == 4 and back.where("severity = 3").count() == 4
    with pytest.raises(SchemaMismatchError, match="column 'orig_bytes' has type bigint in the table but string"):
        sink.write_batch(frame.withColumn("orig_bytes", F.col("orig_bytes").cast("string")), 2)
    sink.close()
    assert DeltaTable(str(tmp_path / "t")).version() == 2  # failed write committed nothing


def test_empty_batch_creates_table_once_and_then_commits_nothing(spark, tmp_path):
    empty = spark.createDataFrame([], ALL_TYPES)
    sink = _sink(tmp_path / "t")
    assert sink.write_batch(empty, 0).version == 0
    assert sink.write_batch(empty, 1).version is None
    sink.close()
    assert read_table(spark, tmp_path / "t").count() == 0


def test_log_checkpoint_every_n_commits(spark, tmp_path):
    sink = _sink(tmp_path / "t", checkpoint_interval=3)
    frame = spark.createDataFrame(_rows(2), ALL_TYPES)
    for batch in range(7):
        sink.write_batch(frame, batch)
    sink.close()
    checkpoints = sorted(p.name for p in (tmp_path / "t" / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints, "expected delta-rs to write a log checkpoint"
    assert read_table(spark, tmp_path / "t").count() == 14


def test_unsupported_reader_features_fail_clearly(spark, tmp_path):
    write_deltalake(str(tmp_path / "dv"), pa.table({"n": [1]}),
                    configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(UnsupportedTableError, match="deletion vectors"):
        read_table(spark, tmp_path / "dv")


def test_missing_table_is_a_clear_error(spark, tmp_path):
    with pytest.raises(ValueError, match="no Delta table at .*nowhere"):
        read_table(spark, tmp_path / "nowhere")
