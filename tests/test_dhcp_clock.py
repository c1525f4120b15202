"""The DHCP clock: attribution in a stream moves with the sensors' other logs when DHCP is quiet."""
from __future__ import annotations

import datetime as dt
import shutil
import threading
import time
from pathlib import Path

from pyspark.sql import functions as F

from pipelines import attribution, etl
from pipelines.dhcp_clock import DHCP_CLOCK, DhcpClock
from pipelines.home import Home
from pipelines.lake.registry import Lake
from pipelines.query import processing_time
from pipelines.schemas import DHCP_CLOCK_SCHEMA
from test_attribution import MAC, SETTINGS, at, attributed, commit, dhcp, event, run_stages

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "sample"


def naive(t: dt.datetime) -> dt.datetime:
    """`t` as Spark returns timestamps: naive, local time."""
    return t.astimezone().replace(tzinfo=None)


def test_the_clock_is_the_slowest_dhcp_feed_released_after_the_hold_and_survives_a_restart():
    t0 = dt.datetime(2026, 11, 20, 10, 0)
    clock = DhcpClock(hold_s=30.0)
    clock.observe(0.0, {"zeek/a": t0, "suricata/x": t0 + dt.timedelta(hours=3)}, {"zeek/a"})
    assert clock.advance(29.9) is None
    assert clock.advance(30.0) == t0, "the flows-only EVE feed, hours ahead, does not count"
    clock.observe(31.0, {"zeek/a": t0 + dt.timedelta(minutes=30)}, set())
    clock.observe(32.0, {"zeek/a": t0 + dt.timedelta(minutes=20)}, set())  # an older file: no step back
    assert clock.advance(62.0) == t0 + dt.timedelta(minutes=30)
    assert clock.advance(90.0) is None, "no move, no row"
    # A restarted ETL resumes from the newest row's feeds; what was held is observed again.
    again = DhcpClock(hold_s=30.0, feeds=clock.row_feeds())
    again.observe(0.0, {"zeek/b": t0 + dt.timedelta(minutes=5)}, {"zeek/b"})
    assert again.advance(10.0) is None, "a new DHCP feed holds the clock until its own newest is released"
    assert again.advance(30.0) is None, "a new DHCP feed behind the clock: never a step back"
    again.observe(31.0, {"zeek/b": t0 + dt.timedelta(minutes=45)}, set())
    assert again.advance(61.0) is None, "zeek/a, now the slower, holds it at 10:30"
    again.observe(62.0, {"zeek/a": t0 + dt.timedelta(minutes=50)}, set())
    assert again.next_due() == 92.0
    assert again.advance(92.0) == t0 + dt.timedelta(minutes=45), "zeek/b, now the slower, sets it"


def test_a_quiet_network_is_attributed_once_the_clock_passes(spark, tmp_path):
    """One ACK, then no DHCP line for hours: a stream's events wait for the next DHCP line unless
    the clock moves dhcp_leases. With a clock row past them (as the ETL writes it when the
    sensor's other logs pass), they are attributed to the holder, without an end-of-input mark.
    A DHCP line older than the watermark the clock moved, committed after, is late and counted."""
    lake = Lake(Home.resolve(tmp_path).create())
    commit(lake, "silver_dhcp", [dhcp("d1", at(8), MAC["A"], ["ACK"], assigned="10.1.0.10", lease=86400.0)])
    commit(lake, "silver_conn", [event("c1", at(8, 27), "10.1.0.10"), event("c2", at(8, 40), "10.1.0.10")])
    run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=False)
    assert attributed(spark, lake, "enriched_conn") == {}, "without the clock the events wait"

    clock = naive(at(8, 30))
    (spark.createDataFrame([(clock, {"zeek/gw": clock}, clock)], DHCP_CLOCK_SCHEMA)
     .write.format("delta").mode("append").save(str(lake.path(DHCP_CLOCK))))
    run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=False)
    # The watermark is the clock minus dhcp_log_delay (08:29:25), not minus the lease watermark (08:25):
    # c1, 3 minutes before the clock, is out; c2 still waits.
    assert attributed(spark, lake, "enriched_conn") == {"c1": MAC["A"]}

    commit(lake, "silver_dhcp", [dhcp("d2", at(8, 15), MAC["B"], ["ACK"], assigned="10.1.0.99")])
    reports = run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=False)
    assert reports[attribution.LEASES].late_rows == 1
    assert lake.read(spark, "late_events").where("query = 'dhcp_leases'").count() == 1


