"""`seclake rollback TABLE --to-version N|--empty [--cascade]`: undo a bad deploy and reprocess (docs/operations.md).

The rule, per stage (`pipelines.stages.stages()` gives who reads and writes what):

- A version that holds the same rows as the current one (only compactions or txn resets after
  it) needs nothing: the plan is empty.
- The stage that writes TABLE is *rewound*: TABLE goes back to version N; B is the last batch of
  that stage inside version N (the Delta txn of each commit names the stage and batch, and the
  batches a version holds are replayed through RESTOREs and resets, `_held`; a batch with no row
  for TABLE commits nothing there, so B runs up to the batch before the first one the current
  version holds and N does not); the stage's other tables go back to their newest version holding
  exactly its batches <= B; its checkpoint is cut back to batch B (offsets, commits and
  file-source logs after B are removed), so the next run re-reads exactly what came after B. The
  ETL's seven tables therefore always move together. A stage that keeps streaming state
  (attribution) cannot be cut back: only a rollback to before its first batch is allowed, which
  *resets* it. `--empty` (version None) resets the stage that writes TABLE: TABLE and its other
  tables emptied, its checkpoint deleted, so it rebuilds everything from its inputs.
- With `--cascade`, every stage that reads a changed table is *reset*: its checkpoint is deleted and
  every table it writes is emptied (Delta DELETE), so it recomputes from its inputs. A table several
  stages write (`late_events`) being emptied resets all of its writers.
- Rules are reset (checkpoint deleted; a new checkpoint gets a new writer id), those of another
  pack too (every `rule_*` checkpoint of the home). `alerts` goes back to its last version
  committed before the first commit this rollback removes upstream that changes rows (a compaction
  or a txn reset gives a rule nothing); alerts have stable ids and
  rules skip the ids the table holds, so re-running every rule adds exactly the missing ones. The
  platform's own alerts (a rule disabled, rows a rule dropped as late) are not the rules' output
  and no re-run writes them again: those the restore removes are appended back (not by
  `rollback alerts --empty`, which asks for none).
- Every table moved back also gets its writers' Delta txn ids set back to the last batch it keeps:
  RESTORE and DELETE leave them, and a writer replaying a batch id above them would be skipped.

Every stream reading a changed table must be reset. Streams skip commits that only remove files
(`read_stream`: so that retention's deletes do not stop them), so a reader left as it is would keep
what the removed rows gave it and take the reprocessed rows again: without `--cascade`, a rollback
that changes a table another query streams from is refused, naming them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipelines.checkpoint import files_after, newest, numbered, read_batch
from pipelines.dhcp_clock import DHCP_CLOCK
from pipelines.end_of_input import END_OF_INPUT
from pipelines.lake.registry import Lake
from pipelines.objectstore.path import remove_tree
from pipelines.operations.running import PENDING, ROLLBACK, pending_record
from pipelines.query import Stage
from pipelines.rules.spec import RULE_QUERY_PREFIX
from pipelines.rules.tables import ALERTS_TABLE

WRITE = "WRITE"  # the operation of a DeltaSink append (RESTORE, DELETE and txn resets are not batches)


# Why a rule's checkpoint goes: its alerts are computed again, and `alerts.unseen` keeps each once.
_RULES_RESET = "rules re-read their inputs; an alert the table still holds is not written twice"


@dataclass(frozen=True)
class TableStep:
    """One table's move: RESTORE to `target`, or delete every row (`target` None), then set `txn`."""

    table: str
    current: int
    target: int | None
    txn: dict[str, int]
    reason: str

    def line(self) -> str:
        goal = "empty (DELETE all rows)" if self.target is None else f"version {self.target}"
        txn = f"  txn {', '.join(f'{a}={b}' for a, b in sorted(self.txn.items()))}" if self.txn else ""
        return f"  table {self.table:<20} version {self.current} -> {goal}{txn}  ({self.reason})"

    def done(self) -> str:
        """The step once applied, in a few words (progress)."""
        return f"{self.table} {'emptied' if self.target is None else f'at version {self.target}'}"

    def changes(self) -> bool:
        """Whether the step changes the table: a RESTORE, a DELETE or a txn reset (a table its reset
        writers never wrote a row to stays as it is)."""
        return self.target != self.current or bool(self.txn)


