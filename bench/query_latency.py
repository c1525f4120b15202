"""Latency of an analyst's top-10 query: `seclake sql`'s path vs plain `spark.read.parquet` on the same files.

Side by side in one SparkSession, interleaved, medians (after one warm-up run of each):

- **ours**: `connect(home).sql(...)`: the table's name registered by path in the catalog,
  delta-spark fixes the snapshot, Spark runs the SQL (what `seclake sql` does per statement);
- **plain**: `spark.read.parquet(<table folder>)` as a view, the same SQL (no snapshot: it
  would also read files of a batch still being committed).

RESULT: `ours_ms` and `plain_ms` (medians) and `ratio` (plain's time over ours: higher is better).

    .venv/bin/python bench/query_latency.py --quick        # ~100k rows in 10 commits
    .venv/bin/python bench/query_latency.py                # synthesises ~300k DNS rows in 30 commits
    .venv/bin/python bench/query_latency.py --home DIR     # DIR's silver_dns when it exists
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

QUERY = "SELECT query, count(*) c FROM {table} GROUP BY query ORDER BY c DESC LIMIT 10"


def synthesise(spark, home, rows: int, commits: int) -> None:
    """`rows` silver_dns rows in `commits` micro-batch commits through the sink; names skewed like
    real DNS (a few very popular, a long tail)."""
    from pyspark.sql import functions as F

    from pipelines.lake.registry import Lake
    from pipelines.schemas import SILVER_SCHEMAS

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", help="a seclake home whose silver_dns to query (default: synthesise one)")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100k rows in 10 commits, 3 reps")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.commits, args.reps = 100_000, 10, 3

    from pipelines.home import Home
    from pipelines.lake.log import summary
    from pipelines.lake.registry import Lake
    from pipelines.sql import connect

    spark = common.spark_session()
    home = Home.resolve(args.home) if args.home else Home.resolve(common.work_dir("query_latency")).create()
    if not Lake(home).exists("silver_dns"):
        print(f"synthesising silver_dns: {args.rows} rows in {args.commits} commits under {home.root}", flush=True)
        synthesise(spark, home, args.rows, args.commits)
    db = connect(home.root, spark=spark)
    path = str(Lake(home).path("silver_dns"))

    def ours():
        return db.sql(QUERY.format(table="silver_dns")).collect()

    def plain():
        spark.read.parquet(path).createOrReplaceTempView("plain_dns")
        return spark.sql(QUERY.format(table="plain_dns")).collect()

    sides = {"ours": ours, "plain": plain}
    # Also the warm-up: each side once, and both must return the same top 10.
    answers = [sorted(run()) for run in sides.values()]
    assert all(a == answers[0] for a in answers), "the paths read different rows"
    times = common.interleaved(args.reps, {name: (lambda rep, run=run: common.timed(run)[0])
                                           for name, run in sides.items()})
    found = summary(path)
    plain_median = common.median(times["plain"])
    print(f"silver_dns: {found.rows:,} rows, {found.files} files, version {found.version}; "
          f"{QUERY.format(table='silver_dns')}")
    table = [[name, common.median(t), min(t), max(t), f"{common.median(t) / plain_median:.2f}x"]
             for name, t in times.items()]
    common.print_table(["path", "median s", "min s", "max s", "vs plain"], table,
                       title=f"top-10 query latency, {args.reps} interleaved runs after a warm-up")
    common.save_results("query_latency", {"args": vars(args), "rows": found.rows, "files": found.files,
                                          "seconds": times})
    spark.catalog.dropTempView("plain_dns")
    ours_median = common.median(times["ours"])
    print(f"RESULT ours_ms={1000 * ours_median:.0f} plain_ms={1000 * plain_median:.0f} "
          f"ratio={plain_median / ours_median:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
