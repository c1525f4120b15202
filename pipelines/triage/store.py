"""The triage state of alerts, kept in `alert_triage` with Delta MERGE (one row per touched alert).

An alert with no row is `open`. A change names alerts by id or by a unique prefix of at least
`MIN_PREFIX` characters (as `seclake alerts list` shows them); it sets the status and/or the
assignee and may add a note; notes accumulate, the rest is replaced. Every change is one MERGE
commit (an alert it would leave as it is is not written), so `DESCRIBE HISTORY alert_triage`
and time travel give the earlier states.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.rules.tables import ALERTS_TABLE, FINDING_COLUMNS
from pipelines.schemas import SEVERITIES
from pipelines.triage.suppressions import NO_NAME

TRIAGE_TABLE = "alert_triage"
TRIAGE_COLUMNS = ("status", "assignee", "notes", "updated_by", "updated_at")
OPEN, ACKNOWLEDGED, CLOSED = "open", "acknowledged", "closed"
STATUSES = (OPEN, ACKNOWLEDGED, CLOSED)
MIN_PREFIX = 8


@dataclass(frozen=True)
class Change:
    """What one `seclake alerts ack|close|reopen|assign` does to each alert it names."""

    status: str | None = None
    assignee: str | None = None
    note: str | None = None
    by: str = "unknown"

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: expected one of {', '.join(STATUSES)}")
        if self.status is None and self.assignee is None and not self.note:
            raise ValueError("a change sets a status, an assignee or a note")
        if self.assignee is not None and not self.assignee.strip():
            raise ValueError("--to: give the name of who takes them (empty would leave them with no one)")
        if not self.by.strip():
            raise ValueError(NO_NAME)


def _require_alerts(lake: Lake) -> None:
    if not lake.exists(ALERTS_TABLE):
        raise ValueError(f"no alerts table in {lake.home.root}: run the pipeline first")


def resolve_ids(spark: SparkSession, lake: Lake, given: list[str]) -> list[str]:
    """The full alert ids that `given` (ids or unique prefixes) name; ValueError names each id
    that is too short, unknown or ambiguous."""
    _require_alerts(lake)
    given = [prefix.lower() for prefix in given]  # ids are lower-case hex
    condition = F.lit(False)
    for prefix in given:
        if len(prefix) >= MIN_PREFIX:
            condition = condition | F.col("alert_id").startswith(prefix)
    matching = lake.read(spark, ALERTS_TABLE).where(condition).select("alert_id").distinct()
    found = [r.alert_id for r in matching.collect()]
    resolved, problems = [], []
    for prefix in given:
        matches = sorted(a for a in found if a.startswith(prefix))
        if len(prefix) < MIN_PREFIX:
            problems.append(f"{prefix} (give at least {MIN_PREFIX} characters)")
        elif len(matches) == 1:
            resolved.append(matches[0])
        else:
            problems.append(f"{prefix} ({'no such alert' if not matches else f'{len(matches)} alerts match'})")
    if problems:
        raise ValueError(f"alert id(s) not resolved: {'; '.join(problems)}")
    return list(dict.fromkeys(resolved))


@dataclass(frozen=True)
class Applied:
    """What `apply` did: the alert_triage version it wrote (None: nothing), the alerts it changed,
    and those already as the change would leave them (nothing written for them)."""

    version: int | None
    changed: list[str]
    unchanged: list[str]


def apply(spark: SparkSession, lake: Lake, alert_ids: list[str], change: Change,
          now: datetime | None = None) -> Applied:
    """Apply `change` to the alerts `alert_ids` name (see `resolve_ids`) in one MERGE. An alert the
    change would leave as it is (closing a closed one, no note) is not written: no commit of nothing."""
    from pipelines.lake.merge import upsert

    resolved = resolve_ids(spark, lake, alert_ids)
    # The states read and the MERGE under one hold of the home's lock on the table: an `ack` judged on
    # a state read before another command's `close` committed would put the closed alert back.
    with lake.home.commit_lock(TRIAGE_TABLE):
        states = _states(spark, lake, resolved)
        inherited = {i for i, state in states.items() if not state.own}
        closed = [i[:12] for i in resolved
                  if change.status == ACKNOWLEDGED and i in states and states[i].status == CLOSED]
        if closed:  # acknowledging would put a closed alert back in the queue: that is `reopen`'s to say
            raise ValueError(f"alert(s) {', '.join(closed)} closed: `seclake alerts reopen` first; "
                             "nothing written")
        ids = resolved if change.note else _changing(states, resolved, change)
        unchanged = [i for i in resolved if i not in ids]
        if not ids:
            return Applied(None, [], unchanged)
        at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
        note = [(at, change.by, change.note)] if change.note else []
        schema = lake.spec(TRIAGE_TABLE).schema

        def row(i: str) -> tuple:
            if i not in inherited:  # the MERGE keeps what the change leaves unset
                return i, change.status, change.assignee, note, change.by, at
            # Its first row starts from the triage its finding had under an earlier version of the rule.
            was = states[i]
            return (i, change.status or was.status, change.assignee or was.assignee, [*was.notes, *note],
                    change.by, at)

        rows = spark.createDataFrame([row(i) for i in ids], schema)
        lake.ensure(spark, TRIAGE_TABLE)
        version = upsert(spark, lake.path(TRIAGE_TABLE), rows, "alert_id",
                         update={"status": "coalesce(s.status, t.status)",
                                 "assignee": "coalesce(s.assignee, t.assignee)",
                                 "notes": "concat(coalesce(t.notes, array()), s.notes)",
                                 "updated_by": "s.updated_by", "updated_at": "s.updated_at"},
                         insert={"alert_id": "s.alert_id", "status": f"coalesce(s.status, '{OPEN}')",
                                 "assignee": "s.assignee", "notes": "s.notes", "updated_by": "s.updated_by",
                                 "updated_at": "s.updated_at"}, lock=nullcontext())
        return Applied(version, ids, unchanged)


@dataclass(frozen=True)
class State:
    """An alert's triage: its own row's (`own`), or the one its finding had under an earlier
    version of the rule."""

    status: str
    assignee: str | None
    notes: list
    own: bool


def _states(spark: SparkSession, lake: Lake, ids: list[str]) -> dict[str, State]:
    """The triage of the alerts of `ids` that have one (their own or inherited, `triaged_alerts`)."""
    if not lake.exists(TRIAGE_TABLE):
        return {}
    rows = (triaged_alerts(spark, lake).where(F.col("alert_id").isin(ids) & F.col("updated_at").isNotNull())
            .select("alert_id", "status", "assignee", "notes", "own_triage").collect())
    return {r.alert_id: State(r.status, r.assignee, list(r.notes or []), r.own_triage) for r in rows}


def _changing(states: dict[str, State], ids: list[str], change: Change) -> list[str]:
    """The alerts of `ids` whose status or assignee `change` (without a note) would change."""
    def now(i: str) -> tuple[str, str | None]:
        return (states[i].status, states[i].assignee) if i in states else (OPEN, None)

    return [i for i in ids
            if (change.status is not None and now(i)[0] != change.status)
            or (change.assignee is not None and now(i)[1] != change.assignee)]


def triaged_alerts(spark: SparkSession, lake: Lake) -> DataFrame:
    """Every alert (suppressed ones too) with its triage state: `status` (open when never
    triaged), `assignee`, `notes`, `updated_by`, `updated_at`, its own or, for an alert never
    triaged, its finding's under an earlier version of the rule (`own_triage` False)."""
    _require_alerts(lake)
    alerts = lake.read(spark, ALERTS_TABLE)
    if "suppressed_by" not in alerts.columns:  # an alerts table written before suppressions
        alerts = alerts.withColumn("suppressed_by", F.lit(None).cast("string"))
    if not lake.exists(TRIAGE_TABLE):
        state = spark.createDataFrame([], lake.spec(TRIAGE_TABLE).schema)
    else:
        state = lake.read(spark, TRIAGE_TABLE)
    joined = alerts.join(state, "alert_id", "left").withColumn("own_triage", F.col("updated_at").isNotNull())
    # An alert never triaged takes the triage its finding last had under an earlier version of the rule:
    # a new version re-raises what analysts closed or took under the old one. Earlier versions only:
    # alerts of one version that share a window and host (other keys) are other findings.
    versions = F.collect_list(F.struct(F.col("updated_at").alias("_at"), F.col("rule_version").alias("_version"),
                                       *TRIAGE_COLUMNS)).over(Window.partitionBy(*FINDING_COLUMNS))
    earlier = F.array_max(F.filter(versions, lambda v: v["_at"].isNotNull()
                                   & (v["_version"] < F.col("rule_version"))))
    joined = joined.withColumn("_earlier", earlier)
    triage = {c: F.when(F.col("own_triage"), F.col(c)).otherwise(F.col("_earlier")[c]) for c in TRIAGE_COLUMNS}
    triage["status"] = F.coalesce(triage["status"], F.lit(OPEN))
    return joined.withColumns(triage).drop("_earlier")


