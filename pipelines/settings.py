"""Stream settings with their defaults and the reasons for them; one object passed to every job."""
from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any

INTERVAL = re.compile(r"(\d+) (second|minute|hour|day)s?")
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def interval_seconds(value: str) -> int:
    """'10 minutes' -> 600; ValueError for anything that is not `<n> second|minute|hour|day[s]`,
    n > 0: the form of the interval settings below and of a rule's `window` and `watermark`.

    >>> interval_seconds("2 hours")
    7200
    >>> interval_seconds("0 minutes")
    Traceback (most recent call last):
    ...
    ValueError: '0 minutes' is not an interval above zero
    """
    match = INTERVAL.fullmatch(str(value).strip().lower())
    if match and int(match.group(1)) == 0:
        raise ValueError(f"{value!r} is not an interval above zero")
    if not match:
        raise ValueError(f"{value!r} is not an interval like '10 minutes' (units: seconds, minutes, hours, days)")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def utc_instant(value: str | datetime) -> datetime:
    """An ISO time ('2026-11-20T06:00', '2026-11-20 06:00:00Z', '...+01:00') or a datetime, as an aware
    UTC datetime; a time that names no zone is UTC. ValueError when the text is not an ISO time.

    >>> utc_instant("2026-11-20 09:10:00").isoformat(), utc_instant("2026-11-20T10:10+01:00").isoformat()
    ('2026-11-20T09:10:00+00:00', '2026-11-20T09:10:00+00:00')
    """
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value.strip())
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def seconds_arg(text: str) -> float:
    """An argparse type: a number of seconds above zero (NaN and inf are not: a wait of NaN never ends).

    >>> seconds_arg("2.5")
    2.5
    >>> seconds_arg("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: nan is not a number of seconds above zero
    """
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above zero")
    return seconds


# Spark's `limit` takes a Java int, and a listing asks for one row more to say it was cut.
MAX_ROWS = 2**31 - 2


def rows_arg(least: int) -> Callable[[str], int]:
    """An argparse type: a row count from `least` to MAX_ROWS (a larger one reached Spark as a Long
    and ended in a Py4J traceback).

    >>> rows_arg(1)("50")
    50
    >>> rows_arg(1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is not a row count from 1 to 2147483646
    """
    def rows(text: str) -> int:
        try:
            count = int(text)
        except ValueError:
            count = least - 1
        if not least <= count <= MAX_ROWS:
            raise argparse.ArgumentTypeError(f"{text} is not a row count from {least} to {MAX_ROWS}")
        return count
    return rows


# Day counts a date can be taken back by: a cutoff before year 1 is Python's OverflowError.
MAX_DAYS = 36_500
# The quarantine check compares the lines read in this many hours (a bad file stands out instead of
# being diluted by the table's history); retention keeps the raw lines read in it.
QUARANTINE_WINDOW_HOURS = 24.0
# The share of a source's lines in that window that may be quarantined before the (blocking) check
# fails; $SECLAKE_MAX_QUARANTINE_RATIO overrides it.
MAX_QUARANTINE_RATIO = 0.05
# The whole-number settings that must be above 0 (the others may be 0: "none" or "keep everything").
_LEAST = {name: 1 for name in ("max_bytes_per_trigger", "max_offsets_per_trigger", "rule_max_failures",
                               "state_partitions", "stages_at_once", "checkpoint_interval", "notify_max_attempts")}


