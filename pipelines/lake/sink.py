"""Streaming sink: a micro-batch appended by delta-spark, exactly once per (app_id, batch_id).

Delta's idempotent writes do the bookkeeping: each append commits a `txn` action (app id, batch
id) with its files, and an append whose app id already committed that batch id commits nothing.
So a batch replayed after a crash, or written twice by two writers that share an app id, lands
once. A batch that writes no row to an existing table of its columns commits nothing: its plan
still runs (a stateful query's state stores commit with it), and a replay writes no row again.
Several tables written from one `foreachBatch` each keep their own txn, so every table is
exactly-once on its own. The append runs Delta's own transaction (`writeFiles`, `commit`); only
the look-up of the app id's last batch reads the commit's checksum file instead of rebuilding
the table's state (`_committed_batch`).
"""
from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StructType, TimestampNTZType, TimestampType

from pipelines.lake.jvm import delta_log, jvm_class, scala_now, scala_object, scala_seq
from pipelines.lake.log import commit_versions
from pipelines.lake.schema import SchemaMismatchError, as_nullable

DEFAULT_CHECKPOINT_INTERVAL = 100
# Commits searched for this write's own commit: other writers of the same table (late_events has
# one per attribution query) may commit between our commit and the look-up.
_HISTORY_PROBE = 20
# `write_next`'s tries: each lost one means another run of the same writer committed in the instant
# between the look-up and the commit.
NEXT_ATTEMPTS = 5


@dataclass(frozen=True)
class CommitResult:
    """What one `write_batch` call did; `version` is None when the batch was already committed
    or wrote no row (then nothing was committed)."""

    table: str
    batch_id: int
    version: int | None
    rows: int = 0
    skipped: bool = False


def table_uri(path: str | os.PathLike) -> str:
    """A table location as Spark wants it: an absolute local path, or a URI (`s3a://...`) unchanged.

    >>> table_uri("/tmp/lake/../lake/silver_dns")
    '/tmp/lake/silver_dns'
    """
    text = str(path)
    return text if "://" in text else str(Path(text).expanduser().resolve())


