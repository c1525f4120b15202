"""A rule's SQL as a batch query over history: alerts per day, entities, ground-truth scores
and the difference with another version of the rule.

The batch run registers the same views the stream does (table snapshots instead of
streams, no watermark) and turns rows into alerts with the same function, so for every
window the stream's watermark has closed, stream and backtest produce the same alert ids.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.read import read_table
from pipelines.lake.registry import Lake
from pipelines.operations.running import refuse_while_rolling_back
from pipelines.rules.alerts import alert_frame, alert_id, detected, unseen, writers_of
from pipelines.rules.engine import analysis_error, retry_on_conflict, rule_session
from pipelines.rules.spec import Rule, RuleError, validate_rule
from pipelines.rules.tables import ALERTS_TABLE, lookup_view, table_path, table_schema
from pipelines.settings import utc_instant
from pipelines.triage.suppressions import mark

GROUND_TRUTH = "ground_truth.jsonl"


def run_batch(spark: SparkSession, rule: Rule, load: Callable[[SparkSession, str], DataFrame]) -> DataFrame:
    """`rule` as a batch query: `load(session, table)` gives each table's rows (in the child
    session it is passed); returns alerts-table rows plus `match_key` (the alert id without
    the rule version, to compare versions).

    `backtest` loads the lake's tables (`lambda s, t: read_table(s, lake.home.table(t))`), the rule
    tests (`seclake rules test`) inline rows; here every table is empty:

    >>> from pipelines.rules.pack import RULES_DIR
    >>> from pipelines.rules.tables import table_schema
    >>> rule = validate_rule(RULES_DIR / "dns" / "dga_nxdomain_burst.sql")
    >>> run_batch(spark, rule, lambda s, table: s.createDataFrame([], table_schema(table))).count()
    0
    """
    session = rule_session(spark)
    for table in rule.tables:
        load(session, table).createOrReplaceTempView(table)
    for table in rule.lookups:
        lookup_view(load(session, table), table).createOrReplaceTempView(table)
    rows = session.sql(rule.sql)
    rows = rows.withColumn("match_key", alert_id(rule, *[rows[k] for k in rule.keys], window_start=rows.window_start,
                                                window_end=rows.window_end, with_version=False))
    return detected(alert_frame(rows, rule, carry=("match_key",)).dropDuplicates(["alert_id"]))


@dataclass(frozen=True)
class Incident:
    """One injected incident of `ground_truth.jsonl` (sample_data's generator)."""

    id: str
    scenario: str
    host_ip: str | None
    mac: str | None
    start: datetime
    end: datetime


def load_ground_truth(path: str | os.PathLike) -> list[Incident]:
    """Read `ground_truth.jsonl`: one JSON object per line with scenario, host_ip, mac, start, end."""
    incidents = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            incidents.append(Incident(r.get("id") or f"line{n}", r["scenario"], r.get("host_ip"), r.get("mac"),
                                      utc_instant(r["start"]), utc_instant(r["end"])))
        except (KeyError, ValueError, TypeError, AttributeError) as exc:  # a list, a number for a time
            raise ValueError(f"{path}:{n}: not a ground-truth record ({exc})") from None
    return incidents


def matches(alert: dict, incident: Incident) -> bool:
    """An alert belongs to an incident when its window overlaps the incident's time and it
    names the incident's host (IP or MAC). An alert that names no host (DHCP starvation:
    spoofed MACs from 0.0.0.0) matches by time alone; `score` then keeps the one incident it
    covers best."""
    if not (alert["window_start"] <= incident.end and incident.start < alert["window_end"]):
        return False
    if alert["src_ip"] is None and alert["mac"] is None:
        return True
    return (alert["src_ip"] is not None and alert["src_ip"] == incident.host_ip) or (
        alert["mac"] is not None and alert["mac"] == incident.mac)


def _coverage(alert: dict, incident: Incident) -> float:
    """Share of the incident's time inside the alert's window (1.0 for an instant inside it)."""
    overlap = min(alert["window_end"], incident.end) - max(alert["window_start"], incident.start)
    duration = (incident.end - incident.start).total_seconds()
    return 1.0 if duration <= 0 else max(0.0, overlap.total_seconds()) / duration


@dataclass
class Scores:
    """Precision over the alerts; recall per scenario as (incidents hit, incidents)."""

    alerts: int
    true_alerts: int
    recall: dict[str, tuple[int, int]]

    @property
    def precision(self) -> float | None:
        return self.true_alerts / self.alerts if self.alerts else None


def score(alerts: list[dict], incidents: list[Incident]) -> Scores:
    """Score alerts (dicts with src_ip, mac, window_start, window_end) against incidents; the
    generator's benign scenarios (`sample_data.scenarios.BENIGN`, a roaming laptop) are not incidents."""
    from sample_data.scenarios import BENIGN

    incidents = [i for i in incidents if i.scenario not in BENIGN]
    hit: set[str] = set()
    true_alerts = 0
    for alert in alerts:
        found = [i for i in incidents if matches(alert, i)]
        if found and alert["src_ip"] is None and alert["mac"] is None:
            found = [max(found, key=lambda i: _coverage(alert, i))]
        true_alerts += bool(found)
        hit.update(i.id for i in found)
    recall: dict[str, tuple[int, int]] = {}
    for inc in incidents:
        got, total = recall.get(inc.scenario, (0, 0))
        recall[inc.scenario] = (got + (inc.id in hit), total + 1)
    return Scores(len(alerts), true_alerts, recall)


@dataclass
class Backtest:
    """The outcome of one backtest; `lines()` is what `seclake rules backtest` prints."""

    rule: Rule
    start: datetime | None
    end: datetime | None
    alerts: list[dict]
    scores: Scores | None = None
    against: Rule | None = None
    new: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)

    def per_day(self) -> dict[date, int]:
        return dict(sorted(Counter(a["window_start"].date() for a in self.alerts).items()))

    def entities(self) -> list[tuple[tuple, int]]:
        return Counter((a["src_ip"], a["mac"], a["device"], a["owner"]) for a in self.alerts).most_common()

    def lines(self) -> list[str]:
        """The report: a headline, then aligned tables (alerts per day, per entity, recall, diff)."""
        from pipelines.terminal import format_table

        span = (f"{_fmt(self.start) if self.start else 'the first event'} .. "
                f"{_fmt(self.end) if self.end else 'the last event'}") if self.start or self.end else "all history"
        out = [f"{self.rule.slug} v{self.rule.version} ({self.rule.severity}) over {span}: {len(self.alerts)} alerts"]
        suppressed = Counter(a["suppressed_by"] for a in self.alerts if a.get("suppressed_by"))
        if suppressed:
            out[0] += f" ({sum(suppressed.values())} suppressed: " + ", ".join(
                f"{n} by {ident}" for ident, n in suppressed.most_common()) + ")"
        if self.alerts:
            out += ["", format_table(["day", "alerts"], [(str(day), n) for day, n in self.per_day().items()])]
            out += ["", format_table(["src_ip", "mac", "device", "owner", "alerts"],
                                     [(*entity, n) for entity, n in self.entities()])]
        if self.scores is not None and not self.scores.recall:
            out += ["", "ground truth: it holds no incident, so nothing is scored"]
        elif self.scores is not None:
            p = self.scores.precision
            out += ["", f"ground truth: precision {'n/a' if p is None else f'{p:.1%}'} "
                        f"({self.scores.true_alerts}/{self.scores.alerts} alerts belong to an injected incident)"]
            recall = sorted(self.scores.recall.items())
            if any(got for _, (got, _) in recall):
                out.append(format_table(["scenario", "recalled", "injected"],
                                        [(s, got, total) for s, (got, total) in recall if got]))
            missed = [s for s, (got, _) in recall if not got]
            if missed:  # a rule hits the scenarios it detects; the others are listed, not scored as misses
                out.append(f"not hit ({len(missed)} of the ground truth's {len(recall)} scenarios): "
                           f"{', '.join(missed)}")
        if self.against is not None:
            # Which is which, named: a draft given as --against reads as the deployed rule's diff reversed.
            out += ["", f"{_version(self.rule)} against {_version(self.against)}: {len(self.new)} new (only the "
                        f"first raises them), {len(self.removed)} removed (only the second raises them)"]
            out += [f"  + {_describe(a)}" for a in self.new]
            out += [f"  - {_describe(a)}" for a in self.removed]
        return out


