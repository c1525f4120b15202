"""Streaming ETL: landing files and Kafka topics -> bronze_<source>, quarantine and silver_<kind> Delta tables.

One query (`etl`, checkpoint `checkpoints/etl`) reads `landing/<source>/` of every registered
source (`pipelines/parsers/sources.py`) with Spark's file source and, per micro-batch, commits every
table the batch has rows for with the same txn(app_id="etl", batch_id): good rows, quarantined rows
and raw lines of one batch land together or, after a crash, are replayed together.

When `$SECLAKE_KAFKA` is set, a second query (`etl_kafka`, its own checkpoint and app id) reads
the sensors' topics (`<source>.<kind>`, as `seclake ship` writes them) into the same tables with
the same parser and writer: Kafka offsets in its checkpoint, its commits idempotent per batch.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial, reduce
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from pipelines import environment
from pipelines.checkpoint import newest, newest_source_files, source_file_times, source_files
from pipelines.dhcp_clock import DHCP_CLOCK, ClockWriter, feed
from pipelines.kafka.ship import HEADER_ZEEK
from pipelines.lake.registry import Lake
from pipelines.lake.sink import CommitResult
from pipelines.parsers import parse, split_lines, to_bronze, to_quarantine, to_silver
from pipelines.parsers.sources import silver_feeds, sources
from pipelines.query import AVAILABLE_NOW, BatchStats, RunningQuery, Stage, clone_session, start_query, without_codegen
from pipelines.schemas import SILVER_SCHEMAS
from pipelines.settings import Settings, interval_seconds

QUERY_NAME = "etl"
KAFKA_QUERY_NAME = "etl_kafka"


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
    cap = (("maxFilesPerTrigger", settings.max_files_per_trigger) if settings.max_files_per_trigger
           else ("maxBytesPerTrigger", settings.max_bytes_per_trigger))
    streams = []
    for source in (s.name for s in sources()):
        folder = lake.home.landing / source
        folder.mkdir(parents=True, exist_ok=True)
        streams.append(
            spark.readStream.schema("value STRING").format("text")
            .option("wholetext", True)
            .option(*cap)
            # A late file keeps an old modification time; never age it out.
            .option("maxFileAge", "3650d")
            # A file deleted after listing is skipped, not fatal: the query must outlive a sensor's cleanup.
            .option("ignoreMissingFiles", True)
            .load(str(folder))
            .select(F.lit(source).alias("source"), F.col("_metadata.file_path").alias("file"),
                    F.col("value").alias("text")))
    return reduce(DataFrame.unionByName, streams)


def visible_files(folder: Path) -> Iterator[Path]:
    """The files under `folder` that Spark's file source lists: recursively, without names starting
    with `.` or `_` (sensors' temp files before their atomic rename) and without folders so named.

    >>> list(visible_files(Path("/nonexistent")))
    []
    """
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
        yield from (Path(dirpath) / name for name in filenames if not name.startswith((".", "_")))


def landing_paths(lake: Lake) -> set[str]:
    """Every file in the landing folders that the ETL's file sources list (`visible_files`)."""
    return {str(path) for source in sources() for path in visible_files(lake.home.landing / source.name)}


def processed_files(lake: Lake) -> set[str]:
    """The landing files (local paths) of every batch the ETL from landing has committed, from its
    checkpoint's file log (no JVM). A file of a batch planned but not committed is not among them
    (nor, while such a batch is open, the other files of each source's newest log batch)."""
    checkpoint = lake.home.checkpoint(QUERY_NAME)
    committed = newest(checkpoint, committed=True)
    if committed is None:
        return set()
    files = {uri for uri in source_files(checkpoint) if uri.startswith("file:")}
    if newest(checkpoint) != committed:
        # A file source's log numbers are not the query's batch ids (`newest_source_files`): the
        # planned batch's files are among each source's newest, which count once it commits.
        files -= newest_source_files(checkpoint).keys()
    return {local_path(uri) for uri in files}


def changed_after_read(lake: Lake) -> list[str]:
    """The landing files (local paths) modified after the ETL from landing read them: appended to,
    or replaced under the same name. Spark's file source reads a path once, so their new lines are
    never read: a sensor must write each file under a hidden name (`.x` or `_x`) and rename it into
    place when complete.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     changed_after_read(Lake(Home.resolve(tmp)))  # never run: nothing read
    []
    """
    changed = []
    for uri, read_ms in source_file_times(lake.home.checkpoint(QUERY_NAME)).items():
        if not uri.startswith("file:"):
            continue
        try:
            modified_ms = int(os.stat(local_path(uri)).st_mtime * 1000)
        except FileNotFoundError:  # removed by retention since
            continue
        if modified_ms > read_ms:
            changed.append(local_path(uri))
    return sorted(changed)


def local_path(uri: str) -> str:
    """A landing file's local path from the URI a file source records.

    >>> local_path("file:///l/a%20b")
    '/l/a b'
    """
    return unquote(urlparse(uri).path)


def idle(lake: Lake, settings: Settings) -> bool:
    """True when the ETL from landing would find nothing new: its last batch is committed and it
    has processed every landing file (whatever the `settings`: they bound a batch, not what is
    new). Read from files (no JVM): an hourly run-once that finds nothing new then starts no Spark.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     idle(Lake(Home.resolve(tmp)), Settings())  # never run: not idle
    False
    """
    checkpoint = lake.home.checkpoint(QUERY_NAME)
    last = newest(checkpoint)
    if last is None or newest(checkpoint, committed=True) != last:
        return False
    return not unprocessed_files(lake)


def unprocessed_files(lake: Lake) -> set[str]:
    """The landing files (local paths) the ETL's file sources list and no committed batch of the
    ETL from landing has read: what its next run takes in.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     lake = Lake(Home.resolve(tmp))
    ...     folder = lake.home.landing / "zeek"
    ...     folder.mkdir(parents=True)
    ...     _ = (folder / "dns.log").write_text("")
    ...     [Path(p).name for p in unprocessed_files(lake)]
    ['dns.log']
    """
    return landing_paths(lake) - processed_files(lake)


def kafka_topics(source: str) -> str:
    """The topics the ETL reads for `source`: `<source>.<anything>` (a regex for `subscribePattern`).

    >>> kafka_topics("zeek")
    'zeek[.].+'
    """
    return re.escape(source) + "[.].+"


def kafka_files(spark: SparkSession, bootstrap: str, source: str, *, topics: str | None = None,
                starting: str = "earliest", limit: int | None = None) -> DataFrame:
    """A stream of `source`'s Kafka messages shaped like landing files (`landing_files`): one row per
    message, `file` = `kafka://<topic>/<partition>@<offset>`, `text` = the Zeek header block carried
    in the message's headers (if any), then the line. `topics` (default `kafka_topics(source)`) is a
    regex of topic names, `limit` caps the messages of a micro-batch.

    So the file parser runs unchanged: it finds the line's header above it, and a Zeek JSON line
    without `_path` takes its kind from the topic (`zeek.dns`). `kafka_lines` then turns
    `@<offset>` into the line number.
    """
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribePattern", topics or kafka_topics(source))
              .option("startingOffsets", starting)
              .option("includeHeaders", True))
    if limit is not None:
        reader = reader.option("maxOffsetsPerTrigger", limit)
    # A cast, like the line's: bytes that are not UTF-8 reach the parser (and the quarantine) instead
    # of failing the query at every restart, as decode() does.
    header = F.expr(f"CAST(get(filter(headers, h -> h.key = '{HEADER_ZEEK}'), 0).value AS STRING)")
    return reader.load().select(
        F.lit(source).alias("source"),
        F.format_string("kafka://%s/%d@%d", "topic", "partition", "offset").alias("file"),
        message_text(F.col("value").cast("string"), header).alias("text"))