class DeltaSink:
    """An exactly-once Delta sink for `foreachBatch`: one (table, app_id); a replayed batch id commits nothing.

    >>> sink = DeltaSink("/tmp/lake/silver_dns", app_id="silver_dns", partition_by=["event_date"])
    >>> sink.name
    'silver_dns'
    """

    def __init__(self, path: str | os.PathLike, *, app_id: str, partition_by: list[str] | tuple[str, ...] = (),
                 commit_lock: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """`commit_lock` is held around each commit: other processes appending to the table take turns
        through it (`Home.commit_lock`; Delta's commits on object storage are atomic only within one driver)."""
        if not app_id:
            raise ValueError("app_id must be a non-empty string")
        self.uri = table_uri(path)
        self.name = self.uri.rstrip("/").rsplit("/", 1)[-1]
        self.app_id = app_id
        self.partition_by = list(partition_by)
        self.commit_lock = commit_lock

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: DataFrame, batch_id: int) -> CommitResult:
        """Append `df` as batch `batch_id`; a batch id already committed for this app_id is skipped,
        and a batch of no row is run but not committed (unless it creates the table or adds columns)."""
        spark = df.sparkSession
        # The commit's userMetadata, unique to this attempt: Delta's writer finds its commit in the
        # history by it (`_find_commit`; a replay has another tag).
        tag = f"{self.app_id}:{batch_id}:{uuid.uuid4().hex}"
        txn = _transaction(spark, self.uri)
        creates = txn.readVersion() < 0
        if creates:
            with delta_errors(self.name):
                _new_table(spark, txn, df.schema, self.partition_by, stats_properties(df.schema, self.partition_by))
        elif not _same_columns(txn, df.schema):
            return self._write_evolving(df, batch_id, tag)
        elif batch_id <= _committed_batch(spark, txn, self.app_id):
            return self._skip(df, batch_id)
        with delta_errors(self.name):
            version, rows = _append(spark, txn, df, self.app_id, batch_id, tag, self.partition_by,
                                    empty_commits=creates, commit_lock=self.commit_lock)
        return CommitResult(self.name, batch_id, version, rows)

    def write_next(self, frame: Callable[[], DataFrame]) -> CommitResult:
        """Append `frame()` as this app id's next batch, one past its last commit: for a writer that
        replays no stream's batch (a backtest's write, a notify pass), whose runs may overlap and
        whose clock may step back. Another run's commit of the same app id in between takes the
        number (Delta refuses ours as a concurrent transaction, or this sink skips it): `frame()` is
        built again (it may read the table) and appended as the batch after that one."""
        for _ in range(NEXT_ATTEMPTS):
            df = frame()
            try:
                result = self.write_batch(df, self.last_batch(df.sparkSession) + 1)
            except Exception as exc:  # Delta's ConcurrentTransactionException comes as a bare Py4JJavaError
                if "ConcurrentTransactionException" not in str(exc):
                    raise
                continue
            if not result.skipped:
                return result
        raise RuntimeError(f"{self.name}: {NEXT_ATTEMPTS} appends of {self.app_id} each met another of the same "
                           "app id committed first; try again")

    def last_batch(self, spark: SparkSession) -> int:
        """The last batch id this sink's app id committed to its table (-1: none, or no table yet)."""
        txn = _transaction(spark, self.uri)
        return -1 if txn.readVersion() < 0 else _committed_batch(spark, txn, self.app_id)

    def _write_evolving(self, df: DataFrame, batch_id: int, tag: str) -> CommitResult:
        """The append through Delta's DataFrame writer: evolves the table's schema (mergeSchema) or
        names the column Delta refused; slower (`_committed_batch` says why)."""
        writer = (df.write.format("delta").mode("append")
                  .option("txnAppId", self.app_id).option("txnVersion", batch_id)
                  .option("mergeSchema", "true").option("userMetadata", tag))
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        with delta_errors(self.name), self.commit_lock():
            writer.save(self.uri)
        ours = _find_commit(df.sparkSession, self.uri, tag)
        if ours is None:
            return self._skip(df, batch_id)
        return CommitResult(self.name, batch_id, *ours)

    def _skip(self, df: DataFrame, batch_id: int) -> CommitResult:
        # Delta skipped the batch without running it; a stateful query's state stores must still
        # commit it, or Spark fails the replay (STATE_STORE_COMMIT_VALIDATION_FAILED) on every
        # restart. Only replays after a crash pay for this run.
        df.write.format("noop").mode("overwrite").save()
        return CommitResult(self.name, batch_id, None, skipped=True)


def _same_columns(txn, schema: StructType) -> bool:
    """The table of `txn` has `schema`'s column names and types, in order; nullability aside (a
    batch's NOT NULL is incidental), anything else is schema evolution for Delta's writer."""
    table = StructType.fromJson(json.loads(txn.metadata().schemaString()))
    return table.simpleString() == schema.simpleString()


def _transaction(spark: SparkSession, uri: str):
    """A delta-spark OptimisticTransaction on the table at `uri` (read version -1: no table yet)."""
    return delta_log(spark, uri).startTransaction()


def _new_table(spark: SparkSession, txn, schema: StructType, partition_by: list[str],
               properties: dict[str, str]) -> None:
    """Make `txn` (on a path with no table yet) create the table: `schema` (nullable), partitioning, properties.

    What Delta's DataFrame writer does for a new table (`updateMetadataForNewTable` applies the
    session's table defaults and Delta's checks of names and properties), without the writer's
    relation built afterwards: a creation costs about a third of the writer's (docs/performance.md,
    "Tables created in the transaction").
    """
    values = jvm_class(spark, "java.util.HashMap")()
    for key, value in properties.items():
        values.put(key, value)
    maps = scala_object(spark, "scala.collection.immutable.Map$")
    configuration = getattr(maps, "from")(jvm_class(spark, "scala.jdk.javaapi.CollectionConverters").asScala(values))
    actions = "org.apache.spark.sql.delta.actions."
    parquet = jvm_class(spark, actions + "Format")("parquet", maps.empty())
    txn.updateMetadataForNewTable(jvm_class(spark, actions + "Metadata")(
        str(uuid.uuid4()), None, None, parquet, as_nullable(schema).json(), scala_seq(spark, partition_by),
        configuration, scala_now(spark)))


