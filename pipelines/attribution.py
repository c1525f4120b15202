"""Event-time attribution: which device held an IP address when an event happened.

Four streaming queries, each with its own checkpoint (rules and edge cases: docs/attribution.md):

- `dhcp_leases` (`checkpoints/dhcp_leases`): silver_dhcp -> lease pieces. A stateful processor
  per IP buffers DHCP messages until the watermark passes them, replays them in event-time
  order and emits non-overlapping pieces [valid_from, valid_to), at most `lease_piece` long,
  each final when emitted: a held lease is also cut at the watermark once `lease_cut` of it is
  not out, so it comes out piece by piece while it is held.
- `enriched_conn`, `enriched_dns`, `enriched_ids_alerts` (`checkpoints/enriched_<kind>`):
  silver_<kind> LEFT OUTER stream-stream join dhcp_leases on IP and event time, then a
  stream-static join with the device inventory `<home>/reference/devices.csv`. An event leaves
  as soon as the piece holding it arrives; one no lease holds, once no piece can still come.

All four also read run-once's end-of-input marks (pipelines/end_of_input.py).

Each query writes its table through an exactly-once `DeltaSink` in `foreachBatch` and records
the rows its watermark dropped in `late_events`.
"""
from __future__ import annotations

import csv
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle, StreamingQuery
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from pipelines import end_of_input
from pipelines.checkpoint import newest, read_batch, state_key
from pipelines.dhcp_clock import DHCP_CLOCK, read_clock
from pipelines.end_of_input import END_OF_INPUT, mark_input, read_marks, with_marks
from pipelines.lake.registry import Lake
from pipelines.lake.source import check_resumable, read_stream
from pipelines.query import (
    AVAILABLE_NOW,
    BatchStats,
    DoneWriter,
    OwnQuery,
    RunningQuery,
    Stage,
    StoppedQuery,
    batch_watermark,
    late_batches,
    start_query,
    stateful_session,
)
from pipelines.schemas import ATTRIBUTION_WATERMARK, ENRICHED_SCHEMAS, LATE_EVENTS_SCHEMA, SILVER_SCHEMAS
from pipelines.settings import Settings, interval_seconds

log = logging.getLogger("seclake")

LEASES = "dhcp_leases"
# What dhcp_leases read before the DHCP clock, in plan order (`clocked`).
_OLD_LEASE_READS = ("silver_dhcp", END_OF_INPUT)
LATE_EVENTS = "late_events"
# enriched table -> the silver table it attributes.
ENRICHED_INPUTS: dict[str, str] = {table: table.replace("enriched_", "silver_", 1) for table in ENRICHED_SCHEMAS}
INVENTORY_FILE = "devices.csv"
_NO_INVENTORY_SAID: set[Path] = set()

# An ACK without a lease time (option 51 missing, or a sensor that drops it) still says who got
# the address; one hour is the shortest lease common in practice (guest Wi-Fi), so a device that
# silently left is not blamed for long.
DEFAULT_LEASE_SECONDS = 3600.0

# Addresses DHCP hands out: RFC 1918, carrier-grade NAT, IPv6 unique-local. An alert's internal
# side is the one in these ranges (scans come from outside, beacons go out).
INTERNAL_IP_PATTERN = (r"^(10\.|192\.168\.|172\.(1[6-9]|2[0-9]|3[01])\."
                       r"|100\.(6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7])\.|f[cd])")


# ---------------------------------------------------------------------------------------------
# Lease segments: the per-IP state machine (plain Python, also used directly by the tests)

@dataclass(frozen=True)
class Message:
    """A DHCP message that can move a lease; times in epoch milliseconds."""

    ts: int
    event_id: str
    kind: str            # "ack" | "inform" | "release" | "decline" | "mark" (end of input: cut just after it)
    mac: str
    hostname: str | None = None
    lease_time: float | None = None   # seconds, ACK only
    renewal: bool = False             # ACK to a client that already used the address (ciaddr set)


@dataclass(frozen=True)
class Segment:
    """[valid_from, valid_to) during which `mac` held `ip`; final once emitted."""

    ip: str
    mac: str
    hostname: str | None
    valid_from: int
    valid_to: int
    lease_time: float | None
    start_reason: str
    end_reason: str


@dataclass
class OpenLease:
    mac: str
    hostname: str | None
    valid_from: int
    expires: int
    lease_time: float | None
    start_reason: str


