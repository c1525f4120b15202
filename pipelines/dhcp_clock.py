"""The DHCP clock: how far a stream's DHCP has surely arrived, told by the sensors' other logs.

dhcp_leases emits a lease piece once its watermark (newest DHCP line - `lease_watermark`) passes
the piece's end, and an event is attributed once its piece is out. A watermark only moves with
newer data, so on a quiet network, where a DHCP line comes every few minutes or hours, an event
would wait in `seclake stream` for the next DHCP line, however long that is.

A sensor writes its DHCP log beside its connection and DNS logs (Zeek rotates them together;
Suricata writes one EVE file), and writes a DHCP line at most `dhcp_log_delay` after its time
(Zeek writes a transaction within 35 s of its first message: `DHCP::max_txid_watch_time`, 30 s,
looked at every 5 s), so once a sensor's other lines reach time T its DHCP lines before
T - `dhcp_log_delay` have been delivered too. The ETL keeps, per *feed* (source/sensor) that has
delivered DHCP, the newest event it has seen from it, and appends to the `dhcp_clock` table the
lowest of them whenever it moves (`DhcpClock`, `ClockWriter`): a slow sensor holds the clock back,
a fast one without DHCP (an EVE stream of flows only) never moves it. dhcp_leases reads that
table as one more stream, in its plan *before* silver_dhcp, and takes each clock row into its
watermark like an end-of-input mark (`pipelines.end_of_input.with_marks`): its watermark is the
later of the newest DHCP line minus `lease_watermark` and the clock minus `dhcp_log_delay`. So
with a clock an event waits for its sensor's other logs to pass it by `dhcp_log_delay`, not by the
lease watermark.

Why the order is safe: a micro-batch counts for the clock only once all its commits are done, so
a clock row is committed after the silver_dhcp commit of every batch it covers, and Spark asks a
query's sources for new data in plan order, so a clock row dhcp_leases reads never runs ahead of
the DHCP lines it reads in the same micro-batch. Files of one rotation that land in different
ETL batches are covered by `rotation_skew`: a batch's newest events move the clock only that long
after the newest modification time of its files (`ClockWriter`: a timer writes the rows), and not
while a landing file modified before then is still uncommitted (a backlog taken a capped batch at
a time, a batch still running): that file may hold the same rotation's DHCP.

What it cannot know: a sensor's DHCP file reaching landing more than `rotation_skew` after its
other logs' modification time, or more than `dhcp_log_delay` behind them in event time, is late (dropped by dhcp_leases,
counted in `late_events`, kept in silver; a re-run of its time range picks it up), and a line
with a bogus future time moves its feed's clock as it already moves a watermark. Run-once does
not need the clock (its end-of-input mark passes everything) and writes none (a row from an
earlier stream is read in the same micro-batch as silver_dhcp). The ETL from Kafka writes no clock.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.lake.source import read_stream
from pipelines.query import error_summary
from pipelines.schemas import DHCP_CLOCK_SCHEMA

log = logging.getLogger("seclake")

DHCP_CLOCK = "dhcp_clock"
# The clock's writer: its own app id, whose txn version is the clock's millisecond (`ClockWriter`).
CLOCK_APP_ID = "etl_clock"
# How often a release held back by an uncommitted landing file looks again: a listing of landing and
# a read of the ETL checkpoint's file log each time, only while a backlog or a batch holds it.
LANDING_POLL_S = 1.0


@dataclass
class DhcpClock:
    """The clock's state in the ETL: per DHCP feed the newest event released, and what waits.

    `observe` takes one micro-batch's newest event per feed (every kind of line) and the feeds
    that had DHCP lines in it; a feed's newest is *released* once `hold_s` seconds have passed
    since it was observed. `advance` returns the new clock (the lowest released newest over every
    feed that ever delivered DHCP) when it moved, else None. `row_feeds()` is what a clock row
    stores, so that a restarted ETL resumes from the table (`DhcpClock(hold_s, feeds=...)`).

    >>> t = datetime.fromisoformat
    >>> clock = DhcpClock(hold_s=30.0)
    >>> clock.observe(0.0, {"zeek/a": t("2026-11-20 10:05"), "suricata/b": t("2026-11-20 11:00")}, {"zeek/a"})
    >>> clock.advance(10.0) is None        # held: the batch's DHCP file may land in the next batch
    True
    >>> clock.advance(30.0)                # the flows-only EVE feed does not count
    datetime.datetime(2026, 11, 20, 10, 5)
    >>> clock.observe(31.0, {"zeek/c": t("2026-11-20 10:01")}, {"zeek/c"})
    >>> clock.observe(32.0, {"zeek/a": t("2026-11-20 10:20")}, set())
    >>> clock.advance(70.0) is None        # a second DHCP sensor, behind the first: no move
    True
    >>> clock.row_feeds() == {"zeek/a": t("2026-11-20 10:20"), "zeek/c": t("2026-11-20 10:01")}
    True
    """

    hold_s: float
    feeds: dict[str, datetime] = field(default_factory=dict)
    _pending: list[tuple[float, str, datetime]] = field(default_factory=list)
    _dhcp: set[str] = field(default_factory=set)
    _last: datetime | None = None

    def __post_init__(self) -> None:
        self._dhcp |= set(self.feeds)
        self._last = min(self.feeds.values(), default=None)

    def observe(self, now: float, newest: dict[str, datetime], dhcp: set[str]) -> None:
        """Record one micro-batch seen at `now` (seconds, any monotonic clock)."""
        self._dhcp |= dhcp
        self._pending += [(now, name, t) for name, t in newest.items()]

    def next_due(self) -> float | None:
        """When the next observation is released (`advance`), None when nothing waits."""
        if not self._pending:
            return None
        return min(seen for seen, _, _ in self._pending) + self.hold_s

    def advance(self, now: float, uncommitted: float | None = None) -> datetime | None:
        """Release what was observed at least `hold_s` before `now`; the clock if it moved, else None.

        `uncommitted`: the oldest modification time (on `now`'s clock) of a landing file the ETL has
        not committed. An observation whose hold ends after it stays held: that file, landed within the
        hold, may be its sensor's DHCP of the same rotation.

        >>> clock = DhcpClock(hold_s=10.0)
        >>> clock.observe(100.0, {"zeek/a": datetime(2026, 11, 20, 10, 5)}, {"zeek/a"})
        >>> clock.advance(110.0, uncommitted=104.0) is None   # landed 4 s after the batch, not committed yet
        True
        >>> clock.advance(111.0, uncommitted=125.0)           # what is left landed after the hold
        datetime.datetime(2026, 11, 20, 10, 5)
        """
        def released(seen: float) -> bool:
            return seen + self.hold_s <= now and (uncommitted is None or uncommitted > seen + self.hold_s)

        due = [p for p in self._pending if released(p[0])]
        self._pending = [p for p in self._pending if not released(p[0])]
        for _, name, newest in due:
            if name not in self.feeds or newest > self.feeds[name]:
                self.feeds[name] = newest
        # A DHCP feed with nothing released yet (new, or seen only in held batches) could be
        # behind every other: no clock until it is known.
        if not self._dhcp or not self._dhcp <= set(self.feeds):
            return None
        clock = min(self.feeds[f] for f in self._dhcp)
        if self._last is not None and clock <= self._last:
            return None
        self._last = clock
        return clock

    def row_feeds(self) -> dict[str, datetime]:
        """The released newest of each DHCP feed: the `feeds` column of a clock row."""
        return {f: self.feeds[f] for f in sorted(self._dhcp) if f in self.feeds}


def feed(source: str, sensor: str | None) -> str:
    """The clock's name for one sensor of one source.

    >>> feed("zeek", "gw-1")
    'zeek/gw-1'
    """
    return f"{source}/{sensor or ''}"


class ClockWriter:
    """The file ETL's DHCP clock: `committed` after each micro-batch's commits, rows from a timer.

    A timer, not the next micro-batch, releases what waited `hold_s`: when the sensors stop
    sending (the quiet network the clock is for) there is no next micro-batch. Before a release the
    timer lists landing (`landing`) against the files committed so far, the ETL's committed file
    log once (`committed_before`) plus each batch's files since, and holds while a file modified
    before the hold's end is not among them (`DhcpClock.advance`), looking again every
    `LANDING_POLL_S`: a look costs a listing, not a read of a file log that grows with every file
    the ETL ever read. Times are wall-clock seconds, the clock of file modification times. Only the
    timer thread writes, with an app id of its own and the clock's millisecond as the txn version
    (a row per new clock value, none twice); a failed write is logged and the clock writes again
    when it next moves, and a failed look (or read of the file log) is logged and releases as
    without the check: the clock must not stop, nor fail the ETL. Rows follow only committed
    batches, so they never run ahead of silver_dhcp.
    """

    def __init__(self, lake: Lake, hold_s: float, landing: Callable[[], set[str]],
                 committed_before: Callable[[], set[str]]) -> None:
        self.lake = lake
        self.hold_s = hold_s
        self.landing = landing
        self.committed_before = committed_before
        self._sink = lake.sink(DHCP_CLOCK, app_id=CLOCK_APP_ID)
        self._clock: DhcpClock | None = None
        self._done: set[str] | None = set()  # None: unknown, releases go without the landing check
        self._spark: SparkSession | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    def committed(self, spark: SparkSession, newest: dict[str, datetime], dhcp: set[str],
                  files: dict[str, float]) -> None:
        """Record a micro-batch whose commits are all done (`Survey.newest`, `Survey.dhcp`), `files`
        its landing files -> modification time (`checkpoint.newest_source_files`, which may add
        files committed before): its hold counts from the newest of them, since a rotation's files
        are written together, not from the commit."""
        with self._lock:
            if self._clock is None:
                self._clock = resume(spark, self.lake, self.hold_s)
                try:
                    self._done = self.committed_before()
                except Exception as exc:  # the clock releases without the check rather than fail the ETL
                    log.warning("dhcp_clock: could not read the committed landing files: %s", error_summary(exc))
                    self._done = None
            if self._done is not None:
                self._done |= files.keys()
            self._spark = spark
            now = time.time()
            self._clock.observe(min(max(files.values(), default=now), now), newest, dhcp)
            self._schedule()

    def close(self) -> None:
        """Stop the timer, waiting for a write in progress (what still waited is not written)."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join(60)

    def _schedule(self, at_least: float = 0.0) -> None:
        """Start the timer for the next release unless one is set (under the lock)."""
        due = self._clock.next_due() if self._clock is not None else None
        if due is None or self._closed or self._timer is not None:
            return
        self._timer = threading.Timer(max(at_least, due - time.time()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        try:  # lists landing and looks at files: outside the lock
            listed = self.landing() if self._done is not None else set()
            with self._lock:
                waiting = listed - (self._done or set())
            uncommitted = oldest_modified(waiting)
        except Exception as exc:  # released as without the check: a dead timer thread would stop the clock
            log.warning("dhcp_clock: could not list the uncommitted landing files: %s", error_summary(exc))
            uncommitted = None
        with self._lock:
            if self._closed or self._clock is None or self._spark is None:
                return
            now = time.time()
            moved, feeds, spark = self._clock.advance(now, uncommitted), self._clock.row_feeds(), self._spark
            due = self._clock.next_due()
            held_by_landing = due is not None and due <= now
        if moved is not None:
            try:
                row = spark.createDataFrame([(moved, feeds, None)], DHCP_CLOCK_SCHEMA)
                self._sink.write_batch(row.withColumn("written_at", F.current_timestamp()),
                                       int(moved.timestamp() * 1000))
            except Exception as exc:  # the clock only speeds attribution up: never fail the ETL for it
                log.warning("dhcp_clock: could not write the clock at %s: %s", moved, error_summary(exc))
        with self._lock:
            self._timer = None
            self._schedule(LANDING_POLL_S if held_by_landing else 0.0)


def oldest_modified(paths: set[str]) -> float | None:
    """The oldest modification time (seconds since the epoch) of `paths`, None when there is none;
    a file gone since it was listed (retention, a sensor's cleanup) does not count.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     os.utime(f.name, (1e9, 1e9))
    ...     oldest_modified({f.name, "/no/such/file"}), oldest_modified(set())
    (1000000000.0, None)
    """
    times = []
    for path in paths:
        try:
            times.append(os.stat(path).st_mtime)
        except FileNotFoundError:
            continue
    return min(times, default=None)


def resume(spark: SparkSession, lake: Lake, hold_s: float) -> DhcpClock:
    """The ETL's clock as the newest row of `dhcp_clock` left it (a fresh one without a row)."""
    if not lake.exists(DHCP_CLOCK):
        return DhcpClock(hold_s)
    last = lake.read(spark, DHCP_CLOCK).orderBy("clock", ascending=False).select("feeds").limit(1).collect()
    return DhcpClock(hold_s, feeds=dict(last[0].feeds) if last else {})


def read_clock(spark: SparkSession, lake: Lake, wait: str) -> DataFrame:
    """The stream of clock rows as end-of-input marks (flush_at, ip, written_at): each at its clock
    minus `wait`, addressed to no IP, for `with_marks` (the table is created if missing)."""
    lake.ensure(spark, DHCP_CLOCK)
    return read_stream(spark, lake.path(DHCP_CLOCK)).selectExpr(
        f"clock - INTERVAL {wait} AS flush_at", "CAST(NULL AS STRING) AS ip", "written_at")