def newest_versions(alerts: DataFrame) -> DataFrame:
    """`alerts` without those that a newer version of their rule raised again, for the same window
    and host: a new version's backfill re-raises what the earlier one found (another `alert_id`,
    which holds the version), and the queue and incidents show each finding once."""
    same = Window.partitionBy(*FINDING_COLUMNS)
    return (alerts.withColumn("_newest", F.max("rule_version").over(same))
            .where(F.col("rule_version").eqNullSafe(F.col("_newest"))).drop("_newest"))


def queue(spark: SparkSession, lake: Lake, statuses: tuple[str, ...] = (OPEN, ACKNOWLEDGED),
          rule: str | None = None, severity: str | None = None, host: str | None = None,
          since: datetime | None = None, suppressed: bool = False) -> DataFrame:
    """The alerts to look at: filtered by status, rule id, severity, host (IP, MAC or device
    name; MAC and name in any case) and window start, most severe first, newest first within a severity. Suppressed
    alerts only with `suppressed`."""
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown:
        raise ValueError(f"status {', '.join(unknown)}: expected one of {', '.join(STATUSES)}")
    frame = newest_versions(triaged_alerts(spark, lake)).where(F.col("status").isin(*statuses))
    if not suppressed:
        frame = frame.where(F.col("suppressed_by").isNull())
    if rule:
        frame = frame.where(F.col("rule_id") == rule)
    if severity:
        frame = frame.where(F.col("severity") == severity)
    if host:
        frame = frame.where((F.col("src_ip") == host) | (F.lower("mac") == host.lower())
                            | (F.lower("device") == host.lower()))
    if since is not None:
        frame = frame.where(F.col("window_start") >= F.lit(since.astimezone(timezone.utc)))
    # Most urgent first: the queue's order.
    position = F.array_position(F.array(*[F.lit(s) for s in reversed(SEVERITIES)]), F.col("severity"))
    rank = F.when(position > 0, position).otherwise(F.lit(99))  # 0 (or NULL): a word not on the scale, last
    return frame.orderBy(rank, F.col("window_start").desc(), "alert_id")
