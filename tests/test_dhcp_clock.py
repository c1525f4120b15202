"""The DHCP clock: attribution in a stream moves with the sensors' other logs when DHCP is quiet."""
from __future__ import annotations

import datetime as dt
import os
import shutil
import threading
import time
from pathlib import Path

from pyspark.sql import functions as F

from pipelines import attribution, etl
from pipelines.dhcp_clock import DHCP_CLOCK, ClockWriter, DhcpClock
from pipelines.home import Home
from pipelines.lake.registry import Lake
from pipelines.query import processing_time
from pipelines.schemas import DHCP_CLOCK_SCHEMA
from test_attribution import MAC, SETTINGS, at, attributed, commit, dhcp, event, run_stages

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "sample"


def naive(t: dt.datetime) -> dt.datetime:
    """`t` as Spark returns timestamps: naive, local time."""
    return t.astimezone().replace(tzinfo=None)


def land(landing: Path, paths: list, mtimes: list[float] | None = None) -> None:
    """Copy `paths` into `landing/<source>/` as a sensor does (a hidden name, then a rename),
    with the given modification times if any."""
    for i, path in enumerate(paths):
        (landing / path.parent.name).mkdir(parents=True, exist_ok=True)
        hidden, final = landing / path.parent.name / f".{path.name}", landing / path.parent.name / path.name
        shutil.copy(path, hidden)
        if mtimes is not None:
            os.utime(hidden, (mtimes[i], mtimes[i]))
        hidden.rename(final)


def clocks(spark, lake: Lake) -> list:
    """The clock rows' values, oldest first (the ETL's first clock row creates the table)."""
    return sorted(r.clock for r in lake.read(spark, DHCP_CLOCK).collect()) if lake.exists(DHCP_CLOCK) else []


def wait_for(done, what: str) -> None:
    deadline = time.monotonic() + 300
    while not done():
        assert time.monotonic() < deadline, f"no {what} within 5 minutes"
        time.sleep(0.5)


def stop_etl(running) -> None:
    running.writer.close()
    stop = threading.Thread(target=running.query.stop)
    stop.start()
    stop.join(120)


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

    def newest(paths: list) -> dt.datetime:
        files = [f"file:{landing / p.parent.name / p.name}" for p in paths]
        return max(lake.read(spark, t).where(F.col("source_file").isin(files)).agg(F.max("event_time")).first()[0]
                   for t in ("silver_conn", "silver_dns", "silver_dhcp"))

    land(landing, first_hour)
    running = etl.start(spark, lake, settings, processing_time("1 second"))
    try:
        wait_for(lambda: len(clocks(spark, lake)) == 1, "clock row")
        land(landing, second_hour)
        wait_for(lambda: len(clocks(spark, lake)) == 2, "second clock row")
        time.sleep(5)  # the 2 s hold again, and a margin: no third row comes
    finally:
        stop_etl(running)
    zeek_8, eve_8, zeek_9 = newest(first_hour[:-1]), newest([eve]), newest(second_hour)
    assert zeek_9 > eve_8 and clocks(spark, lake) == [min(zeek_8, eve_8), eve_8]
    sensors = lake.read(spark, "silver_dhcp").select("source", "sensor").distinct().collect()
    feeds = [r.feeds for r in lake.read(spark, DHCP_CLOCK).orderBy("clock").collect()]
    assert len(sensors) == 2 and set(feeds[-1]) == {f"{r.source}/{r.sensor}" for r in sensors}


def test_the_clock_moves_after_a_batch_that_took_files_of_one_source_alone(spark, tmp_path):
    """Each file source numbers its own log: after a batch of EVE alone, Zeek's next file is its
    source's log batch 1 in the query's batch 2. The writer once looked its files up by the query's
    batch id, found none, and held every later release for a landed file it thought uncommitted:
    the clock stopped for good (`alert_latency.py` saw no threshold alert for a week)."""
    from pipelines.checkpoint import newest_source_files

    home = Home.resolve(tmp_path / "home")
    lake = Lake(home.create())
    zeek = sorted((SAMPLE / "landing" / "zeek").iterdir())
    eve_8, eve_9 = sorted((SAMPLE / "landing" / "suricata").iterdir())
    settings = SETTINGS.with_overrides({"rotation_skew": "1 second"})
    checkpoint = home.checkpoint(etl.QUERY_NAME)

    def took(n: int) -> bool:  # the query's batch n is committed
        return (Path(checkpoint) / "commits" / str(n)).exists()

    land(home.landing, [p for p in zeek if "-08-" in p.name] + [eve_8])
    running = etl.start(spark, lake, settings, processing_time("1 second"))
    try:
        wait_for(lambda: took(0) and len(clocks(spark, lake)) == 1, "batch 0 and its clock row")
        land(home.landing, [eve_9])
        wait_for(lambda: took(1), "batch 1 (EVE alone)")
        land(home.landing, [p for p in zeek if "-09-" in p.name])
        wait_for(lambda: took(2), "batch 2 (Zeek alone)")
        assert {Path(uri).name for uri in newest_source_files(checkpoint)} >= {p.name for p in zeek if "-09-" in p.name}
        newest_9 = max(lake.read(spark, t).agg(F.max("event_time")).first()[0] for t in ("silver_conn", "silver_dns"))
        wait_for(lambda: clocks(spark, lake)[-1] > naive(dt.datetime(2026, 11, 20, 9, 30, tzinfo=dt.timezone.utc)),
                 "a clock row in Zeek's and Suricata's 09:00 hour")
    finally:
        stop_etl(running)
    assert clocks(spark, lake)[-1] <= newest_9


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
    assert not idle(lake, stage, SETTINGS), "a new silver_dhcp commit to read"
    with caplog.at_level("WARNING", logger="seclake"):
        reports = run_stages(spark, lake, SETTINGS, (), flush=False)
    assert reports[attribution.LEASES].error is None
    assert "predates the DHCP clock" in caplog.text
    assert idle(lake, stage, SETTINGS) and not attribution.clocked(lake)