@dataclass
class IpLeases:
    """Who holds one IP: the open lease and where the last segment ended.

    `advance(messages, until)` applies messages (ts <= until) in event-time order and closes
    what expires up to `until`; it returns the segments that closed. Segments never overlap and
    are at most `segment_ms` long, which bounds join state. A held lease is also cut at `until`
    once `cut_ms` of it is not out yet: what is held up to the watermark comes out but for less
    than one cut, so an event waits for the next cut, not for its lease to end. (A cut at the
    watermark, not every `cut_ms`: a run-once that passes a day in one step makes one row per
    `segment_ms`, as many as the enriched joins compare each event with.)

    >>> book = IpLeases("10.0.0.5", segment_ms=600_000, cut_ms=60_000)
    >>> ack = Message(0, "e1", "ack", "aa", lease_time=3600.0)
    >>> [(s.valid_to, s.end_reason) for s in book.advance([ack], until=90_000)]
    [(90000, 'split')]
    >>> [(s.valid_to, s.end_reason) for s in book.advance([], until=1_290_000)]
    [(690000, 'split'), (1290000, 'split')]
    """

    ip: str
    segment_ms: int
    cut_ms: int | None = None
    default_lease_ms: int = int(DEFAULT_LEASE_SECONDS * 1000)
    open: OpenLease | None = None
    last_end: int | None = None
    _out: list[Segment] = field(default_factory=list, repr=False)

    def advance(self, messages: list[Message], until: int) -> list[Segment]:
        self._out = []
        for m in sorted(messages, key=lambda m: (m.ts, m.event_id)):
            if m.ts > until:
                raise ValueError(f"message at {m.ts} is after the point to advance to ({until})")
            self._close_due(m.ts)
            self._apply(m)
        self._close_due(until)
        if (held := self.open) is not None and until - held.valid_from >= self._cut_ms:
            self._split(held, until)
        return self._out

    def next_boundary(self) -> int | None:
        """When the open lease next expires or reaches `segment_ms`; None when nothing is open."""
        if self.open is None:
            return None
        return min(self.open.expires, self.open.valid_from + self.segment_ms)

    def next_cut(self) -> int | None:
        """From when on an `advance` emits a row of the open lease (its next boundary, or `cut_ms`
        after its start); None when nothing is open."""
        if self.open is None:
            return None
        return min(self.open.expires, self.open.valid_from + self._cut_ms)

    @property
    def _cut_ms(self) -> int:
        return min(self.cut_ms or self.segment_ms, self.segment_ms)

    def _close_due(self, now: int) -> None:
        while (held := self.open) is not None and (boundary := self.next_boundary()) is not None \
                and boundary <= now:
            if boundary == held.expires:
                self._close(boundary, "expire")
            else:
                self._split(held, boundary)

    def _apply(self, m: Message) -> None:
        if m.kind == "mark":
            # End of input: what is held so far comes out now, the mark's millisecond included;
            # the lease stays held. The enriched joins' watermark then stands on the mark, and Spark
            # drops as late a piece starting on its watermark: the next run's events of that piece
            # would lose their device.
            self._close_due(m.ts + 1)
            if (held := self.open) is not None and held.valid_from <= m.ts:
                self._split(held, m.ts + 1)
            # For the same reason a later renewal's backfill starts after the mark, held or not.
            self.last_end = m.ts + 1 if self.last_end is None else max(self.last_end, m.ts + 1)
            return
        held = self.open
        if m.kind == "inform" and held is not None and held.mac == m.mac:
            return  # the holder asking for options: its lease, not a default-length binding, goes on
        if m.kind in ("release", "decline"):
            # Only the holder gives an address back; a stray or spoofed RELEASE changes nothing.
            if held is not None and held.mac == m.mac:
                self._close(m.ts, m.kind)
            return
        # INFORM and lease-less ACKs are evidence of the binding without a term: the default lease.
        term = m.lease_time if m.lease_time is not None and m.lease_time > 0 else None
        lease_ms = self.default_lease_ms if term is None else int(term * 1000)
        expires, hostname, lease_time = m.ts + lease_ms, m.hostname, m.lease_time
        if held is not None and held.mac == m.mac:
            start = "renew"
            hostname = hostname or held.hostname
            if term is None:  # confirms the holder's binding: never shortens the lease it was granted
                expires, lease_time = max(expires, held.expires), held.lease_time
            self._close(m.ts, "renew")
        elif held is not None:
            start = "ack"
            self._close(m.ts, "reassigned")
        else:
            start = "ack"
            if m.renewal:
                # A client renewing an address already held it before this ACK (RFC 2131: it is
                # BOUND), at most one lease time ago. Cap at one piece so pieces reach the join in
                # valid_from order (see `attribute`), and never reach back over someone else's.
                since = m.ts - min(lease_ms, self.segment_ms)
                if self.last_end is not None:
                    since = max(since, self.last_end)
                if since < m.ts:
                    self._emit(OpenLease(m.mac, hostname, since, m.ts, m.lease_time, "backfill"), m.ts, "renew")
                start = "renew"
        if m.kind == "inform":
            start = "inform"
        self.open = OpenLease(m.mac, hostname, m.ts, expires, lease_time, start)

    def _split(self, held: OpenLease, at: int) -> None:
        """Emit the open lease `held` up to `at`; it stays held from there."""
        self._emit(held, at, "split")
        self.open = replace(held, valid_from=at, start_reason="split")

    def _close(self, at: int, reason: str) -> None:
        if self.open is not None:
            self._emit(self.open, at, reason)
        self.open = None

    def _emit(self, lease: OpenLease, end: int, reason: str) -> None:
        self.last_end = end
        if end > lease.valid_from:  # two ACKs in the same millisecond: the later one wins, nothing to emit
            self._out.append(Segment(self.ip, lease.mac, lease.hostname, lease.valid_from, end,
                                     lease.lease_time, lease.start_reason, reason))


