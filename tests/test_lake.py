"""The table layer on delta-spark: exactly-once sink commits, batch reads, time travel, schema
evolution, deletion vectors, and the JVM-free log listings (delta-rs) of tables delta-spark wrote."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from conftest import spark_jobs, waits_for_lock
from pipelines.home import Home
from pipelines.lake.log import commits, newest_in_stats, summary
from pipelines.lake.read import is_table, read_in_range, read_table
from pipelines.lake.registry import CatalogWatch, Lake
from pipelines.lake.schema import SchemaMismatchError
from pipelines.lake.sink import DeltaSink, create_empty, table_uri
from pipelines.rules.status import platform_alert

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


def _frame(spark, n: int, offset: int = 0):
    return spark.createDataFrame(_rows(n, offset), ALL_TYPES)


def _sink(path, app_id="q") -> DeltaSink:
    return DeltaSink(path, app_id=app_id, partition_by=["event_date"])


def _log_actions(table: Path, version: int) -> list[dict]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _latest_version(spark, table: Path) -> int:
    return DeltaTable.forPath(spark, str(table)).history(1).first().version


def test_round_trip_all_types(spark, tmp_path):
    frame = _frame(spark, 120)
    sink = _sink(tmp_path / "t")
    result = sink.write_batch(frame, 0)
    assert (result.table, result.batch_id, result.version, result.rows, result.skipped) == ("t", 0, 0, 120, False)
    back = read_table(spark, tmp_path / "t")
    assert back.schema == ALL_TYPES
    assert sorted(back.collect()) == sorted(frame.collect())
    # Partitioned by event_date: the rows span two dates, one folder each.
    assert sorted(p.name for p in (tmp_path / "t").glob("event_date=*")) == \
        ["event_date=2026-11-20", "event_date=2026-11-21"]
    assert back.select("event_date").distinct().count() == 2


def test_replayed_batch_commits_nothing(spark, tmp_path):
    table = tmp_path / "t"
    frame = _frame(spark, 10)
    sink = _sink(table)
    assert sink.write_batch(frame, 0).version == 0
    assert sink.write_batch(frame, 1).version == 1
    replay = sink.write_batch(frame, 1)
    older = sink.write_batch(frame, 0)
    assert (replay.skipped, replay.version, replay.rows) == (True, None, 0)
    assert older.skipped and older.version is None
    assert _latest_version(spark, table) == 1
    # The log records the app's txn in each commit it made.
    txns = [a["txn"] for v in (0, 1) for a in _log_actions(table, v) if "txn" in a]
    assert [(t["appId"], t["version"]) for t in txns] == [("q", 0), ("q", 1)]
    assert read_table(spark, table).count() == 20
    # Another app id is its own sequence: its batch 0 lands.
    assert _sink(table, app_id="other").write_batch(frame, 0).version == 2
    assert read_table(spark, table).count() == 30


@pytest.mark.parametrize("partition_by", [["event_date"], []], ids=["partitioned", "unpartitioned"])
def test_a_batch_of_no_row_commits_nothing_and_later_batches_land(spark, tmp_path, partition_by):
    # An empty commit would wake every query reading the table for a micro-batch of nothing.
    table = tmp_path / "t"
    sink = DeltaSink(table, app_id="q", partition_by=partition_by)
    assert sink.write_batch(_frame(spark, 3), 0).version == 0
    empty = sink.write_batch(spark.createDataFrame([], ALL_TYPES), 1)
    assert (empty.version, empty.rows, empty.skipped) == (None, 0, False)
    assert _latest_version(spark, table) == 0
    assert sink.write_batch(_frame(spark, 2, 3), 2).version == 1
    assert sink.write_batch(_frame(spark, 2, 3), 1).skipped  # an id below the last committed one stays refused
    assert read_table(spark, table).count() == 5


def test_two_writers_with_same_app_id_land_a_batch_once(spark, tmp_path):
    table = tmp_path / "t"
    first, second = _sink(table), _sink(table)
    assert first.write_batch(_frame(spark, 5), 0).version == 0
    assert second.write_batch(_frame(spark, 5), 0).skipped
    assert second.write_batch(_frame(spark, 7, 5), 1).version == 1
    assert first.write_batch(_frame(spark, 7, 5), 1).skipped
    ids = sorted(r.event_id for r in read_table(spark, table).select("event_id").collect())
    assert ids == sorted(f"e{i}" for i in range(12))
    assert _latest_version(spark, table) == 1


def test_write_next_lands_after_a_later_numbered_commit_of_its_app_id(spark, tmp_path):
    # A backtest's write and a notify pass numbered their batch by the clock: a run that started
    # earlier, or after the clock stepped back, was skipped as already committed and its rows lost.
    table = tmp_path / "t"
    other_run, ours = _sink(table, app_id="backtest:r:v1"), _sink(table, app_id="backtest:r:v1")
    assert other_run.write_batch(_frame(spark, 3), 1_800_000_000_000).version == 0
    built = []
    result = ours.write_next(lambda: built.append(1) or _frame(spark, 4, 3))
    assert (result.skipped, result.batch_id, result.version, result.rows) == (False, 1_800_000_000_001, 1, 4)
    assert built == [1]
    assert read_table(spark, table).count() == 7


def test_two_writers_with_same_app_id_at_the_same_moment_land_a_batch_once(spark, tmp_path):
    # Started together, both usually read the table before either commits; then the loser's only
    # defence is Delta's conflict check on the app id the sink registers as read (`_committed_batch`).
    table = tmp_path / "t"
    big = spark.range(150_000).select(F.col("id"), F.sha2(F.col("id").cast("string"), 256).alias("pad"),
                                      F.lit(dt.date(2026, 11, 20)).alias("event_date"))
    sinks = (_sink(table), _sink(table))
    sinks[0].write_batch(big.limit(1), 0)
    for batch in (1, 2):
        outcomes = _at_once([lambda sink=sink, batch=batch: sink.write_batch(big, batch) for sink in sinks])
        committed = [o for o in outcomes if not isinstance(o, Exception) and not o.skipped]
        lost = [o for o in outcomes if o not in committed]
        assert len(committed) == 1 and len(lost) == 1, outcomes
        assert (getattr(lost[0], "skipped", False)
                or "ConcurrentTransactionException" in str(lost[0])), lost[0]
    assert read_table(spark, table).count() == 1 + 2 * 150_000


def _at_once(calls: list) -> list[object]:
    """Run `calls` in threads started together; each one's result, or the exception it raised."""
    outcomes: list[object] = []

    def run(call) -> None:
        try:
            outcomes.append(call())
        except Exception as exc:  # e.g. the conflict raised to the losing writer's query
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_an_append_reads_the_app_version_from_the_checksum_and_falls_back_without_it(spark, tmp_path):
    table = tmp_path / "t"
    sink = _sink(table)
    for batch in range(4):
        sink.write_batch(_frame(spark, 3, 3 * batch), batch)
    # One Spark job, the write: no rebuild of the table's state to find the app's last version.
    appended, jobs = spark_jobs(spark, lambda: sink.write_batch(_frame(spark, 3, 12), 4))
    assert (appended.version, jobs) == (4, 1)
    # Without the newest checksum (a crash between commit and checksum), Delta's own look-up
    # answers: the replay is still skipped, and the next batch lands.
    (table / "_delta_log" / f"{4:020d}.crc").unlink()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    assert sink.write_batch(_frame(spark, 3, 12), 4).skipped
    assert sink.write_batch(_frame(spark, 3, 15), 5).version == 5
    assert read_table(spark, table).count() == 18


