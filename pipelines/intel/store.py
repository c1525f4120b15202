"""`indicators` (loaded with MERGE) and the sweep of retained history for matches.

Loading a feed upserts its indicators, keyed by (source, type, value): a known one gets its
`valid_until` and `loaded_at` moved on, a new one is inserted. Matching is done by the rules that
look `indicators` up (`lookups: [indicators]`, rules/intel/): in the stream they join each
micro-batch against the table's current version; after a load, the sweep runs the same rules as
a backtest over the last `sweep_days` and writes the alerts the table lacks. Same rule, same
alert ids: a match found by both is written once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.intel.feeds import read_feed
from pipelines.lake.registry import Lake
from pipelines.rules.spec import Rule
from pipelines.settings import MAX_DAYS

INDICATORS_TABLE = "indicators"


@dataclass(frozen=True)
class LoadResult:
    """What `load` did: indicators in the file, the lines skipped (each named, with its reason when
    known), the table's new version, alerts the sweep added, and the rules it ran (none: no rule in
    the folder looks indicators up)."""

    indicators: int
    skipped: tuple[str, ...]
    version: int
    alerts: int
    rules: tuple[str, ...]


def intel_rules(rules_dir: str | os.PathLike | None = None) -> list[Rule]:
    """The valid rules of the rules folder that look up `indicators`.

    >>> [r.slug for r in intel_rules()]
    ['threat_intel_domain', 'threat_intel_ip']
    """
    from pipelines.rules.pack import default_rules_dir, scan_rules

    return [r for r in scan_rules(rules_dir or default_rules_dir()).rules if INDICATORS_TABLE in r.lookups]


def check_days(valid_days: int, sweep_days: int) -> None:
    """ValueError unless each count of days is 1 to MAX_DAYS: a negative sweep searched the future
    (no alert, reported a success), one past MAX_DAYS overflowed a date after the MERGE committed.

    >>> check_days(30, 0)
    Traceback (most recent call last):
    ...
    ValueError: --valid-days 30 and --sweep-days 0: each must be 1 to 36500
    """
    if not (0 < valid_days <= MAX_DAYS and 0 < sweep_days <= MAX_DAYS):
        raise ValueError(f"--valid-days {valid_days} and --sweep-days {sweep_days}: each must be 1 to {MAX_DAYS}")


def load(spark: SparkSession, lake: Lake, path: Path, source: str | None = None, valid_days: int = 30,
         sweep_days: int = 90, rules_dir: str | os.PathLike | None = None) -> LoadResult:
    """Upsert the indicators of the feed at `path` (source: the file name unless given), valid
    from now for `valid_days`, then sweep with the intel rules of `rules_dir`."""
    from pipelines.lake.merge import upsert
    from pipelines.operations.running import refuse_while_rolling_back

    check_days(valid_days, sweep_days)
    refuse_while_rolling_back(lake.home, f"intel load {path.name}")  # its sweep appends alerts
    feed = read_feed(path)
    at = datetime.now(timezone.utc)
    name = source or path.name
    rows = spark.createDataFrame([(f"{name}\u001f{kind}\u001f{value}", name, kind, value, at,
                                   at + timedelta(days=valid_days), at) for kind, value in feed.indicators],
                                 lake.spec(INDICATORS_TABLE).schema)
    lake.ensure(spark, INDICATORS_TABLE)
    version = upsert(spark, lake.path(INDICATORS_TABLE), rows, "indicator_key",
                     update={"valid_until": "s.valid_until", "loaded_at": "s.loaded_at"},
                     insert={c: f"s.{c}" for c in rows.columns}, lock=lake.home.commit_lock(INDICATORS_TABLE))
    rules = intel_rules(rules_dir)
    alerts = sweep(spark, lake, rules, sweep_days)
    return LoadResult(len(feed.indicators), tuple(feed.skipped), version, alerts, tuple(r.slug for r in rules))


def sweep(spark: SparkSession, lake: Lake, rules: list[Rule], sweep_days: int = 90) -> int:
    """Run each of `rules` over the events of the last `sweep_days` (from midnight UTC, so its
    daily windows are whole) and add the alerts `alerts` lacks; how many were added. A rule whose
    input table does not exist yet has no history to sweep."""
    from pipelines.rules.backtest import write_missing

    first_day = (datetime.now(timezone.utc) - timedelta(days=sweep_days)).date()
    start = datetime.combine(first_day, datetime.min.time(), timezone.utc)
    added = 0
    for rule in rules:
        if all(lake.exists(t) for t in rule.tables):
            added += write_missing(spark, lake, rule, start=start)[1]
    return added
