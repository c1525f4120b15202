"""A query's `foreachBatch` writer when its query is stopped mid-batch (pipelines/query.py)."""
from __future__ import annotations

import pytest
from py4j.protocol import Py4JJavaError

from pipelines.query import InterruptedBatch, stop_aware


def interrupted_call(spark) -> None:
    """A JVM call interrupted as a stop interrupts the stream thread (the flag is cleared by the throw)."""
    thread = spark._jvm.java.lang.Thread
    thread.currentThread().interrupt()
    thread.sleep(5000)


def test_an_interrupted_batch_fails_short_and_spark_still_sees_a_stop(spark):
    stream_execution = spark._jvm.org.apache.spark.sql.execution.streaming.runtime.StreamExecution

    def is_stop(message: str) -> bool:  # what Spark asks of a foreachBatch error once stop() was called
        return stream_execution.isInterruptionException(spark._jvm.py4j.Py4JException(message),
                                                        spark.sparkContext._jsc.sc())

    with pytest.raises(Py4JJavaError) as raw:
        interrupted_call(spark)
    assert len(str(raw.value)) > 1000, "the Java stack trace Spark's regex recursed over"

    with pytest.raises(InterruptedBatch) as short:
        stop_aware(lambda frame, batch_id: interrupted_call(spark))(None, 0)
    message = str(short.value)
    assert len(message) < 300 and "java.lang.InterruptedException" in message
    assert is_stop(f"Traceback (most recent call last):\n  ...\npipelines.query.InterruptedBatch: {message}")


def test_other_errors_pass_through_unchanged(spark):
    def failing(frame, batch_id):
        spark._jvm.java.util.ArrayList().get(5)

    with pytest.raises(Py4JJavaError, match="IndexOutOfBoundsException"):
        stop_aware(failing)(None, 0)
    with pytest.raises(ValueError, match="bad rows"):
        stop_aware(lambda frame, batch_id: (_ for _ in ()).throw(ValueError("bad rows")))(None, 0)


class _Query:
    """A query handle as `report` reads it: no progress yet, no failure, and a trigger state."""

    def __init__(self, trigger_active: bool) -> None:
        self.recentProgress: list = []
        self.status = {"isTriggerActive": trigger_active}

    def exception(self) -> None:
        return None


class _Writer:
    history: list = []


@pytest.mark.parametrize("active, line", [(True, "etl: first micro-batch running"),
                                          (False, "etl: 0 batches, 0 rows in -> nothing written in 0.0s")])
def test_a_report_before_the_first_batch_says_whether_it_is_running(active, line):
    import time

    from pipelines.query import RunningQuery, report

    rep = report(RunningQuery("etl", _Query(active), _Writer(), ()), time.monotonic())  # type: ignore[arg-type]
    assert rep.line() == line


def test_a_report_leaves_out_sparks_zero_watermark_of_a_query_that_saw_no_event_time():
    import time
    from types import SimpleNamespace

    from pipelines.query import RunningQuery, report

    def progress(mark: str) -> SimpleNamespace:
        return SimpleNamespace(numInputRows=0, eventTime={"watermark": mark}, stateOperators=[], batchId=0)

    query = _Query(False)
    query.recentProgress = [progress("1970-01-01T00:00:00.000Z")]
    rep = report(RunningQuery("rule_x", query, _Writer(), ()), time.monotonic())  # type: ignore[arg-type]
    assert rep.watermark is None and "watermark" not in rep.line()
    query.recentProgress.append(progress("2026-11-20T00:13:17.601Z"))
    rep = report(RunningQuery("rule_x", query, _Writer(), ()), time.monotonic())  # type: ignore[arg-type]
    assert rep.watermark == "2026-11-20T00:13:17.601Z"


def test_late_rows_are_found_when_triggers_without_input_run_between_batches(spark, tmp_path):
    """`seclake stream` triggers every few seconds; most find nothing and Spark reports them under
    the id of the next batch. Counting those as batches hid the drops of the batch after them."""
    import json
    import time

    from pyspark.sql import functions as F

    from pipelines.query import late_batches

    source = tmp_path / "in"
    source.mkdir()

    def land(name: str, at: str) -> None:
        (source / f".{name}").write_text(json.dumps({"t": at}) + "\n")
        (source / f".{name}").rename(source / name)

    found: list = []
    after = [-1]

    def writer(frame, batch_id):
        frame.write.format("noop").mode("overwrite").save()  # a stateful batch must run whole
        late, after[0] = late_batches(query, after[0])
        found.extend(late)

    counts = (spark.readStream.schema("t timestamp").json(str(source))
              .withWatermark("t", "1 minute").groupBy(F.window("t", "1 minute")).count())
    query = (counts.writeStream.outputMode("append").foreachBatch(writer)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds")
             .start())

    def idle_after(batches: int) -> None:  # the batch ran, then triggers that found nothing
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            progress = query.lastProgress
            if progress and progress.batchId >= batches and "addBatch" not in progress.durationMs:
                return
            time.sleep(0.1)
        raise AssertionError(f"no idle trigger after batch {batches - 1}: {query.lastProgress}")

    try:
        land("a.json", "2026-11-20T10:00:00")
        idle_after(2)  # its batch, then the batch without data that moves the watermark to 09:59
        land("late.json", "2026-11-20T09:00:00")  # older than the watermark: dropped
        idle_after(query.lastProgress.batchId + 1)
        land("b.json", "2026-11-20T10:05:00")  # its batch asks about the batches before it
        idle_after(query.lastProgress.batchId + 1)
        land("c.json", "2026-11-20T10:06:00")
        idle_after(query.lastProgress.batchId + 1)
    finally:
        query.stop()
    assert [b.rows for b in found] == [1], found


def test_a_streams_reports_count_every_batch_past_the_reports_spark_keeps(spark, tmp_path):
    """Spark keeps a query's last reports only (100 by default, 2 here); `seclake stream` reports
    every minute for days, so each report adds the batches since the one before."""
    import json

    from pipelines.query import DoneWriter, RunningQuery, report

    source = tmp_path / "in"
    source.mkdir()
    session = spark.newSession()
    session.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2")
    query = (session.readStream.schema("n long").json(str(source)).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    running = RunningQuery("etl", query, DoneWriter(), ())
    try:
        for batch in range(5):
            (source / f"{batch}.json").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(batch + 1)))
            query.processAllAvailable()
            rep = report(running, 0.0)
    finally:
        query.stop()
    assert len(query.recentProgress) <= 2
    assert rep.rows_in == 1 + 2 + 3 + 4 + 5