def message_text(line: Column, header: Column) -> Column:
    """The text the parser reads for one Kafka message: its Zeek header block (when it has one),
    its line, a newline. A line sent with its own newline gets no second one: the empty line after
    it was a quarantine row of the same offset.

    >>> rows = spark.createDataFrame([("a", None), ("b\\n", None), ("c\\r\\n", "#fields\\tts")], "v string, h string")
    >>> [r.t for r in rows.select(message_text(F.col("v"), F.col("h")).alias("t")).collect()]
    ['a\\n', 'b\\n', '#fields\\tts\\nc\\n']
    """
    return F.concat(F.when(header.isNotNull(), F.concat(header, F.lit("\n"))).otherwise(F.lit("")),
                    F.regexp_replace(line, r"\r?\n\z", ""), F.lit("\n"))


def kafka_lines(parsed: DataFrame) -> DataFrame:
    """Parsed Kafka messages (`parse` of `kafka_files`): `file` -> `kafka://<topic>/<partition>`,
    `line_number` -> the message's offset, so bronze names each line's message exactly."""
    return parsed.withColumns({
        "line_number": F.regexp_extract("file", "@([0-9]+)$", 1).cast("long"),
        "file": F.regexp_replace("file", "@[0-9]+$", ""),
    })


def parse_kafka(spark: SparkSession, bootstrap: str, settings: Settings) -> DataFrame:
    """Every source's topics -> one parsed row per message (PARSED_COLUMNS), one Kafka reader per
    source so that each message is read and parsed once."""
    frames = []
    for source in (s.name for s in sources()):
        files = kafka_files(spark, bootstrap, source, limit=settings.max_offsets_per_trigger)
        frames.append(kafka_lines(parse(split_lines(files, source), source)))
    return reduce(DataFrame.unionByName, frames)