def test_the_clock_waits_for_a_rotation_split_over_capped_batches(spark, tmp_path):
    """A backlog taken one file per micro-batch: Zeek's 09:00 conn, dns and dhcp logs (modified in
    that order, within the 1 s skew) go in three batches, each longer than the skew. The clock must not pass 09:00 until
    the batch holding that hour's DHCP is committed, or dhcp_leases would find those lines late."""
    from pipelines.lake.log import commits

    home = Home.resolve(tmp_path / "home")
    lake = Lake(home.create())
    zeek = sorted((SAMPLE / "landing" / "zeek").iterdir())
    hour = {h: [p for p in zeek if f"-{h}-" in p.name] for h in ("08", "09")}
    second = sorted(hour["09"], key=lambda p: ("conn", "dns", "dhcp").index(p.name.split(".")[0]))
    skew = SETTINGS.with_overrides({"rotation_skew": "1 second"})
    land(home.landing, hour["08"])
    running = etl.start(spark, lake, skew, processing_time("1 second"))
    try:
        wait_for(lambda: len(clocks(spark, lake)) == 1, "clock row for 08:00")
    finally:
        stop_etl(running)
    now = time.time()  # one rotation: modified within the 1 s skew, each batch longer than that
    land(home.landing, second, mtimes=[now - 0.6, now - 0.4, now - 0.2])
    running = etl.start(spark, lake, skew.with_overrides({"max_files_per_trigger": 1}), processing_time("1 second"))
    past_9 = naive(dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.timezone.utc))
    try:
        wait_for(lambda: clocks(spark, lake)[-1] > past_9, "clock row past 09:00")
    finally:
        stop_etl(running)
    dhcp_rows = lake.read(spark, "silver_dhcp").where(F.col("source_file").endswith(second[-1].name)).count()
    assert dhcp_rows > 0, "the clock passed 09:00, and the ETL stopped, before 09:00's DHCP was committed"
    # Only the 09:00 dhcp log's batch has DHCP rows in the second run: silver_dhcp's newest commit.
    dhcp_9 = naive(commits(lake.path("silver_dhcp"), limit=1)[0]["timestamp"])
    written = min(r.written_at for r in lake.read(spark, DHCP_CLOCK).collect() if r.clock > past_9)
    assert written >= dhcp_9, f"the clock passed 09:00 at {written}, before silver_dhcp got 09:00's DHCP at {dhcp_9}"


def test_the_writer_reads_the_committed_file_log_once_and_holds_while_a_landed_file_waits(spark, tmp_path):
    """The committed files are the ETL's file log read at the first batch plus each batch's files:
    a landed file outside them holds a release until a batch takes it, and no look reads the log again."""
    lake = Lake(Home.resolve(tmp_path / "home").create())
    old, first, waiting = (tmp_path / name for name in ("old.log", "first.log", "waiting.log"))
    for path in (old, first, waiting):
        path.write_text("x")
    listed, seeds = {str(old), str(first)}, []

    def committed_before() -> set[str]:
        seeds.append(1)
        return {str(old)}

    writer = ClockWriter(lake, 0.5, lambda: set(listed), committed_before)
    t = [naive(dt.datetime(2026, 11, 20, h, tzinfo=dt.timezone.utc)) for h in (9, 10)]
    try:
        writer.committed(spark, {"zeek/s": t[0]}, {"zeek/s"}, {str(first): time.time()})
        wait_for(lambda: clocks(spark, lake) == [t[0]], "clock row for 09:00")
        listed.add(str(waiting))  # landed, in no batch yet
        writer.committed(spark, {"zeek/s": t[1]}, set(), {})
        time.sleep(3)
        assert clocks(spark, lake) == [t[0]], "the clock moved while a landed file was in no committed batch"
        writer.committed(spark, {"zeek/s": t[1]}, set(), {str(waiting): os.stat(waiting).st_mtime})
        wait_for(lambda: clocks(spark, lake) == t, "clock row for 10:00")
    finally:
        writer.close()
    assert seeds == [1]


def test_a_file_log_that_cannot_be_read_releases_without_the_landing_check(spark, tmp_path, caplog):
    lake = Lake(Home.resolve(tmp_path / "home").create())
    waiting = tmp_path / "waiting.log"
    waiting.write_text("x")

    def committed_before() -> set[str]:
        raise OSError("checkpoints/etl/sources/0/7: Input/output error")

    writer = ClockWriter(lake, 0.5, lambda: {str(waiting)}, committed_before)
    t = naive(dt.datetime(2026, 11, 20, 9, tzinfo=dt.timezone.utc))
    try:
        writer.committed(spark, {"zeek/s": t}, {"zeek/s"}, {})
        wait_for(lambda: clocks(spark, lake) == [t], "clock row for 09:00")
    finally:
        writer.close()
    assert "could not read the committed landing files: " in caplog.text and "Input/output error" in caplog.text