def _version(rule: Rule) -> str:
    """A rule as a backtest's diff names it: its file's name when it has one, and its version.

    >>> from pipelines.rules.pack import RULES_DIR
    >>> _version(validate_rule(RULES_DIR / "dns" / "dns_tunneling.sql"))  # doctest: +ELLIPSIS
    'dns_tunneling.sql v...'
    """
    return f"{rule.path.name if rule.path else rule.slug} v{rule.version}"


def backtest(spark: SparkSession, lake: Lake, rule: Rule, start: datetime | None = None, end: datetime | None = None,
             ground_truth: str | os.PathLike | None = None, against: Rule | None = None) -> Backtest:
    """Run `rule` over the tables' current snapshots, events in [start, end).

    `ground_truth` (a ground_truth.jsonl) adds precision and per-scenario recall over the
    incidents overlapping the range; `against` (another version of the rule) adds the alerts
    only one of them raises, matched on group keys and window.

    `seclake rules backtest` prints `"\\n".join(backtest(spark, lake, rule, ground_truth=...).lines())`;
    it needs a populated lake (tests/test_rules_e2e.py runs it over a generated day).
    """
    check_range(start, end)
    result = Backtest(rule, start, end, _collect(spark, lake, rule, start, end))
    if ground_truth is not None:
        incidents = [i for i in load_ground_truth(ground_truth)
                     if (start is None or i.end >= start) and (end is None or i.start < end)]
        result.scores = score(result.alerts, incidents)
    if against is not None:
        try:
            other = _collect(spark, lake, against, start, end)
        except PySparkException as exc:  # said of the version compared with, at its own file's line
            raise ValueError(f"the version compared with, {_version(against)}, fails on the tables: "
                             f"{analysis_error(spark, against, exc)}") from None
        mine = {a["match_key"] for a in result.alerts}
        theirs = {a["match_key"] for a in other}
        result.against = against
        result.new = [a for a in result.alerts if a["match_key"] not in theirs]
        result.removed = [a for a in other if a["match_key"] not in mine]
    return result