def _committed_batch(spark: SparkSession, txn, app_id: str) -> int:
    """The last batch id `app_id` committed in the transaction's snapshot (-1: none), registered
    as Delta's own `txnVersion` registers it, so a concurrent commit of the same app id fails ours.

    `txnVersion` rebuilds the snapshot's whole state with Spark jobs: about half a second per
    commit on 2 cores, whatever the table's size (`bench/table_layer.py`). The checksum file Delta
    writes with each commit (`.crc`) lists the app ids' versions; it is read when it does.
    """
    checksum = txn.snapshot().checksumOpt()
    if not checksum.isDefined() or not checksum.get().setTransactions().isDefined():
        # The state rebuild runs Spark jobs, which Delta starts from the thread's active session: a
        # writer's thread of its own (the ETL writes its tables in threads) has none. A RESTORE
        # (a rollback's last commit) writes no checksum, so the next append comes here.
        jvm_class(spark, "org.apache.spark.sql.SparkSession").setActiveSession(spark._jsparkSession)
        return int(txn.txnVersion(app_id))
    txn.readTxn().addOne(app_id)
    # As JSON in one round trip: a table's checksum lists every app id that ever wrote it.
    mapper = jvm_class(spark, "org.apache.spark.sql.delta.util.JsonUtils").mapper()
    known = json.loads(mapper.writeValueAsString(checksum.get().setTransactions().get()))
    return max((int(t["version"]) for t in known if t["appId"] == app_id), default=-1)


def _append(spark: SparkSession, txn, df: DataFrame, app_id: str, batch_id: int, tag: str,
            partition_by: list[str], *, empty_commits: bool,
            commit_lock: Callable[[], AbstractContextManager[None]]) -> tuple[int | None, int]:
    """Write `df`'s files and commit them with the app id's txn in `txn`: (version, rows), or
    (None, 0) when `df` had no row and nothing was committed (unless `empty_commits`: a new table).

    What Delta's DataFrame writer does for an append to a table of the same schema, with the
    transaction active while `df` runs, as it is there (a read of the table that Delta plans inside
    `df` is registered with the active transaction). The rules' de-duplication against `alerts` is
    not such a read: it is cached before the write, under the rule's `writers_of` lock.
    """
    # A thread-local of the object OptimisticTransaction (py4j keeps one JVM thread per Python thread).
    active = scala_object(spark, "org.apache.spark.sql.delta.OptimisticTransaction$")
    active.setActive(txn)
    try:
        files = txn.writeFiles(df._jdf)  # a Scala Seq, left in the JVM: one round trip per file otherwise
    finally:
        active.clearActive()
    if files.isEmpty() and not empty_commits:
        # An empty commit would wake every streaming query reading the table for a micro-batch of
        # nothing (17 of 18 enriched_ids_alerts commits in one alert_latency run).
        return None, 0
    actions = getattr(files, "$colon$plus")(jvm_class(spark, "org.apache.spark.sql.delta.actions.SetTransaction")(
        app_id, batch_id, scala_now(spark)))
    with commit_lock():
        version = int(txn.commit(actions, _write_operation(spark, "Append", partition_by, tag)))
    rows = txn.getMetric("numOutputRows")
    return version, int(rows.get().value()) if rows.isDefined() else 0


def _write_operation(spark: SparkSession, mode: str, partition_by: list[str], tag: str | None):
    """Delta's WRITE operation for a commit's history: save mode `mode`, partitioning, userMetadata `tag`."""
    some = jvm_class(spark, "scala.Some")
    none = jvm_class(spark, "scala.Option").empty()
    return jvm_class(spark, "org.apache.spark.sql.delta.DeltaOperations$Write")(
        getattr(jvm_class(spark, "org.apache.spark.sql.SaveMode"), mode), some(scala_seq(spark, partition_by)), none,
        none if tag is None else some(tag), none, none, none, none, none)


