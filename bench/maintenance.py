"""`seclake maintain` on a home of generated days: files before and after, and query latency.

1. Generates `--days` days (7) of `--hosts` devices (5, one data line in `--keep` kept) and runs
   every stage over them the way scheduled run-once leaves a home: the ETL in micro-batches of
   `--batch-files` landing files (12: a few hours each), so every table holds many small files.
2. Copies the home twice: **before** (as built), **after** (`pipelines.operations.maintain`, what
   `seclake maintain` runs: OPTIMIZE, VACUUM, log checkpoint) and **zorder** (the maintained copy,
   its `enriched_dns` keeping statistics on `src_ip` besides its time columns, then `OPTIMIZE
   enriched_dns ZORDER BY (src_ip)`: rules and analysts filter by host).
3. Times, interleaved in one SparkSession through `seclake sql`'s path (`connect(home).sql`), an
   analyst's top-10 query on `enriched_dns` and a one-host query on it, on each copy.

RESULT: `files_before`, `files_after` (live files of every table), `top10_before_ms`,
`top10_after_ms`, `top10_ratio` (before's time over after's: higher means maintenance helped),
`host_after_ms`, `host_zorder_ms`, `zorder_ratio` (after's over zorder's).

    .venv/bin/python bench/maintenance.py --quick   # 2 days, 5 reps
    .venv/bin/python bench/maintenance.py           # 7 days, 7 reps
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

TOP10 = "SELECT query, count(*) c FROM enriched_dns GROUP BY query ORDER BY c DESC LIMIT 10"
HOST = "SELECT count(*) n, count(DISTINCT query) q FROM enriched_dns WHERE src_ip = '{ip}'"


def build(spark, landing: Path, home_dir: Path, batch_files: int) -> None:
    """Every stage over `landing`, the ETL `batch_files` files per micro-batch."""
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

    common.link_tree(landing, home_dir / "landing")
    # The device inventory: enriched rows name their device and owner, as in a real home.
    shutil.copytree(landing.parent / "reference", home_dir / "reference", dirs_exist_ok=True)
    lake = Lake(Home.resolve(home_dir).create())
    reports = run_once(spark, lake, Settings().with_overrides({"max_files_per_trigger": batch_files}))
    failed = [r for r in reports if r.error]
    if failed:
        raise RuntimeError(f"run-once failed building the home: {failed[0].name}: {failed[0].error}")
    print(f"  {sum(r.batches for r in reports)} micro-batches over {len(reports)} stages", flush=True)


def live_files(home_dir: Path) -> tuple[int, float]:
    """Live files and MiB of every table of the home."""
    from pipelines.home import Home
    from pipelines.lake.admin import file_stats
    from pipelines.lake.registry import Lake

    lake = Lake(Home.resolve(home_dir))
    stats = [file_stats(lake.path(n)) for n in lake.names() if lake.exists(n)]
    return sum(s.files for s in stats), sum(s.size_bytes for s in stats) / 2**20


def copy_home(src: Path, dest: Path) -> Path:
    """Tables and checkpoints copied (Delta logs hold relative file paths), landing left out."""
    dest.mkdir(parents=True)
    for name in ("tables", "checkpoints"):
        shutil.copytree(src / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--hosts", type=int, default=5, help="devices (default 5, the generator's minimum)")
    parser.add_argument("--keep", type=int, default=2, help="keep one data line in N of each file (default 2)")
    parser.add_argument("--batch-files", type=int, default=12, help="landing files per ETL micro-batch")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--work", help="scratch folder (default $TMPDIR/seclake-bench-maintenance)")
    parser.add_argument("--quick", action="store_true", help="2 days, 5 reps")
    args = parser.parse_args(argv)
    if args.quick:
        args.days, args.reps = 2.0, 5

    from etl_throughput import thin

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.operations.maintain import maintain
    from pipelines.sql import connect

    work = common.work_dir("maintenance", args.work)
    started = time.monotonic()
    start = datetime.fromisoformat(common.BUSY_START.replace("Z", "+00:00")) - timedelta(days=args.days)
    manifest = common.generate(work / "gen", hours=24 * args.days, hosts=args.hosts,
                               start=start.strftime("%Y-%m-%dT%H:%M:%SZ"))
    kept = thin(work / "gen" / "landing", args.keep)
    print(f"generated {args.days:g} days of {args.hosts} hosts: {kept:,} lines kept (one in {args.keep}) "
          f"in {manifest['totals']['files']} files", flush=True)
    spark = common.spark_session()
    print(f"building the home (run-once, {args.batch_files} landing files per ETL batch) ...", flush=True)
    built_s, _ = common.timed(lambda: build(spark, work / "gen" / "landing", work / "before", args.batch_files))
    print(f"  built in {built_s:.0f} s", flush=True)

    after = copy_home(work / "before", work / "after")
    maintained_s, report = common.timed(lambda: maintain(spark, Lake(Home.resolve(after))))
    print(f"maintain took {maintained_s:.1f} s:", flush=True)
    for table in report:
        print(f"  {table.line()}", flush=True)
    zorder = copy_home(after, work / "zorder")
    from delta.tables import DeltaTable

    lake = Lake(Home.resolve(zorder))
    table = DeltaTable.forPath(spark, str(lake.path("enriched_dns")))
    # seclake's tables keep statistics on their time columns only (`stats_properties`), so Delta
    # refuses to Z-order by a column it cannot skip on: the copy keeps them on `src_ip` too, and
    # the Z-order's rewrite of every file writes them.
    stats = table.detail().first().properties["delta.dataSkippingStatsColumns"]
    lake.register(spark, ["enriched_dns"])
    spark.sql(f"ALTER TABLE enriched_dns SET TBLPROPERTIES ('delta.dataSkippingStatsColumns' = '{stats},src_ip')")
    table.optimize().executeZOrderBy("src_ip")

    dbs = {name: connect(work / name, spark=spark) for name in ("before", "after", "zorder")}
    busiest = dbs["before"].sql("SELECT src_ip FROM enriched_dns GROUP BY src_ip ORDER BY count(*) DESC LIMIT 1"
                                ).first()
    host = HOST.format(ip=busiest.src_ip)
    sides = {"top10 before": ("before", TOP10), "top10 after": ("after", TOP10),
             "host after": ("after", host), "host zorder": ("zorder", host)}
    # The warm-up: every side once; copies of one home must answer alike.
    answers = {name: sorted(map(tuple, dbs[db].sql(sql).collect())) for name, (db, sql) in sides.items()}
    if answers["top10 before"] != answers["top10 after"] or answers["host after"] != answers["host zorder"]:
        raise RuntimeError(f"the copies answer differently: {answers}")
    times = common.interleaved(args.reps, {name: (lambda rep, db=db, sql=sql: common.timed(
        lambda: dbs[db].sql(sql).collect())[0]) for name, (db, sql) in sides.items()})
    med = {name: common.median(t) for name, t in times.items()}
    files_before, mib_before = live_files(work / "before")
    files_after, mib_after = live_files(after)
    common.print_table(["query", "home", "median s", "min s", "max s"],
                       [[name.split()[0], name.split()[1], med[name], min(t), max(t)] for name, t in times.items()],
                       title=f"query latency, {args.reps} interleaved runs after a warm-up; {host}")
    print(f"live files of every table: {files_before} ({mib_before:.1f} MiB) before, "
          f"{files_after} ({mib_after:.1f} MiB) after; whole run {time.monotonic() - started:.0f} s")
    common.save_results("maintenance", {"args": vars(args), "lines": kept, "build_s": built_s,
                                        "maintain_s": maintained_s, "files_before": files_before,
                                        "files_after": files_after, "seconds": times})
    shutil.rmtree(work, ignore_errors=True)
    print(f"RESULT files_before={files_before} files_after={files_after} "
          f"top10_before_ms={1000 * med['top10 before']:.0f} top10_after_ms={1000 * med['top10 after']:.0f} "
          f"top10_ratio={med['top10 before'] / med['top10 after']:.2f} "
          f"host_after_ms={1000 * med['host after']:.0f} host_zorder_ms={1000 * med['host zorder']:.0f} "
          f"zorder_ratio={med['host after'] / med['host zorder']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