def _timed_files(folder: Path, files: int) -> Path:
    """`files` JSON files of a few timed rows each, an hour apart: one micro-batch each at maxFilesPerTrigger=1."""
    folder.mkdir(parents=True)
    for i in range(files):
        rows = [{"ts": f"2026-11-20T{10 + i:02d}:{m:02d}:00Z", "n": m} for m in range(0, 30, 10)]
        path = folder / f"part-{i}.json"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source reads oldest first
    return folder


def test_a_stateful_query_replaying_a_committed_batch_goes_on(spark, tmp_path):
    # A kill between the Delta commit and Spark's commit log: the batch replays, Delta skips it,
    # and the stateful operator must still commit its state for it.
    table = tmp_path / "t"
    sink = DeltaSink(table, app_id="q")
    counts = (spark.readStream.schema("ts timestamp, n long").option("maxFilesPerTrigger", 1)
              .json(str(_timed_files(tmp_path / "in", 3)))
              .withWatermark("ts", "1 minute")
              .groupBy(F.window("ts", "1 hour")).count()
              .select(F.col("window.start").alias("start"), "count"))
    sink.write_batch(spark.createDataFrame([], counts.schema), 0)
    results = []
    query = (counts.writeStream.foreachBatch(lambda frame, batch: results.append(sink.write_batch(frame, batch)))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the query did not end"
    assert query.exception() is None
    assert results[0].skipped and [r.batch_id for r in results[:3]] == [0, 1, 2]
    assert not any(r.skipped for r in results[1:])
    # Batch 0's window (10:00) was in the skipped batch's state: it still closes and is written.
    starts = {r.start.hour for r in read_table(spark, table).collect()}
    assert {10, 11} <= starts


class _CrashBeforeCommit(DeltaSink):
    """Dies after the batch's Parquet files are in the table folder, before any commit references them."""

    def write_batch(self, df, batch_id):
        staged = Path(self.uri).parent / f"staged-{batch_id}"
        df.write.partitionBy(*self.partition_by).parquet(str(staged))
        for part in staged.rglob("part-*.parquet"):
            target = Path(self.uri) / part.relative_to(staged)
            target.parent.mkdir(parents=True, exist_ok=True)
            part.rename(target)
        raise RuntimeError("injected crash between Parquet write and commit")


class _CrashAfterCommit(DeltaSink):
    """Commits the batch, then dies before the stream records the batch as done."""

    def write_batch(self, df, batch_id):
        super().write_batch(df, batch_id)
        raise RuntimeError("injected crash after commit")


def test_stream_killed_around_the_commit_is_exactly_once(spark, tmp_path):
    landing, table, checkpoint = tmp_path / "in", tmp_path / "t", str(tmp_path / "ck")
    landing.mkdir()
    schema = "id BIGINT, event_date DATE"

    def add_file(name, ids):
        spark.createDataFrame([(i, dt.date(2026, 11, 20)) for i in ids], schema).coalesce(1) \
            .write.mode("overwrite").json(str(tmp_path / "stage" / name))
        part = next((tmp_path / "stage" / name).glob("part-*.json"))
        part.rename(landing / f"{name}.json")

    def run(sink):
        query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(landing))
                 .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)

    def referenced():
        return {r.path for r in spark.read.json(str(table / "_delta_log" / "*.json"))
                .where("add IS NOT NULL").select("add.path").collect()}

    add_file("a", range(0, 100))
    run(_sink(table, app_id="ingest"))
    add_file("b", range(100, 200))
    with pytest.raises(StreamingQueryException, match="injected crash between"):
        run(_CrashBeforeCommit(table, app_id="ingest", partition_by=["event_date"]))
    # The crashed batch left Parquet files in the table folder that no commit references ...
    on_disk = {p.relative_to(table).as_posix() for p in table.rglob("*.parquet")}
    assert on_disk - referenced(), "the crash should leave orphan files behind"
    # ... which the table does not read.
    assert read_table(spark, table).count() == 100
    with pytest.raises(StreamingQueryException, match="injected crash after commit"):
        run(_CrashAfterCommit(table, app_id="ingest"))  # batch "b" commits, the stream does not know
    assert read_table(spark, table).count() == 200
    add_file("c", range(200, 300))
    run(_sink(table, app_id="ingest"))  # replays batch "b" (skipped), then "c"
    ids = [r.id for r in read_table(spark, table).select("id").collect()]
    assert sorted(ids) == list(range(300))
    assert _latest_version(spark, table) == 2


