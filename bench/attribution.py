"""Attribution cost, measured side by side in one run: join throughput vs stateless queries on
the same input, state size after one simulated day, and how many scenario events are attributed.

    .venv/bin/python bench/attribution.py --hours 24 --hosts 50

Generates the day with sample_data.generator into a temporary home, runs the ETL (landing ->
silver), then the attribution stages as run-once does (end-of-input mark, `dhcp_leases`, the
three enriched queries; AvailableNow), and a stateless copy of silver_conn through the same
Delta source and sink as a baseline for the join.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import functions as F  # noqa: E402

from pipelines import attribution, etl, query  # noqa: E402
from pipelines.home import Home  # noqa: E402
from pipelines.lake.registry import Lake  # noqa: E402
from pipelines.lake.sink import DeltaSink  # noqa: E402
from pipelines.lake.source import read_stream  # noqa: E402
from pipelines.schemas import ENRICHED_SCHEMAS  # noqa: E402
from pipelines.settings import Settings  # noqa: E402
from pipelines.spark import get_spark  # noqa: E402
from sample_data.generator import generate  # noqa: E402


def run(spark, lake: Lake, settings: Settings, name: str, start) -> query.QueryReport:
    began = time.monotonic()
    running = start(spark, lake, settings, query.AVAILABLE_NOW)
    try:
        running.query.awaitTermination()
    finally:
        running.writer.close()
    rep = query.report(running, began)
    if rep.error:
        raise SystemExit(f"{name} failed: {rep.error}")
    return rep


def stateless_copy(spark, lake: Lake, settings: Settings, trigger: dict) -> query.RunningQuery:
    """Baseline: silver_conn -> a copy, same source, read limit and sink as enriched_conn, no join."""
    sink = DeltaSink(lake.home.table("bench_conn_copy"), app_id="bench_conn_copy", partition_by=["event_date"])

    class Writer:
        history: list = []

        def __call__(self, df, batch_id):
            stats = query.BatchStats(batch_id)
            stats.record(sink.write_batch(df, batch_id))
            self.history.append(stats)

        def close(self):
            """Nothing to release."""

    writer = Writer()
    frame = read_stream(spark, lake.path("silver_conn"), max_files=settings.max_files_per_trigger or None)
    started = query.start_query(frame, "bench_conn_copy", writer, lake.home.checkpoint("bench_conn_copy"), trigger)
    return query.RunningQuery("bench_conn_copy", started, writer, ("bench_conn_copy",))


def throughput(rep: query.QueryReport) -> int:
    silver = sum(n for table, n in rep.rows_out.items() if table.startswith("silver_"))
    return silver if rep.name == "etl" else rep.rows_in


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lease-piece", default=Settings().lease_piece)
    parser.add_argument("--lease-cut", default=Settings().lease_cut)
    parser.add_argument("--home", help="keep the run here instead of a temporary folder")
    parser.add_argument("--quick", action="store_true", help="2 simulated hours of 20 hosts")
    args = parser.parse_args()
    if args.quick:
        args.hours, args.hosts = 2, 20

    home = Home.resolve(args.home or tempfile.mkdtemp(prefix="seclake-bench-"))
    began = time.monotonic()
    generate(home.root, hours=args.hours, hosts=args.hosts, seed=args.seed, overwrite=True)
    print(f"generated {args.hours:g} h for {args.hosts} hosts in {time.monotonic() - began:.0f}s into {home.root}")

    spark = get_spark(ui=False)
    lake = Lake(home.create())
    settings = Settings().with_overrides({"lease_piece": args.lease_piece, "lease_cut": args.lease_cut})
    reports = [run(spark, lake, settings, "etl", etl.start)]
    reports.append(run(spark, lake, settings, "bench_conn_copy", stateless_copy))
    reports += [run(spark, lake, settings, s.name, s.start) for s in attribution.stages()]

    print(f"\nlease_piece={settings.lease_piece}, lease_cut={settings.lease_cut}, event/lease watermark "
          f"{settings.event_watermark}/{settings.lease_watermark}")
    print("(etl: rows in = files, rows/s = silver rows written per second)")
    print(f"{'query':<22}{'rows in':>10}{'rows out':>10}{'s':>8}{'rows/s':>9}{'state rows':>12}{'state KiB':>11}"
          f"{'checkpoint KiB':>16}")
    for rep in reports:
        rate = throughput(rep) / rep.duration_s
        checkpoint = du(home.checkpoint(rep.name)) // 1024 if home.checkpoint(rep.name).exists() else 0
        print(f"{rep.name:<22}{rep.rows_in:>10}{sum(rep.rows_out.values()):>10}{rep.duration_s:>8.1f}{rate:>9.0f}"
              f"{rep.state_rows:>12}{rep.state_bytes // 1024:>11}{checkpoint:>16}")
    by_name = {r.name: r for r in reports}
    copy, join, etl_report = by_name["bench_conn_copy"], by_name["enriched_conn"], by_name["etl"]
    print(f"\nenriched_conn join vs stateless copy of the same silver_conn: "
          f"{(join.rows_in / join.duration_s) / (copy.rows_in / copy.duration_s):.2f}x the rows/s")
    print(f"enriched_conn join vs stateless ETL: "
          f"{(join.rows_in / join.duration_s) / (throughput(etl_report) / etl_report.duration_s):.2f}x the rows/s")
    joins_s = sum(by_name[s.name].duration_s for s in attribution.stages())
    print(f"dhcp_leases + 3 enriched queries vs ETL: {joins_s / etl_report.duration_s:.2f}x the ETL's time")

    held = sum(lake.read(spark, t).count() for t in attribution.ENRICHED_INPUTS.values()) - \
        sum(lake.read(spark, t).count() for t in ENRICHED_SCHEMAS)
    print(f"\nafter the run (end of input marked): {held} silver events not in an enriched table")

    truth = [json.loads(line) for line in (home.root / "ground_truth.jsonl").read_text().splitlines() if line.strip()]
    enriched = None
    for table in ENRICHED_SCHEMAS:
        frame = lake.read(spark, table).select("uid", "mac")
        enriched = frame if enriched is None else enriched.unionByName(frame)
    for scenario in ("roaming_laptop", "ids_alert_reused_ip"):
        cases = [t for t in truth if t["scenario"] == scenario and t.get("mac")]
        wanted = spark.createDataFrame([(str(e), t["mac"]) for t in cases for e in t["event_ids"]],
                                       "uid string, want string")
        got = wanted.join(enriched, "uid", "left").groupBy().agg(
            F.count("*").alias("n"), F.sum((F.col("mac") == F.col("want")).cast("int")).alias("right"),
            F.sum(F.col("mac").isNull().cast("int")).alias("missing")).first()
        print(f"{scenario}: {got.right or 0}/{got.n} scenario rows attributed to the right MAC "
              f"({got.missing or 0} without attribution or not emitted yet)")
    total = enriched.count()
    attributed = enriched.where("mac IS NOT NULL").count()
    print(f"all enriched rows: {attributed}/{total} attributed ({100 * attributed / max(total, 1):.1f}%)")
    # the stream-stream join's rows/s over the stateless copy's, same input (higher is better)
    join_ratio = (join.rows_in / join.duration_s) / (copy.rows_in / copy.duration_s)
    print(f"RESULT join_over_copy_ratio={join_ratio:.3f} attributed_pct={100 * attributed / max(total, 1):.1f}")


if __name__ == "__main__":
    main()
