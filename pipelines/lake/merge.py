"""Upserts by key through delta-spark's MERGE (the state tables commands keep: `alert_triage`), and
the whole-table replace of a derived table (`incidents`)."""
from __future__ import annotations

import os
from contextlib import AbstractContextManager

from pyspark.sql import Column, DataFrame, SparkSession

from pipelines.lake.sink import delta_errors, table_uri


def upsert(spark: SparkSession, path: str | os.PathLike, rows: DataFrame, key: str,
           update: dict[str, str | Column], insert: dict[str, str | Column],
           *, lock: AbstractContextManager[None]) -> int:
    """MERGE `rows` (alias `s`) into the Delta table at `path` (alias `t`) on `key`: a matched row
    gets the `update` expressions, a new key the `insert` ones, holding `lock` (the home's
    `commit_lock` on the table). Returns the version committed.

    One commit, atomic: a concurrent change to the same rows makes Delta refuse this one
    (`ConcurrentUpdateException`) rather than lose either. On object storage that holds only
    within one driver, so the MERGEs of two commands take turns through `lock`.

    >>> import tempfile
    >>> from contextlib import nullcontext
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.createDataFrame([("a", 1)], "k string, n int").write.format("delta").save(tmp)
    ...     rows = spark.createDataFrame([("a", 5), ("b", 2)], "k string, n int")
    ...     version = upsert(spark, tmp, rows, "k", {"n": "t.n + s.n"}, {"k": "s.k", "n": "s.n"}, lock=nullcontext())
    ...     version, sorted(spark.read.format("delta").load(tmp).collect())
    (1, [Row(k='a', n=6), Row(k='b', n=2)])
    """
    from delta.tables import DeltaTable

    uri = table_uri(path)
    table = DeltaTable.forPath(spark, uri)
    with delta_errors(uri.rstrip("/").rsplit("/", 1)[-1]), lock:
        (table.alias("t").merge(rows.alias("s"), f"t.{key} = s.{key}")
         .whenMatchedUpdate(set=update).whenNotMatchedInsert(values=insert).execute())
        latest = table.history(1).select("version").first()  # ours: no other commit while the lock is held
    assert latest is not None  # a table has at least its version 0
    return int(latest[0])


def replace(path: str | os.PathLike, rows: DataFrame, tag: str | None = None,
            *, lock: AbstractContextManager[None]) -> int:
    """Replace every row of the Delta table at `path` with `rows` in one commit (an overwrite:
    readers see the old rows or the new, never a mix; the old ones stay in the history), with
    `tag` as the commit's userMetadata, holding `lock` (as `upsert`). Returns the version committed.

    >>> import tempfile
    >>> from contextlib import nullcontext
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spark.range(3).write.format("delta").save(tmp)
    ...     replace(tmp, spark.range(5, 7), lock=nullcontext()), spark.read.format("delta").load(tmp).count()
    (1, 2)
    """
    from delta.tables import DeltaTable

    uri = table_uri(path)
    with delta_errors(uri.rstrip("/").rsplit("/", 1)[-1]), lock:
        writer = rows.write.format("delta").mode("overwrite")
        (writer.option("userMetadata", tag) if tag is not None else writer).save(uri)
        latest = DeltaTable.forPath(rows.sparkSession, uri).history(1).select("version").first()
    assert latest is not None  # a table has at least its version 0
    return int(latest[0])