def test_create_empty_once_with_nullable_columns_and_log_checkpoints(spark, tmp_path):
    table = tmp_path / "t"
    schema = StructType([StructField("n", LongType(), False), StructField("event_date", DateType(), False)])
    spark.conf.set("spark.databricks.delta.properties.defaults.appendOnly", "true")
    try:
        created, jobs = spark_jobs(spark, lambda: create_empty(spark, table, schema, ["event_date"], 2))
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.appendOnly")
    # No Spark job: Delta's state of a table that did not exist is not rebuilt for its checksum.
    assert (created, jobs) == (True, 0)
    assert create_empty(spark, table, schema, ["event_date"]) is False
    assert is_table(spark, table)
    empty = read_table(spark, table)
    assert empty.count() == 0
    assert [(f.name, f.dataType, f.nullable) for f in empty.schema.fields] == \
        [("n", LongType(), True), ("event_date", DateType(), True)]
    detail = DeltaTable.forPath(spark, str(table)).detail().first()
    assert detail.partitionColumns == ["event_date"]
    assert detail.properties["delta.checkpointInterval"] == "2"
    assert detail.properties["delta.appendOnly"] == "true"  # the session's table defaults apply
    sink = DeltaSink(table, app_id="q", partition_by=["event_date"])
    for batch in range(3):
        sink.write_batch(spark.createDataFrame([(batch, dt.date(2026, 1, 1))], schema), batch)
    assert (table / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    # Each checksum counts the files without listing them (spark.py: `allFilesInCrc`).
    for version in range(4):
        checksum = json.loads((table / "_delta_log" / f"{version:020d}.crc").read_text())
        assert checksum["numFiles"] == version and not checksum.get("allFiles")
    assert sorted(r.n for r in read_table(spark, table).collect()) == [0, 1, 2]


def test_a_registry_sinks_commit_waits_while_another_process_of_the_home_commits(spark, tmp_path):
    # Delta's commits on object storage are atomic within one driver only: `seclake rules backtest
    # --write` appends to alerts beside the stream's rules application, so each commit takes the home's lock.
    lake = Lake(Home.resolve(tmp_path / "home").create())
    lake.ensure(spark, "alerts")
    log = lake.path("alerts") / "_delta_log"
    alert = spark.createDataFrame(
        [platform_alert("a1", "seclake.test", "test", "low", "s", "{}",
                        dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.timezone.utc))], lake.spec("alerts").schema)
    result = waits_for_lock(lake.home.root / "locks" / "alerts.lock",
                            lambda: lake.sink("alerts", app_id="backtest").write_batch(alert, 1),
                            lambda: len(list(log.glob("*.json"))))
    assert result.rows == 1 and lake.read(spark, "alerts").count() == 1