# ---------------------------------------------------------------------------------------------
# The dhcp_leases query

_MESSAGE_COLUMNS = ("ip", "ts", "event_id", "kind", "mac", "hostname", "lease_time", "renewal")
_MESSAGE_SCHEMA = StructType([
    StructField("ts", LongType()), StructField("event_id", StringType()), StructField("kind", StringType()),
    StructField("mac", StringType()), StructField("hostname", StringType()),
    StructField("lease_time", DoubleType()), StructField("renewal", BooleanType()),
])
_HELD_SCHEMA = StructType([
    StructField("mac", StringType()), StructField("hostname", StringType()), StructField("valid_from", LongType()),
    StructField("expires", LongType()), StructField("lease_time", DoubleType()),
    StructField("start_reason", StringType()), StructField("last_end", LongType()),
])
_SEGMENT_OUTPUT = StructType([
    StructField("ip", StringType()), StructField("mac", StringType()), StructField("hostname", StringType()),
    StructField("valid_from_ms", LongType()), StructField("valid_to_ms", LongType()),
    StructField("lease_time", DoubleType()), StructField("start_reason", StringType()),
    StructField("end_reason", StringType()),
])


def dhcp_messages(dhcp: DataFrame) -> DataFrame:
    """silver_dhcp rows -> the messages that move a lease, keyed by the IP they are about.

    ACK grants `assigned_addr`, or `client_addr` for a renewal ACK without one; INFORM shows a
    client using `client_addr` (set otherwise; it only asks for options), and so does an ACK with
    neither an assigned address nor a lease time (the answer to an INFORM, a line of its own in
    Suricata); RELEASE and DECLINE give back `client_addr` (`requested_addr` for DECLINE). Other
    lines (DISCOVER, OFFER, REQUEST alone, NAK) grant nothing and are dropped here.

    An ACK is a renewal (the client used the address before it) only when the client sent from
    it and asked for no address: Zeek fills `client_addr` with the assigned address for a
    DISCOVER ... ACK or a rebooting client's REQUEST (`requested_addr` set), which are not.

    >>> acked = spark.sql("SELECT TIMESTAMP'2026-11-20 10:00:00' AS event_time, 'e1' AS event_id, array('ACK') AS "
    ...                   "msg_types, '' AS client_addr, '10.0.0.7' AS assigned_addr, NULL AS requested_addr, "
    ...                   "'08:00:27:5E:9A:A6' AS mac, 'pc-a' AS hostname, 3600.0 AS lease_time")
    >>> dhcp_messages(acked).select("kind", "ip", "mac", "renewal").first()
    Row(kind='ack', ip='10.0.0.7', mac='08:00:27:5e:9a:a6', renewal=False)
    """
    types = F.col("msg_types")
    answers_inform = _address("assigned_addr").isNull() & ~(F.col("lease_time") > 0).eqNullSafe(True)
    kind = (F.when(F.array_contains(types, "INFORM"), F.lit("inform"))
            .when(F.array_contains(types, "ACK") & answers_inform, F.lit("inform"))
            .when(F.array_contains(types, "ACK"), F.lit("ack"))
            .when(F.array_contains(types, "RELEASE"), F.lit("release"))
            .when(F.array_contains(types, "DECLINE"), F.lit("decline")))
    client = _address("client_addr")
    ip = (F.when(kind == "ack", F.coalesce(_address("assigned_addr"), client))
          .when(kind == "inform", client)
          .otherwise(F.coalesce(client, _address("requested_addr"))))
    return (dhcp
            .select("event_time", "event_id", kind.alias("kind"), ip.alias("ip"),
                    F.lower(F.trim("mac")).alias("mac"), "hostname", "lease_time",
                    (client.isNotNull() & (client == ip) & _address("requested_addr").isNull()
                     & ~F.array_contains(types, "DISCOVER")).alias("renewal"))
            .where(F.col("kind").isNotNull() & F.col("ip").isNotNull() & F.col("mac").isNotNull())
            .withColumn("ts", F.unix_millis("event_time")))