@dataclass(frozen=True)
class CheckpointStep:
    """One query's checkpoint: cut back to batch `rewind_to`, or deleted (`rewind_to` None)."""

    stage: str
    path: Path
    rewind_to: int | None
    reason: str

    def line(self) -> str:
        action = "delete" if self.rewind_to is None else f"rewind to batch {self.rewind_to}"
        return f"  checkpoint {self.stage:<15} {action}  ({self.reason})"

    def done(self) -> str:
        """The step once applied, in a few words (progress)."""
        action = "deleted" if self.rewind_to is None else f"rewound to batch {self.rewind_to}"
        return f"checkpoint {self.stage} {action}"


@dataclass
class RollbackPlan:
    """What `apply_plan` will do; `lines()` is what `--dry-run` prints."""

    table: str
    version: int | None  # None: --empty
    cascade: bool
    tables: list[TableStep] = field(default_factory=list)
    checkpoints: list[CheckpointStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def steps(self) -> list[str]:
        """One line per change, tables first (none: nothing to do)."""
        return [*(s.line() for s in self.tables if s.changes()), *(c.line() for c in self.checkpoints)]

    def command(self) -> str:
        """The command line that makes this plan."""
        goal = "--empty" if self.version is None else f"--to-version {self.version}"
        return f"seclake rollback {self.table} {goal}{' --cascade' if self.cascade else ''}"

    def lines(self) -> list[str]:
        goal = "empty" if self.version is None else f"version {self.version}"
        head = f"rollback {self.table} to {goal}{' with --cascade' if self.cascade else ''}:"
        return [head, *(self.steps() or ["  nothing to do"]), *(f"  note: {n}" for n in self.notes)]


def _is_rule(stage: Stage) -> bool:
    return set(stage.writes) == {ALERTS_TABLE}


def _history(lake: Lake, table: str) -> list[dict[str, Any]]:
    from pipelines.lake.log import commits

    return sorted(commits(lake.path(table)), key=lambda c: c["version"])


# (generation, batch id, version of the append) of one writer's batches: a batch run again after a
# rollback cut its checkpoint back has the id it had, not the rows.
Held = frozenset[tuple[int, int, int]]


def _held(history: list[dict[str, Any]], app_id: str) -> dict[int, Held]:
    """Per version, the batches of `app_id` whose rows the table holds there: an append adds its
    batch, a RESTORE takes the restored version's, a DELETE of every row (a reset: the writer's new
    checkpoint numbers its batches from 0 again) starts a new generation; other commits (OPTIMIZE,
    txn resets, a retention DELETE of old rows) keep them.

    >>> history = [{"version": 0, "operation": "WRITE", "app_id": "etl", "batch_id": 0},
    ...            {"version": 1, "operation": "WRITE", "app_id": "etl", "batch_id": 1},
    ...            {"version": 2, "operation": "RESTORE", "parameters": {"version": 0}},
    ...            {"version": 3, "operation": "WRITE", "app_id": "etl", "batch_id": 1},
    ...            {"version": 4, "operation": "DELETE", "parameters": {"predicate": '["true"]'}},
    ...            {"version": 5, "operation": "WRITE", "app_id": "etl", "batch_id": 0}]
    >>> [sorted(batches) for batches in _held(history, "etl").values()]
    [[(0, 0, 0)], [(0, 0, 0), (0, 1, 1)], [(0, 0, 0)], [(0, 0, 0), (0, 1, 3)], [], [(1, 0, 5)]]
    """
    held: dict[int, Held] = {}
    now: Held = frozenset()
    generation = 0
    for commit in history:
        operation, parameters = commit["operation"], commit.get("parameters") or {}
        if operation == "RESTORE":
            restored = parameters.get("version")
            if restored is None or int(restored) not in held:
                raise ValueError(f"version {commit['version']} restored "
                                 f"{'a timestamp' if restored is None else f'version {restored}'}, which the "
                                 "table's log no longer holds: the batches it holds are unknown")
            now = held[int(restored)]
        elif operation == "DELETE" and parameters.get("predicate") in ('["true"]', "[]"):
            generation, now = generation + 1, frozenset()
        elif operation == WRITE and commit["app_id"] == app_id and commit["batch_id"] is not None:
            now = now | {(generation, commit["batch_id"], commit["version"])}
        held[commit["version"]] = now
    return held


def _kept_batch(history: list[dict[str, Any]], app_id: str, version: int) -> int | None:
    """The last batch of `app_id` that version `version` holds: up to the batch before the first one
    the current version holds and it does not (the ETL commits nothing to a table its batch has no
    row for), or None when the current version holds no batch it lacks. ValueError when it holds a
    batch the current version does not (undone since by a rollback or a reset)."""
    held = _held(history, app_id)
    then, now = held[version], held[history[-1]["version"]]
    extra = now - then
    if not then <= now or any(g != max(now)[0] for g, _, _ in extra) \
            or (extra and any(b >= min(b for _, b, _ in extra) for _, b, _ in then)):
        raise ValueError(f"version {version} holds batches of {app_id} that a later rollback or reset "
                         "removed: roll back to a version committed since, or use --empty")
    return min(b for _, b, _ in extra) - 1 if extra else None


def _before_batch(history: list[dict[str, Any]], app_id: str, batch: int) -> int | None:
    """The newest version holding exactly the batches <= `batch` of `app_id` that the current
    version holds (the current version when it holds no later one), None when no version does and
    the table is to hold none of them (every row deleted)."""
    held = _held(history, app_id)
    want = frozenset(p for p in held[history[-1]["version"]] if p[1] <= batch)
    found = [version for version, batches in held.items() if batches == want]
    if found:
        return max(found)
    if not want:
        return None
    raise ValueError(f"no version holds exactly {app_id}'s batches <= {batch}")


def _before_time(history: list[dict[str, Any]], cut: datetime) -> int | None:
    """The last version committed before `cut` (None: every version is at or after it)."""
    return max((c["version"] for c in history if c["timestamp"] < cut), default=None)


def _txn_resets(history: list[dict[str, Any]], target: int | None) -> dict[str, int]:
    """Per writer that appended after `target`: the last batch id it keeps (-1: none)."""
    upto = -1 if target is None else target
    # Rules are left out: a reset rule's new checkpoint writes under a new app id.
    apps = {c["app_id"] for c in history if c["version"] > upto and c["operation"] == WRITE and c["app_id"]
            and not c["app_id"].startswith("rule:")}
    return {app: max((b for _, b, _ in _held(history, app)[target]), default=-1) if target is not None else -1
            for app in sorted(apps)}


def _first_removed(history: list[dict[str, Any]], target: int | None) -> datetime | None:
    """When the first commit after `target` that changes rows was made (None: none does). Only
    those give a reader anything to derive: a txn reset an earlier rollback made right after its
    RESTORE is the first commit after that RESTORE's version, but alerts from before it would hold
    what that rollback undid.

    >>> from datetime import timezone
    >>> at = [datetime(2026, 11, 20, h, tzinfo=timezone.utc) for h in range(3)]
    >>> _first_removed([{"version": 0, "timestamp": at[0], "changes_data": True},
    ...                 {"version": 1, "timestamp": at[1], "changes_data": False},
    ...                 {"version": 2, "timestamp": at[2], "changes_data": True}], 0).hour
    2
    """
    upto = -1 if target is None else target
    removed = [c["timestamp"] for c in history if c["version"] > upto and c["changes_data"]]
    return min(removed) if removed else None


def plan_rollback(lake: Lake, table: str, version: int | None, cascade: bool = False,
                  rules_dir: str | Path | None = None) -> RollbackPlan:
    """The steps that bring `table` back to `version` (None: empty, its stage rebuilt) and keep every
    query consistent with it (see the module docstring for the rule). Reads only the Delta logs and
    checkpoints.
    """
    from pipelines import environment
    from pipelines.etl import KAFKA_QUERY_NAME
    from pipelines.stages import stages

    Lake.spec(table)  # an unknown name is a ValueError listing the known ones
    if not environment.kafka() and lake.home.checkpoint(KAFKA_QUERY_NAME).is_dir():
        # Planned without the Kafka stage, its rows would be undone and its checkpoint left past them.
        raise ValueError(f"this home's ETL also reads Kafka ({KAFKA_QUERY_NAME} has a checkpoint): set "
                         "SECLAKE_KAFKA as its stream runs with, so that the rollback rewinds that stage too")
    if not lake.exists(table):
        raise ValueError(f"table {table} does not exist in {lake.home.root}")
    all_stages = stages(rules_dir)
    histories: dict[str, list[dict[str, Any]]] = {}

    def history(name: str) -> list[dict[str, Any]]:
        if name not in histories:
            histories[name] = _history(lake, name)
        return histories[name]

    oldest, current = history(table)[0]["version"], history(table)[-1]["version"]
    if version is not None and (isinstance(version, bool) or not oldest <= version <= current):
        # Older than `oldest`: Delta's log clean-up removed those commits (their files may be gone too).
        raise ValueError(f"--to-version must be between {oldest} and {current} (the versions of {table} its log "
                         f"keeps), not {version}")
    plan = RollbackPlan(table, version, cascade)
    after = [c for c in history(table) if version is not None and c["version"] > version]
    if version is not None and not any(c["changes_data"] for c in after):
        if after:  # compaction, txn resets: restoring would change nothing but make readers start over
            operations = sorted({c["operation"] for c in after})
            plan.notes.append(f"version {version} holds the same rows as version {current}: the commits after it "
                              f"({', '.join(operations)}) change no data")
        return plan
    targets: dict[str, int | None] = {}
    emptied_by: dict[str, list[str]] = {}  # a table -> the stages whose reset empties it (late_events has four)
    kept_txn: dict[str, dict[str, int]] = {}  # a shared log kept as it is -> the txn its rewound writer goes back to
    reasons: dict[str, str] = {}
    resets: dict[str, str] = {}  # stage -> why its checkpoint is deleted
    handled: set[str] = set()  # the stage whose steps the request itself decides
    rules = [s for s in all_stages if _is_rule(s)]

    if table == ALERTS_TABLE:
        targets[table], reasons[table] = version, "requested"
        for rule in rules:
            resets[rule.name] = _RULES_RESET
    else:
        writers = [s for s in all_stages if table in s.writes]
        if not writers:
            raise ValueError(f"no query writes {table} (seclake's commands keep it): rollback rewinds what the "
                             "pipeline's queries write")
        if len(writers) != 1:
            raise ValueError(f"{table} is written by {len(writers)} stages ({', '.join(s.name for s in writers)}): "
                             "roll back the table they read instead, with --cascade")
        writer = writers[0]
        handled.add(writer.name)
        try:
            batch = -1 if version is None else _kept_batch(history(table), writer.name, version)
        except ValueError as exc:
            raise ValueError(f"{table}: {exc}") from None
        checkpoint = lake.home.checkpoint(writer.name)
        if version is None:
            resets[writer.name] = f"{table} is emptied; recomputed from its inputs"
            for name in writer.writes:
                if lake.exists(name):
                    emptied_by[name] = [writer.name]
                    targets[name] = None
                    reasons[name] = "requested" if name == table else f"{writer.name} is reset"
        elif batch is None:  # the stage appended nothing after it: its checkpoint and other tables stay
            targets[table], reasons[table] = version, "requested"
        elif batch >= 0 and (checkpoint / "state").is_dir():
            first = _before_batch(history(table), writer.name, -1)
            alone = (f"roll it back to version {first} (before that stage's first batch)"
                     if first is not None else "no version of it can be rolled back to alone (its version 0 is "
                                               "that stage's first batch)")
            raise ValueError(f"{table} is written by {writer.name}, whose checkpoint holds streaming state that "
                             f"cannot be rewound: {alone}; or roll back what it reads ({', '.join(writer.reads)}) "
                             f"to a version before the batches to undo, with --cascade")
        else:
            for name in writer.writes:
                if not lake.exists(name):
                    continue
                if name != table and any(name in s.writes for s in all_stages if s is not writer):
                    # A log other stages append to too (late_events): a restore would drop their
                    # records; only this writer's txn goes back, its undone batches' records stay.
                    targets[name], kept_txn[name] = history(name)[-1]["version"], {writer.name: batch}
                    reasons[name] = f"{writer.name} batches <= {batch}; the other writers' records stay"
                    continue
                try:
                    targets[name] = version if name == table else _before_batch(history(name), writer.name, batch)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
                reasons[name] = "requested" if name == table else f"{writer.name} batches <= {batch}"
            if checkpoint.is_dir():
                if batch < 0:
                    resets[writer.name] = f"nothing of {writer.name} is kept"
                elif (last := newest(checkpoint)) is not None and last > batch:
                    kept = numbered(checkpoint / "offsets")
                    if batch not in kept:  # Spark keeps a checkpoint's last 100 batches: refused before any change
                        raise ValueError(
                            f"{table} version {version} holds {writer.name}'s batches <= {batch}, but its checkpoint "
                            f"keeps batches {min(kept, default=0)}-{last} only (Spark keeps the last 100): roll back "
                            f"to a later version, or empty {table} and rebuild it from its inputs (--empty)")
                    if gone := _gone_files(lake, files_after(checkpoint, batch)):
                        # Retention removes landing files once read: the rewind would read them again,
                        # find them gone, and their rows, removed from the tables, would be lost.
                        raise ValueError(
                            f"{table} version {version}: {writer.name} would read again {len(gone)} landing "
                            f"file(s) that are gone (retention removes files already read): "
                            f"{', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}; put them back in "
                            f"landing, or roll back to a later version")
                    plan.checkpoints.append(CheckpointStep(writer.name, checkpoint, batch,
                                                           f"{table} version {version} holds its batches <= {batch}"))

    def changed() -> set[str]:
        """Tables whose rows the plan changes (emptying a table that never held a row changes none)."""
        return {t for t, v in targets.items() if v != history(t)[-1]["version"]
                and (v is not None or any(c["rows_added"] for c in history(t)))}

    cut = min((t for t in (_first_removed(history(n), v) for n, v in targets.items()) if t is not None),
              default=None)
    # Closure: reset readers of changed tables (--cascade) and co-writers of emptied shared tables.
    stale: dict[str, list[str]] = {}  # without --cascade: stage -> the changed tables it streams from
    grew = True
    while grew:
        grew = False
        moved = changed()
        for stage in all_stages:
            if _is_rule(stage) or stage.name in resets or stage.name in handled:
                continue
            shares = [t for t in stage.writes if t in moved and targets[t] is None]
            reads = [t for t in stage.reads if t in moved]
            if shares or (cascade and reads):
                resets[stage.name] = (f"reads {', '.join(reads)}" if reads
                                      else f"it also writes {', '.join(shares)}") + "; recomputed from its inputs"
                for name in stage.writes:
                    if lake.exists(name):
                        by = emptied_by.setdefault(name, [])
                        by.append(stage.name)
                        targets[name] = None
                        reasons[name] = f"{', '.join(sorted(by))} {'are' if len(by) > 1 else 'is'} reset"
                grew = True
            elif reads and stage.name != END_OF_INPUT:  # its mark is read from statistics, not a stream
                stale[stage.name] = reads
    moved = changed()
    clock_kept = DHCP_CLOCK not in targets or targets[DHCP_CLOCK] is not None
    if "silver_dhcp" in moved and lake.exists(DHCP_CLOCK) and clock_kept:
        # The clock says how far silver_dhcp's DHCP has surely arrived: kept, it would stand past the
        # rows the ETL writes again, and dhcp_leases, rebuilt, would drop them as late. The ETL writes
        # it again as it goes (its own app id, `etl_clock`, reset with it).
        targets[DHCP_CLOCK] = None
        reasons[DHCP_CLOCK] = "silver_dhcp changes; the ETL writes the clock again"
    readers = [r for r in rules if any(t in moved for t in r.reads)]
    stale.update({r.name: [t for t in r.reads if t in moved] for r in readers if not cascade})
    if stale and table != ALERTS_TABLE:
        # Streams skip whole-file deletes (so that retention does not stop them): a reader left as
        # it is would keep what the removed rows gave it, and take the reprocessed rows again.
        raise ValueError(f"rolling back {table} changes {', '.join(sorted({t for ts in stale.values() for t in ts}))}, "
                         f"which {', '.join(sorted(stale))} stream from: add --cascade to recompute them "
                         "(they would keep what the removed rows gave them)")
    if table != ALERTS_TABLE and readers:
        if lake.exists(ALERTS_TABLE) and cut is not None:
            targets[ALERTS_TABLE] = _before_time(history(ALERTS_TABLE), cut)
            reasons[ALERTS_TABLE] = ("last version committed before the first removed upstream rows"
                                     if targets[ALERTS_TABLE] is not None else
                                     "every version was committed after the first removed upstream rows")
        alerts_moved = ALERTS_TABLE in changed()
        for rule in rules if alerts_moved else readers:
            resets[rule.name] = _RULES_RESET
    if any(_is_rule(s) and s.name in resets for s in all_stages) and lake.home.checkpoints.is_dir():
        # Rules of another pack (`--rules`) wrote alerts too: their checkpoints go with the others.
        for folder in sorted(lake.home.checkpoints.glob(f"{RULE_QUERY_PREFIX}*")):
            resets.setdefault(folder.name, "a rule not in this rules folder; reset with the others")
    for name, target in targets.items():
        now = history(name)[-1]["version"]
        try:
            txn = _txn_resets(history(name), target) if target != now else kept_txn.get(name, {})
        except ValueError as exc:  # its message names versions, not the table
            raise ValueError(f"{name}: {exc}") from None
        if target is None and not any(c["rows_added"] for c in history(name)):
            # Never held a row: nothing to delete, but its writers' empty batches still hold txn
            # ids, and a replayed batch Delta skips is never computed (a stateful query then
            # fails its state store commit validation).
            target = now
        plan.tables.append(TableStep(name, now, target, txn, reasons[name]))
    for stage_name, why in resets.items():
        path = lake.home.checkpoint(stage_name)
        if path.exists():
            plan.checkpoints.append(CheckpointStep(stage_name, path, None, why))
    return plan


def _gone_files(lake: Lake, uris: list[str]) -> list[str]:
    """The landing files of `uris` (as a file source records them) that are no longer there; a
    file recorded under the folder a moved home had is looked for under this home's landing."""
    from pipelines.etl import local_path
    from pipelines.objectstore.path import as_path
    from pipelines.operations.relocate import moved_here

    gone = []
    for uri in uris:
        if uri.startswith("file:"):
            local = local_path(uri)
            there = Path(moved_here(local, str(lake.home.landing)) or local)
        else:
            there = as_path(uri)
        if not there.exists():
            gone.append(uri)
    return gone


def apply_plan(spark: SparkSession, lake: Lake, plan: RollbackPlan,
               on_step: Callable[[TableStep | CheckpointStep], None] | None = None) -> None:
    """Carry out `plan`: tables first, then checkpoints, `on_step` told of each once done. Every step
    can be done again (a RESTORE to the same version, the same txn reset, a rewind or a removal
    already done), which is how `rollback` finishes a plan an interruption left half done (`PENDING`)."""
    from pipelines.lake.admin import delete_all, restore, set_transactions

    for step in filter(TableStep.changes, plan.tables):  # the steps `lines()` shows, no more
        path = lake.path(step.table)
        with lake.home.commit_lock(step.table):  # `rules enable`, a backtest may commit meanwhile
            if step.target is None:
                delete_all(spark, path)
            elif step.target != step.current:
                restore(spark, path, step.target)
            set_transactions(spark, path, step.txn)
        if step.table == ALERTS_TABLE and step.target != step.current and (plan.table, plan.version) != (
                ALERTS_TABLE, None):  # `rollback alerts --empty` asks for no alert at all
            _keep_platform_alerts(spark, lake, step.current)
        if on_step is not None:
            on_step(step)
    for ck in plan.checkpoints:
        if ck.rewind_to is None:
            remove_tree(ck.path)
        else:
            rewind_checkpoint(ck.path, ck.rewind_to)
        if on_step is not None:
            on_step(ck)


def _keep_platform_alerts(spark: SparkSession, lake: Lake, version: int) -> None:
    """Append the platform's alerts that `alerts` held at `version` and holds no longer. Read from
    that version, not from the table before its move: done again after an interruption, each is
    added once."""
    from pyspark.sql import functions as F

    from pipelines.rules.status import append_platform_alerts
    from pipelines.rules.tables import PLATFORM_RULE_IDS

    held = lake.read(spark, ALERTS_TABLE, version=version).where(F.col("rule_id").isin(list(PLATFORM_RULE_IDS)))
    gone = held.join(lake.read(spark, ALERTS_TABLE).select("alert_id"), "alert_id", "left_anti").select(*held.columns)
    if not gone.isEmpty():
        append_platform_alerts(lake, gone)


def save_pending(lake: Lake, plan: RollbackPlan) -> None:
    """Write `plan` as the home's pending rollback (`PENDING`), atomically."""
    record = {"command": plan.command(), "table": plan.table, "version": plan.version, "cascade": plan.cascade,
              "tables": [asdict(t) for t in plan.tables],
              "checkpoints": [{"stage": c.stage, "rewind_to": c.rewind_to, "reason": c.reason}
                              for c in plan.checkpoints]}
    path = lake.home.root / PENDING
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, path)