def write_missing(spark: SparkSession, lake: Lake, rule: Rule, start: datetime | None = None,
                  end: datetime | None = None) -> tuple[int, int]:
    """Add to `alerts` what a backtest of `rule` over events in [start, end) finds and the table
    lacks; return (alerts found, alerts added).

    This is how late events get their alerts: the stream dropped them (they are counted in
    late_events and kept in silver), a re-run of their hours finds them. Alert ids make it
    idempotent: running it again, or the stream meeting the same window later, adds nothing. A
    range that cuts a window in two sees only part of its events: give whole windows (`--from`
    and `--to` on window boundaries, or whole days).
    """
    check_range(start, end)
    command = f"add {rule.slug}'s missing alerts"
    refuse_while_rolling_back(lake.home, command)
    found = run_batch(spark, rule, _loader(lake, rule, start, end)).drop("match_key").persist()

    def missing() -> DataFrame:
        # Again before each append: a rollback started during the backtest would RESTORE `alerts`
        # under it (its plan is on the home from its start to its end).
        refuse_while_rolling_back(lake.home, command)
        return mark(unseen(found, lake.path(ALERTS_TABLE), rule.id), lake)

    try:
        lake.ensure(spark, ALERTS_TABLE)
        # Its own writer id, each run appending as its next batch (`write_next`).
        sink = lake.sink(ALERTS_TABLE, app_id=f"backtest:{rule.id}:v{rule.version}")
        # The stream's rules application may commit alerts of the same day meanwhile: read again, append again.
        with writers_of(lake, rule.id):
            result = retry_on_conflict(lambda: sink.write_next(missing), f"the backtest of {rule.slug}")
        return found.count(), result.rows
    finally:
        found.unpersist()


def _collect(spark: SparkSession, lake: Lake, rule: Rule, start: datetime | None, end: datetime | None) -> list[dict]:
    return collect_alerts(mark(run_batch(spark, rule, _loader(lake, rule, start, end)), lake))


def check_range(start: datetime | None, end: datetime | None, typed: tuple[str, str] | None = None) -> None:
    """Refuse a range whose start is not before its end, naming the bounds as typed when given
    (a date typed for `--to` means its day's end).

    >>> check_range(datetime(2026, 11, 21), datetime(2026, 11, 20, 23, 59, 59), typed=("2026-11-21", "2026-11-20"))
    Traceback (most recent call last):
    ...
    ValueError: --from 2026-11-21 must be before --to 2026-11-20
    """
    if start and end and start >= end:
        shown = typed or (start, end)
        raise ValueError(f"--from {shown[0]} must be before --to {shown[1]}")


