"""Event-time attribution: dhcp_leases and enriched_<kind> on real Spark + Delta under tmp_path."""
from __future__ import annotations

import datetime as dt
import random

import pytest
from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from conftest import state_partitions
from pipelines import attribution
from pipelines.attribution import IpLeases, Message
from pipelines.end_of_input import END_OF_INPUT, idle, mark, mark_input, newest_event
from pipelines.home import Home
from pipelines.lake.read import read_table
from pipelines.lake.registry import Lake
from pipelines.query import AVAILABLE_NOW, report
from pipelines.schemas import ATTRIBUTION_WATERMARK, ENRICHED_SCHEMAS, SILVER_SCHEMAS
from pipelines.settings import Settings

UTC = dt.timezone.utc
DAY = dt.datetime(2024, 3, 1, tzinfo=UTC)
SETTINGS = Settings()
MAC = {name: f"02:00:00:00:00:{i:02x}" for i, name in enumerate(
    ["A", "B", "laptop", "D", "E", "stray", "informer", "H", "M"], start=1)}


def at(hh: int, mm: int = 0, day: int = 0) -> dt.datetime:
    return DAY + dt.timedelta(days=day, hours=hh, minutes=mm)


# ---------------------------------------------------------------------------------------------
# Synthetic silver rows

def dhcp(eid: str, ts: dt.datetime, mac: str, msg: list[str], *, assigned: str | None = None,
         client: str | None = None, requested: str | None = None, lease: float | None = 3600.0,
         host: str | None = None) -> dict:
    return {"event_id": eid, "event_time": ts, "mac": mac, "msg_types": msg, "assigned_addr": assigned,
            "client_addr": client, "requested_addr": requested, "lease_time": lease, "hostname": host}


def event(eid: str, ts: dt.datetime, src: str, dst: str = "198.51.100.7") -> dict:
    return {"event_id": eid, "event_time": ts, "src_ip": src, "dst_ip": dst, "proto": "tcp"}


def scenario() -> tuple[dict[str, list[dict]], dict[str, str | None]]:
    """Silver rows for one day and the MAC each event must be attributed to (None: no lease)."""
    A, B, L, D, E = MAC["A"], MAC["B"], MAC["laptop"], MAC["D"], MAC["E"]
    leases = [
        # 10.1.0.10 changes hands: A (renewed twice, then RELEASE at 10:00), then B (expires 12:00).
        dhcp("d01", at(8), A, ["DISCOVER", "OFFER", "REQUEST", "ACK"], assigned="10.1.0.10", host="pc-a"),
        dhcp("d02", at(8, 30), A, ["REQUEST", "ACK"], assigned="10.1.0.10", client="10.1.0.10"),
        dhcp("d03", at(9, 0), A, ["REQUEST", "ACK"], client="10.1.0.10"),  # renewal ACK without assigned_addr
        dhcp("d04", at(9, 50), A, ["RELEASE"], client="10.1.0.10", lease=None),
        dhcp("d05", at(10, 30), B, ["REQUEST", "ACK"], assigned="10.1.0.10", host="pc-b"),
        dhcp("d06", at(11), B, ["REQUEST", "ACK"], assigned="10.1.0.10", client="10.1.0.10"),
        # the roaming laptop: 10.1.0.20 in one building, then 10.1.0.30 in another
        dhcp("d07", at(8), L, ["REQUEST", "ACK"], assigned="10.1.0.20", lease=7200.0, host="laptop"),
        dhcp("d08", at(9), L, ["REQUEST", "ACK"], assigned="10.1.0.30", lease=7200.0, host="laptop"),
        # a day-long lease (emitted in pieces), a stray RELEASE, then the address goes to E
        dhcp("d09", at(8), D, ["ACK"], assigned="10.1.0.40", lease=86400.0),
        dhcp("d10", at(12, 30), MAC["stray"], ["RELEASE"], client="10.1.0.40", lease=None),
        dhcp("d11", at(13), E, ["ACK"], assigned="10.1.0.40"),
        # INFORM: a client with an address set otherwise, bound for the default lease; NAK grants nothing
        dhcp("d12", at(8), MAC["informer"], ["INFORM", "ACK"], client="10.1.0.50", lease=None),
        dhcp("d13", at(8), MAC["informer"], ["REQUEST", "NAK"], requested="10.1.0.51", lease=None),
        # no lease_time: the default lease (1 h)
        dhcp("d14", at(8), MAC["H"], ["ACK"], assigned="10.1.0.60", lease=None),
        # a renewal seen first (capture started mid-lease): the lease is backfilled 10 minutes
        dhcp("d15", at(8, 20), MAC["M"], ["REQUEST", "ACK"], assigned="10.1.0.70", client="10.1.0.70", lease=600.0),
    ]
    conn = [
        event("c01", at(8, 10), "10.1.0.10"), event("c02", at(9, 45), "10.1.0.10"),
        event("c03", at(10, 15), "10.1.0.10"), event("c04", at(10, 45), "10.1.0.10"),
        event("c05", at(11, 30), "10.1.0.10"), event("c06", at(12, 30), "10.1.0.10"),
        event("c07", at(8, 30), "10.1.0.20"), event("c08", at(9, 30), "10.1.0.30"),
        event("c09", at(12, 0), "10.1.0.40"), event("c10", at(12, 45), "10.1.0.40"),
        event("c11", at(13, 30), "10.1.0.40"), event("c12", at(8, 5), "10.1.0.50"),
        event("c13", at(8, 30), "10.1.0.60"), event("c14", at(9, 30), "10.1.0.60"),
        event("c15", at(8, 15), "10.1.0.70"), event("c16", at(9, 0), "10.1.0.99"),
    ]
    expected = {"c01": A, "c02": A, "c03": None, "c04": B, "c05": B, "c06": None, "c07": L, "c08": L,
                "c09": D, "c10": D, "c11": E, "c12": MAC["informer"], "c13": MAC["H"], "c14": None,
                "c15": MAC["M"], "c16": None}
    dns = [event("n01", at(8, 31), "10.1.0.20", "10.1.0.1")]
    alerts = [event("a01", at(8, 10), "203.0.113.5", "10.1.0.10"), event("a02", at(10, 50), "10.1.0.10", "203.0.113.5")]
    expected |= {"n01": L, "a01": A, "a02": B}
    return {"silver_dhcp": leases, "silver_conn": conn, "silver_dns": dns, "silver_ids_alerts": alerts}, expected


