"""`seclake retention`: delete what is older than each layer's retention (`pipelines/settings.py`).

Tables: Delta `DELETE WHERE event_date < cutoff` (files go at the next VACUUM, after its own
retention); bronze's raw lines not while the quarantine check counts them (read within its window),
and those that never became events by the time they were read (`ingest_time`), as quarantine's;
late_events by the time each record was made (`recorded_at`). Landing
files: removed when their modification time is before the cutoff *and* a batch the ETL
committed read them (`etl.processed_files`), so nothing unprocessed goes.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.etl import landing_paths, processed_files
from pipelines.lake.registry import Lake
from pipelines.operations.relocate import moved_here
from pipelines.settings import QUARANTINE_WINDOW_HOURS, Settings

LAYER_SETTING = {"bronze": "retention_bronze_days", "silver": "retention_silver_days",
                 "enriched": "retention_enriched_days", "gold": "retention_gold_days"}
# The column a table ages by, the first it has: its events' day, else when its lines were read
# (quarantine) or its record made (late_events). A table with none (the state tables) is kept.
AGE_COLUMNS = ("event_date", "ingest_time", "recorded_at")


@dataclass(frozen=True)
class RetentionStep:
    """One table or the landing folder: what is (or would be) removed, older than `cutoff`."""

    target: str
    cutoff: date | None
    removed: int
    unit: str
    note: str = ""

    def line(self, dry_run: bool) -> str:
        if self.cutoff is None:
            return f"{self.target:<20} kept ({self.note or 'no retention'})"
        verb = "would delete" if dry_run else "deleted"
        return f"{self.target:<20} {verb} {self.removed} {self.unit} before {self.cutoff}{self.note}"


def _raw_lines(cutoff: date, today: date) -> str:
    """Bronze's condition: a line by its event's day, unless it was read within the quarantine
    check's window (a backfill of old logs deleted at once would leave that check only its bad
    lines: a blocking check failed); a line with no event day (it did not parse) by when it was read.

    >>> print(_raw_lines(date(2026, 1, 30), date(2026, 3, 1)).replace(" OR ", "\\nOR "))
    (event_date < DATE'2026-01-30' AND ingest_time < TIMESTAMP'2026-02-28 00:00:00')
    OR (event_date IS NULL AND ingest_time < TIMESTAMP'2026-01-30 00:00:00')
    """
    fresh = datetime.combine(today, time()) - timedelta(hours=QUARANTINE_WINDOW_HOURS)
    return (f"(event_date < DATE'{cutoff.isoformat()}' AND ingest_time < TIMESTAMP'{fresh:%Y-%m-%d %H:%M:%S}') "
            f"OR (event_date IS NULL AND ingest_time < TIMESTAMP'{cutoff.isoformat()} 00:00:00')")


def _cutoff(days: int, today: date) -> date | None:
    return None if days <= 0 else today - timedelta(days=days)


def apply_retention(spark: SparkSession | Callable[[], SparkSession] | None, lake: Lake,
                    settings: Settings = Settings(), dry_run: bool = False, today: date | None = None
                    ) -> list[RetentionStep]:
    """Delete rows and processed landing files older than each layer's retention (or, with
    `dry_run`, count them). `today` defaults to the UTC date. `spark` may be a function making
    the session, called once the home's writer lock is held: a refusal comes before a JVM starts."""
    from pipelines.operations.running import refuse_while_streaming, writer_lock

    if not dry_run:  # a dry run only reads: a look at the plan while the stream runs
        refuse_while_streaming(lake.home, "retention")
    with nullcontext() if dry_run else writer_lock(lake.home, "seclake retention"):
        session = spark() if callable(spark) else spark
        return _apply(session, lake, settings, dry_run, today or datetime.now(timezone.utc).date())


def _apply(spark: SparkSession | None, lake: Lake, settings: Settings, dry_run: bool,
           today: date) -> list[RetentionStep]:
    """`apply_retention` as of `today`, under the home's writer lock unless a dry run."""
    steps = []
    for name in (n for n in lake.names() if lake.exists(n)):
        spec = lake.spec(name)
        cutoff = _cutoff(getattr(settings, LAYER_SETTING[spec.layer]), today)
        column = next((c for c in AGE_COLUMNS if c in spec.schema.fieldNames()), None)
        if cutoff is None or column is None:
            steps.append(RetentionStep(name, None, 0, "rows", "no retention" if cutoff is None
                                       else "no event_date, ingest_time or recorded_at"))
            continue
        if spark is None:
            raise ValueError("retention of tables needs a SparkSession")
        condition = (_raw_lines(cutoff, today) if spec.layer == "bronze" and column == "event_date"
                     else f"{column} < DATE'{cutoff.isoformat()}'")
        old = lake.read(spark, name).where(condition).count()
        if old and not dry_run:
            from pipelines.lake.admin import delete_where

            with lake.home.commit_lock(name):  # `rules enable`, a backtest may commit meanwhile
                delete_where(spark, lake.path(name), condition)
        steps.append(RetentionStep(name, cutoff, old, "rows"))
    landing_cut = _cutoff(settings.retention_landing_days, today)
    if landing_cut is None:
        steps.append(RetentionStep("landing", None, 0, "files"))
        return steps
    limit = datetime.combine(landing_cut, datetime.min.time(), timezone.utc).timestamp()
    # A copied or moved home's checkpoint names the old home's landing until its next run: the same files.
    landing = str(lake.home.landing)
    processed = {Path(moved_here(p, landing) or p).resolve() for p in processed_files(lake)}
    # What the ETL lists (`landing_paths`): a sensor's temp file is neither input nor "waiting".
    old_files = [p for p in map(Path, landing_paths(lake)) if p.stat().st_mtime < limit]
    ready = [p for p in old_files if p.resolve() in processed]
    if not dry_run:
        for path in ready:
            path.unlink(missing_ok=True)
    waiting = len(old_files) - len(ready)
    steps.append(RetentionStep("landing", landing_cut, len(ready), "files",
                               f" ({waiting} older but not yet processed: kept)" if waiting else ""))
    return steps