def check_tables(lake: Lake, rule: Rule) -> None:
    """ValueError naming the tables `rule` reads that `lake` does not hold (no JVM needed)."""
    missing = [t for t in rule.tables if not lake.exists(t)]
    if missing:
        raise ValueError(f"no table(s) {missing} under {lake.home.tables}: run the pipeline first")


def _loader(lake: Lake, rule: Rule, start: datetime | None,
            end: datetime | None) -> Callable[[SparkSession, str], DataFrame]:
    """Each table of `rule` read from the lake, events in [start, end) only."""
    check_tables(lake, rule)

    def load(session: SparkSession, table: str) -> DataFrame:
        if table in rule.lookups:  # current state, whatever the range
            return (read_table(session, table_path(lake, table)) if lake.exists(table)
                    else session.createDataFrame([], table_schema(table)))
        frame = read_table(session, table_path(lake, table))
        if start is not None:
            frame = frame.where(F.col(rule.event_time) >= F.lit(start))
            if "event_date" in frame.columns:
                frame = frame.where(F.col("event_date") >= F.lit(start.date()))
        if end is not None:
            frame = frame.where(F.col(rule.event_time) < F.lit(end))
            if "event_date" in frame.columns:
                frame = frame.where(F.col("event_date") <= F.lit(end.date()))
        return frame

    return load


def collect_alerts(alerts: DataFrame) -> list[dict]:
    """The alerts as dicts ordered by window and host, timestamps as UTC datetimes."""
    stamps = [f.name for f in alerts.schema.fields if f.dataType.typeName() == "timestamp"]
    rows = [{k: _from_micros(v) if k in stamps and v is not None else v for k, v in r.asDict().items()}
            for r in alerts.withColumns({c: F.unix_micros(c) for c in stamps}).collect()]
    return sorted(rows, key=lambda a: (a["window_start"], a["src_ip"] or "", a["alert_id"]))


def parse_when(value: str, *, end_of_day: bool = False) -> datetime:
    """'2026-11-20' or '2026-11-20T08:00:00[Z]' -> UTC datetime; a bare date given as an end
    means the end of that day (so `--from D --to D` is the whole day D).

    >>> parse_when("2026-11-20", end_of_day=True).isoformat()
    '2026-11-21T00:00:00+00:00'
    """
    try:
        if len(value.strip()) == 10:
            day = date.fromisoformat(value.strip())
            return datetime.combine(day + timedelta(days=1 if end_of_day else 0), time(), timezone.utc)
        return utc_instant(value)
    except (ValueError, OverflowError):  # OverflowError: the day after 9999-12-31
        raise ValueError(f"{value!r} is not a date (2026-11-20) or an ISO-8601 time (2026-11-20T08:00:00Z) "
                         "before 9999-12-31") from None


def rule_at_revision(path: str | os.PathLike, revision: str) -> Rule:
    """The rule file `path` as committed at git `revision` (`git show REV:path`), validated.

    E.g. `rule_at_revision(RULES_DIR / "dns" / "dga_nxdomain_burst.sql", "HEAD~1")` gives the
    previous commit's version, to backtest `against` it (tests/test_rules_backtest.py).
    """
    path = Path(path).resolve()
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path.parent, capture_output=True,
                             text=True, check=True).stdout.strip()
        shown = subprocess.run(["git", "show", f"{revision}:{path.relative_to(top).as_posix()}"], cwd=top,
                               capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise ValueError(f"cannot read {path} at git revision {revision!r}: {detail.strip()}") from None
    try:
        return validate_rule(shown, slug=path.stem)
    except RuleError as exc:
        raise RuleError(f"{path} at {revision}: {exc}") from None


def _from_micros(micros: int) -> datetime:
    # Through epoch micros: collect() would hand back naive datetimes in the Python process's zone.
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)


def _fmt(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _describe(alert: dict) -> str:
    who = " ".join(str(alert[k]) for k in ("src_ip", "mac", "device") if alert.get(k))
    return f"{_fmt(alert['window_start'])}..{_fmt(alert['window_end'])} {who or '(no host)'}: {alert['evidence']}"