def _address(column: str) -> Column:
    # Zeek leaves unset addresses empty, some sensors write 0.0.0.0 for "none".
    value = F.trim(F.col(column))
    return F.when(value.isin("", "0.0.0.0", "::"), F.lit(None)).otherwise(value)


class LeaseProcessor(StatefulProcessor):
    """transformWithState processor over messages grouped by IP, in event-time mode.

    Input rows are only buffered (a timer at each one's time); when the watermark passes a
    timer, every buffered message up to the watermark is replayed in event-time order through
    `IpLeases`, so DHCP lines that arrive out of order (within the watermark) count in order.
    The open lease has a timer at its next expiry or cut (`IpLeases.next_cut`).
    """

    def __init__(self, segment_ms: int, cut_ms: int) -> None:
        self.segment_ms = segment_ms
        self.cut_ms = cut_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.pending = handle.getListState("pending", _MESSAGE_SCHEMA)
        self.held = handle.getValueState("held", _HELD_SCHEMA)

    def handleInputRows(self, key, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        messages = [tuple(row[c] for c in _MESSAGE_SCHEMA.fieldNames()) for row in rows]
        self.pending.appendList(messages)
        for ts in {m[0] for m in messages}:
            self.handle.registerTimer(ts)
        return iter(())

    def handleExpiredTimer(self, key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Row]:
        until = timerValues.getCurrentWatermarkInMs()
        pending = [Message(*m) for m in self.pending.get()] if self.pending.exists() else []
        due = [m for m in pending if m.ts <= until]
        later = [m for m in pending if m.ts > until]
        book = self._load(key[0])
        boundary_before = book.next_cut()
        segments = book.advance(due, until)
        if due:
            if later:
                self.pending.put([(m.ts, m.event_id, m.kind, m.mac, m.hostname, m.lease_time, m.renewal)
                                  for m in later])
            else:
                self.pending.clear()
        self._save(book)
        boundary = book.next_cut()
        if boundary is not None and boundary != boundary_before:
            self.handle.registerTimer(boundary)
        for s in segments:
            yield Row(ip=s.ip, mac=s.mac, hostname=s.hostname, valid_from_ms=s.valid_from, valid_to_ms=s.valid_to,
                      lease_time=s.lease_time, start_reason=s.start_reason, end_reason=s.end_reason)

    def close(self) -> None:
        pass

    def _load(self, ip: str) -> IpLeases:
        book = IpLeases(ip, self.segment_ms, self.cut_ms)
        state = self.held.get() if self.held.exists() else None
        if state is not None:
            mac, hostname, valid_from, expires, lease_time, start_reason, last_end = state
            book.last_end = last_end
            if mac is not None:
                book.open = OpenLease(mac, hostname, valid_from, expires, lease_time, start_reason)
        return book

    def _save(self, book: IpLeases) -> None:
        # The last segment end stays (one small row per IP ever leased) so a later backfill never
        # reaches over a segment already emitted.
        lease = book.open
        if lease is None:
            self.held.update((None, None, None, None, None, None, book.last_end))
        else:
            self.held.update((lease.mac, lease.hostname, lease.valid_from, lease.expires, lease.lease_time,
                              lease.start_reason, book.last_end))


def lease_segments(dhcp: DataFrame, marks: DataFrame, settings: Settings, clock: DataFrame | None = None) -> DataFrame:
    """The dhcp_leases rows of a silver_dhcp stream (LEASE_SCHEMA), each emitted once, when final.

    `marks` are the end-of-input marks (`end_of_input.read_marks`): one addressed to an IP cuts its
    held lease just after the mark (`IpLeases`). `clock` is the DHCP clock as marks
    (`dhcp_clock.read_clock`), which moves the watermark when DHCP is quiet; None on a checkpoint
    started before it. `start_leases` applies it to the silver_dhcp stream and writes the result
    to dhcp_leases.
    """
    at_mark = F.col("flush_at") + F.expr(f"INTERVAL {settings.lease_watermark}")
    cuts = marks.where(F.col("ip").isNotNull()).select(
        at_mark.alias("event_time"), "ip", F.unix_millis("flush_at").alias("ts"), F.lit("mark").alias("event_id"),
        F.lit("mark").alias("kind"), *(F.lit(None).cast(t).alias(c) for c, t in
                                        (("mac", "string"), ("hostname", "string"), ("lease_time", "double"))),
        F.lit(False).alias("renewal"))
    messages = dhcp_messages(dhcp).select("event_time", *_MESSAGE_COLUMNS).unionByName(cuts)
    if clock is None:
        messages = messages.withWatermark("event_time", settings.lease_watermark)
    else:
        messages = with_marks(messages, clock, "event_time", settings.lease_watermark, marks_first=True)
    segments = messages.groupBy("ip").transformWithState(
        LeaseProcessor(interval_seconds(settings.lease_piece) * 1000, interval_seconds(settings.lease_cut) * 1000),
        _SEGMENT_OUTPUT, outputMode="Append", timeMode="EventTime")
    return segments.select(
        "ip", "mac", "hostname",
        F.timestamp_millis("valid_from_ms").alias("valid_from"), F.timestamp_millis("valid_to_ms").alias("valid_to"),
        "lease_time", "start_reason", "end_reason",
        F.to_date(F.timestamp_millis("valid_from_ms")).alias("event_date"),
    )


# ---------------------------------------------------------------------------------------------
# The enriched_<kind> queries

def attributed_ip(table: str) -> Column:
    """The address a row is attributed by: the internal side of an alert, else the source.

    >>> alerts = spark.createDataFrame([("203.0.113.9", "10.0.0.5")], "src_ip string, dst_ip string")
    >>> alerts.select(attributed_ip("enriched_ids_alerts")).first()
    Row(attributed_ip='10.0.0.5')
    """
    if table == "enriched_ids_alerts":
        internal = F.col("src_ip").rlike(INTERNAL_IP_PATTERN)
        ip = F.when(~internal & F.col("dst_ip").rlike(INTERNAL_IP_PATTERN), F.col("dst_ip")).otherwise(F.col("src_ip"))
    else:
        _check_enriched(table)
        ip = F.col("src_ip")
    return ip.alias("attributed_ip")


def _check_enriched(table: str) -> None:
    if table not in ENRICHED_INPUTS:
        raise ValueError(f"unknown enriched table {table!r}; expected one of {sorted(ENRICHED_INPUTS)}")


def load_devices(spark: SparkSession, path: Path) -> DataFrame:
    """The device inventory (mac, device, owner) from a CSV with at least those columns.

    A missing file is not an error: attribution still names the MAC and hostname, device and
    owner stay NULL (with a warning). Read once per query start, so an edit takes effect at the
    next start. MACs compare lower-case with colons.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "devices.csv").write_text("mac,device,owner\\n08-00-27-5E-9A-A6,PC-A,ann\\n")
    ...     load_devices(spark, Path(tmp, "devices.csv")).collect()
    [Row(inv_mac='08:00:27:5e:9a:a6', device='PC-A', owner='ann')]
    """
    schema = "inv_mac string, device string, owner string"
    if not path.is_file():
        if path not in _NO_INVENTORY_SAID:  # once per process, not once per enriched query
            _NO_INVENTORY_SAID.add(path)
            log.warning("no device inventory at %s: enriched rows get device and owner NULL, so every host with a "
                        "DHCP lease is an unknown device (rule unknown_device) and priority-1 IDS alerts come from "
                        "high_severity_ids_alert_unknown_host (docs/attribution.md, \"Device inventory\")", path)
        return spark.createDataFrame([], schema)
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"mac", "device", "owner"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {sorted(missing)}; header is {reader.fieldnames}")
        rows: dict[str, tuple] = {}
        for line, rec in enumerate(reader, start=2):
            mac = (rec["mac"] or "").strip().lower().replace("-", ":")
            if not mac:
                continue
            if mac in rows:
                raise ValueError(f"{path} line {line}: MAC {mac!r} is listed twice; one device per MAC")
            rows[mac] = (mac, rec["device"] or None, rec["owner"] or None)
    return spark.createDataFrame(list(rows.values()), schema)


# The enriched joins' second key column, each side's slot of time (`attribute`). The slot is a
# fixed length, not `lease_piece`: state written before that setting changes keeps its slots.
_EVENT_SLOT, _LEASE_SLOT = "event_slot", "lease_slot"
_SLOT_MS = 10 * 60 * 1000


def attribute(events: DataFrame, leases: DataFrame, marks: tuple[DataFrame, DataFrame], devices: DataFrame, table: str,
              settings: Settings, *, bucketed: bool = True) -> DataFrame:
    """Join an event stream with the lease piece holding its IP at its time, then the inventory.

    A matched event is emitted in the micro-batch where both it and its piece are in. The time
    bounds are what let Spark evict, and set how long an unmatched event waits:
    `valid_from <= event_time` (a piece starting later cannot hold it) evicts an event once the
    watermark passes its time; `valid_from >= event_time - lease_piece` (no piece is longer)
    evicts a piece once the watermark passes its start by a piece. Leases are watermarked on
    `valid_from` with a delay of one piece: dhcp_leases emits a piece once the lease watermark
    passes its end, so every piece starts at most a piece before anything emitted earlier, and
    none is ever late. Both sides also take the end-of-input marks (`marks`).

    The join's key is the address and the event's 10-minute slot of time (`bucketed`): a piece is
    keyed under each slot it overlaps (one or two at the default `lease_piece`), so an event meets
    only its address's pieces of its own slot, not all of them. A run-once passing a day in one
    micro-batch holds the whole day in the join state, where an address's 144 pieces a day each
    met every event of that address (docs/performance.md, "The join keyed by time slot"). A
    checkpoint started before the slot (`bucketed_join`) keeps the address alone as key: Spark
    resumes no other.

    `start_enriched` calls it with the silver stream, the dhcp_leases stream, the marks stream and
    `load_devices` of the home's inventory.
    """
    piece = F.expr(f"INTERVAL {interval_seconds(settings.lease_piece) * 1000} MILLISECONDS")
    ev = (with_marks(events, marks[0], "event_time", settings.event_watermark)
          .withColumn("attributed_ip", attributed_ip(table)))
    ls = with_marks(leases, marks[1], "valid_from", settings.lease_piece).select(
        F.col("ip").alias("lease_ip"), F.col("mac").alias("lease_mac"), F.col("hostname").alias("lease_hostname"),
        F.col("valid_from").alias("lease_valid_from"), F.col("valid_to").alias("lease_valid_to"))
    key = ev.attributed_ip == ls.lease_ip
    if bucketed:
        ev = ev.withColumn(_EVENT_SLOT, _slot(F.col("event_time"), _SLOT_MS))
        first, last = _slot(F.col("lease_valid_from"), _SLOT_MS), _slot(F.col("lease_valid_to"), _SLOT_MS, end=True)
        ls = ls.withColumn(_LEASE_SLOT, F.explode(F.sequence(first, F.greatest(first, last))))
        key = (ev.attributed_ip == ls.lease_ip) & (ev[_EVENT_SLOT] == ls[_LEASE_SLOT])
    matched = ev.join(ls, key
                      & (ls.lease_valid_from <= ev.event_time) & (ev.event_time < ls.lease_valid_to)
                      & (ls.lease_valid_from >= ev.event_time - piece), "left_outer")
    with_devices = matched.join(F.broadcast(devices), matched.lease_mac == devices.inv_mac, "left_outer")
    silver = [c for c in ENRICHED_SCHEMAS[table].fieldNames() if c in events.columns]
    return with_devices.select(*silver, "attributed_ip", F.col("lease_mac").alias("mac"),
                               F.col("lease_hostname").alias("hostname"), "device", "owner", "lease_valid_from")


def _slot(time: Column, slot_ms: int, *, end: bool = False) -> Column:
    """The number of the `slot_ms`-long slot of epoch time holding `time`; with `end`, of the
    last millisecond before `time` (a piece's `valid_to` is not in it)."""
    millis = F.unix_millis(time) - (1 if end else 0)
    return F.floor(millis / F.lit(slot_ms))


def bucketed_join(checkpoint: Path) -> bool:
    """Whether an enriched query's join is keyed by address and time slot (`attribute`): yes,
    unless its checkpoint holds join state keyed by the address alone (started before the slot).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     bucketed_join(Path(tmp))
    True
    """
    key = state_key(checkpoint, "left-keyToNumValues")
    return key is None or len(key) > 1


# Set on the copy of each row that carries its attribution watermark (NULL on the rows themselves).
_FLOOR_COLUMN = "_attribution_floor"


def held_to_attribution(frame: DataFrame, marks: DataFrame, time_column: str, delay: str) -> DataFrame:
    """`with_marks(frame, marks, time_column, delay)` for a stream of an enriched table, its watermark
    also held at or below the attribution watermark of the rows read so far.

    Attribution writes an unattributed row only once its own watermark passes the row, which can
    be a micro-batch after it wrote the attributed rows of the same hours (a backlog caught up in
    one batch). A rule reading that first commit alone would move its watermark (newest row -
    `delay`) past the rows still to come and drop them. So each row enters twice: as itself, and
    as a copy at its `attribution_watermark` under a watermark of no delay, dropped right after
    it; with Spark's default `min` policy the rule's watermark is the lower of the two. Rows
    written before the column existed count at their own time (no hold). Any other stream, or a
    rule timed by another column, is returned as `with_marks` makes it.

    The copies are a second source over the same table, first in the plan: Spark asks sources for
    new data in plan order, so a commit landing between the two look-ups reaches the rows only
    and holds the watermark lower for a batch, never higher.

    `start_rule` builds each streamed table's view of a rule with it.
    """
    rows = with_marks(frame, marks, time_column, delay)
    if time_column != "event_time" or ATTRIBUTION_WATERMARK not in frame.columns:
        return rows
    floor = F.coalesce(ATTRIBUTION_WATERMARK, time_column)
    # The copies keep every real column: a rule's filters are pushed below both watermarks, and on
    # literal columns Spark would prune the copies' branch, watermark included (see `with_marks`).
    copies = with_marks(frame.withColumn(time_column, floor).withColumn(_FLOOR_COLUMN, floor),
                        marks, time_column, "0 seconds")
    keep = F.when(F.col(time_column).isNotNull(), F.col(_FLOOR_COLUMN).isNull())
    return copies.unionByName(rows, allowMissingColumns=True).where(keep).drop(_FLOOR_COLUMN)


# ---------------------------------------------------------------------------------------------
# Writing: one foreachBatch writer per query, and the starters jobs.py runs

class AttributionWriter:
    """The `foreachBatch` function of one attribution query: writes its table exactly once per
    batch, then records the earlier batches whose watermark dropped rows in `late_events`.

    Drops are known only from a finished batch's progress, so batch N records batches < N and
    `close()` the rest; each is committed with txn(app_id=query, version=its batch id), so a
    replay records nothing twice. Progress of batches that ran just before a crash is lost
    (Spark keeps it in memory only); the rows themselves are never lost (they stay in silver).

    `start_leases` and `start_enriched` create one per query, e.g. `AttributionWriter(spark, lake,
    "enriched_conn")`, and pass it to the query's `foreachBatch`.
    """

    query = OwnQuery()  # the query running this writer, set by its starter

    def __init__(self, spark: SparkSession, lake: Lake, table: str) -> None:
        self.spark = spark
        self.query_name = table
        self.sink = lake.sink(table, app_id=table)
        self.late_sink = lake.sink(LATE_EVENTS, app_id=table)
        self.history: list[BatchStats] = []
        self._recorded = -1

    def __call__(self, rows: DataFrame, batch_id: int) -> None:
        stats = BatchStats(batch_id)
        if self.query_name in ENRICHED_INPUTS:
            # An enriched batch emits attributed rows as soon as their lease piece is in, unattributed
            # ones only once the watermark passes them (in a later batch, when a backlog is caught up):
            # the rows say up to where this table is complete, so that rules do not run ahead of it.
            watermark = batch_watermark(self._running())
            rows = rows.withColumn(ATTRIBUTION_WATERMARK, F.timestamp_millis(F.lit(watermark)))
        stats.record(self.sink.write_batch(rows, batch_id))
        self._record_late(stats)
        self.history.append(stats)

    def _running(self) -> StreamingQuery:
        """The query; its first batch may start before its starter has set `query`."""
        deadline = time.monotonic() + 60
        while self.query is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.query_name}: the query's starter never handed its writer the query")
            time.sleep(0.05)
        return self.query

    def close(self) -> None:
        """Record the late rows of batches that finished after the last one recorded."""
        if self.history:
            self._record_late(self.history[-1])

    def _record_late(self, stats: BatchStats) -> None:
        if self.query is None:
            return
        late, last = late_batches(self.query, self._recorded)
        if late:
            now = datetime.now(timezone.utc)
            rows = [(self.query_name, b.batch_id, b.watermark, b.rows, now) for b in late]
            stats.record(self.late_sink.write_batch(self.spark.createDataFrame(rows, LATE_EVENTS_SCHEMA), last))
        self._recorded = last