def commit(lake: Lake, table: str, rows: list[dict]) -> None:
    """Append `rows` to a silver table as one Delta commit (missing columns NULL)."""
    schema = SILVER_SCHEMAS[table]
    full = [{**{name: None for name in schema.fieldNames()}, "event_date": r["event_time"].date(), **r} for r in rows]
    spark = SparkSession.getActiveSession()
    (spark.createDataFrame([tuple(r[n] for n in schema.fieldNames()) for r in full], schema)
     .write.format("delta").mode("append").partitionBy("event_date").save(str(lake.path(table))))


def run_stages(spark, lake: Lake, settings: Settings, tables: tuple[str, ...], *, flush: bool = True) -> dict:
    """Run dhcp_leases then each enriched table once (AvailableNow), after marking the end of the
    input unless `flush` is False (as a stream would); return the reports by name."""
    reports = {}
    for stage in attribution.stages():
        name = stage.name
        if name == END_OF_INPUT and not flush:
            continue
        if name not in (END_OF_INPUT, attribution.LEASES) and name not in tables:
            continue
        running = stage.start(spark, lake, settings, AVAILABLE_NOW)
        try:
            running.query.awaitTermination()
        finally:
            running.writer.close()
        reports[name] = report(running, 0.0)
        assert reports[name].error is None, reports[name].error
    return reports


def attributed(spark, lake: Lake, table: str) -> dict[str, str | None]:
    return {r.event_id: r.mac for r in lake.read(spark, table).select("event_id", "mac").collect()}


def assert_complete_below_its_watermark(spark, lake: Lake, table: str) -> int:
    """Every row carries the attribution watermark of the batch that wrote it, and no later commit
    adds a row older than a watermark already written (rules hold their watermark to it); returns
    how many rows came after an earlier commit's watermark had moved (rows the check covered)."""
    path, seen, floor, covered = lake.path(table), set(), None, 0
    versions = [r.version for r in DeltaTable.forPath(spark, str(path)).history().select("version").collect()]
    for version in sorted(versions):
        rows = read_table(spark, path, version=version).select("event_id", "event_time", ATTRIBUTION_WATERMARK)
        new = [r for r in rows.collect() if r.event_id not in seen]
        assert all(r[ATTRIBUTION_WATERMARK] for r in new), f"{table} v{version}: a row without its watermark"
        if floor is not None and floor.year > 1970:
            early = [(r.event_id, str(r.event_time)) for r in new if r.event_time < floor]
            assert not early, f"{table} v{version}: rows older than the watermark {floor} written before: {early}"
            covered += len(new)
        seen |= {r.event_id for r in new}
        floor = max([t for t in (floor, *(r[ATTRIBUTION_WATERMARK] for r in new)) if t], default=None)
    return covered


