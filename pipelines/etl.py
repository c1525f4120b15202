"""Streaming ETL: landing files -> bronze_<source>, quarantine and silver_<kind> Delta tables.

One query (`etl`, checkpoint `checkpoints/etl`) reads `landing/zeek/` and `landing/suricata/`
with Spark's file source and, per micro-batch, commits every table it writes with the same
txn(app_id="etl", batch_id): good rows, quarantined rows and raw lines of one batch land together
or, after a crash, are replayed together.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake
from pipelines.lake.sink import CommitResult
from pipelines.parsers import parse, split_lines, to_bronze, to_quarantine, to_silver
from pipelines.schemas import SILVER_SCHEMAS, SOURCES
from pipelines.settings import Settings

QUERY_NAME = "etl"
ETL_TABLES: tuple[str, ...] = (*(f"bronze_{s}" for s in SOURCES), "quarantine", *SILVER_SCHEMAS)


def landing_files(spark: SparkSession, lake: Lake, settings: Settings) -> DataFrame:
    """A stream of whole landing files: (source, file, text), one row per file.

    Whole files, so each line keeps its file, line number and the Zeek header above it.
    Spark's file source ignores names starting with `.` or `_`: the sensors' temp files.
    """
    streams = []
    for source in SOURCES:
        folder = lake.home.landing / source
        folder.mkdir(parents=True, exist_ok=True)
        streams.append(
            spark.readStream.schema("value STRING").format("text")
            .option("wholetext", True)
            .option("maxFilesPerTrigger", settings.max_files_per_trigger)
            # A late file keeps an old modification time; never age it out.
            .option("maxFileAge", "3650d")
            .load(str(folder))
            .select(F.lit(source).alias("source"), F.col("_metadata.file_path").alias("file"),
                    F.col("value").alias("text")))
    return streams[0].unionByName(streams[1])


@dataclass
class BatchStats:
    """What one ETL micro-batch wrote: rows and versions per table."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


class EtlWriter:
    """The `foreachBatch` function of the ETL query.

    >>> writer = EtlWriter(Lake(Home.resolve("/tmp/x")), Settings())  # doctest: +SKIP
    >>> landing_files(spark, lake, settings).writeStream.foreachBatch(writer)  # doctest: +SKIP
    """

    def __init__(self, lake: Lake, settings: Settings) -> None:
        self.lake = lake
        self.settings = settings
        self.sinks = {name: lake.sink(name, app_id=QUERY_NAME) for name in ETL_TABLES}
        self.history: list[BatchStats] = []

    def __call__(self, files: DataFrame, batch_id: int) -> None:
        spark = files.sparkSession
        stats = BatchStats(batch_id)
        ingest = {"batch_id": F.lit(batch_id).cast("long"), "ingest_time": F.current_timestamp()}
        parsed = None
        try:
            parsed = self._parse(files).withColumns(ingest).persist()
            self._record(stats, self.sinks["quarantine"].write_batch(to_quarantine(parsed).withColumns(ingest), batch_id))
            for source in SOURCES:
                bronze = to_bronze(parsed.where(F.col("source") == source)).withColumns(ingest)
                self._record(stats, self.sinks[f"bronze_{source}"].write_batch(bronze, batch_id))
            for table in SILVER_SCHEMAS:
                rows = self._deduplicated(spark, table, to_silver(parsed, table))
                self._record(stats, self.sinks[table].write_batch(rows, batch_id))
        finally:
            if parsed is not None:
                parsed.unpersist()
        self.history.append(stats)

    def close(self) -> None:
        for sink in self.sinks.values():
            sink.close()

    @staticmethod
    def _parse(files: DataFrame) -> DataFrame:
        frames = [parse(split_lines(files.where(F.col("source") == source), source), source) for source in SOURCES]
        return frames[0].unionByName(frames[1])

    def _deduplicated(self, spark: SparkSession, table: str, rows: DataFrame) -> DataFrame:
        """Drop repeats of an event_id within the batch and within `dedup_window` of the table's rows.

        The table itself is the dedup state: it survives restarts and is exactly as committed.
        """
        rows = rows.dropDuplicates(["event_id"])
        if not self.lake.exists(table):
            return rows
        bounds = rows.agg(F.min("event_time").alias("lo"), F.max("event_time").alias("hi")).first()
        if bounds.lo is None:
            return rows
        seen = (self.lake.read(spark, table)
                .where(F.col("event_date").between(F.to_date(F.lit(bounds.lo) - F.expr(f"INTERVAL {self.settings.dedup_window}")),
                                                   F.to_date(F.lit(bounds.hi))))
                .where(F.col("event_time") >= F.lit(bounds.lo) - F.expr(f"INTERVAL {self.settings.dedup_window}"))
                .select("event_id"))
        return rows.join(seen, "event_id", "left_anti")

    @staticmethod
    def _record(stats: BatchStats, result: CommitResult) -> None:
        if result.skipped:
            stats.skipped.append(result.table)
        elif result.version is not None:
            stats.rows[result.table] = result.rows
            stats.versions[result.table] = result.version


def start(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> "RunningQuery":
    """Start the ETL query with `trigger` (AvailableNow for run-once, processing time for streaming)."""
    from pipelines.jobs import RunningQuery

    writer = EtlWriter(lake, settings)
    query = (landing_files(spark, lake, settings).writeStream
             .queryName(QUERY_NAME)
             .foreachBatch(writer)
             .option("checkpointLocation", str(lake.home.checkpoint(QUERY_NAME)))
             .trigger(**trigger)
             .start())
    return RunningQuery(QUERY_NAME, query, writer, ETL_TABLES)