def _run(name: str, frame: DataFrame, writer: AttributionWriter, lake: Lake, trigger: dict) -> RunningQuery:
    check_resumable(lake.home.checkpoint(name))
    query = start_query(frame, name, writer, lake.home.checkpoint(name), trigger, sinks=(writer.sink, writer.late_sink))
    writer.query = query
    return RunningQuery(name, query, writer, (name, LATE_EVENTS))


def start_leases(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> RunningQuery:
    """Start the dhcp_leases query (silver_dhcp -> dhcp_leases) with `trigger`.

    It is the `start` of the dhcp_leases stage in `stages()`; a run passes a trigger such as
    `{"availableNow": True}` and waits on the returned RunningQuery's `query`.
    """
    # Whole commits per micro-batch (no read limit), as every query downstream of the ETL reads:
    # each file of a silver commit spans the commit's whole event-time range, so a limit in files
    # that split a commit would make the later files' rows look late (and a run-once's end-of-input
    # mark, read whole in the first micro-batch, would come before the rest of the data).
    session = stateful_session(spark, settings)
    clock = read_clock(session, lake, settings.dhcp_log_delay) if clocked(lake) else None
    if clock is None:
        log.warning("dhcp_leases: its checkpoint predates the DHCP clock, so in a stream a lease piece waits "
                    "for a newer DHCP line; `seclake rollback dhcp_leases --empty --cascade` rebuilds it with the "
                    "clock (docs/attribution.md)")
    dhcp = read_stream(session, lake.path("silver_dhcp"))
    writer = AttributionWriter(spark, lake, LEASES)
    # The enriched queries stream from dhcp_leases and all four queries write late_events: create
    # both before any of them runs (no stream over a missing table, no two writers racing to
    # create one). Batch id -1 marks "nothing committed yet": batch 0 still commits.
    for table in (LEASES, LATE_EVENTS):
        lake.ensure(spark, table, settings.checkpoint_interval)
    return _run(LEASES, lease_segments(dhcp, read_marks(session, lake), settings, clock), writer, lake, trigger)


def clocked(lake: Lake) -> bool:
    """Whether dhcp_leases reads the DHCP clock: yes, but on a checkpoint started before it (two
    sources, silver_dhcp and the marks), which Spark cannot resume with a third.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     clocked(Lake(Home.resolve(tmp)))
    True
    """
    checkpoint = lake.home.checkpoint(LEASES)
    last = newest(checkpoint)
    return last is None or len(read_batch(checkpoint, last).offsets) != len(_OLD_LEASE_READS)


def start_enriched(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict, *, table: str) -> RunningQuery:
    """Start the query writing `table` (enriched_conn, enriched_dns or enriched_ids_alerts).

    dhcp_leases must exist (`start_leases` creates it): `stages()` lists one such stage per
    enriched table, after dhcp_leases.
    """
    _check_enriched(table)
    # Events and leases by whole commits (no read limit): see `start_leases`, and `attribute`.
    session = stateful_session(spark, settings)
    events = read_stream(session, lake.path(ENRICHED_INPUTS[table]))
    leases = read_stream(session, lake.path(LEASES))
    devices = load_devices(session, lake.home.reference / INVENTORY_FILE)
    # Each side reads the marks as a source of its own, so neither side's plan shares column ids
    # with the other's (the optimizer infers filters across the join from them).
    bucketed = bucketed_join(lake.home.checkpoint(table))
    if not bucketed:
        log.warning("%s: its checkpoint predates the join keyed by time slot, so a run-once over a long backlog "
                    "is slower; `seclake rollback %s --empty --cascade` rebuilds it with the slot "
                    "(docs/attribution.md, \"The join\")", table, table)
    frame = attribute(events, leases, (read_marks(session, lake), read_marks(session, lake)), devices, table, settings,
                      bucketed=bucketed)
    return _run(table, frame, AttributionWriter(spark, lake, table), lake, trigger)


def leased_ips(spark: SparkSession, lake: Lake) -> list[str]:
    """Every IP address a DHCP message in silver_dhcp is about: the keys dhcp_leases may hold a lease for."""
    if not lake.exists("silver_dhcp"):
        return []
    return [r.ip for r in dhcp_messages(lake.read(spark, "silver_dhcp")).select("ip").distinct().collect()]


def start_end_of_input(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> RunningQuery:
    """Run-once's end-of-input mark (pipelines/end_of_input.py) at the newest event in silver, or at
    `settings.input_ends_at` when that is later; with any other trigger (`seclake stream`) nothing:
    there the watermarks move with the data."""
    writer = DoneWriter()
    if trigger == AVAILABLE_NOW:
        written = mark_input(spark, lake, tuple(SILVER_SCHEMAS), partial(leased_ips, spark, lake), settings.input_end)
        stats = BatchStats(0)
        if written:
            stats.rows[END_OF_INPUT] = written
        writer.history.append(stats)
    return RunningQuery(END_OF_INPUT, StoppedQuery(END_OF_INPUT), writer, (END_OF_INPUT,))


def stages() -> list[Stage]:
    """The attribution queries in dependency order: run-once's `end_of_input` mark, `dhcp_leases`,
    then one per enriched table.

    >>> [(s.name, s.reads) for s in stages()][1:3]  # doctest: +NORMALIZE_WHITESPACE
    [('dhcp_leases', ('dhcp_clock', 'silver_dhcp', 'end_of_input')),
     ('enriched_conn', ('silver_conn', 'dhcp_leases', 'end_of_input'))]
    """
    return [Stage(END_OF_INPUT, reads=tuple(SILVER_SCHEMAS), writes=(END_OF_INPUT,), start=start_end_of_input,
                  idle=partial(end_of_input.idle, tables=tuple(SILVER_SCHEMAS))),
            Stage(LEASES, reads=(DHCP_CLOCK, *_OLD_LEASE_READS), writes=(LEASES, LATE_EVENTS), start=start_leases),
            *(Stage(table, reads=(events, LEASES, END_OF_INPUT), writes=(table, LATE_EVENTS),
                    start=partial(start_enriched, table=table))
              for table, events in ENRICHED_INPUTS.items())]