def test_a_sinks_first_batch_creates_the_table_in_one_commit_with_delta_s_checks(spark, tmp_path):
    table = tmp_path / "t"
    spark.conf.set("spark.databricks.delta.properties.defaults.appendOnly", "true")
    try:
        result, jobs = spark_jobs(spark, lambda: _sink(table).write_batch(_frame(spark, 4), 0))
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.appendOnly")
    # The batch's write only: Delta's state of a table that did not exist is not rebuilt.
    assert (result.version, result.rows, jobs) == (0, 4, 1)
    kinds = {kind for action in _log_actions(table, 0) for kind in action}
    assert {"metaData", "protocol", "add", "txn", "commitInfo"} <= kinds
    detail = DeltaTable.forPath(spark, str(table)).detail().first()
    assert detail.partitionColumns == ["event_date"]
    assert detail.properties["delta.appendOnly"] == "true"  # the session's table defaults apply
    assert _sink(table).write_batch(_frame(spark, 4), 0).skipped  # batch 0's txn is in version 0
    # An empty first batch still creates the table, with its txn: a replay commits nothing.
    empty = tmp_path / "empty"
    assert _sink(empty).write_batch(_frame(spark, 0), 7).version == 0
    assert _sink(empty).write_batch(_frame(spark, 0), 7).skipped
    # Delta's checks of a new table's names still run, and name the column.
    bad = spark.createDataFrame([(1, dt.date(2026, 1, 1))], "`a b` INT, event_date DATE")
    with pytest.raises(Exception, match="a b"):
        _sink(tmp_path / "bad").write_batch(bad, 0)
    assert not is_table(spark, tmp_path / "bad")