@dataclass(frozen=True)
class Settings:
    """Knobs shared by the ETL, attribution and rule queries.

    >>> Settings().with_overrides({"trigger_interval": "5 seconds"}).trigger_interval
    '5 seconds'
    """

    # Processing-time trigger of `seclake stream`: Zeek rotates hourly and Suricata flushes
    # every few seconds, so 10 s keeps alert latency low without spinning on empty batches.
    trigger_interval: str = "10 seconds"
    # Bounds one ETL micro-batch of landing files (bytes per sensor folder) so a backlog is eaten in
    # as few steps as fit in memory: each micro-batch pays seconds of fixed cost (a Delta txn per
    # table). The 24 h demo's 43 MB went in one batch at the JVM's usual peak (1.9 GB resident);
    # a batch's cache spills to disk past memory. A file larger than this is read alone. The
    # queries after the ETL read whole commits.
    max_bytes_per_trigger: int = 128 * 2**20
    # A cap in files instead (0: none). Spark takes one cap or the other, so a value here wins;
    # the fault tests set 1 to get a micro-batch per file.
    max_files_per_trigger: int = 0
    # The same for Kafka messages (one line each), per source's topics: 200k lines are ~60 MB
    # of text, a few seconds of parsing on 2 cores, so a backlog drains without a long first batch.
    max_offsets_per_trigger: int = 200_000
    # How far an event may trail the newest event of its table and still be attributed: lines of
    # one sensor arrive in order, sensors and file rotations skew by minutes. Later ones are late
    # (counted in late_events, kept in silver). The newest event is any sensor's: two sensors'
    # files of a rotation longer than this, landing in different micro-batches, make the later
    # one's rows late (docs/attribution.md, "Sensors that share a table").
    event_watermark: str = "10 minutes"
    # The same for DHCP messages. A lease piece is final once the watermark passes its end, so
    # without a DHCP clock (below) this is also most of the wait before an event is attributed.
    lease_watermark: str = "5 minutes"
    # Run-once: when the input is known to be complete up to (an ISO time, UTC unless it names a
    # zone), such as the end of a capture or of the last hourly file. The end-of-input mark moves
    # there when that is after the newest event, so each window ending by then is evaluated (an
    # `emit: closed` rule's last hour); an event before it that lands later is late. Empty: the
    # mark is at the newest event, and the window holding it waits for later input.
    input_ends_at: str = ""
    # The log files of one rotation of a sensor (Zeek's conn, dns and dhcp logs, moved by one
    # shipper run) land within this much wall time of each other, so they may fall in consecutive
    # ETL micro-batches: a batch's newest events move the DHCP clock (pipelines/dhcp_clock.py) only
    # this long after its files' newest modification time, and only once every landing file
    # modified before then is committed. A DHCP file landing later than that behind its sensor's
    # other logs may come out late. Short, because it adds to every quiet-network attribution.
    rotation_skew: str = "10 seconds"
    # How long after its time a sensor may write a DHCP line: Zeek writes a transaction 5 s after
    # its last message, or once DHCP::max_txid_watch_time (30 s) after its first has passed, looked
    # at every 5 s (its dhcp/main.zeek): within 35 s. Suricata writes each message at once.
    # So once a sensor's other lines reach T, its DHCP lines before T minus this have arrived: the
    # DHCP clock moves dhcp_leases' watermark to there (pipelines/dhcp_clock.py). It, not the lease
    # watermark, is an event's wait for attribution in a stream with a clock.
    dhcp_log_delay: str = "35 seconds"
    # No dhcp_leases row is longer than this: it bounds the enriched joins' time condition and lease
    # state, and a renewal seen without its ACK is taken as held this far back (one row).
    lease_piece: str = "10 minutes"
    # A held lease is cut at the watermark once this much of it is not out (at most lease_piece): an
    # event is attributed once the row holding it is out, up to a cut and the lease watermark (with a
    # DHCP clock, dhcp_log_delay) after it. Without a clock, pieces alone made that 5 to 15 minutes;
    # 1 minute makes it 5 to 6, for up to 1,440 rows a day per held IP in a stream instead of 144
    # (a run-once's one big step still makes 144).
    lease_cut: str = "1 minute"
    # A rule that declares no `watermark`: how late an enriched row may reach the rule. Enriched
    # rows of one commit span about a lease piece plus the lease watermark.
    rule_watermark: str = "20 minutes"
    # A rule that fails at run time is retried after this, doubled per failure in a row: a
    # transient fault (a lost executor, a full disk) clears in minutes, a broken rule stops
    # costing a query start every trigger.
    rule_retry: str = "1 minute"
    # ... and disabled at this many failures in a row (a platform alert says so), until
    # `seclake rules enable` or an edit of its file. Three rules out one flaky minute.
    rule_max_failures: int = 3
    # A rule micro-batch running longer than this is stopped and counted as a failure: the pack's
    # rules take seconds per batch; minutes mean a runaway join or regex starving the others.
    rule_batch_budget: str = "10 minutes"
    # Partitions of the state of each stateful query (dhcp_leases, the enriched joins, every rule),
    # taken by a checkpoint when it is created (an existing one keeps its own: Spark restores it).
    # Every partition is a state store to load and commit in every micro-batch, whatever its rows:
    # on 2 cores a streaming join's state stage took 1.2-1.4 s of task time per 20-row micro-batch
    # with 4 partitions and 0.23-0.26 s with 1, a rule's 0.33-0.47 s and 0.06-0.09 s (docs/performance.md).
    # A cluster with big state may want more. Run-once's big batches did not slow down: the 24 h
    # demo's dhcp_leases (alone in its wave) took 11.6-11.7 s against 10.8-11.9 s with 4, its
    # enriched wave 41-45 s against 42-53 s.
    state_partitions: int = 1
    # Run-once runs the stages of a wave (the enriched tables, then the rules) this many at once:
    # one query's planning and commits fill the cores while another's tasks run. The pack's 12 rules
    # on a 3-hour home (2 cores, warm JVM): one at a time 66-78 s, 4 at once 34 s, all 12 at once 39-53 s.
    stages_at_once: int = 4
    # `seclake stream` runs its rules' application (a child process) this much nicer than itself
    # (0-19, Linux niceness). Nicer gives the ETL and the joins the CPU first, but the rules are the
    # last step of the alert path: `bench/alert_latency.py --quick` (2026-11-29), at 10 no alert
    # within the run (3 runs); with the DHCP clock minus dhcp_log_delay, at 5 the IDS alert's rule
    # batch took 50-57 s after its enriched commit (per-event p95 101 and 111 s, threshold 62 and
    # 69 s, landing -> silver p95 38-40 s), at 0 22-23 s (72 and 85 s, 61 and 64 s, 46-50 s): the
    # alerts sooner, silver later (docs/performance.md).
    rules_niceness: int = 0
    # Delta writes a log checkpoint every N commits (delta.checkpointInterval) so opening a table stays flat.
    checkpoint_interval: int = 100
    # `seclake maintain`: VACUUM keeps files younger than this. Delta's default (7 days) and its
    # floor: a stream lagging less than this, and time travel within it, still find their files.
    vacuum_retention_hours: int = 168
    # `seclake retention`: days of data kept per layer (by event_date; 0 keeps everything).
    # Landing files are only the ETL's input: once processed they are replayable from bronze.
    retention_landing_days: int = 7
    # Raw lines serve re-parsing after a parser fix and quarantine triage: a month covers both.
    retention_bronze_days: int = 30
    # Silver and enriched events are what investigations and rule backtests look back over: a year.
    retention_silver_days: int = 365
    retention_enriched_days: int = 365
    # Alerts are the audit trail of what was detected and when: kept.
    retention_gold_days: int = 0
    # `seclake notify`: one webhook (Slack-compatible JSON); empty: notifications off. High and
    # critical by default: a channel that pages on every medium finding gets muted.
    notify_webhook_url: str = ""
    notify_min_severity: str = "high"
    # Five tries with a doubling back-off from 1 s ride out a receiver's restart (~30 s).
    notify_max_attempts: int = 5

    def __post_init__(self) -> None:
        for name in INTERVALS:  # named here, not in a query's plan or a batch minutes later
            value = getattr(self, name)
            try:
                interval_seconds(value)
            except ValueError:
                raise ValueError(f"setting {name}={value!r}: not an interval like '10 minutes' "
                                 "(units: seconds, minutes, hours, days)") from None
        # Counts, sizes and days: Spark's own refusal would come at a query's start, naming its option.
        for f in fields(self):
            value, least = getattr(self, f.name), _LEAST.get(f.name, 0)
            if isinstance(value, int) and value < least:
                raise ValueError(f"setting {f.name}={value}: must be {least} or more")
            # A retention's cutoff before year 1 would fail in a delete, after the deletes before it.
            if f.name.endswith("_days") and value > MAX_DAYS:
                raise ValueError(f"setting {f.name}={value}: must be at most {MAX_DAYS} "
                                 "(100 years; 0 keeps everything)")
        self.input_end  # noqa: B018 (refuses a value that is not a time, when the settings are made)
        if not 0 <= self.rules_niceness <= 19:  # os.nice would clamp it silently
            raise ValueError(f"setting rules_niceness={self.rules_niceness}: must be 0 to 19")

    @property
    def input_end(self) -> datetime | None:
        """`input_ends_at` as an aware time (None: not set).

        >>> Settings(input_ends_at="2026-11-20T02:00Z").input_end
        datetime.datetime(2026, 11, 20, 2, 0, tzinfo=datetime.timezone.utc)
        """
        if not self.input_ends_at:
            return None
        try:
            return utc_instant(self.input_ends_at)
        except ValueError:
            raise ValueError(f"setting input_ends_at={self.input_ends_at!r}: not an ISO time such as "
                             "2026-11-20T02:00Z") from None

    def with_overrides(self, overrides: Mapping[str, object]) -> "Settings":
        """A copy with `overrides` applied, strings converted to each setting's type (the CLI's
        `--set`, Dagster's run config); an unknown name or a bad number is a ValueError naming it.

        >>> Settings().with_overrides({"max_files_per_trigger": "20"}).max_files_per_trigger
        20
        >>> Settings().with_overrides({"trigger_intervl": "5 seconds"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown setting trigger_intervl; did you mean trigger_interval? (the settings: ...)
        >>> Settings().with_overrides({"max_files_per_trigger": "many"})
        Traceback (most recent call last):
        ...
        ValueError: setting max_files_per_trigger='many': not a number (int)
        >>> Settings().with_overrides({"state_partitions": "0"})
        Traceback (most recent call last):
        ...
        ValueError: setting state_partitions=0: must be 1 or more
        >>> Settings().with_overrides({"max_bytes_per_trigger": "-5"})
        Traceback (most recent call last):
        ...
        ValueError: setting max_bytes_per_trigger=-5: must be 1 or more
        >>> Settings().with_overrides({"rules_niceness": "20"})
        Traceback (most recent call last):
        ...
        ValueError: setting rules_niceness=20: must be 0 to 19
        >>> Settings().with_overrides({"lease_piece": "a day"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: setting lease_piece='a day': not an interval like '10 minutes' (units: ...)
        """
        kinds = {f.name: type(getattr(self, f.name)) for f in fields(self)}
        unknown = sorted(set(overrides) - set(kinds))
        if unknown:
            near = [m for name in unknown for m in difflib.get_close_matches(name, kinds, n=1)]
            raise ValueError(f"unknown setting {', '.join(unknown)}" + (f"; did you mean {', '.join(near)}?" if near
                             else "") + f" (the settings: {', '.join(sorted(kinds))}; pipelines/settings.py)")
        converted: dict[str, Any] = {}
        for name, value in overrides.items():
            kind = kinds[name]
            try:
                converted[name] = kind(value) if kind in (int, float) and isinstance(value, str) else value
            except ValueError:
                raise ValueError(f"setting {name}={value!r}: not a number ({kind.__name__})") from None
        return replace(self, **converted)


