"""Operator commands on one Delta table, through delta-spark: RESTORE, delete rows, reset a writer's
txn, write a log checkpoint, list live files. Used by `pipelines/operations/` (rollback, maintain,
retention); nothing here knows about stages or homes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql import SparkSession

from pipelines.lake.jvm import delta_log, jvm_class, scala_now, scala_object, scala_seq
from pipelines.lake.read import existing_table


@dataclass(frozen=True)
class FileStats:
    """Live data files of a table's latest snapshot and their total size."""

    files: int
    size_bytes: int



def restore(spark: SparkSession, path: str | os.PathLike, version: int) -> None:
    """Delta `RESTORE` of the table at `path` to `version` (a new commit; history stays).

    RESTORE does not rewind the writers' txn ids (`set_transactions` does): a writer replaying
    batch ids it had committed after `version` would otherwise be skipped as already written.
    """
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, existing_table(spark, path)).restoreToVersion(version)


def delete_all(spark: SparkSession, path: str | os.PathLike) -> None:
    """Remove every row (Delta `DELETE` without a condition): the table stays, with its schema and history."""
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, existing_table(spark, path)).delete()


def delete_where(spark: SparkSession, path: str | os.PathLike, condition: str) -> None:
    """Delta `DELETE WHERE condition` (SQL text, e.g. "event_date < '2026-01-01'")."""
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, existing_table(spark, path)).delete(condition)


def set_transactions(spark: SparkSession, path: str | os.PathLike, versions: dict[str, int]) -> None:
    """Commit one `txn` action per app id, setting its last committed batch id (-1: none).

    A DeltaSink skips a batch whose id is <= the table's txn version for its app id; after a
    rollback the writer's checkpoint restarts at an earlier batch id, so the txn must go back too.
    The log replay keeps the latest `txn` per app id, so a lower version here wins.
    """
    if not versions:
        return
    log = delta_log(spark, existing_table(spark, path))
    now = scala_now(spark)
    txn = jvm_class(spark, "org.apache.spark.sql.delta.actions.SetTransaction")
    actions = [txn(app_id, int(version), now) for app_id, version in sorted(versions.items())]
    # DeltaOperations.ManualUpdate is a Scala object nested in an object.
    operation = scala_object(spark, "org.apache.spark.sql.delta.DeltaOperations$ManualUpdate$")
    log.startTransaction().commit(scala_seq(spark, actions), operation)


def write_log_checkpoint(spark: SparkSession, path: str | os.PathLike) -> int:
    """Write a Delta log checkpoint at the table's latest version and return that version.

    Opening a table then reads one Parquet checkpoint instead of replaying every JSON commit.
    """
    log = delta_log(spark, existing_table(spark, path))
    none = jvm_class(spark, "scala.Option").empty()
    snapshot = log.update(False, none, none)
    log.checkpoint(snapshot, none)
    return int(snapshot.version())


def file_stats(path: str | os.PathLike) -> FileStats:
    """Live files and bytes of the table's latest snapshot, read from its log (delta-rs, no JVM)."""
    from pipelines.lake.log import summary

    found = summary(path)
    return FileStats(found.files, found.size_bytes)