def test_new_tables_keep_statistics_on_their_time_columns_only(spark, tmp_path):
    # Made by create_empty (the registry's tables) or by a sink's first append (the ETL's): the same.
    ensured, appended = tmp_path / "ensured", tmp_path / "appended"
    create_empty(spark, ensured, ALL_TYPES, ["event_date"])
    for table in (ensured, appended):
        _sink(table).write_batch(_frame(spark, 3), 0)
        actions = _log_actions(table, _latest_version(spark, table))
        files = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
        assert sum(f["numRecords"] for f in files) == 3
        assert all(set(f["minValues"]) == set(f["maxValues"]) == {"event_time"} for f in files)
        assert summary(table).rows == 3  # delta-rs's count, from the statistics
        assert newest_in_stats(table, "event_time") == dt.datetime(2026, 11, 20, 23, 59, 2, 123000,
                                                                    tzinfo=dt.timezone.utc)


def test_newest_in_stats_reads_the_log_and_names_a_file_without_statistics(spark, tmp_path):
    table = str(tmp_path / "t")
    spark.sql("SELECT timestamp'2026-11-20 10:00:00.123456' AS t, 1 AS n").write.format("delta").save(table)
    truncated = dt.datetime(2026, 11, 20, 10, 0, 0, 123000, tzinfo=dt.timezone.utc)
    assert newest_in_stats(table, "t") == truncated  # Delta's statistics: milliseconds, truncated
    # A file holding only NULLs of the column has no maximum and is known to hold no value.
    spark.sql("SELECT CAST(NULL AS timestamp) AS t, 2 AS n").write.format("delta").mode("append").save(table)
    assert newest_in_stats(table, "t") == truncated
    spark.conf.set("spark.databricks.delta.stats.collect", "false")
    try:
        spark.sql("SELECT timestamp'2026-11-19 00:00:00' AS t, 3 AS n").write.format("delta").mode("append").save(table)
    finally:
        spark.conf.unset("spark.databricks.delta.stats.collect")
    with pytest.raises(LookupError, match="t: a file without statistics for t"):
        newest_in_stats(table, "t")
    empty = str(tmp_path / "empty")
    spark.sql("SELECT timestamp'2026-11-20 10:00:00' AS t").where("false").write.format("delta").save(empty)
    assert newest_in_stats(empty, "t") is None


def test_newest_in_stats_refuses_a_table_with_deletion_vectors(spark, tmp_path):
    # Deleted rows stay counted in their file's statistics: the newest row they name may be gone.
    table = str(tmp_path / "t")
    spark.conf.set("spark.databricks.delta.properties.defaults.enableDeletionVectors", "true")
    try:
        spark.sql("SELECT timestamp'2026-11-20 10:00:00' + make_interval(0, 0, 0, 0, 0, id, 0) AS t, id FROM range(10)"
                  ).coalesce(1).write.format("delta").save(table)
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.enableDeletionVectors")
    DeltaTable.forPath(spark, table).delete("id >= 5")
    assert read_table(spark, table).agg(F.max("t")).first()[0] == dt.datetime(2026, 11, 20, 10, 4)
    with pytest.raises(LookupError, match="deletion vectors"):
        newest_in_stats(table, "t")