def _find_commit(spark: SparkSession, uri: str, tag: str) -> tuple[int, int] | None:
    """(version, rows written) of the commit whose userMetadata is `tag`, among the newest ones.

    A local table's newest commit files are read directly (milliseconds); elsewhere Delta's
    history, which costs a Spark round trip (~0.2 s) per call.
    """
    if "://" in uri and not uri.startswith("file:"):
        from delta.tables import DeltaTable

        found = (DeltaTable.forPath(spark, uri).history(_HISTORY_PROBE)
                 .where(F.col("userMetadata") == tag).select("version", "operationMetrics").collect())
        if not found:
            return None
        return found[0].version, int((found[0].operationMetrics or {}).get("numOutputRows", 0))
    log = Path(uri.removeprefix("file:")) / "_delta_log"
    for version in commit_versions(log)[::-1][:_HISTORY_PROBE]:
        try:
            lines = (log / f"{version:020d}.json").read_text().splitlines()
        except FileNotFoundError:  # removed by log cleanup meanwhile
            continue
        for line in lines:
            if line.startswith('{"commitInfo"'):
                info = json.loads(line)["commitInfo"]
                if info.get("userMetadata") == tag:
                    return version, int(info.get("operationMetrics", {}).get("numOutputRows", 0))
                break
    return None


def stats_properties(schema: StructType, partition_by: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The statistics a new table collects: min/max/null counts on its time columns only (numRecords always).

    Delta's default is the first 32 columns. On these tables only time columns set one file apart
    from another: rows land in time order, while every file spans most hosts, ports and hashed ids.
    They are also what reads by statistics use (the ETL's de-duplication, the end-of-input marks,
    the quarantine check's window). The other columns cost 10-23% of an append
    (docs/performance.md, "Table layer"); a table without a time column keeps the row count only.

    >>> stats_properties(StructType.fromDDL("event_id STRING, event_time TIMESTAMP, event_date DATE"), ["event_date"])
    {'delta.dataSkippingStatsColumns': 'event_time'}
    >>> stats_properties(StructType.fromDDL("rule STRING"), [])
    {'delta.dataSkippingNumIndexedCols': '0'}
    """
    times = [f.name for f in schema.fields
             if isinstance(f.dataType, (TimestampType, TimestampNTZType, DateType)) and f.name not in partition_by]
    if not times:
        return {"delta.dataSkippingNumIndexedCols": "0"}
    return {"delta.dataSkippingStatsColumns": ",".join(times)}


def create_empty(spark: SparkSession, path: str | os.PathLike, schema: StructType, partition_by: list[str],
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> bool:
    """Create an empty Delta table at `path` unless one exists; True if this call created it.

    Streams read their input tables from the start, so a downstream query can start before its
    upstream has committed anything. Two creators racing (rule queries, a second process) are
    safe: Delta commits version 0 once, and the loser finds the table there.

    >>> import tempfile
    >>> from pyspark.sql.types import LongType, StructField
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     schema = StructType([StructField("a", LongType())])
    ...     print(create_empty(spark, f"{tmp}/t", schema, []), create_empty(spark, f"{tmp}/t", schema, []))
    True False
    """
    uri = table_uri(path)
    txn = _transaction(spark, uri)
    if txn.readVersion() >= 0:
        return False
    properties = {"delta.checkpointInterval": str(checkpoint_interval), **stats_properties(schema, partition_by)}
    try:
        with delta_errors(uri.rsplit("/", 1)[-1]):
            _new_table(spark, txn, schema, partition_by, properties)
            txn.commit(scala_seq(spark, []), _write_operation(spark, "ErrorIfExists", partition_by, None))
    except Exception:
        if _transaction(spark, uri).readVersion() >= 0:
            return False  # another creator won the race
        raise
    return True


@contextmanager
def delta_errors(table: str) -> Iterator[None]:
    """Delta's schema refusals as SchemaMismatchError naming the table and Delta's reason."""
    from pyspark.errors import PySparkException

    try:
        yield
    except PySparkException as exc:
        condition = exc.getCondition() or ""
        if condition.startswith(("DELTA_FAILED_TO_MERGE_FIELDS", "DELTA_PARTITION_COLUMNS_MISMATCH",
                                 "DELTA_METADATA_MISMATCH", "DELTA_MERGE_INCOMPATIBLE_DATATYPE")):
            reason = str(exc).split("\n")[0]
            raise SchemaMismatchError(f"table {table}: {reason}") from None
        raise
