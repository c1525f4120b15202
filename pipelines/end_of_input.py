"""End of input: complete results on a bounded input, without changing what a stream computes.

A stateful query emits a lease piece, an unattributed event or a rule window once its watermark
passes it, and a watermark only moves with newer data. On a bounded input (a capture, a day of
files, the generator's hours) nothing newer comes, so the last pieces, events and windows would
wait in state for the next run's data.

Run-once therefore marks the end of its input: the `end_of_input` stage appends to the
`end_of_input` table a `flush_at` at most one millisecond after the newest event in silver, meaning
"every event before this has arrived", or later when the run is told so (the setting
`input_ends_at`: a capture's end, the end of the last hourly file). Each stateful query reads
that table as one more stream and unions the marks into its watermarked input (`with_marks`), so
its watermark reaches `flush_at` and no further: everything before it is emitted and nothing
newer becomes late.
dhcp_leases also gets a mark per IP it has seen (`ip` set), because a query only visits the
keys it has input for, and each open lease must be cut at `flush_at`.

`seclake stream` never marks: there the watermarks move with the data. An event older than a
mark that arrives after it is late (dropped by the query, counted in `late_events`, kept in
silver).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, DateType, NumericType, StringType, TimestampType

from pipelines.lake.log import newest_in_stats, open_log, quiet_since
from pipelines.lake.registry import Lake
from pipelines.lake.source import read_stream
from pipelines.schemas import END_OF_INPUT_SCHEMA
from pipelines.settings import Settings

END_OF_INPUT = "end_of_input"
# Set on the mark rows `with_marks` adds to a stream (NULL on the stream's own rows).
MARK_COLUMN = "_end_of_input"
# In the stage's checkpoint folder: the table versions the last mark was decided on (`idle`).
MARKED_VERSIONS = "marked_versions.json"


def read_marks(spark: SparkSession, lake: Lake) -> DataFrame:
    """The stream of end-of-input marks (flush_at, ip, written_at); the table is created if missing."""
    lake.ensure(spark, END_OF_INPUT)
    return read_stream(spark, lake.path(END_OF_INPUT))


def with_marks(frame: DataFrame, marks: DataFrame, time_column: str, delay: str, *,
               marks_first: bool = False) -> DataFrame:
    """`frame.withWatermark(time_column, delay)`, also moved to each mark's `flush_at` by the marks.

    A mark row enters with its time at `flush_at + delay`, so the watermark (newest time - delay)
    reaches `flush_at` exactly, and leaves right after the watermark operator. `marks_first` puts
    the marks' source before `frame`'s in the plan, where Spark asks it for new data first (the
    DHCP clock, pipelines/dhcp_clock.py); a checkpoint records its sources in plan order, so an
    existing query keeps the order it was started with.

    The marks must reach that operator, and Spark's optimizer works against it: it pushes below
    the operator every filter that does not name the event-time column (including the `IS NOT
    NULL` it infers from a join), and in a micro-batch that holds only marks it evaluates filters
    on their columns at planning time and prunes the whole branch, watermark included. So no
    column of a mark is a literal: each is the mark's `written_at` cast to the column's type
    (values no row joins on or filters for; NULL where no cast exists), and the filter that drops
    the marks names the time column.
    """
    # SQL text, one call for all columns: a Column per field cost ~0.4 s of Py4J round trips per
    # query start (a rule's tables have dozens of columns), paid by every rule and join.
    written = "coalesce(_mark_written_at, _mark_flush_at)"
    columns = [f"_mark_flush_at + INTERVAL {delay} AS `{time_column}`", f"{written} AS {MARK_COLUMN}"]
    columns += [f"{_from_written(written, field.dataType)} AS `{field.name}`"
                for field in frame.schema.fields if field.name != time_column and _castable(field.dataType)]
    shifted = (marks.selectExpr("flush_at AS _mark_flush_at", "ip AS _mark_ip", "written_at AS _mark_written_at")
               .where("_mark_ip IS NULL").selectExpr(*columns))
    if marks_first:
        both = shifted.unionByName(frame, allowMissingColumns=True).select(*frame.columns, MARK_COLUMN)
    else:
        both = frame.unionByName(shifted, allowMissingColumns=True)
    keep = F.when(F.col(time_column).isNotNull(), F.col(MARK_COLUMN).isNull())
    return both.withWatermark(time_column, delay).where(keep).drop(MARK_COLUMN)


def _castable(kind: DataType) -> bool:
    return isinstance(kind, (StringType, TimestampType, DateType, NumericType, BooleanType))


def _from_written(written: str, kind: DataType) -> str:
    """A mark's value for a column of type `kind`, from its `written` SQL (ANSI casts no timestamp to boolean)."""
    return f"({written} IS NULL)" if isinstance(kind, BooleanType) else f"CAST({written} AS {kind.simpleString()})"


def table_versions(lake: Lake, tables: Sequence[str]) -> dict[str, list]:
    """Each of `tables` that exists -> [its Delta table id, its newest version], from its log (no JVM)."""
    found = {}
    for name in tables:
        if lake.exists(name):
            log = open_log(lake.path(name))
            found[name] = [log.metadata().id, log.version()]
    return found


