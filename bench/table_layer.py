"""The table layer: Delta sink and stream source vs plain Parquet, and commit latency vs log length.

Three measurements, each side by side in one SparkSession, interleaved, medians:

1. **Sink.** The same Parquet input streamed with the same trigger (AvailableNow,
   maxFilesPerTrigger=1, so one micro-batch per input file) into
   - `foreachBatch(DeltaSink)` (Spark writes Parquet to `_staging-*`, files moved into
     their partitions, delta-rs commit with txn(app_id, batch_id)),
   - `foreachBatch(df.write.parquet)` (the same micro-batches, no Delta: the sink's own cost),
   - `writeStream.format("parquet")` (Spark's file sink).
2. **Read.** The same files (a Delta table written by the sink)
   - streamed with `read_stream` (the `seclake_delta` Python data source, Arrow batches),
   - read with `spark.read.parquet(<the snapshot's files>)`,
   - read with `read_table` (delta-rs file list + Spark's native Parquet reader),
   each written to Spark's `noop` sink, so every row is materialised.
3. **Commit latency vs table version.** Tiny batches committed directly through the sink's
   commit path (open table, `transaction_version(app_id)`, `create_write_transaction` with
   txn and the checkpoint hook; no Spark write), timed at version ~10 and ~1,000, on a table
   with log checkpoints every 100 commits (the default) and one with checkpoints disabled
   (checkpoint_interval = 10^9); plus the cost of opening the latest snapshot there.

    python bench/table_layer.py                 # ~6 min on 2 busy cores
    python bench/table_layer.py --rows 500000 --batches 20 --commits 2000
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NO_CHECKPOINTS = 10**9


# ---- 1. sink ---------------------------------------------------------------------------------

def make_input(spark, gen_landing: Path, out: Path, rows: int, batches: int):
    """EVE events from the generator as flat rows with event_time/event_date, `batches` Parquet files."""
    from pyspark.sql import functions as F

    eve = spark.read.json(str(gen_landing / "suricata" / "eve.*.json"))
    flat = eve.select(
        F.sha2(F.to_json(F.struct(*eve.columns)), 256).alias("event_id"),
        F.to_timestamp("timestamp").alias("event_time"),
        "event_type", "src_ip", "src_port", "dest_ip", "dest_port", "proto", "community_id", "flow_id",
        F.to_json(F.struct(*eve.columns)).alias("raw"))
    flat = flat.withColumn("event_date", F.to_date("event_time"))
    # Repeat the generated events to reach `rows` (ids kept unique), then cut into files.
    have = flat.count()
    copies = max(1, -(-rows // have))
    frame = (flat.crossJoin(spark.range(copies).withColumnRenamed("id", "copy"))
             .withColumn("event_id", F.concat("event_id", F.lit("-"), F.col("copy").cast("string")))
             .drop("copy").limit(rows))
    frame.repartition(batches).write.parquet(str(out))
    return spark.read.parquet(str(out)).schema, spark.read.parquet(str(out)).count()


def stream_delta_sink(spark, src: Path, schema, dest: Path) -> float:
    from pipelines.lake.sink import DeltaSink

    _clear(dest, dest.with_name(dest.name + "-ck"))
    sink = DeltaSink(dest, app_id="bench", partition_by=["event_date"])
    started = time.perf_counter()
    (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
     .writeStream.foreachBatch(sink).option("checkpointLocation", str(dest) + "-ck")
     .trigger(availableNow=True).start().awaitTermination())
    seconds = time.perf_counter() - started
    sink.close()
    return seconds


def stream_foreach_parquet(spark, src: Path, schema, dest: Path) -> float:
    _clear(dest, dest.with_name(dest.name + "-ck"))

    def write(df, batch_id):
        df.write.mode("append").partitionBy("event_date").parquet(str(dest))

    started = time.perf_counter()
    (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
     .writeStream.foreachBatch(write).option("checkpointLocation", str(dest) + "-ck")
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - started


def stream_file_sink(spark, src: Path, schema, dest: Path) -> float:
    _clear(dest, dest.with_name(dest.name + "-ck"))
    started = time.perf_counter()
    (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
     .writeStream.format("parquet").partitionBy("event_date").option("path", str(dest))
     .option("checkpointLocation", str(dest) + "-ck")
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - started


# ---- 2. read ---------------------------------------------------------------------------------

def read_stream_noop(spark, table: Path, ck: Path) -> float:
    from pipelines.lake.source import read_stream

    _clear(ck)
    started = time.perf_counter()
    (read_stream(spark, table).writeStream.format("noop").option("checkpointLocation", str(ck))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - started


def read_parquet_noop(spark, table: Path) -> float:
    from deltalake import DeltaTable

    started = time.perf_counter()
    files = DeltaTable(str(table)).file_uris()
    spark.read.option("basePath", str(table)).parquet(*files).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def read_table_noop(spark, table: Path) -> float:
    from pipelines.lake.read import read_table

    started = time.perf_counter()
    read_table(spark, table).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


# ---- 3. commit latency ----------------------------------------------------------------------

class TinyCommitter:
    """Commits one tiny Parquet file per batch through DeltaSink's own commit code."""

    def __init__(self, path: Path, checkpoint_interval: int) -> None:
        import pyarrow as pa
        from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType, TimestampType

        from pipelines.lake.sink import DeltaSink

        self.path = path
        self.sink = DeltaSink(path, app_id="bench-commits", partition_by=["event_date"],
                              checkpoint_interval=checkpoint_interval)
        self.schema = StructType([StructField("event_id", StringType()), StructField("event_time", TimestampType()),
                                  StructField("n", LongType()), StructField("event_date", DateType())])
        self.arrow_schema = pa.schema([("event_id", pa.string()), ("event_time", pa.timestamp("us", tz="UTC")),
                                       ("n", pa.int64())])
        self.batch_id = 0
        self.files_written = 0
        self.handle = None  # a kept-open table for the untimed fill

    def _actions(self):
        import json

        import pyarrow as pa
        import pyarrow.parquet as pq
        from deltalake.transaction import AddAction

        from pipelines.lake.sink import _stats

        i = self.files_written
        self.files_written += 1
        day = date(2026, 11, 20)
        part = self.path / f"event_date={day.isoformat()}"
        part.mkdir(parents=True, exist_ok=True)
        name = f"part-{i:06d}.parquet"
        when = datetime(2026, 11, 20, tzinfo=timezone.utc) + timedelta(seconds=i)
        pq.write_table(pa.table({"event_id": [f"e{i}"], "event_time": [when], "n": [i]}, schema=self.arrow_schema),
                       part / name)
        meta = pq.read_metadata(part / name)
        stat = (part / name).stat()
        return [AddAction(path=f"event_date={day.isoformat()}/{name}", size=stat.st_size,
                          partition_values={"event_date": day.isoformat()}, modification_time=int(stat.st_mtime * 1000),
                          data_change=True, stats=json.dumps(_stats(meta)))]

    def create(self, files: int = 1) -> None:
        """Version 0, holding `files` tiny files (so a young table can have as many files as an old one)."""
        actions = []
        for _ in range(files):
            actions += self._actions()
            self.batch_id += 1
        self.sink._commit(None, self.schema, actions, 0, [])
        self.batch_id = 1

    def commit_timed(self) -> tuple[float, float]:
        """One batch the way `DeltaSink.write_batch` does it, minus the Spark write:
        (seconds to open the table and check the txn, seconds to commit)."""
        from deltalake import DeltaTable

        actions = self._actions()
        started = time.perf_counter()
        table = DeltaTable(str(self.path)) if DeltaTable.is_deltatable(str(self.path)) else None
        if table is not None:
            done = table.transaction_version(self.sink.app_id)
            assert done is None or done < self.batch_id
        opened = time.perf_counter()
        self.sink._commit(table, self.schema, actions, self.batch_id, [])
        committed = time.perf_counter()
        self.batch_id += 1
        self.handle = None
        return opened - started, committed - opened

    def commit_fast(self) -> None:
        """An untimed commit on a kept-open table (update_incremental), to reach high versions quickly."""
        from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction

        from pipelines.lake.schema import spark_to_delta

        if self.handle is None:
            self.handle = DeltaTable(str(self.path))
            self.delta_schema = spark_to_delta(self.schema)
        props = CommitProperties(app_transactions=[Transaction(self.sink.app_id, self.batch_id)])
        hooks = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
        self.handle.create_write_transaction(self._actions(), mode="append", schema=self.delta_schema,
                                            partition_by=["event_date"], commit_properties=props,
                                            post_commithook_properties=hooks)
        self.handle.update_incremental()
        self.batch_id += 1

    def commit_json(self) -> None:
        """An untimed commit written as the Delta log file delta-rs would write (commitInfo, add,
        txn), without delta-rs: filling a log without checkpoints through delta-rs costs
        O(version) per commit, so 1,000 versions would take minutes."""
        import json

        if self.handle is not None:
            self.handle = None
        version = self.batch_id  # batch ids and versions move together on these tables
        (add,) = self._actions()
        now = int(time.time() * 1000)
        lines = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE",
                            "operationParameters": {"mode": "Append", "partitionBy": '["event_date"]'},
                            "engineInfo": "seclake-bench", "seclake.batch_id": str(self.batch_id)}},
            {"add": {"path": add.path, "partitionValues": add.partition_values, "size": add.size,
                     "modificationTime": add.modification_time, "dataChange": True, "stats": add.stats}},
            {"txn": {"appId": self.sink.app_id, "version": self.batch_id, "lastUpdated": now}},
        ]
        log = self.path / "_delta_log"
        tmp = log / f".{version:020d}.json.tmp"
        tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
        tmp.rename(log / f"{version:020d}.json")
        self.batch_id += 1

    def version(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(str(self.path)).version()

    def open_latest(self) -> float:
        """Seconds to open the latest snapshot and list its files (what every reader pays)."""
        from deltalake import DeltaTable

        started = time.perf_counter()
        DeltaTable(str(self.path)).file_uris()
        return time.perf_counter() - started


def commit_latency(work: Path, commits: int, samples: int, with_nocheckpoint: bool) -> list[list]:
    """Tables live side by side, timed commits round-robin over them (load changes hit all alike):

    - checkpoints every 100 / none, at version ~10 and ~`commits`;
    - the young tables start with as many files as the old ones hold (one per commit), so the
      v~`commits` / v~10 ratio is the cost of the log's length alone;
    - one young table with few files shows what the file count itself costs.
    """
    logs = {"checkpoint every 100": 100}
    if with_nocheckpoint:
        logs["no checkpoints"] = NO_CHECKPOINTS
    plans = []
    for log_name, interval in logs.items():
        plans += [(log_name, interval, 10, commits), (log_name, interval, commits, 1)]
    plans.append(("checkpoint every 100", 100, 10, 1))
    tables: dict[tuple[str, int, int], TinyCommitter] = {}
    for log_name, interval, target, initial_files in plans:
        t = TinyCommitter(work / f"commits-{interval}-{target}-{initial_files}", interval)
        t.create(initial_files)
        fill_started = time.perf_counter()
        while t.batch_id < max(1, target - samples // 2):
            if interval == NO_CHECKPOINTS:
                t.commit_json()
            else:
                t.commit_fast()  # through delta-rs, so its log checkpoints are written
        print(f"  {log_name}: {initial_files} file(s), filled to version {t.batch_id - 1} "
              f"in {time.perf_counter() - fill_started:.1f} s", flush=True)
        tables[(log_name, target, initial_files)] = t
    results = {key: {"open": [], "commit": [], "total": [], "read": []} for key in tables}
    keys = list(tables)
    for i in range(samples):
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            opened, committed = tables[key].commit_timed()
            r = results[key]
            r["open"].append(opened)
            r["commit"].append(committed)
            r["total"].append(opened + committed)
            r["read"].append(tables[key].open_latest())
    rows = []
    for (log_name, target, initial_files), t in tables.items():
        r = results[(log_name, target, initial_files)]
        rows.append([log_name, f"{t.batch_id - samples}..{t.batch_id - 1}", t.files_written,
                     1000 * common.median(r["total"]), 1000 * common.median(r["open"]),
                     1000 * common.median(r["commit"]), 1000 * max(r["total"]), 1000 * common.median(r["read"])])
    return rows


def _clear(*paths: Path) -> None:
    for p in paths:
        if p.exists():
            shutil.rmtree(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows streamed in parts 1 and 2 (default 200k)")
    parser.add_argument("--batches", type=int, default=10, help="input files = micro-batches (default 10)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--commits", type=int, default=1000, help="table version for the 'long log' sample")
    parser.add_argument("--samples", type=int, default=21, help="timed commits per table and version")
    parser.add_argument("--no-nocheckpoint", action="store_true", help="skip the table without log checkpoints")
    parser.add_argument("--parts", default="sink,read,commit", help="which parts to run")
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    work = common.work_dir("table-layer", args.work)
    t0 = time.monotonic()
    results: dict = {"args": vars(args)}

    if parts & {"sink", "read"}:
        common.generate(work / "gen", hours=1, hosts=30, seed=7, zeek_format="json")
        spark = common.spark_session()
        schema, rows = make_input(spark, work / "gen" / "landing", work / "input", args.rows, args.batches)
        print(f"input: {rows:,} rows in {args.batches} Parquet files", flush=True)
        # Warm-up (untimed): one run of each path on the same input.
        stream_delta_sink(spark, work / "input", schema, work / "delta")
        stream_foreach_parquet(spark, work / "input", schema, work / "fb")
        stream_file_sink(spark, work / "input", schema, work / "pq")
        if "sink" in parts:
            print("measuring sinks", flush=True)
            times = common.interleaved(args.reps, {
                "DeltaSink": lambda rep: stream_delta_sink(spark, work / "input", schema, work / "delta"),
                "foreachBatch parquet": lambda rep: stream_foreach_parquet(spark, work / "input", schema, work / "fb"),
                "file sink parquet": lambda rep: stream_file_sink(spark, work / "input", schema, work / "pq"),
            })
            results["sink_s"] = times
            med = {k: common.median(v) for k, v in times.items()}
            base = med["file sink parquet"]
            common.print_table(["sink", "median s", "s/batch", "rows/s", "vs file sink"],
                               [[k, v, v / args.batches, rows / v, f"{v / base:.2f}x"] for k, v in med.items()],
                               title=f"\n1. streaming sink, {rows:,} rows, {args.batches} batches, "
                                     f"AvailableNow maxFilesPerTrigger=1, median of {args.reps}")
        if "read" in parts:
            print("measuring reads", flush=True)
            stream_delta_sink(spark, work / "input", schema, work / "delta")  # the table to read
            read_stream_noop(spark, work / "delta", work / "rs-ck")  # warm-up
            times = common.interleaved(args.reps, {
                "read_stream (AvailableNow)": lambda rep: read_stream_noop(spark, work / "delta", work / "rs-ck"),
                "spark.read.parquet": lambda rep: read_parquet_noop(spark, work / "delta"),
                "read_table": lambda rep: read_table_noop(spark, work / "delta"),
            })
            results["read_s"] = times
            med = {k: common.median(v) for k, v in times.items()}
            base = med["spark.read.parquet"]
            common.print_table(["read", "median s", "rows/s", "vs read.parquet"],
                               [[k, v, rows / v, f"{v / base:.2f}x"] for k, v in med.items()],
                               title=f"\n2. reading the same {rows:,} rows ({args.batches} files) into the noop sink, "
                                     f"median of {args.reps}")
        spark.stop()

    if "commit" in parts:
        print("measuring commit latency", flush=True)
        rows = commit_latency(work, args.commits, args.samples, not args.no_nocheckpoint)
        results["commit_ms"] = rows
        common.print_table(
            ["log", "versions", "files", "batch ms", "open+txn ms", "commit ms", "max ms", "open snapshot ms"], rows,
            title=f"\n3. per-batch table-layer cost (no Spark write), median of {args.samples} commits")
        ratio_rows = []
        for name in dict.fromkeys(r[0] for r in rows):
            young = next(r for r in rows if r[0] == name and int(r[1].split("..")[0]) < 100 and r[2] > 100)
            old = next(r for r in rows if r[0] == name and int(r[1].split("..")[0]) >= 100)
            ratio_rows.append([name, f"{old[3] / young[3]:.2f}x", f"{old[7] / young[7]:.2f}x"])
        few = next(r for r in rows if r[2] < 100)
        many = next(r for r in rows if r[0] == few[0] and int(r[1].split("..")[0]) < 100 and r[2] > 100)
        ratio_rows.append([f"{few[0]}: {many[2]} vs {few[2]} files at v~10", f"{many[3] / few[3]:.2f}x",
                           f"{many[7] / few[7]:.2f}x"])
        common.print_table(["log", f"batch v{args.commits}/v10", f"open v{args.commits}/v10"], ratio_rows,
                           title="ratios (same number of files unless said)")
    path = common.save_results("table_layer", {**results, "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