def pending_plan(lake: Lake) -> RollbackPlan | None:
    """The plan of a rollback that was interrupted on this home (`PENDING`), or None."""
    record = pending_record(lake.home)
    if record is None:
        return None
    return RollbackPlan(record["table"], record["version"], record["cascade"],
                        tables=[TableStep(**t) for t in record["tables"]],
                        checkpoints=[CheckpointStep(c["stage"], lake.home.checkpoint(c["stage"]), c["rewind_to"],
                                                    c["reason"]) for c in record["checkpoints"]],
                        notes=["resumed: a run of this rollback was interrupted; its steps are done again "
                               "(each can be)"])


def rollback(spark: SparkSession | Callable[[], SparkSession] | None, lake: Lake, table: str, version: int | None,
             cascade: bool = False, dry_run: bool = False, rules_dir: str | Path | None = None,
             on_plan: Callable[[RollbackPlan], None] | None = None,
             on_step: Callable[[TableStep | CheckpointStep], None] | None = None) -> RollbackPlan:
    """Plan and (unless `dry_run`) apply a rollback; the rollback refuses while a stream runs on the home.

    `spark` may be a function making the session: it is called only when there is something to do.
    `on_plan` sees the plan before anything changes (the command prints it), `on_step` each step done.
    """
    from pipelines.operations.running import refuse_while_streaming, writer_lock

    if not dry_run:  # a dry run only reads: a look at the plan while the stream runs
        refuse_while_streaming(lake.home, "a rollback")
    # Taken before the pending plan is read: a rollback running now is named as the lock's holder.
    with nullcontext() if dry_run else writer_lock(lake.home, ROLLBACK):
        # A second plan made from a half-rolled-back home would miss steps: once the table named is
        # restored, it finds no batch of its writer to undo, and rewinds no checkpoint.
        plan = pending_plan(lake)
        if plan is not None and (plan.table, plan.version, plan.cascade) != (table, version, cascade):
            raise ValueError(f"a rollback was interrupted on {lake.home.root}: `{plan.command()}` finishes it "
                             "first (docs/operations.md)")
        plan = plan or plan_rollback(lake, table, version, cascade, rules_dir)
        if on_plan is not None:
            on_plan(plan)
        if not dry_run and plan.steps():
            if spark is None:
                raise ValueError("a rollback that is not a dry run needs a SparkSession")
            save_pending(lake, plan)
            apply_plan(spark if isinstance(spark, SparkSession) else spark(), lake, plan, on_step)
            (lake.home.root / PENDING).unlink()
    return plan


