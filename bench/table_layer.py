"""The table layer (delta-spark) next to plain Spark Parquet, and commit latency vs log length.

Three measurements in one SparkSession, sides interleaved (ABC, BCA, ...), medians:

1. **Sink.** The same Parquet input streamed with the same trigger (AvailableNow,
   maxFilesPerTrigger=1: one micro-batch per input file) into
   - `foreachBatch(DeltaSink)`: delta-spark append with txnAppId/txnVersion, partitioned by
     event_date, plus the look-up of its own commit (what the pipeline's sinks do);
   - `writeStream.format("parquet")`: Spark's file sink, same partitioning (the baseline).
2. **Stream read.** The Delta table the sink wrote, read to Spark's `noop` sink with
   - `read_stream` (delta-spark's streaming source, AvailableNow; a fresh checkpoint on this
     young append-only table reads its commits from version 0: `pipelines.lake.source.replayable`);
   - delta-spark's source as it starts by default, from the table's snapshot (what `read_stream`
     does on a table with a long log or removed rows);
   - `readStream.parquet` over the table's data folder (the baseline: same files, no Delta).
3. **Commit latency vs table version.** Small appends through `DeltaSink`, timed at version
   ~10 and ~N (default 1,000) of tables with log checkpoints every 100 commits.

RESULT keys: `stream_read_ratio` and `sink_ratio` are our throughput divided by the baseline's
(higher is better); `commit_v1000_over_v10` is the median commit latency at version ~N divided
by that at version ~10 (lower is better); `stream_read_ratio_snapshot` is the stream read ratio
of the snapshot start.

    python bench/table_layer.py --quick       # a few minutes on 2 cores
    python bench/table_layer.py               # 200k rows, 3 reps, 1,000 commits
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


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
    copies = max(1, -(-rows // flat.count()))
    frame = (flat.crossJoin(spark.range(copies).withColumnRenamed("id", "copy"))
             .withColumn("event_id", F.concat("event_id", F.lit("-"), F.col("copy").cast("string")))
             .drop("copy").limit(rows))
    frame.repartition(batches).write.parquet(str(out))
    return spark.read.parquet(str(out)).schema, spark.read.parquet(str(out)).count()


def _stream_in(spark, src: Path, schema):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))


def stream_delta_sink(spark, src: Path, schema, dest: Path) -> float:
    from pipelines.lake.sink import DeltaSink

    _clear(dest, dest.with_name(dest.name + "-ck"))
    sink = DeltaSink(dest, app_id="bench", partition_by=["event_date"])
    t = time.perf_counter()
    (_stream_in(spark, src, schema).writeStream.foreachBatch(sink)
     .option("checkpointLocation", str(dest.with_name(dest.name + "-ck")))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - t


def stream_file_sink(spark, src: Path, schema, dest: Path) -> float:
    _clear(dest, dest.with_name(dest.name + "-ck"))
    t = time.perf_counter()
    (_stream_in(spark, src, schema).writeStream.format("parquet").partitionBy("event_date")
     .option("path", str(dest)).option("checkpointLocation", str(dest.with_name(dest.name + "-ck")))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - t


def read_stream_noop(spark, table: Path, checkpoint: Path) -> float:
    from pipelines.lake.source import read_stream

    _clear(checkpoint)
    t = time.perf_counter()
    (read_stream(spark, table).writeStream.format("noop").option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - t


def read_snapshot_stream_noop(spark, table: Path, checkpoint: Path) -> float:
    _clear(checkpoint)
    t = time.perf_counter()
    (spark.readStream.format("delta").load(str(table))
     .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - t


def read_parquet_stream_noop(spark, table: Path, schema, checkpoint: Path) -> float:
    _clear(checkpoint)
    t = time.perf_counter()
    (spark.readStream.schema(schema).option("recursiveFileLookup", False).parquet(str(table))
     .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    return time.perf_counter() - t


def commit_latency(spark, work: Path, commits: int, samples: int) -> dict[str, list[float]]:
    """Samples of one small DeltaSink append at version ~10 and ~`commits`.

    The long log is filled with metadata-only commits (`ALTER TABLE ... SET TBLPROPERTIES`: no
    Spark job, so a thousand take about a minute); Delta checkpoints it every 100 commits as usual.
    """
    from pipelines.lake.registry import Lake
    from pipelines.lake.sink import DeltaSink, create_empty

    spec = Lake.spec("silver_dns")
    frame = spark.createDataFrame([], spec.schema)
    # `delta.<path>` in SQL needs runSQLOnFiles, which seclake's sessions turn off.
    session = spark.newSession()
    session.conf.set("spark.sql.runSQLOnFiles", "true")
    sinks = {}
    for label, target in (("v10", 10), (f"v{commits}", commits)):
        path = work / f"commits-{target}"
        _clear(path)
        create_empty(spark, path, spec.schema, list(spec.partition_by))
        started = time.perf_counter()
        for i in range(max(1, target - samples // 2)):
            session.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('seclake.bench.fill' = '{i}')")
        print(f"  {label}: filled to version ~{target - samples // 2} in {time.perf_counter() - started:.0f} s",
              flush=True)
        sinks[label] = DeltaSink(path, app_id="bench", partition_by=spec.partition_by)
    times: dict[str, list[float]] = {label: [] for label in sinks}
    labels = list(sinks)
    for i in range(samples):
        for label in labels[i % 2:] + labels[:i % 2]:
            t = time.perf_counter()
            sinks[label].write_batch(frame, i)
            times[label].append(time.perf_counter() - t)
    return times


def _clear(*paths: Path) -> None:
    for p in paths:
        if p.exists():
            shutil.rmtree(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60k rows, 3 reps, 9 samples: a few minutes")
    parser.add_argument("--rows", type=int, default=200_000, help="rows streamed in parts 1 and 2")
    parser.add_argument("--batches", type=int, default=10, help="input files = micro-batches")
    parser.add_argument("--reps", type=int, default=3, help="timed runs of each sink")
    parser.add_argument("--read-reps", type=int, default=7,
                        help="timed runs of each stream read: a read takes a fraction of a second, so its "
                             "median needs more samples than a sink's")
    parser.add_argument("--commits", type=int, default=1000, help="table version of the 'long log' sample")
    parser.add_argument("--samples", type=int, default=15, help="timed commits per table")
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.batches, args.reps, args.samples = 60_000, 6, 3, 9
    work = common.work_dir("table-layer", args.work)
    t0 = time.monotonic()
    results: dict = {"args": vars(args)}

    common.generate(work / "gen", hours=1, hosts=30, seed=7, zeek_format="json")
    spark = common.spark_session()
    schema, rows = make_input(spark, work / "gen" / "landing", work / "input", args.rows, args.batches)
    print(f"input: {rows:,} rows in {args.batches} Parquet files", flush=True)
    # Warm-up (untimed): one run of each side.
    stream_delta_sink(spark, work / "input", schema, work / "delta")
    stream_file_sink(spark, work / "input", schema, work / "pq")
    read_stream_noop(spark, work / "delta", work / "rs-ck")
    read_snapshot_stream_noop(spark, work / "delta", work / "ss-ck")
    read_parquet_stream_noop(spark, work / "pq", schema, work / "rp-ck")

    print("measuring sinks", flush=True)
    sink_s = common.interleaved(args.reps, {
        "DeltaSink (delta-spark)": lambda rep: stream_delta_sink(spark, work / "input", schema, work / "delta"),
        "file sink parquet": lambda rep: stream_file_sink(spark, work / "input", schema, work / "pq"),
    })
    print("measuring stream reads", flush=True)
    read_s = common.interleaved(args.read_reps, {
        "read_stream (delta-spark)": lambda rep: read_stream_noop(spark, work / "delta", work / "rs-ck"),
        "delta-spark, snapshot start": lambda rep: read_snapshot_stream_noop(spark, work / "delta", work / "ss-ck"),
        "readStream.parquet": lambda rep: read_parquet_stream_noop(spark, work / "pq", schema, work / "rp-ck"),
    })
    print("measuring commit latency", flush=True)
    commit_s = commit_latency(spark, work, args.commits, args.samples)
    spark.stop()

    results.update(sink_s=sink_s, read_s=read_s, commit_s=commit_s)
    med_sink = {k: common.median(v) for k, v in sink_s.items()}
    med_read = {k: common.median(v) for k, v in read_s.items()}
    med_commit = {k: common.median(v) for k, v in commit_s.items()}
    common.print_table(["sink", "median s", "rows/s"], [[k, v, rows / v] for k, v in med_sink.items()],
                       title=f"\n1. streaming sink, {rows:,} rows, {args.batches} batches, median of {args.reps}")
    common.print_table(["stream read", "median s", "rows/s"], [[k, v, rows / v] for k, v in med_read.items()],
                       title=f"\n2. stream read to noop, {rows:,} rows, median of {args.read_reps}")
    common.print_table(["table version", "median commit ms"], [[k, 1000 * v] for k, v in med_commit.items()],
                       title=f"\n3. one small append through DeltaSink, median of {args.samples}")
    sink_ratio = med_sink["file sink parquet"] / med_sink["DeltaSink (delta-spark)"]
    read_ratio = med_read["readStream.parquet"] / med_read["read_stream (delta-spark)"]
    snapshot_ratio = med_read["readStream.parquet"] / med_read["delta-spark, snapshot start"]
    commit_ratio = med_commit[f"v{args.commits}"] / med_commit["v10"]
    results.update(sink_ratio=sink_ratio, stream_read_ratio=read_ratio, stream_read_ratio_snapshot=snapshot_ratio,
                   commit_ratio=commit_ratio)
    path = common.save_results("table_layer", {**results, "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"RESULT stream_read_ratio={read_ratio:.2f} sink_ratio={sink_ratio:.2f} "
          f"commit_v{args.commits}_over_v10={commit_ratio:.2f} stream_read_ratio_snapshot={snapshot_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
