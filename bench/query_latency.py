"""Latency of an analyst's top-10 query: `seclake sql`'s path vs plain `spark.read.parquet` on the same files.

Ours opens the Delta snapshot with delta-rs, registers a view over exactly its files and runs the
SQL; plain lists the table folder and runs the same SQL. A third line runs ours with Spark's
parallel file listing off: given more than 32 paths (spark.sql.sources.parallelPartitionDiscovery
.threshold) Spark stats them in a Spark job, which costs more than the query on a small table.
Median of --runs runs each (after one warm-up each, interleaved), one Spark session, same files.

    .venv/bin/python bench/query_latency.py                  # synthesises ~300k DNS rows in 30 commits
    .venv/bin/python bench/query_latency.py --home DIR       # uses DIR's silver_dns when it exists
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from pipelines.home import Home  # noqa: E402
from pipelines.lake.read import open_table  # noqa: E402
from pipelines.lake.registry import Lake  # noqa: E402
from pipelines.schemas import SILVER_SCHEMAS  # noqa: E402
from pipelines.spark import get_spark  # noqa: E402
from pipelines.sql import connect  # noqa: E402

QUERY = "SELECT query, count(*) c FROM {table} GROUP BY query ORDER BY c DESC LIMIT 10"


def synthesise(spark: SparkSession, home: Home, rows: int, commits: int) -> None:
    """`rows` silver_dns rows in `commits` micro-batch commits; names skewed like real DNS (few popular)."""
    sink = Lake(home).sink("silver_dns")
    per = rows // commits
    schema = SILVER_SCHEMAS["silver_dns"]
    for batch in range(commits):
        df = spark.range(batch * per, (batch + 1) * per).select(
            F.format_string("e%d", "id").alias("event_id"),
            (F.lit(1795219200) + F.floor(F.col("id") * (2 * 86400 / rows))).cast("timestamp").alias("event_time"),
            F.lit("zeek").alias("source"),
            F.format_string("10.0.%d.%d", F.col("id") % 4, F.col("id") % 250).alias("src_ip"),
            F.lit("10.0.0.53").alias("dst_ip"),
            F.format_string("host%d.example%d.com", (F.pow(F.rand(batch), 3) * 5000).cast("int"),
                            F.col("id") % 40).alias("query"),
            F.lit("A").alias("qtype_name"),
            F.lit("NOERROR").alias("rcode_name"),
            F.array(F.lit("192.0.2.1")).alias("answers"),
        ).withColumn("event_date", F.to_date("event_time"))
        sink.write_batch(df.select([F.col(f.name).cast(f.dataType) if f.name in df.columns
                                    else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields]), batch)
    sink.close()


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", help="a seclake home whose silver_dns to query (default: synthesise one)")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    spark = get_spark(app_name="seclake-bench-sql", ui=False)
    scratch = tempfile.TemporaryDirectory(prefix="seclake-bench-")
    home = Home.resolve(args.home) if args.home else Home.resolve(scratch.name).create()
    if not Lake(home).exists("silver_dns"):
        print(f"synthesising silver_dns: {args.rows} rows in {args.commits} commits under {home.root}", file=sys.stderr)
        synthesise(spark, home, args.rows, args.commits)
    db = connect(home.root, spark=spark)
    path = str(Lake(home).path("silver_dns"))
    snapshot = open_table(path)

    def ours():
        return db.sql(QUERY.format(table="silver_dns")).collect()

    def plain():
        spark.read.parquet(path).createOrReplaceTempView("plain_dns")
        return spark.sql(QUERY.format(table="plain_dns")).collect()

    threshold = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    default_threshold = spark.conf.get(threshold)

    def ours_driver_listing():
        spark.conf.set(threshold, "100000")
        try:
            return ours()
        finally:
            spark.conf.set(threshold, default_threshold)

    variants = {"ours": ours, "plain": plain, "driver": ours_driver_listing}
    assert sorted(ours()) == sorted(plain()) == sorted(ours_driver_listing()), "the paths read different rows"
    times: dict[str, list[float]] = {key: [] for key in variants}
    for _ in range(args.runs):
        for key, run in variants.items():
            times[key].append(timed(run))
    opens = [timed(lambda: open_table(path).file_uris()) for _ in range(args.runs)]

    rows = spark.read.parquet(path).count()
    print(f"silver_dns: {rows} rows, {len(snapshot.file_uris())} files, version {snapshot.version()}; "
          f"median of {args.runs} runs after one warm-up each")
    print(f"query: {QUERY.format(table='silver_dns')}")
    print(f"{'path':<44} {'median s':>9} {'min s':>7} {'max s':>7}")
    labels = {"ours": "seclake sql (delta-rs snapshot + view)", "plain": "spark.read.parquet(folder) + view",
              "driver": "seclake sql, file listing on the driver"}
    for key, label in labels.items():
        t = times[key]
        print(f"{label:<44} {statistics.median(t):>9.3f} {min(t):>7.3f} {max(t):>7.3f}")
    print(f"{'  of which delta-rs open + file list':<44} {statistics.median(opens):>9.3f}")
    plain_median = statistics.median(times["plain"])
    print(f"ratio ours / plain (medians): {statistics.median(times['ours']) / plain_median:.2f}; "
          f"with driver-side listing: {statistics.median(times['driver']) / plain_median:.2f}")
    spark.catalog.dropTempView("plain_dns")
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