def test_the_stream_etl_writes_the_clock_of_the_slowest_sensor_that_delivers_dhcp(spark, tmp_path):
    """The ETL as a stream: Zeek's and Suricata's first hour (both deliver DHCP), then Zeek's second
    hour alone. Each clock row, written `rotation_skew` after its batch without waiting for a later
    one, is the lower of the two sensors' newest events: after Zeek's second hour, Suricata's
    first hour holds the clock back."""
    home = Home.resolve(tmp_path / "home")
    lake = Lake(home.create())
    landing = home.landing
    zeek = sorted((SAMPLE / "landing" / "zeek").iterdir())
    eve = sorted((SAMPLE / "landing" / "suricata").iterdir())[0]
    first_hour, second_hour = [p for p in zeek if "-08-" in p.name] + [eve], [p for p in zeek if "-09-" in p.name]
    settings = SETTINGS.with_overrides({"rotation_skew": "2 seconds"})

    def land(paths: list) -> None:
        for path in paths:
            (landing / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, landing / path.parent.name / f".{path.name}")
            (landing / path.parent.name / f".{path.name}").rename(landing / path.parent.name / path.name)

    def newest(paths: list) -> dt.datetime:
        files = [f"file:{landing / p.parent.name / p.name}" for p in paths]
        return max(lake.read(spark, t).where(F.col("source_file").isin(files)).agg(F.max("event_time")).first()[0]
                   for t in ("silver_conn", "silver_dns", "silver_dhcp"))

    def clocks() -> list:  # the ETL's first clock row creates the table
        return sorted(r.clock for r in lake.read(spark, DHCP_CLOCK).collect()) if lake.exists(DHCP_CLOCK) else []

    def wait_for(done, what: str) -> None:
        deadline = time.monotonic() + 300
        while not done():
            assert time.monotonic() < deadline, f"no {what} within 5 minutes"
            time.sleep(0.5)

    land(first_hour)
    running = etl.start(spark, lake, settings, processing_time("1 second"))
    try:
        wait_for(lambda: len(clocks()) == 1, "clock row")
        land(second_hour)
        wait_for(lambda: len(clocks()) == 2, "second clock row")
        time.sleep(5)  # the 2 s hold again, and a margin: no third row comes
    finally:
        running.writer.close()
        stop = threading.Thread(target=running.query.stop)
        stop.start()
        stop.join(120)
    zeek_8, eve_8, zeek_9 = newest(first_hour[:-1]), newest([eve]), newest(second_hour)
    assert zeek_9 > eve_8 and clocks() == [min(zeek_8, eve_8), eve_8]
    sensors = lake.read(spark, "silver_dhcp").select("source", "sensor").distinct().collect()
    feeds = [r.feeds for r in lake.read(spark, DHCP_CLOCK).orderBy("clock").collect()]
    assert len(sensors) == 2 and set(feeds[-1]) == {f"{r.source}/{r.sensor}" for r in sensors}


def test_a_dhcp_leases_checkpoint_from_before_the_clock_resumes_without_it(spark, tmp_path, caplog):
    """A checkpoint of dhcp_leases started with the plan before the clock (two sources) cannot take
    a third: it resumes with its own plan, says so, and is idle once caught up."""
    from pipelines.end_of_input import read_marks
    from pipelines.lake.source import read_stream
    from pipelines.query import AVAILABLE_NOW, start_query
    from pipelines.stages import idle

    lake = Lake(Home.resolve(tmp_path).create())
    commit(lake, "silver_dhcp", [dhcp("d1", at(8), MAC["A"], ["ACK"], assigned="10.1.0.10")])
    for table in (attribution.LEASES, attribution.LATE_EVENTS):
        lake.ensure(spark, table)
    silver_dhcp = read_stream(spark, lake.path("silver_dhcp"))
    old_plan = attribution.lease_segments(silver_dhcp, read_marks(spark, lake), SETTINGS)
    writer = attribution.AttributionWriter(spark, lake, attribution.LEASES)
    start_query(old_plan, attribution.LEASES, writer, lake.home.checkpoint(attribution.LEASES),
                AVAILABLE_NOW).awaitTermination()
    assert not attribution.clocked(lake)

    commit(lake, "silver_dhcp", [dhcp("d2", at(9), MAC["B"], ["ACK"], assigned="10.1.0.20")])
    stage = next(s for s in attribution.stages() if s.name == attribution.LEASES)
    assert not idle(lake, stage), "a new silver_dhcp commit to read"
    with caplog.at_level("WARNING", logger="seclake"):
        reports = run_stages(spark, lake, SETTINGS, (), flush=False)
    assert reports[attribution.LEASES].error is None
    assert "predates the DHCP clock" in caplog.text
    assert idle(lake, stage) and not attribution.clocked(lake)