# The settings that are intervals, in `interval_seconds`' form (Spark takes them as they are too).
INTERVALS: tuple[str, ...] = tuple(f.name for f in fields(Settings) if isinstance(f.default, str)
                                   and INTERVAL.fullmatch(f.default))


# Settings that one command alone reads, by name prefix: a `--set` of one elsewhere would change nothing.
READ_ONLY_BY = {"vacuum_": "maintain", "retention_": "retention", "notify_": "notify", "input_ends_at": "run-once"}
# The commands that read their own settings and no other (run-once reads the streams' too).
OWN_SETTINGS_ONLY = ("maintain", "retention", "notify")


def command_settings(command: str, items: list[str]) -> Settings:
    """The settings `seclake <command>` runs with, given its `--set NAME=VALUE` items; ValueError
    names a bad item, or a setting that the command never reads (`READ_ONLY_BY`).

    >>> command_settings("retention", ["retention_bronze_days=90"]).retention_bronze_days
    90
    >>> command_settings("maintain", ["retention_bronze_days=90"])
    Traceback (most recent call last):
    ...
    ValueError: setting retention_bronze_days: seclake maintain does not read it (seclake retention does)
    >>> command_settings("run-once", ["vacuum_retention_hours=24"])
    Traceback (most recent call last):
    ...
    ValueError: setting vacuum_retention_hours: seclake run-once does not read it (seclake maintain does)
    >>> command_settings("run-once", ["input_ends_at=2026-11-20T02:00Z", "rule_max_failures=1"]).rule_max_failures
    1
    """
    overrides = parse_assignments(items)
    settings = Settings().with_overrides(overrides)  # an unknown name is named first
    for name in overrides:
        reader = next((cmd for prefix, cmd in READ_ONLY_BY.items() if name.startswith(prefix)), None)
        if reader != command and (reader is not None or command in OWN_SETTINGS_ONLY):
            raise ValueError(f"setting {name}: seclake {command} does not read it"
                             + (f" (seclake {reader} does)" if reader else ""))
    return settings


def parse_assignments(items: list[str]) -> dict[str, str]:
    """`NAME=VALUE` strings (the CLI's repeated `--set`) -> {NAME: VALUE}; ValueError names a bad one.

    >>> parse_assignments(["trigger_interval=5 seconds"])
    {'trigger_interval': '5 seconds'}
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out