def parse_files(files: DataFrame) -> DataFrame:
    """Whole landing files (`landing_files`) -> one parsed row per data line (PARSED_COLUMNS).

    Applied to the stream, not inside foreachBatch: the parse plan is large, and Spark parses and
    analyses it once per query start instead of once per micro-batch.
    """
    frames = [parse(split_lines(files.where(F.col("source") == s.name), s.name), s.name) for s in sources()]
    return reduce(DataFrame.unionByName, frames)


@dataclass(frozen=True)
class Survey:
    """What `EtlWriter._survey` found in one micro-batch: input counts, the tables that get rows,
    the de-duplication range (earliest, latest event time) per silver table, and for the DHCP
    clock the newest event per feed (`dhcp_clock.feed`) and the feeds that had DHCP lines."""

    read: dict[str, int]
    tables: set[str]
    bounds: dict[str, tuple[datetime, datetime]]
    newest: dict[str, datetime]
    dhcp: set[str]


class EtlWriter:
    """The `foreachBatch` function of the ETL query (`start`): one parsed micro-batch -> every ETL table
    it has rows for, each committed with txn(app_id="etl", batch_id)."""

    def __init__(self, lake: Lake, app_id: str = QUERY_NAME, *, rotation_skew: str | None = None) -> None:
        """`rotation_skew` (a setting) turns on the DHCP clock (pipelines/dhcp_clock.py): the file ETL's in a stream."""
        self.lake = lake
        self.sources = sources()
        self.sinks = {name: lake.sink(name, app_id=app_id) for name in etl_tables()}
        self.history: list[BatchStats] = []
        # What went in, in the input's own units: from Kafka a "file" is a topic partition.
        self.units = ("topic partitions", "messages") if app_id == KAFKA_QUERY_NAME else ("files", "data lines")
        self._existing: set[str] = set()
        self._clock = (None if rotation_skew is None else
                       ClockWriter(lake, float(interval_seconds(rotation_skew)),
                                   partial(landing_paths, lake), partial(processed_files, lake)))

    def __call__(self, lines: DataFrame, batch_id: int) -> None:
        spark = lines.sparkSession
        stats = BatchStats(batch_id)
        ingest = {"batch_id": F.lit(batch_id).cast("long"), "ingest_time": F.current_timestamp()}
        # In-batch repeats of an event are flagged once here (one shuffle) instead of per silver table.
        first = Window.partitionBy("event_id").orderBy("file", "line_number")
        with _checkpointed(lines.withColumn("_repeat", F.row_number().over(first) > 1)) as parsed:
            survey = self._survey(parsed)
            stats.read = survey.read

            # A table with no row in this batch gets no commit: an empty append costs a Delta
            # txn look-up (~0.6 s) and a micro-batch of every query reading the table. The
            # survey decides from the batch alone, so a replay skips the same tables.
            fresh = parsed.where(~F.col("_repeat"))
            outputs: dict[str, Callable[[], DataFrame]] = {
                "quarantine": lambda: to_quarantine(parsed).withColumns(ingest),
                **{s.bronze_table: partial(_bronze, parsed, s.name, ingest) for s in self.sources},
                **{t: partial(self._unseen, spark, t, to_silver(fresh, t), survey.bounds.get(t))
                   for t in SILVER_SCHEMAS},
            }
            due = [t for t in outputs if t in survey.tables or not self._exists(t)]

            def write(table: str) -> CommitResult:
                return self.sinks[table].write_batch(outputs[table](), batch_id)

            # The tables are independent Delta logs, each with its own txn: committed side by side,
            # one table's commit overlaps another's Spark job (a batch paid ~1 s per table in turn).
            # The threads inherit this one's Spark properties: the query's job group, so stopping
            # the query cancels their jobs too.
            with ThreadPoolExecutor(len(due) or 1, thread_name_prefix="etl-write") as pool:
                for result in pool.map(inheritable_thread_target(spark)(write), due):
                    stats.record(result)
        # Only once the batch's silver_dhcp is committed: the clock never runs ahead of it.
        if self._clock is not None:
            files = newest_source_files(self.lake.home.checkpoint(QUERY_NAME))
            self._clock.committed(spark, survey.newest, survey.dhcp,
                                  {local_path(uri): t for uri, t in files.items() if uri.startswith("file:")})
        self.history.append(stats)

    def close(self) -> None:
        """Stop the DHCP clock's timer; every batch's commits are complete when the batch ends."""
        if self._clock is not None:
            self._clock.close()

    def _exists(self, table: str) -> bool:
        """Whether `table` exists; remembered once true (tables are not dropped under a running query)."""
        if table not in self._existing and self.lake.exists(table):
            self._existing.add(table)
        return table in self._existing

    def _survey(self, parsed: DataFrame) -> Survey:
        """One job over the cached batch: what went in (files, data lines), which tables get rows,
        and per silver table the earliest and latest time of its good, first-seen events (the
        de-duplication's range).

        Files and lines in their own units: Spark's numInputRows counts whole files, and each file
        once per source branch that scans it. (A file of header lines only has no row here.)
        """
        good = F.col("error").isNull() & ~F.col("_repeat")
        rows = (parsed.groupBy("source", "sensor", "kind")
                .agg(F.collect_set("file").alias("files"), F.count(F.lit(1)).alias("lines"),
                     F.count(F.when(F.col("error").isNotNull(), 1)).alias("bad"),
                     F.min(F.when(good, F.col("event_time"))).alias("lo"),
                     F.max(F.when(good, F.col("event_time"))).alias("hi")).collect())
        read = dict(zip(self.units, (len({f for r in rows for f in r.files}), sum(r.lines for r in rows))))
        tables = {s.bronze_table for s in self.sources if any(r.source == s.name for r in rows)}
        if any(r.bad for r in rows):
            tables.add("quarantine")
        by_kind: dict[tuple[str, str], tuple[datetime, datetime]] = {}
        newest: dict[str, datetime] = {}
        for r in (r for r in rows if r.lo is not None):
            lo, hi = by_kind.get((r.source, r.kind), (r.lo, r.hi))
            by_kind[(r.source, r.kind)] = (min(lo, r.lo), max(hi, r.hi))
            newest[feed(r.source, r.sensor)] = max(newest.get(feed(r.source, r.sensor), r.hi), r.hi)
        dhcp_feeds = set(silver_feeds("silver_dhcp"))
        dhcp = {feed(r.source, r.sensor) for r in rows if r.lo is not None and (r.source, r.kind) in dhcp_feeds}
        bounds = {}
        for table in SILVER_SCHEMAS:
            spans = [by_kind[f] for f in silver_feeds(table) if f in by_kind]
            if spans:
                bounds[table] = (min(lo for lo, _ in spans), max(hi for _, hi in spans))
                tables.add(table)
        return Survey(read, tables, bounds, newest, dhcp)

    def _unseen(self, spark: SparkSession, table: str, rows: DataFrame,
                bounds: tuple[datetime, datetime] | None) -> DataFrame:
        """Drop rows whose event_id the table already holds between this batch's first and last event times.

        event_id hashes the raw line, timestamp included, so a repeat carries the original's
        exact event_time: the time range is exact, not a tuning window. The table itself is the
        dedup state: it survives restarts and is exactly as committed.
        """
        if bounds is None or not self.lake.exists(table):
            return rows
        seen = self.lake.read_in_range(spark, table, "event_time", *bounds).select("event_id")
        return rows.join(seen, "event_id", "left_anti")


