"""`seclake rollback TABLE --to-version N|--empty [--cascade]`: undo a bad deploy and reprocess (docs/operations.md).

The rule, per stage (`pipelines.stages.stages()` gives who reads and writes what):

- The stage that writes TABLE is *rewound*: TABLE goes back to version N; B is the last batch of
  that stage inside version N (the Delta txn of each commit names the stage and batch; a batch with
  no row for TABLE commits nothing there, so B runs up to the stage's next append); the stage's
  other tables go back to their last version holding batches <= B; its checkpoint is cut back to
  batch B (offsets, commits and file-source logs after B are removed), so the next run re-reads
  exactly what came after B. The ETL's seven tables therefore always move together. A stage that
  keeps streaming state (attribution) cannot be cut back: only a rollback to before its first batch
  is allowed, which *resets* it. `--empty` (version None) resets the stage that writes TABLE: TABLE
  and its other tables emptied, its checkpoint deleted, so it rebuilds everything from its inputs.
- With `--cascade`, every stage that reads a changed table is *reset*: its checkpoint is deleted and
  every table it writes is emptied (Delta DELETE), so it recomputes from its inputs. A table several
  stages write (`late_events`) being emptied resets all of its writers.
- Rules are reset (checkpoint deleted; a new checkpoint gets a new writer id). `alerts` goes back
  to its last version committed before the first commit this rollback removes upstream; alerts
  have stable ids and rules skip the ids the table holds, so re-running every rule adds exactly
  the missing ones.
- Every table moved back also gets its writers' Delta txn ids set back to the last batch it keeps:
  RESTORE and DELETE leave them, and a writer replaying a batch id above them would be skipped.

Every stream reading a changed table must be reset: Delta's streaming source stops at a commit
that removes rows. Without `--cascade` such readers are listed as warnings.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipelines.checkpoint import newest, numbered, read_batch
from pipelines.lake.registry import Lake
from pipelines.objectstore.path import remove_tree
from pipelines.query import Stage
from pipelines.rules.tables import ALERTS_TABLE

WRITE = "WRITE"  # the operation of a DeltaSink append (RESTORE, DELETE and txn resets are not batches)


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


@dataclass
class RollbackPlan:
    """What `apply_plan` will do; `lines()` is what `--dry-run` prints."""

    table: str
    version: int | None  # None: --empty
    cascade: bool
    tables: list[TableStep] = field(default_factory=list)
    checkpoints: list[CheckpointStep] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        goal = "empty" if self.version is None else f"version {self.version}"
        head = f"rollback {self.table} to {goal}{' with --cascade' if self.cascade else ''}:"
        changes = [s.line() for s in self.tables if s.target != s.current or s.txn]
        steps = [*changes, *(c.line() for c in self.checkpoints)]
        return [head, *(steps or ["  nothing to do"]), *(f"  warning: {w}" for w in self.warnings)]


def _is_rule(stage: Stage) -> bool:
    return set(stage.writes) == {ALERTS_TABLE}


def _history(lake: Lake, table: str) -> list[dict[str, Any]]:
    from pipelines.lake.log import commits

    return sorted(commits(lake.path(table)), key=lambda c: c["version"])


def _last_batch(history: list[dict[str, Any]], app_id: str, upto: int | None) -> int:
    """The highest batch `app_id` appended at or before version `upto` (-1: none, or `upto` None)."""
    if upto is None:
        return -1
    return max((c["batch_id"] for c in history
                if c["version"] <= upto and c["operation"] == WRITE and c["app_id"] == app_id), default=-1)


def _kept_batch(history: list[dict[str, Any]], app_id: str, version: int) -> int | None:
    """The last batch of `app_id` that version `version` holds: up to the batch before the stage's next
    append (the ETL commits nothing to a table its batch has no row for), or None when the stage
    appended nothing after `version`."""
    later = [c["batch_id"] for c in history if c["version"] > version and c["operation"] == WRITE
             and c["app_id"] == app_id and c["batch_id"] is not None]
    return max(_last_batch(history, app_id, version), min(later) - 1) if later else None


def _before_batch(history: list[dict[str, Any]], app_id: str, batch: int) -> int | None:
    """The last version before `app_id`'s first append of a batch above `batch`: the table's current
    version when there is none, None when it is version 0 (nothing before it to restore)."""
    later = [c["version"] for c in history if c["operation"] == WRITE and c["app_id"] == app_id
             and c["batch_id"] is not None and c["batch_id"] > batch]
    if not later:
        return history[-1]["version"]
    first = min(later)
    return first - 1 if first > 0 else None


def _before_time(history: list[dict[str, Any]], cut: datetime) -> int | None:
    """The last version committed before `cut` (None: every version is at or after it)."""
    return max((c["version"] for c in history if c["timestamp"] < cut), default=None)


def _txn_resets(history: list[dict[str, Any]], target: int | None) -> dict[str, int]:
    """Per writer that appended after `target`: the last batch id it keeps (-1: none)."""
    upto = -1 if target is None else target
    # Rules are left out: a reset rule's new checkpoint writes under a new app id.
    apps = {c["app_id"] for c in history if c["version"] > upto and c["operation"] == WRITE and c["app_id"]
            and not c["app_id"].startswith("rule:")}
    return {app: _last_batch(history, app, target) for app in sorted(apps)}


def _first_removed(history: list[dict[str, Any]], target: int | None) -> datetime | None:
    upto = -1 if target is None else target
    removed = [c["timestamp"] for c in history if c["version"] > upto]
    return min(removed) if removed else None


def plan_rollback(lake: Lake, table: str, version: int | None, cascade: bool = False,
                  rules_dir: str | Path | None = None) -> RollbackPlan:
    """The steps that bring `table` back to `version` (None: empty, its stage rebuilt) and keep every
    query consistent with it (see the module docstring for the rule). Reads only the Delta logs and
    checkpoints.
    """
    from pipelines.stages import stages

    Lake.spec(table)  # an unknown name is a ValueError listing the known ones
    if not lake.exists(table):
        raise ValueError(f"table {table} does not exist in {lake.home.root}")
    all_stages = stages(rules_dir)
    histories: dict[str, list[dict[str, Any]]] = {}

    def history(name: str) -> list[dict[str, Any]]:
        if name not in histories:
            histories[name] = _history(lake, name)
        return histories[name]

    current = history(table)[-1]["version"]
    if version is not None and (isinstance(version, bool) or not 0 <= version <= current):
        raise ValueError(f"--to-version must be between 0 and {current} (the versions of {table}), not {version}")
    plan = RollbackPlan(table, version, cascade)
    targets: dict[str, int | None] = {}
    reasons: dict[str, str] = {}
    resets: dict[str, str] = {}  # stage -> why its checkpoint is deleted
    rules = [s for s in all_stages if _is_rule(s)]

    if table == ALERTS_TABLE:
        targets[table], reasons[table] = version, "requested"
        for rule in rules:
            resets[rule.name] = "rules re-read their inputs; alerts the table holds are not written twice"
    else:
        writers = [s for s in all_stages if table in s.writes]
        if len(writers) != 1:
            raise ValueError(f"{table} is written by {len(writers)} stages ({', '.join(s.name for s in writers)}): "
                             "roll back the table they read instead, with --cascade")
        writer = writers[0]
        batch = -1 if version is None else _kept_batch(history(table), writer.name, version)
        checkpoint = lake.home.checkpoint(writer.name)
        if version is None:
            resets[writer.name] = f"{table} is emptied; recomputed from its inputs"
            for name in writer.writes:
                if lake.exists(name):
                    targets[name] = None
                    reasons[name] = "requested" if name == table else f"{writer.name} is reset"
        elif batch is None:  # the stage appended nothing after it: its checkpoint and other tables stay
            targets[table], reasons[table] = version, "requested"
        elif batch >= 0 and (checkpoint / "state").is_dir():
            first = _before_batch(history(table), writer.name, -1)
            alone = (f"roll it back to version {first} or earlier (before that stage's first batch)"
                     if first is not None else "no version of it can be rolled back to alone (its version 0 is "
                                               "that stage's first batch)")
            raise ValueError(f"{table} is written by {writer.name}, whose checkpoint holds streaming state that "
                             f"cannot be rewound: {alone}; or roll back what it reads ({', '.join(writer.reads)}) "
                             f"to a version before the batches to undo, with --cascade")
        else:
            for name in writer.writes:
                if lake.exists(name):
                    targets[name] = version if name == table else _before_batch(history(name), writer.name, batch)
                    reasons[name] = "requested" if name == table else f"{writer.name} batches <= {batch}"
            if checkpoint.is_dir():
                if batch < 0:
                    resets[writer.name] = f"nothing of {writer.name} is kept"
                elif (last := newest(checkpoint)) is not None and last > batch:
                    plan.checkpoints.append(CheckpointStep(writer.name, checkpoint, batch,
                                                           f"{table} version {version} holds its batches <= {batch}"))

    def changed() -> set[str]:
        return {t for t, v in targets.items() if v != history(t)[-1]["version"]}

    cut = min((t for t in (_first_removed(history(n), v) for n, v in targets.items()) if t is not None),
              default=None)
    # Closure: reset readers of changed tables (--cascade) and co-writers of emptied shared tables.
    grew = True
    while grew:
        grew = False
        moved = changed()
        for stage in all_stages:
            if _is_rule(stage) or stage.name in resets or any(c.stage == stage.name for c in plan.checkpoints):
                continue
            shares = [t for t in stage.writes if t in moved]
            reads = [t for t in stage.reads if t in moved]
            if shares or (cascade and reads):
                resets[stage.name] = (f"it also writes {', '.join(shares)}" if shares
                                      else f"reads {', '.join(reads)}") + "; recomputed from its inputs"
                for name in stage.writes:
                    if lake.exists(name):
                        targets[name], reasons[name] = None, f"{stage.name} is reset"
                grew = True
            elif reads:
                plan.warnings.append(f"{stage.name} reads {', '.join(reads)}, which this rollback changes: "
                                     "it fails on its next run unless reset (use --cascade)")
    moved = changed()
    readers = [r for r in rules if any(t in moved for t in r.reads)]
    if table != ALERTS_TABLE and readers:
        if cascade:
            if lake.exists(ALERTS_TABLE) and cut is not None:
                targets[ALERTS_TABLE] = _before_time(history(ALERTS_TABLE), cut)
                reasons[ALERTS_TABLE] = "last version committed before the first removed upstream commit"
            alerts_moved = ALERTS_TABLE in changed()
            for rule in rules if alerts_moved else readers:
                resets[rule.name] = "rules re-read their inputs; alerts the table holds are not written twice"
        else:
            plan.warnings.append(f"rules {', '.join(r.name for r in readers)} read changed tables: "
                                 "their next run fails and alerts keep what the removed rows raised (use --cascade)")
    for name, target in targets.items():
        now = history(name)[-1]["version"]
        txn = _txn_resets(history(name), target) if target != now else {}
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


def apply_plan(spark: SparkSession, lake: Lake, plan: RollbackPlan) -> None:
    """Carry out `plan`: tables first, then checkpoints. Re-planning after an interruption gives the
    remaining steps again (targets are found from the history, which the steps only extend)."""
    from pipelines.lake.admin import delete_all, restore, set_transactions

    for step in plan.tables:
        path = lake.path(step.table)
        if step.target is None:
            delete_all(spark, path)
        elif step.target != step.current:
            restore(spark, path, step.target)
        set_transactions(spark, path, step.txn)
    for ck in plan.checkpoints:
        if ck.rewind_to is None:
            remove_tree(ck.path)
        else:
            rewind_checkpoint(ck.path, ck.rewind_to)


def rollback(spark: SparkSession | None, lake: Lake, table: str, version: int | None, cascade: bool = False,
             dry_run: bool = False, rules_dir: str | Path | None = None) -> RollbackPlan:
    """Plan and (unless `dry_run`) apply a rollback; the rollback refuses while a stream runs on the home."""
    from pipelines.operations.running import refuse_while_streaming

    if not dry_run:  # a dry run only reads: a look at the plan while the stream runs
        refuse_while_streaming(lake.home, "a rollback")
    plan = plan_rollback(lake, table, version, cascade, rules_dir)
    if not dry_run:
        if spark is None:
            raise ValueError("a rollback that is not a dry run needs a SparkSession")
        apply_plan(spark, lake, plan)
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
    offsets = numbered(checkpoint / "offsets")
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
    for sub in ("offsets", "commits"):
        for number, path in numbered(checkpoint / sub).items():
            if number > batch:
                _remove(path)


def _truncate_source_log(folder: Path, last: int) -> None:
    """Keep a file-source log's entries up to log batch `last`; entries only a removed compaction
    held (Spark deletes the files a compaction replaced) are written back as per-batch files."""
    orphaned: dict[int, list[str]] = {}
    for number, path in numbered(folder).items():
        if number > last:
            if path.name.endswith(".compact"):
                for line in path.read_text().splitlines()[1:]:
                    if line.strip():
                        orphaned.setdefault(int(json.loads(line)["batchId"]), []).append(line)
            _remove(path)
    kept = numbered(folder)
    compactions = [n for n, p in kept.items() if p.name.endswith(".compact")]
    start = max(compactions) + 1 if compactions else 0
    for number in range(start, last + 1):
        if number not in kept:
            (folder / str(number)).write_text("\n".join(["v1", *orphaned.get(number, [])]))