def _day_files(spark, table: str, days: int) -> list[Path]:
    """One file per day of November 2026, rows 'a' at 10:00 and 'b' at 10:00:00.000900: the data files in order."""
    for day in range(1, days + 1):
        spark.sql(f"SELECT timestamp'2026-11-0{day} 10:00:00' + make_interval(0, 0, 0, 0, 0, 0, s) AS t, n, "
                  f"{day} AS day FROM VALUES (0.0, 'a'), (0.0009, 'b') AS v(s, n)").coalesce(1).write.format(
                      "delta").mode("append").save(table)
    return [Path(table) / a["add"]["path"] for v in range(days) for a in _log_actions(Path(table), v) if "add" in a]


def test_read_in_range_reads_only_the_files_whose_statistics_overlap(spark, tmp_path):
    table = str(tmp_path / "t")
    files = _day_files(spark, table, 3)
    assert len(files) == 3
    files[0].unlink()  # day 1's file gone: Delta's full read fails, a read of days 2-3 never opens it
    with pytest.raises(Exception, match="FileNotFound|does not exist|FAILED_READ_FILE"):
        read_table(spark, table).collect()
    found = read_in_range(spark, table, "t", dt.datetime(2026, 11, 2), dt.datetime(2026, 11, 3, 12))
    assert sorted((r.day, r.n) for r in found.collect()) == [(2, "a"), (2, "b"), (3, "a"), (3, "b")]
    assert found.columns == ["t", "n", "day"]
    # The statistics keep milliseconds, truncated (day 3's maximum is recorded as 10:00:00.000):
    # a range starting after it but before the true maximum still finds the row.
    late = read_in_range(spark, table, "t", dt.datetime(2026, 11, 3, 10, 0, 0, 500), dt.datetime(2026, 11, 4))
    assert [(r.day, r.n) for r in late.collect()] == [(3, "b")]
    assert read_in_range(spark, table, "t", dt.datetime(2026, 11, 5), dt.datetime(2026, 11, 6)).count() == 0


def test_read_in_range_keeps_the_table_s_columns_and_deleted_rows_out(spark, tmp_path):
    table = str(tmp_path / "t")
    _day_files(spark, table, 2)
    spark.sql("SELECT timestamp'2026-11-02 11:00' AS t, 'c' AS n, 2 AS day, 'x' AS added").write.format("delta").mode(
        "append").option("mergeSchema", "true").save(table)
    rows = read_in_range(spark, table, "t", dt.datetime(2026, 11, 2), dt.datetime(2026, 11, 3)).collect()
    assert sorted((r.t.hour, r.added) for r in rows) == [(10, None), (10, None), (11, "x")]
    # Deletion vectors: a file's rows are not all the table's, so Delta's own scan answers.
    dv = str(tmp_path / "dv")
    spark.conf.set("spark.databricks.delta.properties.defaults.enableDeletionVectors", "true")
    try:
        _day_files(spark, dv, 2)
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.enableDeletionVectors")
    DeltaTable.forPath(spark, dv).delete("day = 2 AND n = 'b'")
    found = read_in_range(spark, dv, "t", dt.datetime(2026, 11, 1), dt.datetime(2026, 11, 3))
    assert sorted((r.day, r.n) for r in found.collect()) == [(1, "a"), (1, "b"), (2, "a")]