# --- checkpoints ----------------------------------------------------------------------------------

def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def rewind_checkpoint(checkpoint: Path, batch: int) -> None:
    """Cut a stateless query's checkpoint back so that `batch` is its last committed batch.

    Removes offsets and commits after `batch`, and the entries of file-source logs
    (`sources/<n>/`) past the offsets `batch` ended at, so the files read after it are read again.
    """
    if (checkpoint / "state").is_dir():
        raise ValueError(f"checkpoint {checkpoint} holds streaming state, which cannot be rewound")
    offsets, commits = numbered(checkpoint / "offsets"), numbered(checkpoint / "commits")
    if batch not in offsets:
        raise ValueError(f"checkpoint {checkpoint} has no batch {batch} (batches: {sorted(offsets)})")
    # A source used twice in the plan (the ETL unions each landing stream into every parse) repeats.
    ends = read_batch(checkpoint, batch).offsets
    logs = sorted(numbered(checkpoint / "sources").items())
    if logs:
        if len(ends) % len(logs) or any(ends[i] != ends[i % len(logs)] for i in range(len(ends))) \
                or any("logOffset" not in e for e in ends[:len(logs)]):
            raise ValueError(f"checkpoint {checkpoint}: cannot match the offsets of batch {batch} to its "
                             f"{len(logs)} file-source logs")
        for (_, folder), end in zip(logs, ends):
            _truncate_source_log(folder, int(end["logOffset"]))
    # From the newest batch down, each batch's commit before its offsets: never a commit without its
    # offsets, whatever point an interruption cuts this at (the rollback then does it again).
    for number in sorted(set(offsets) | set(commits), reverse=True):
        if number <= batch:
            break
        for log in (commits, offsets):
            if number in log:
                _remove(log[number])


def _truncate_source_log(folder: Path, last: int) -> None:
    """Keep a file-source log's entries up to log batch `last`; entries only a removed compaction
    held (Spark deletes the files a compaction replaced) are written back as per-batch files."""
    orphaned: dict[int, list[str]] = {}
    logs = numbered(folder)
    for number, path in logs.items():
        if number > last and path.name.endswith(".compact"):
            for line in path.read_text().splitlines()[1:]:
                if line.strip():
                    orphaned.setdefault(int(json.loads(line)["batchId"]), []).append(line)
    kept = {n: p for n, p in logs.items() if n <= last}
    compactions = [n for n, p in kept.items() if p.name.endswith(".compact")]
    start = max(compactions) + 1 if compactions else 0
    # Written back (each whole, by a rename) before the compaction holding them goes: a rewind cut
    # short between the two and done again would find them nowhere.
    for number in range(start, last + 1):
        if number not in kept:
            written = folder / f".{number}.tmp"
            written.write_text("\n".join(["v1", *orphaned.get(number, [])]))
            os.replace(written, folder / str(number))
    for number, path in logs.items():
        if number > last:
            _remove(path)