def segments(spark, lake: Lake, ip: str) -> list[tuple]:
    """The lease segments of `ip`, its pieces put back together: (mac, "HH:MM" from, to, start_reason, end_reason)."""
    whole: list[list] = []
    for r in lake.read(spark, "dhcp_leases").where(f"ip = '{ip}'").orderBy("valid_from").collect():
        if whole and r.start_reason == "split" and whole[-1][2] == r.valid_from:
            whole[-1][2], whole[-1][4] = r.valid_to, r.end_reason
        else:
            whole.append([r.mac, r.valid_from, r.valid_to, r.start_reason, r.end_reason])
    return [(mac, start.strftime("%H:%M"), until.strftime("%H:%M"), why, ended)
            for mac, start, until, why, ended in whole]


# ---------------------------------------------------------------------------------------------
# Tests

def test_lease_rules_without_spark():
    book = IpLeases("10.1.0.10", segment_ms=3_600_000)
    minute = 60_000
    out = book.advance([
        Message(0, "1", "ack", "a", lease_time=7200.0),
        Message(30 * minute, "2", "release", "someone-else"),     # ignored: not the holder
        Message(90 * minute, "3", "ack", "a", lease_time=7200.0),  # renewal: new segment
        Message(100 * minute, "4", "ack", "b", lease_time=600.0),  # reassigned
        Message(105 * minute, "5", "release", "b"),
    ], until=300 * minute)
    assert [(s.mac, s.valid_from // minute, s.valid_to // minute, s.start_reason, s.end_reason) for s in out] == [
        ("a", 0, 60, "ack", "split"), ("a", 60, 90, "split", "renew"), ("a", 90, 100, "renew", "reassigned"),
        ("b", 100, 105, "ack", "release")]
    assert book.open is None and book.next_boundary() is None


def test_backfill_default_lease_and_races_without_spark():
    minute = 60_000
    book = IpLeases("10.1.0.70", segment_ms=60 * minute)
    # A renewal seen first: held before, at most one lease time (and one segment) back.
    out = book.advance([Message(100 * minute, "1", "ack", "m", lease_time=600.0, renewal=True)], until=100 * minute)
    assert [(s.valid_from // minute, s.valid_to // minute, s.start_reason) for s in out] == [(90, 100, "backfill")]
    # ...never back over the previous segment of the IP.
    book = IpLeases("10.1.0.70", segment_ms=60 * minute, last_end=95 * minute)
    out = book.advance([Message(100 * minute, "1", "ack", "m", lease_time=600.0, renewal=True)], until=100 * minute)
    assert [(s.valid_from // minute, s.valid_to // minute) for s in out] == [(95, 100)]
    # No lease_time: the default lease; two MACs in the same millisecond: the later event_id wins.
    book = IpLeases("10.1.0.60", segment_ms=600 * minute)
    out = book.advance([Message(0, "1", "ack", "h"), Message(5 * minute, "2", "ack", "x"),
                        Message(5 * minute, "3", "ack", "y", lease_time=60.0)], until=300 * minute)
    assert [(s.mac, s.valid_from // minute, s.valid_to // minute, s.end_reason) for s in out] == [
        ("h", 0, 5, "reassigned"), ("y", 5, 6, "expire")]
    with pytest.raises(ValueError, match="after the point to advance to"):
        book.advance([Message(500 * minute, "4", "ack", "z")], until=400 * minute)


def test_an_ack_without_a_lease_time_never_shortens_the_holders_lease_without_spark():
    # Windows' INFORM answered by an ACK with no lease time (Suricata logs it on its own line): the
    # holder's 24-hour lease was cut to the default hour, and its later events had no device.
    minute = 60_000
    book = IpLeases("10.1.0.80", segment_ms=24 * 60 * minute, default_lease_ms=60 * minute)
    out = book.advance([Message(0, "1", "ack", "aa", lease_time=86400.0),
                        Message(60 * minute, "2", "ack", "aa")], until=180 * minute)
    assert [(s.mac, s.valid_from // minute, s.valid_to // minute) for s in out] == [("aa", 0, 60)]
    assert book.open is not None and (book.open.mac, book.open.expires) == ("aa", 24 * 60 * minute)
    # A lease-less ACK to a client holding nothing is still a binding of the default length.
    book = IpLeases("10.1.0.81", segment_ms=24 * 60 * minute, default_lease_ms=60 * minute)
    out = book.advance([Message(0, "1", "ack", "bb")], until=180 * minute)
    assert [(s.mac, s.valid_from // minute, s.valid_to // minute, s.end_reason) for s in out] == [
        ("bb", 0, 60, "expire")]


def test_zeeks_dora_is_not_a_renewal_and_an_ack_to_an_inform_is_an_inform(spark):
    # Zeek fills client_addr with the assigned address when the client never sent from it (its
    # dhcp/main.zeek): the MACCDC capture's DORA lines have client = requested = assigned. Taken for
    # renewals, they backfilled the new device over the 10 minutes before it came.
    rows = [dhcp("dora", at(0, 40), "0a:00:00:00:00:01", ["DISCOVER", "OFFER", "REQUEST", "ACK"],
                 assigned="10.1.0.5", client="10.1.0.5", requested="10.1.0.5"),
            dhcp("reboot", at(0, 41), "0a:00:00:00:00:01", ["REQUEST", "ACK"], assigned="10.1.0.5", client="10.1.0.5",
                 requested="10.1.0.5"),
            dhcp("renew", at(0, 42), "0a:00:00:00:00:01", ["REQUEST", "ACK"], assigned="10.1.0.5", client="10.1.0.5"),
            dhcp("answer", at(0, 43), "0a:00:00:00:00:02", ["ACK"], client="10.1.0.9", lease=None)]
    schema = SILVER_SCHEMAS["silver_dhcp"]
    full = [{**{name: None for name in schema.fieldNames()}, "event_date": r["event_time"].date(), **r} for r in rows]
    frame = spark.createDataFrame([tuple(r[n] for n in schema.fieldNames()) for r in full], schema)
    got = {r.event_id: (r.kind, r.ip, r.renewal) for r in attribution.dhcp_messages(frame).collect()}
    assert got == {"dora": ("ack", "10.1.0.5", False), "reboot": ("ack", "10.1.0.5", False),
                   "renew": ("ack", "10.1.0.5", True), "answer": ("inform", "10.1.0.9", True)}


def test_an_end_of_input_mark_cuts_just_after_itself_without_spark():
    minute = 60_000
    book = IpLeases("10.1.0.40", segment_ms=10 * minute)
    out = book.advance([Message(0, "1", "ack", "d", lease_time=86400.0),
                        Message(25 * minute, "mark", "mark", "")], until=30 * minute)
    # The mark's millisecond is in the piece that comes out; the next piece starts after it.
    assert [(s.valid_from, s.valid_to, s.end_reason) for s in out] == [
        (0, 10 * minute, "split"), (10 * minute, 20 * minute, "split"), (20 * minute, 25 * minute + 1, "split")]
    assert book.open is not None and book.open.valid_from == 25 * minute + 1
    # A piece boundary on the millisecond after the mark closes there; no empty piece follows.
    book = IpLeases("10.1.0.40", segment_ms=10 * minute)
    out = book.advance([Message(0, "1", "ack", "d", lease_time=86400.0),
                        Message(10 * minute - 1, "mark", "mark", "")], until=12 * minute)
    assert [(s.valid_from, s.valid_to) for s in out] == [(0, 10 * minute)]
    assert book.open is not None and book.open.valid_from == 10 * minute
    # An address nobody holds at the mark: a renewal after it backfills from just after the mark.
    # From before it, the enriched joins (their watermark on the mark) dropped the piece as late, and
    # the address's events between the mark and the renewal had no device.
    book = IpLeases("10.1.0.41", segment_ms=10 * minute)
    book.advance([Message(0, "1", "ack", "d", lease_time=60.0), Message(20 * minute, "mark", "mark", "")],
                 until=20 * minute)
    out = book.advance([Message(23 * minute, "2", "ack", "e", lease_time=600.0, renewal=True)], until=23 * minute)
    assert [(s.mac, s.valid_from, s.valid_to, s.start_reason) for s in out] == [
        ("e", 20 * minute + 1, 23 * minute, "backfill")]


def test_a_finer_cut_changes_the_rows_not_the_holder_at_any_time():
    # Random DHCP on three addresses (grants, renewals, reassignments, RELEASEs, INFORMs), advanced
    # in random steps as watermarks do: with a 1-minute cut, all but the last minute held before
    # each step is out after it, and the holder of every address at every second is the same.
    minute, rng = 60_000, random.Random(14)
    kinds = ["ack", "ack", "ack", "release", "inform"]
    messages = {ip: sorted((Message(rng.randrange(0, 300 * minute, 1000), f"{ip}-{i}", rng.choice(kinds),
                                    rng.choice("abc"), lease_time=rng.choice([None, 300.0, 1800.0, 7200.0]),
                                    renewal=rng.random() < 0.2) for i in range(40)), key=lambda m: m.ts)
                for ip in ("10.9.0.1", "10.9.0.2", "10.9.0.3")}

    def holders(cut_ms: int) -> tuple[dict, int]:
        held, rows = {}, 0
        for ip, msgs in messages.items():
            book, done = IpLeases(ip, segment_ms=10 * minute, cut_ms=cut_ms), 0
            for until in sorted(rng.sample(range(0, 400 * minute, 1000), 30)) + [400 * minute]:
                due = [m for m in msgs[done:] if m.ts <= until]
                done += len(due)
                for seg in book.advance(due, until):
                    assert seg.valid_to - seg.valid_from <= 10 * minute
                    rows += 1
                    held.update({(ip, t): seg.mac for t in range(seg.valid_from // 1000, seg.valid_to // 1000)})
                assert book.open is None or until - book.open.valid_from < cut_ms
        return held, rows

    coarse, coarse_rows = holders(10 * minute)
    fine, fine_rows = holders(minute)
    assert fine == coarse and len(coarse) > 10_000
    assert fine_rows > coarse_rows


def test_device_inventory_and_bad_settings(spark, tmp_path, caplog):
    devices = tmp_path / "devices.csv"
    assert attribution.load_devices(spark, devices).count() == 0
    assert "no device inventory" in caplog.text
    caplog.clear()  # said once per process: the three enriched queries each load it
    assert attribution.load_devices(spark, devices).count() == 0 and "no device inventory" not in caplog.text
    devices.write_text("mac,device,owner,os\nAA-BB-CC-00-00-01,pc,ann,win\n,blank,,\n")
    assert ([tuple(r) for r in attribution.load_devices(spark, devices).collect()]
            == [("aa:bb:cc:00:00:01", "pc", "ann")])
    devices.write_text("mac,device,owner\naa:bb:cc:00:00:01,pc,ann\nAA:BB:CC:00:00:01,pc2,bob\n")
    with pytest.raises(ValueError, match="line 3: MAC 'aa:bb:cc:00:00:01' is listed twice"):
        attribution.load_devices(spark, devices)
    devices.write_text("mac,name\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['device', 'owner'\]"):
        attribution.load_devices(spark, devices)
    lake = Lake(Home.resolve(tmp_path).create())
    with pytest.raises(ValueError, match="unknown enriched table 'enriched_http'"):
        attribution.start_enriched(spark, lake, SETTINGS, AVAILABLE_NOW, table="enriched_http")
    with pytest.raises(ValueError, match="lease_piece='a day'"):  # named when the settings are made
        SETTINGS.with_overrides({"lease_piece": "a day"})


def test_every_event_attributed_to_the_holder_at_its_time(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    (lake.home.reference / "devices.csv").write_text(
        "mac,device,owner,device_type\n"
        f"{MAC['A'].upper()},PC-A,alice,desktop\n{MAC['laptop']},LAPTOP-7,bob,laptop\n")
    rows, expected = scenario()
    for table, table_rows in rows.items():
        commit(lake, table, table_rows)
    reports = run_stages(spark, lake, SETTINGS, tuple(ENRICHED_SCHEMAS))

    got = {}
    for table in ENRICHED_SCHEMAS:
        got |= attributed(spark, lake, table)
    assert got == expected
    conn = {r.event_id: r for r in lake.read(spark, "enriched_conn").collect()}
    assert (conn["c01"].device, conn["c01"].owner, conn["c01"].hostname) == ("PC-A", "alice", "pc-a")
    assert ((conn["c02"].hostname, conn["c07"].owner, conn["c04"].device, conn["c04"].hostname)
            == ("pc-a", "bob", None, "pc-b"))
    assert conn["c16"].mac is None and conn["c16"].attributed_ip == "10.1.0.99"
    alert = lake.read(spark, "enriched_ids_alerts").where("event_id = 'a01'").first()
    assert (alert.attributed_ip, alert.device) == ("10.1.0.10", "PC-A")
    # Pieces ending at a renewal or RELEASE on a piece boundary end "split"; the next one starts "renew".
    assert segments(spark, lake, "10.1.0.10") == [
        (MAC["A"], "08:00", "08:30", "ack", "split"), (MAC["A"], "08:30", "09:00", "renew", "split"),
        (MAC["A"], "09:00", "09:50", "renew", "split"), (MAC["B"], "10:30", "11:00", "ack", "split"),
        (MAC["B"], "11:00", "12:00", "renew", "expire")]
    assert segments(spark, lake, "10.1.0.50") == [(MAC["informer"], "07:50", "08:00", "backfill", "renew"),
                                                  (MAC["informer"], "08:00", "09:00", "inform", "expire")]
    pieces = lake.read(spark, "dhcp_leases").selectExpr("max(valid_to - valid_from) AS longest").first().longest
    assert pieces <= dt.timedelta(minutes=10)  # lease_piece: a held lease comes out piece by piece
    # The day-long lease of 10.1.0.40 is still held at the end of the input: cut just after the mark.
    flush_at = at(13, 30).replace(tzinfo=None) + dt.timedelta(milliseconds=1)  # after the newest event
    last = lake.read(spark, "dhcp_leases").where("ip = '10.1.0.40'").orderBy("valid_from").collect()[-1]
    assert (last.mac, last.valid_to, last.end_reason) == (MAC["E"], flush_at + dt.timedelta(milliseconds=1), "split")
    assert all(r.late_rows == 0 for r in reports.values())

    # Rows later than the watermark are dropped by the queries, counted and recorded (they stay in silver).
    commit(lake, "silver_conn", [event("late-conn", at(9), "10.1.0.10")])
    commit(lake, "silver_dhcp", [dhcp("late-dhcp", at(9), MAC["B"], ["ACK"], assigned="10.1.0.80")])
    reports = run_stages(spark, lake, SETTINGS, ("enriched_conn",))
    assert reports["dhcp_leases"].late_rows == 1 and reports["enriched_conn"].late_rows == 1
    late = {(r.query, r.late_rows) for r in lake.read(spark, "late_events").collect()}
    assert late == {("dhcp_leases", 1), ("enriched_conn", 1)}
    assert "late-conn" not in attributed(spark, lake, "enriched_conn")


def test_run_once_and_the_dagster_ops_say_when_attribution_dropped_late_rows():
    from pipelines.jobs import late_attribution_warning
    from pipelines.query import QueryReport

    # A rule's late rows are its own notice (seclake.rule_late_rows; a backtest adds their alerts).
    quiet = [QueryReport("etl"), QueryReport("enriched_conn"), QueryReport("rule_dns_tunneling", late_rows=4)]
    assert late_attribution_warning(quiet) is None
    warning = late_attribution_warning([*quiet, QueryReport("dhcp_leases", late_rows=1),
                                        QueryReport("enriched_dns", late_rows=3512)])
    assert warning is not None and "dhcp_leases 1, enriched_dns 3,512" in warning
    assert "seclake rollback dhcp_leases --empty --cascade" in warning


def test_a_lease_held_across_run_onces_attributes_the_next_runs_events(spark, tmp_path):
    """A run-once cuts a held lease at its end-of-input mark, where the enriched join's watermark
    then stands. The lease's next piece, written by the next run-once, must not start on that
    watermark: Spark dropped it as late (30 'late rows' per enriched table in an analyst's
    walk-through) and the next run's first events on the address had no device."""
    lake = Lake(Home.resolve(tmp_path).create())
    commit(lake, "silver_dhcp", [dhcp("d1", at(8), MAC["D"], ["ACK"], assigned="10.1.0.40", lease=86400.0)])
    commit(lake, "silver_conn", [event("c1", at(9), "10.1.0.40")])
    reports = run_stages(spark, lake, SETTINGS, ("enriched_conn",))
    assert all(r.late_rows == 0 for r in reports.values())
    # The next run-once: events just after the mark and later, no new DHCP line.
    commit(lake, "silver_conn", [event("c2", at(9) + dt.timedelta(milliseconds=2), "10.1.0.40"),
                                 event("c3", at(9, 5), "10.1.0.40")])
    reports = run_stages(spark, lake, SETTINGS, ("enriched_conn",))
    assert {name: r.late_rows for name, r in reports.items() if r.late_rows} == {}
    assert not lake.exists("late_events") or lake.read(spark, "late_events").count() == 0
    assert attributed(spark, lake, "enriched_conn") == {"c1": MAC["D"], "c2": MAC["D"], "c3": MAC["D"]}


def test_same_result_in_small_shuffled_batches_with_dhcp_after_events(spark, tmp_path):
    """The input committed jittered (each row up to 90 minutes behind rows committed before it,
    within 2 h watermarks), four conn rows per commit, a run after each commit as a stream would
    (no end-of-input mark), and every DHCP row committed after the events it explains. Once the
    end of the input is marked, the emitted rows equal the single-run result."""
    lake = Lake(Home.resolve(tmp_path).create())
    settings = SETTINGS.with_overrides({"max_files_per_trigger": 1, "event_watermark": "2 hours",
                                        "lease_watermark": "2 hours"})
    rows, expected = scenario()
    rng = random.Random(5)
    jittered = {t: sorted(rows[t], key=lambda r: r["event_time"] + dt.timedelta(minutes=rng.uniform(0, 90)))
                for t in ("silver_dhcp", "silver_conn")}
    # The queries read whole commits: a run after every few commits gives the many small
    # micro-batches a stream would see.
    steps = [("silver_conn", jittered["silver_conn"][i:i + 4]) for i in range(0, len(jittered["silver_conn"]), 4)]
    steps += [("silver_dhcp", jittered["silver_dhcp"][i:i + 8]) for i in range(0, len(jittered["silver_dhcp"]), 8)]
    commit(lake, "silver_dhcp", [])  # the table exists, empty, before its first rows
    batches = 0
    for number, (table, table_rows) in enumerate([*steps, ("silver_dhcp", [])], start=1):
        if table_rows:
            commit(lake, table, table_rows)
        # Checkpoints made with 3 state partitions keep them when the setting changes half-way.
        partitions = 3 if number <= len(steps) // 2 else 1
        reports = run_stages(spark, lake, settings.with_overrides({"state_partitions": partitions}),
                             ("enriched_conn",), flush=number == len(steps) + 1)
        assert all(r.late_rows == 0 for r in reports.values())
        batches += reports["enriched_conn"].batches
    assert batches >= len(jittered["silver_conn"]) // 4  # a micro-batch per conn commit at least
    assert attributed(spark, lake, "enriched_conn") == {k: v for k, v in expected.items() if k.startswith("c")}
    assert state_partitions(lake, attribution.LEASES) == state_partitions(lake, "enriched_conn") == {"3"}


def test_one_run_once_over_a_backlog_of_small_commits_attributes_every_event(spark, tmp_path):
    """A backlog of many small commits, then one run-once with `max_files_per_trigger=1`: the
    attribution queries still read whole commits, so the end-of-input mark (read whole, in the
    first micro-batch) does not come before the data and no event is late. With the file limit
    applied to them (the code before), this test failed on late rows."""
    lake = Lake(Home.resolve(tmp_path).create())
    settings = SETTINGS.with_overrides({"max_files_per_trigger": 1})
    rows, expected = scenario()
    for table in ("silver_dhcp", "silver_conn"):
        ordered = sorted(rows[table], key=lambda r: r["event_time"])
        for i in range(0, len(ordered), 4):
            commit(lake, table, ordered[i:i + 4])
    reports = run_stages(spark, lake, settings, ("enriched_conn",))
    assert all(r.late_rows == 0 for r in reports.values())
    assert not lake.exists("late_events") or lake.read(spark, "late_events").count() == 0
    # A new checkpoint takes the default state_partitions (1), whatever the session's shuffle partitions.
    assert state_partitions(lake, attribution.LEASES) == state_partitions(lake, "enriched_conn") == {"1"}
    assert attributed(spark, lake, "enriched_conn") == {k: v for k, v in expected.items() if k.startswith("c")}
    assert attribution.bucketed_join(lake.home.checkpoint("enriched_conn"))  # a new checkpoint: address and slot


def test_a_checkpoint_keyed_by_the_address_alone_resumes_with_that_key(spark, tmp_path, monkeypatch, caplog):
    """A checkpoint made before the join was keyed by time slot: Spark resumes join state only
    with the key it was written with, so the query keeps the address alone, says so once, and
    attributes the rest of the input as before. Forced to the new key, the resume fails."""
    lake = Lake(Home.resolve(tmp_path).create())
    rows, expected = scenario()
    commit(lake, "silver_dhcp", rows["silver_dhcp"])
    commit(lake, "silver_conn", [r for r in rows["silver_conn"] if r["event_time"] < at(10)])
    with monkeypatch.context() as patch:
        patch.setattr(attribution, "bucketed_join", lambda checkpoint: False)  # the code before the slot
        run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=False)
    checkpoint = lake.home.checkpoint("enriched_conn")
    assert not attribution.bucketed_join(checkpoint)
    commit(lake, "silver_conn", [r for r in rows["silver_conn"] if r["event_time"] >= at(10)])
    with monkeypatch.context() as patch:
        patch.setattr(attribution, "bucketed_join", lambda checkpoint: True)
        with pytest.raises(StreamingQueryException, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
            run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=False)
    caplog.clear()
    run_stages(spark, lake, SETTINGS, ("enriched_conn",))
    assert caplog.text.count("predates the join keyed by time slot") == 1
    assert attributed(spark, lake, "enriched_conn") == {k: v for k, v in expected.items() if k.startswith("c")}


def test_a_stream_in_hourly_commits_never_writes_a_row_below_a_watermark_it_wrote(spark, tmp_path):
    """Hourly commits of DHCP and conn rows, a run after each as a stream would: attributed rows
    leave as soon as their piece is in, unattributed ones a batch or more later, once the
    watermark passes them. Each commit says up to where the table is complete (its rows'
    attribution watermark); no later commit may add a row older than that."""
    lake = Lake(Home.resolve(tmp_path).create())
    rows, expected = scenario()
    commit(lake, "silver_dhcp", [])
    for hour in range(7, 15):
        for table in ("silver_dhcp", "silver_conn"):
            commit(lake, table, [r for r in rows[table] if r["event_time"].hour == hour])
        run_stages(spark, lake, SETTINGS, ("enriched_conn",), flush=hour == 14)
    assert attributed(spark, lake, "enriched_conn") == {k: v for k, v in expected.items() if k.startswith("c")}
    assert assert_complete_below_its_watermark(spark, lake, "enriched_conn") > 0


def test_remcos_host_attributed_on_real_zeek_logs(spark, tmp_path, real_logs):
    """The labelled capture: 741 conn rows from 192.168.1.107, ONE DHCP line (a renewal ACK,
    lease 600 s) in the middle of it. The renewal backfills the 10 minutes before the ACK and
    the new lease covers the 10 minutes after, so every conn row of the host is attributed."""
    from pipelines import jobs

    lake = Lake(Home.resolve(tmp_path).create())
    landing = lake.home.landing / "zeek"
    landing.mkdir(parents=True, exist_ok=True)
    for name in ("conn", "dns", "dhcp"):
        (landing / f"{name}.log").write_bytes((real_logs / "zeek-tsv-labeled" / f"{name}.log.labeled").read_bytes())
    [etl] = jobs.run_once(spark, lake, SETTINGS, only=["etl"])
    assert etl.error is None, etl.error
    # The capture is all there is: run-once marks its end, so every row is emitted.
    run_stages(spark, lake, SETTINGS, ("enriched_conn",))

    host = (lake.read(spark, "enriched_conn").where("src_ip = '192.168.1.107'")
            .groupBy("mac", "hostname").count().collect())
    assert [(r.mac, r.hostname, r["count"]) for r in host] == [("08:00:27:5e:9a:a6", "NWin3", 741)]
    [lease, *_] = lake.read(spark, "dhcp_leases").where("ip = '192.168.1.107'").orderBy("valid_from").collect()
    assert (lease.start_reason, lease.end_reason, lease.lease_time) == ("backfill", "renew", 600.0)


def test_the_end_of_input_mark_comes_after_the_newest_event_with_or_without_file_statistics(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    newest = dt.datetime(2026, 11, 20, 12, 0, 0, 999999)  # naive local time, as Spark returns it
    rows = spark.createDataFrame([(newest,), (newest - dt.timedelta(hours=1),)], "event_time timestamp")
    rows.write.format("delta").save(str(lake.path("silver_dns")))
    from_stats = newest_event(spark, lake, ["silver_dns", "silver_conn"])  # silver_conn: no table yet
    assert newest - dt.timedelta(milliseconds=1) < from_stats <= newest < from_stats + dt.timedelta(milliseconds=1)
    # A file written without statistics: the rows are read instead, to the microsecond.
    spark.conf.set("spark.databricks.delta.stats.collect", "false")
    try:
        rows.limit(1).write.format("delta").mode("append").save(str(lake.path("silver_dns")))
    finally:
        spark.conf.unset("spark.databricks.delta.stats.collect")
    assert newest_event(spark, lake, ["silver_dns"]) == newest


def test_a_mark_falls_on_the_millisecond_after_the_newest_event_and_is_written_once(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    newest = dt.datetime(2026, 11, 20, 12, 0, 0, 999999)  # to the microsecond, as Spark reads it
    assert mark(spark, lake, newest, lambda: ["10.0.0.7"]) == 2
    # The same input marked again, from statistics this time (to the millisecond): nothing new.
    assert mark(spark, lake, newest.replace(microsecond=999000), lambda: ["10.0.0.7"]) == 0
    assert mark(spark, lake, newest, lambda: ["10.0.0.7"]) == 0
    flush = {r.flush_at for r in read_table(spark, lake.path(END_OF_INPUT)).collect()}
    assert flush == {dt.datetime(2026, 11, 20, 12, 0, 1)}


def test_a_stated_end_of_input_moves_the_mark_there_and_is_marked_once(spark, tmp_path):
    """A capture's last hour: its newest event is at 01:59:39, and `input_ends_at` says nothing
    before 02:00 is still to come, so the mark (and the windows ending by then) go to 02:00."""
    lake = Lake(Home.resolve(tmp_path).create())
    newest = dt.datetime(2026, 11, 20, 1, 59, 39)  # naive local time, as Spark returns it
    spark.createDataFrame([(newest,)], "event_time timestamp").write.format("delta").save(str(lake.path("silver_dns")))
    tables = ["silver_dns"]
    assert mark_input(spark, lake, tables, lambda: []) == 1
    assert idle(lake, Settings(), tables)
    # Past the millisecond: a mark (and its statistics) keeps milliseconds, and must still count as there.
    ends_at = dt.datetime(2026, 11, 20, 2, 0, 0, 500).astimezone(dt.timezone.utc)
    asked = Settings(input_ends_at=ends_at.isoformat())
    assert not idle(lake, asked, tables)  # nothing new, but a mark past the last one is asked for
    assert mark_input(spark, lake, tables, lambda: [], ends_at) == 1
    assert idle(lake, asked, tables)
    assert mark_input(spark, lake, tables, lambda: [], ends_at - dt.timedelta(hours=1)) == 0  # before the newest
    flush = sorted(r.flush_at for r in read_table(spark, lake.path(END_OF_INPUT)).collect())
    assert flush == [newest + dt.timedelta(milliseconds=1), dt.datetime(2026, 11, 20, 2, 0)]


def test_a_stated_end_of_input_that_is_not_a_time_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"setting input_ends_at='tomorrow': not an ISO time"):
        Settings().with_overrides({"input_ends_at": "tomorrow"})