def mark_input(spark: SparkSession, lake: Lake, tables: Sequence[str], ips: Callable[[], list[str]],
               ends_at: datetime | None = None) -> int:
    """`mark` the end of the input at the newest event in `tables`, or at `ends_at` (aware: the
    setting `input_ends_at`) when that is later; return the rows written.

    The versions of `tables` and of the marks it decided on are kept in the stage's checkpoint
    folder, so that `idle` can later tell, without Spark, that the mark would be the same.
    """
    seen = table_versions(lake, tables)
    newest = newest_event(spark, lake, list(tables))
    if newest is not None and ends_at is not None:  # with no event, nothing waits to be closed
        # `mark` puts the mark a millisecond after the time it is given: exactly at `ends_at`.
        newest = max(newest, _millisecond(ends_at).astimezone().replace(tzinfo=None) - timedelta(milliseconds=1))
    written = mark(spark, lake, newest, ips)
    seen.update(table_versions(lake, [END_OF_INPUT]))
    folder = lake.home.checkpoint(END_OF_INPUT)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKED_VERSIONS).write_text(json.dumps(seen, sort_keys=True))
    return written


def idle(lake: Lake, settings: Settings, tables: Sequence[str]) -> bool:
    """True when neither `tables` nor the marks changed since `mark_input` last decided and no mark
    is asked for past the last one (`settings.input_ends_at`): a mark now would add nothing. A
    rollback or a new table changes a version and makes it False.

    >>> import tempfile
    >>> from pipelines.home import Home
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     idle(Lake(Home.resolve(tmp)), Settings(), ["silver_dns"])  # never marked
    False
    """
    if settings.input_end and not _marked_by(lake, settings.input_end):
        return False
    try:
        recorded = json.loads((lake.home.checkpoint(END_OF_INPUT) / MARKED_VERSIONS).read_text())
    except (FileNotFoundError, ValueError):
        return False
    now = table_versions(lake, [*tables, END_OF_INPUT])
    # A compaction (seclake maintain) since the mark changes a version but no row.
    return recorded.keys() == now.keys() and all(
        recorded[name][0] == now[name][0] and (recorded[name][1] == now[name][1]
                                               or quiet_since(lake.path(name), recorded[name][1]))
        for name in now)


def _marked_by(lake: Lake, ends_at: datetime) -> bool:
    """Whether a mark at or after `ends_at` is in the table, told from its statistics (no JVM)."""
    try:
        last = newest_in_stats(lake.path(END_OF_INPUT), "flush_at") if lake.exists(END_OF_INPUT) else None
    except LookupError:  # a file without statistics: let the stage look with Spark
        return False
    return last is not None and last >= _millisecond(ends_at)


def _millisecond(at: datetime) -> datetime:
    """`at` cut to its millisecond: a mark's time, as its statistics keep it."""
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def newest_event(spark: SparkSession, lake: Lake, tables: list[str]) -> datetime | None:
    """The newest `event_time` in `tables` (those that exist), at most a millisecond early (never
    late), or None when they hold no row; naive local time, as Spark returns it."""
    found = [_newest(spark, lake, table, "event_time") for table in tables if lake.exists(table)]
    return max((t for t in found if t is not None), default=None)


def _newest(spark: SparkSession, lake: Lake, table: str, column: str) -> datetime | None:
    """The newest `column` of `table` from its files' statistics (`newest_in_stats`: milliseconds,
    truncated), so a run-once's mark scans no silver history; aggregated by Spark when a file
    lacks them."""
    try:
        newest = newest_in_stats(lake.path(table), column)
    except LookupError:
        # An aggregate without grouping returns exactly one row.
        return lake.read(spark, table).agg(F.max(column)).collect()[0][0]
    return newest.astimezone().replace(tzinfo=None) if newest is not None else None


def mark(spark: SparkSession, lake: Lake, newest: datetime | None, ips: Callable[[], list[str]]) -> int:
    """Append a mark at the millisecond after `newest` (global, and one per IP `ips()` returns) unless
    an earlier run already marked that far; return the rows written (0: nothing new since the last
    mark). With `newest` at most a millisecond before the newest event (`newest_event`), the mark is
    after it.

    `ips` is only called when a mark is written: a run-once that found nothing new reads no DHCP.

    `newest` is a datetime as Spark returns it (naive, local time).
    """
    if newest is None:
        return 0
    # On a millisecond, still after `newest`: the marks' own statistics (milliseconds, truncated)
    # then compare exactly with it, whether `newest` came from statistics or from Spark.
    flush_at = _millisecond(newest) + timedelta(milliseconds=1)
    lake.ensure(spark, END_OF_INPUT)
    last = _newest(spark, lake, END_OF_INPUT, "flush_at")
    if last is not None and last >= flush_at:
        return 0
    rows = [(flush_at, None)] + [(flush_at, ip) for ip in sorted(set(ips()))]
    frame = (spark.createDataFrame(rows, "flush_at timestamp, ip string")
             .withColumn("written_at", F.current_timestamp()).select(*END_OF_INPUT_SCHEMA.names))
    # The mark's own time is its transaction version: a repeated mark commits once.
    result = lake.sink(END_OF_INPUT).write_batch(frame, int(flush_at.timestamp() * 1000))
    return 0 if result.skipped else result.rows
