"""Data-quality asset checks: Great Expectations suites (`pipelines/quality.py`) on table assets.

- `expectations` on every silver and enriched table: the table's GE suite (not-null ids and
  event times, IP/MAC formats, ports, enum value sets). Non-blocking: a failure is recorded on the
  asset (severity ERROR) and names the failing expectations.
- `quarantine_ratio` on every silver table written by the stage that quarantines lines (`etl`):
  quarantined / (good + quarantined) lines per source over recently ingested lines must stay
  under `max_ratio` (default 5%, `$SECLAKE_MAX_QUARANTINE_RATIO`). Blocking: when it fails,
  nothing downstream of that table (leases, enriched tables, rules, alerts) runs in that run.
  One op evaluates it for every such table (the sources' lines are counted once).

GE is imported when a check runs, not when the code location loads (it takes seconds).
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    Config,
    MetadataValue,
    asset_check,
    multi_asset_check,
)
from pydantic import Field

from assets.resources import LakeResource, SparkResource
from assets.tables import table_key
from pipelines import environment
from pipelines.lake.registry import Lake
from pipelines.parsers.sources import silver_feeds
from pipelines.query import Stage
from pipelines.settings import MAX_DAYS, MAX_QUARANTINE_RATIO, QUARANTINE_WINDOW_HOURS
from pipelines.stages import own_tables

QUALITY_LAYERS = ("silver", "enriched")
QUARANTINE_RATIO = "quarantine_ratio"


def max_quarantine_ratio() -> float:
    """The quarantine check's threshold: `$SECLAKE_MAX_QUARANTINE_RATIO`, else `MAX_QUARANTINE_RATIO`."""
    return environment.max_quarantine_ratio(MAX_QUARANTINE_RATIO)


# The windows' bounds: a window below them selects no row (a future date, an empty range) and the
# check passes on nothing; one above them overflows the date it starts from (pipelines.settings.MAX_DAYS).
class ExpectationsConfig(Config):
    engine: str = Field(default="auto", description="auto | spark | pandas (auto: pandas up to 200k rows)")
    window_days: int | None = Field(default=None, ge=0, le=MAX_DAYS,
                                    description=f"validate only the last N event dates (0: today; at most "
                                                f"{MAX_DAYS}); None: all")


class QuarantineRatioConfig(Config):
    max_ratio: float = Field(default_factory=max_quarantine_ratio, ge=0, le=1, allow_inf_nan=False,
                             description="largest allowed quarantined / (good + quarantined) per source, 0 to 1")
    window_hours: float | None = Field(default=QUARANTINE_WINDOW_HOURS, gt=0, le=MAX_DAYS * 24, allow_inf_nan=False,
                                       description=f"count lines ingested in the last N hours (above 0, at most "
                                                   f"{MAX_DAYS * 24}); None: all")


def _describe(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _result_metadata(outcome) -> dict:
    return {
        "suite": outcome.suite,
        "engine": outcome.engine,
        "rows": outcome.rows,
        "evaluated": outcome.evaluated,
        "failed": len(outcome.failed),
        "failed_expectations": MetadataValue.json([
            {"expectation": f.expectation, "column": f.column, "unexpected_count": f.unexpected_count,
             "unexpected_percent": f.unexpected_percent, "examples": f.examples, "error": f.error}
            for f in outcome.failed]),
    }


def expectations_check(table: str) -> AssetChecksDefinition:
    """The `expectations` check of one table: its GE suite over the table's current snapshot."""

    @asset_check(asset=table_key(table), name="expectations", blocking=False,
                 description=f"Great Expectations suite `{table}`: not-null ids and times, IP/MAC formats, "
                             "ports, enum value sets (pipelines/quality.py)")
    def _check(context: AssetCheckExecutionContext, config: ExpectationsConfig, spark: SparkResource,
               lake: LakeResource) -> AssetCheckResult:
        from pipelines import quality

        the_lake = lake.lake
        if not the_lake.exists(table):
            return AssetCheckResult(passed=True, metadata={"note": "table not created yet: nothing to validate"})
        outcome = quality.validate_table(spark.session, the_lake, table, engine=config.engine,
                                         window_days=config.window_days)
        context.log.info(outcome.describe())
        return AssetCheckResult(passed=outcome.success, severity=AssetCheckSeverity.ERROR,
                                description=_describe(outcome.describe()), metadata=_result_metadata(outcome))

    return _check


def quarantine_ratio_checks(tables: list[str]) -> AssetChecksDefinition:
    """The blocking `quarantine_ratio` check of each silver table in `tables`, over the sources that
    feed it: one op (`quarantine_ratio`) that counts every source's lines once."""
    feeds = {table: tuple(sorted({source for source, _ in silver_feeds(table)})) for table in tables}
    specs = [AssetCheckSpec(QUARANTINE_RATIO, asset=table_key(table), blocking=True,
                            description=f"quarantined / (good + quarantined) lines of {', '.join(sources)} under "
                                        "the limit; blocks everything downstream when exceeded")
             for table, sources in feeds.items()]

    @multi_asset_check(name=QUARANTINE_RATIO, specs=specs, can_subset=True,
                       description="quarantined / (good + quarantined) lines per source under the limit")
    def _check(context: AssetCheckExecutionContext, config: QuarantineRatioConfig, spark: SparkResource,
               lake: LakeResource) -> Iterator[AssetCheckResult]:
        from pipelines import quality

        chosen = {key.asset_key for key in context.selected_asset_check_keys}
        wanted = {table: sources for table, sources in feeds.items() if table_key(table) in chosen}
        every = sorted({source for sources in wanted.values() for source in sources})
        counts = quality.quarantine_counts(spark.session, lake.lake, every, window_hours=config.window_hours)
        for table, sources in wanted.items():
            mine = counts[counts["source"].isin(sources)].reset_index(drop=True)
            outcome = quality.validate_quarantine_ratio(mine, config.max_ratio)
            context.log.info(f"{table}: {outcome.describe()}")
            meta = _result_metadata(outcome)
            meta.update({
                "max_ratio": config.max_ratio,
                "window_hours": config.window_hours if config.window_hours is not None else "all",
                "counts": MetadataValue.md(_markdown(mine)),
                "max_observed_ratio": float(mine["ratio"].max()) if len(mine) else 0.0,
            })
            yield AssetCheckResult(asset_key=table_key(table), check_name=QUARANTINE_RATIO, passed=outcome.success,
                                   severity=AssetCheckSeverity.ERROR, description=_describe(outcome.describe()),
                                   metadata=meta)

    return _check


def _markdown(frame) -> str:
    head = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([head, *rows])


def quality_checks(stages: list[Stage]) -> list[AssetChecksDefinition]:
    """`expectations` on silver/enriched tables; `quarantine_ratio` on the silver tables that sources
    feed, of quarantining stages (not the ETL's `dhcp_clock`: no line of it is ever quarantined)."""
    checks = []
    quarantined = []
    for stage in stages:
        quarantines = "quarantine" in stage.writes
        for table in own_tables(stage, stages):
            layer = Lake.spec(table).layer
            if layer in QUALITY_LAYERS:
                checks.append(expectations_check(table))
            if quarantines and layer == "silver" and silver_feeds(table):
                quarantined.append(table)
    if quarantined:
        checks.append(quarantine_ratio_checks(quarantined))
    return checks