@contextmanager
def _checkpointed(frame: DataFrame) -> Iterator[DataFrame]:
    """`frame` computed once (by its first job) into the executors' block storage, as a plan of one node.

    A cache would keep the parse's plan, hundreds of expressions deep, under every frame derived
    from the batch (the survey, seven outputs, the look-ups' joins), and Spark analyses each
    against it: about 0.2 s of driver time per derived frame, against milliseconds on the
    checkpoint (docs/performance.md, "The batch as a checkpoint").
    """
    done = frame.localCheckpoint(eager=False)
    try:
        yield done
    finally:
        # PySpark cannot unpersist a checkpoint: its blocks go now, not at some later JVM GC.
        done._jdf.queryExecution().logical().rdd().unpersist(False)


def _bronze(parsed: DataFrame, source: str, ingest: dict) -> DataFrame:
    """`source`'s raw lines of a parsed batch, as its bronze table holds them."""
    return to_bronze(parsed.where(F.col("source") == source)).withColumns(ingest)


def start(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> RunningQuery:
    """Start the ETL query with `trigger` (AvailableNow for run-once, processing time for streaming)."""
    # Run-once needs no clock: its end-of-input mark passes everything (pipelines/dhcp_clock.py).
    writer = EtlWriter(lake, rotation_skew=None if trigger == AVAILABLE_NOW else settings.rotation_skew)
    query = start_query(parse_files(landing_files(_session(spark, trigger), lake, settings)), QUERY_NAME, writer,
                        lake.home.checkpoint(QUERY_NAME), trigger, sinks=tuple(writer.sinks.values()))
    return RunningQuery(QUERY_NAME, query, writer, (*etl_tables(), DHCP_CLOCK))


def start_kafka(spark: SparkSession, lake: Lake, settings: Settings, trigger: dict) -> RunningQuery:
    """Start the ETL from Kafka (`$SECLAKE_KAFKA`) with `trigger`; ValueError when no broker answers there."""
    bootstrap = environment.kafka()
    if bootstrap is None:
        raise ValueError("SECLAKE_KAFKA is not set: the ETL from Kafka needs the brokers' host:port")
    check_reachable(bootstrap)
    writer = EtlWriter(lake, app_id=KAFKA_QUERY_NAME)
    query = start_query(parse_kafka(_session(spark, trigger), bootstrap, settings), KAFKA_QUERY_NAME, writer,
                        lake.home.checkpoint(KAFKA_QUERY_NAME), trigger, sinks=tuple(writer.sinks.values()))
    return RunningQuery(KAFKA_QUERY_NAME, query, writer, etl_tables())


def _session(spark: SparkSession, trigger: dict) -> SparkSession:
    """The session an ETL query is built in: for run-once a clone without generated code
    (`without_codegen`), for a stream `spark` itself: under the live feed of `bench/alert_latency.py`
    the interpreted ETL's hop to silver was slower (performance.md, "The ETL without generated code")."""
    return without_codegen(clone_session(spark)) if trigger == AVAILABLE_NOW else spark


def check_reachable(bootstrap: str, timeout_s: float = 15.0) -> None:
    """ValueError in one line when no Kafka broker answers at `bootstrap` within `timeout_s`.

    Spark's Kafka source would otherwise retry quietly for minutes before failing. A refused
    connection to every bootstrap address is said at once (the Kafka client retries it until
    `timeout_s`).

    >>> check_reachable("127.0.0.1:1")
    Traceback (most recent call last):
    ...
    ValueError: no Kafka broker answers at 127.0.0.1:1 (SECLAKE_KAFKA): 127.0.0.1:1: connection refused
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from pipelines.servers import refused as refusals

    refused = refusals(bootstrap, timeout_s)
    if refused:
        raise ValueError(f"no Kafka broker answers at {bootstrap} (SECLAKE_KAFKA): {refused}")
    try:
        config: dict = {"bootstrap.servers": bootstrap, "logger": _quiet_logger()}
        AdminClient(config).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ValueError(f"no Kafka broker answers at {bootstrap} (SECLAKE_KAFKA): {exc.args[0].str()}") from None


def _quiet_logger() -> logging.Logger:
    """A logger for librdkafka that drops its retry chatter: `check_reachable` says what failed."""
    logger = logging.getLogger("seclake.kafka.client")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def stages() -> list[Stage]:
    """The ETL as pipeline stages: `etl` reads landing folders, `etl_kafka` (when `$SECLAKE_KAFKA` is
    set) the sensors' topics; neither reads a table, both write `etl_tables()`, `etl` also the DHCP clock."""
    found = [Stage(QUERY_NAME, reads=(), writes=(*etl_tables(), DHCP_CLOCK), start=start, idle=idle)]
    if environment.kafka():
        found.append(Stage(KAFKA_QUERY_NAME, reads=(), writes=etl_tables(), start=start_kafka,
                           part_of=QUERY_NAME))
    return found
