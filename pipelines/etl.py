"""Streaming ETL: landing files -> bronze_<source>, quarantine and silver_<kind> Delta tables.

One query (`etl`, checkpoint `checkpoints/etl`) reads `landing/<source>/` of every registered
source (`pipelines/parsers/sources.py`) with Spark's file source and, per micro-batch, commits every
table it writes with the same txn(app_id="etl", batch_id): good rows, quarantined rows and raw
lines of one batch land together or, after a crash, are replayed together.
"""
from __future__ import annotations

from datetime import datetime
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.parsers import parse, split_lines, to_bronze, to_quarantine, to_silver
from pipelines.parsers.sources import silver_feeds, sources
from pipelines.query import BatchStats, RunningQuery, Stage, start_query
from pipelines.schemas import SILVER_SCHEMAS
from pipelines.settings import Settings

QUERY_NAME = "etl"


def etl_tables() -> tuple[str, ...]:
    """The tables the ETL writes: one bronze table per source, quarantine, every silver table.

    >>> etl_tables()[:3]
    ('bronze_zeek', 'bronze_suricata', 'quarantine')
    """
    return (*(s.bronze_table for s in sources()), "quarantine", *SILVER_SCHEMAS)


def landing_files(spark: SparkSession, lake: Lake, settings: Settings) -> DataFrame:
    """A stream of whole landing files: (source, file, text), one row per file.

    Whole files, so each line keeps its file, line number and the Zeek header above it.
    Spark's file source ignores names starting with `.` or `_`: the sensors' temp files.
    """
    streams = []
    for source in (s.name for s in sources()):
        folder = lake.home.landing / source
        folder.mkdir(parents=True, exist_ok=True)
        streams.append(
            spark.readStream.schema("value STRING").format("text")
            .option("wholetext", True)
            .option("maxFilesPerTrigger", settings.max_files_per_trigger)
            # A late file keeps an old modification time; never age it out.
            .option("maxFileAge", "3650d")
            # A file deleted after listing is skipped, not fatal: the query must outlive a sensor's cleanup.
            .option("ignoreMissingFiles", True)
            .load(str(folder))
            .select(F.lit(source).alias("source"), F.col("_metadata.file_path").alias("file"),
                    F.col("value").alias("text")))
    return reduce(DataFrame.unionByName, streams)


def parse_files(files: DataFrame) -> DataFrame:
    """Whole landing files (`landing_files`) -> one parsed row per data line (PARSED_COLUMNS).

    Applied to the stream, not inside foreachBatch: the parse plan is large, and Spark parses and
    analyses it once per query start instead of once per micro-batch.
    """
    frames = [parse(split_lines(files.where(F.col("source") == s.name), s.name), s.name) for s in sources()]
    return reduce(DataFrame.unionByName, frames)


class EtlWriter:
    """The `foreachBatch` function of the ETL query (`start`): one parsed micro-batch -> every ETL table,
    all committed with txn(app_id="etl", batch_id)."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.sources = sources()
        self.sinks = {name: lake.sink(name, app_id=QUERY_NAME) for name in etl_tables()}
        self.history: list[BatchStats] = []

    def __call__(self, lines: DataFrame, batch_id: int) -> None:
        spark = lines.sparkSession
        stats = BatchStats(batch_id)
        ingest = {"batch_id": F.lit(batch_id).cast("long"), "ingest_time": F.current_timestamp()}
        # In-batch repeats of an event are flagged once here (one shuffle) instead of per silver table.
        first = Window.partitionBy("event_id").orderBy("file", "line_number")
        parsed = lines.withColumn("_repeat", F.row_number().over(first) > 1).persist()
        try:
            # What went in, in its own units: Spark's numInputRows counts whole files, and each file
            # once per source branch that scans it. (A file of header lines only has no row here.)
            [read] = parsed.agg(F.count_distinct("file").alias("files"), F.count(F.lit(1)).alias("lines")).collect()
            stats.read = {"files": read["files"], "data lines": read["lines"]}
            quarantine = to_quarantine(parsed).withColumns(ingest)
            stats.record(self.sinks["quarantine"].write_batch(quarantine, batch_id))
            for source in self.sources:
                bronze = to_bronze(parsed.where(F.col("source") == source.name)).withColumns(ingest)
                stats.record(self.sinks[source.bronze_table].write_batch(bronze, batch_id))
            fresh = parsed.where(~F.col("_repeat"))
            bounds = self._bounds(fresh)
            for table in SILVER_SCHEMAS:
                rows = self._unseen(spark, table, to_silver(fresh, table), bounds.get(table))
                stats.record(self.sinks[table].write_batch(rows, batch_id))
        finally:
            parsed.unpersist()
        self.history.append(stats)

    def close(self) -> None:
        """Nothing to release: every batch's commits are complete when the batch ends."""

    @staticmethod
    def _bounds(parsed: DataFrame) -> dict[str, tuple[datetime, datetime]]:
        """Per silver table, the batch's earliest and latest good event time (one aggregation for all)."""
        rows = (parsed.where(F.col("error").isNull()).groupBy("source", "kind")
                .agg(F.min("event_time").alias("lo"), F.max("event_time").alias("hi")).collect())
        by_kind = {(r.source, r.kind): (r.lo, r.hi) for r in rows}
        bounds = {}
        for table in SILVER_SCHEMAS:
            spans = [by_kind[f] for f in silver_feeds(table) if f in by_kind]
            if spans:
                bounds[table] = (min(lo for lo, _ in spans), max(hi for _, hi in spans))
        return bounds

    def _unseen(self, spark: SparkSession, table: str, rows: DataFrame,
                bounds: tuple[datetime, datetime] | None) -> DataFrame:
        """Drop rows whose event_id the table already holds between this batch's first and last event times.

        event_id hashes the raw line, timestamp included, so a repeat carries the original's
        exact event_time: the time range is exact, not a tuning window. The table itself is the
        dedup state: it survives restarts and is exactly as committed.
        """
        if bounds is None or not self.lake.exists(table):
            return rows
        lo, hi = F.lit(bounds[0]), F.lit(bounds[1])
        seen = (self.lake.read(spark, table)
                .where(F.col("event_date").between(F.to_date(lo), F.to_date(hi)))
                .where(F.col("event_time").between(lo, hi))
                .select("event_id"))
        return rows.join(seen, "event_id", "left_anti")


def start(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> RunningQuery:
    """Start the ETL query with `trigger` (AvailableNow for run-once, processing time for streaming)."""
    writer = EtlWriter(lake)
    query = start_query(parse_files(landing_files(spark, lake, settings)), QUERY_NAME, writer,
                        lake.home.checkpoint(QUERY_NAME), trigger)
    return RunningQuery(QUERY_NAME, query, writer, etl_tables())


def stage() -> Stage:
    """The ETL as a pipeline stage: reads landing folders (no table), writes `etl_tables()`."""
    return Stage(QUERY_NAME, reads=(), writes=etl_tables(), start=start)