def test_tables_delta_spark_wrote_are_listed_by_delta_rs(spark, tmp_path):
    table = tmp_path / "t"
    frame = _frame(spark, 50).drop("tags", "flow", "raw")
    sink = _sink(table, app_id="silver")
    sink.write_batch(frame.where("src_port < 20"), 3)
    sink.write_batch(frame.where("src_port >= 20"), 4)

    info = summary(table)
    assert (info.version, info.rows, info.partition_columns) == (1, 50, ["event_date"])
    on_disk = list(table.rglob("*.parquet"))
    assert info.files == len(on_disk)
    assert info.size_bytes == sum(p.stat().st_size for p in on_disk)
    newest = commits(table)
    assert [(c["version"], c["app_id"], c["batch_id"], c["rows_added"]) for c in newest] == \
        [(1, "silver", 4, 30), (0, "silver", 3, 20)]
    assert all(c["operation"] == "WRITE" for c in newest)
    assert commits(table, limit=1)[0]["version"] == 1
    # delta-rs reads the same rows.
    from deltalake import DeltaTable as RsTable

    theirs = sorted(r["event_id"] for r in RsTable(str(table)).to_pyarrow_table(columns=["event_id"]).to_pylist())
    assert theirs == sorted(r.event_id for r in read_table(spark, table).collect())


def test_time_travel_by_version_and_timestamp(spark, tmp_path):
    table = tmp_path / "t"
    sink = _sink(table)
    sink.write_batch(_frame(spark, 10), 0)
    time.sleep(0.5)
    between = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.5)
    sink.write_batch(_frame(spark, 15, 10), 1)
    assert read_table(spark, table).count() == 25
    assert read_table(spark, table, version=0).count() == 10
    assert read_table(spark, table, version=1).count() == 25
    assert read_table(spark, table, timestamp=between).count() == 10
    # A naive ISO text is UTC, as is a "Z" suffix.
    assert read_table(spark, table, timestamp=between.replace(tzinfo=None).isoformat()).count() == 10
    assert read_table(spark, table, timestamp=between.isoformat().replace("+00:00", "Z")).count() == 10
    assert read_table(spark, table, timestamp=between.astimezone(dt.timezone(dt.timedelta(hours=5)))).count() == 10
    with pytest.raises(ValueError, match="t has no version 7"):
        read_table(spark, table, version=7).count()
    with pytest.raises(ValueError, match="t has no version at or before 2001-01-01T00:00:00Z"):
        read_table(spark, table, timestamp="2001-01-01T00:00:00Z").count()
    with pytest.raises(ValueError, match="either version= or timestamp="):
        read_table(spark, table, version=0, timestamp=between)


def test_additive_schema_evolution_and_type_change_error(spark, tmp_path):
    table = tmp_path / "t"
    sink = _sink(table)
    frame = _frame(spark, 4).select("event_id", "event_date", "orig_bytes")
    sink.write_batch(frame, 0)
    assert sink.write_batch(frame.withColumn("severity", F.lit(3)), 1).version == 1
    back = read_table(spark, table)
    assert back.columns == ["event_id", "event_date", "orig_bytes", "severity"]
    assert back.where("severity IS NULL").count() == 4 and back.where("severity = 3").count() == 4
    # A batch missing a column is fine too: the column is null in its rows.
    assert sink.write_batch(frame, 2).version == 2
    assert read_table(spark, table).where("severity IS NULL").count() == 8
    with pytest.raises(SchemaMismatchError, match=r"table t: .*orig_bytes"):
        sink.write_batch(frame.withColumn("orig_bytes", F.col("orig_bytes").cast("string")), 3)
    assert _latest_version(spark, table) == 2  # the failed write committed nothing
    assert read_table(spark, table).count() == 12


def test_deletion_vectors_are_read(spark, tmp_path):
    table = table_uri(tmp_path / "dv")
    # Not `CREATE TABLE delta.`path` ... TBLPROPERTIES`: path identifiers need
    # spark.sql.runSQLOnFiles, which seclake's sessions turn off. The first write sets the property.
    spark.createDataFrame([], "n BIGINT, host STRING").write.format("delta") \
        .option("delta.enableDeletionVectors", "true").save(table)
    spark.range(0, 100, numPartitions=1).select("id", F.concat(F.lit("h"), F.col("id") % 3)) \
        .toDF("n", "host").write.format("delta").mode("append").save(table)
    assert DeltaTable.forPath(spark, table).detail().first().properties["delta.enableDeletionVectors"] == "true"
    DeltaTable.forPath(spark, table).delete("n % 10 = 0")

    # The DELETE wrote a deletion vector instead of rewriting the file.
    delete = _log_actions(Path(table), 2)
    assert any((a.get("add") or {}).get("deletionVector") for a in delete)
    assert list(Path(table).glob("deletion_vector_*.bin"))
    back = read_table(spark, table)
    assert back.count() == 90
    assert sorted(r.n for r in back.collect()) == [n for n in range(100) if n % 10]
    assert read_table(spark, table, version=1).count() == 100


def test_missing_table_is_a_clear_error(spark, tmp_path):
    (tmp_path / "plain").mkdir()
    for missing in (tmp_path / "nowhere", tmp_path / "plain"):
        assert not is_table(spark, missing)
        with pytest.raises(ValueError, match=f"no Delta table at {missing}$"):
            read_table(spark, missing)
    with pytest.raises(ValueError, match="app_id must be a non-empty string"):
        DeltaSink(tmp_path / "t", app_id="")


def test_tables_of_an_old_home_written_by_delta_rs_stay_readable_and_writable(spark, tmp_path):
    """Homes from before delta-spark hold tables that delta-rs committed: standard Delta, so
    delta-spark reads them, time-travels them and appends to them exactly once."""
    import pyarrow as pa
    from deltalake import write_deltalake

    old = pa.table({"event_id": ["a", "b"], "event_date": [dt.date(2026, 11, 20)] * 2, "n": [1, 2]})
    write_deltalake(str(tmp_path / "t"), old, partition_by=["event_date"])
    assert sorted(r.event_id for r in read_table(spark, tmp_path / "t").collect()) == ["a", "b"]
    new = spark.createDataFrame([("c", dt.date(2026, 11, 21), 3)], "event_id string, event_date date, n long")
    sink = _sink(tmp_path / "t")
    assert sink.write_batch(new, 0).version == 1
    assert sink.write_batch(new, 0).skipped
    assert sorted(r.event_id for r in read_table(spark, tmp_path / "t").collect()) == ["a", "b", "c"]
    assert read_table(spark, tmp_path / "t", version=0).count() == 2


def test_the_catalog_watch_forgets_a_deleted_table_and_follows_one_made_again_with_fewer_commits(spark, tmp_path):
    # `seclake serve`'s watch looks for each table's next commit file: a table made again at
    # version 0 has none past the version seen, so without a look at that version's own file the
    # catalog would keep the old table's columns.
    lake = Lake(Home.resolve(tmp_path / "home").create())
    watch = CatalogWatch(lake, spark)
    lake.ensure(spark, "dhcp_clock")
    for _ in range(2):
        spark.createDataFrame([], "extra string").write.format("delta").mode("append") \
            .option("mergeSchema", "true").save(str(lake.path("dhcp_clock")))
    assert watch.refresh() == ["dhcp_clock"]
    assert spark.catalog.listColumns("dhcp_clock")[-1].name == "extra"
    shutil.rmtree(lake.path("dhcp_clock"))
    assert watch.refresh() == []  # gone: nothing to register, and its name forgotten
    assert not spark.catalog.tableExists("dhcp_clock") and watch.names() == []
    lake.ensure(spark, "dhcp_clock")
    assert watch.refresh() == ["dhcp_clock"]
    assert "extra" not in [c.name for c in spark.catalog.listColumns("dhcp_clock")]
