"""ETL throughput: seclake's landing -> bronze/quarantine/silver (AvailableNow) vs plain Spark.

Both sides read the same generated landing files in the same SparkSession, interleaved,
median of --reps repetitions after one untimed warm-up of each side:

- seclake: `jobs.run_once(spark, lake, only=["etl"])` into a fresh home (the real query:
  whole-file source, parse, 7 Delta tables committed by delta-rs, de-duplication).
- plain parse: `spark.read.json` of each Zeek kind (Zeek JSON) or `spark.read.csv(sep=TAB,
  comment=#)` (Zeek TSV) and of the EVE files, each written with `write.parquet`.
- plain text: `spark.read.text` of every file -> `write.parquet` (the I/O floor).

Zeek JSON (`--zeek-format json`) makes `read.json` a like-for-like parse; TSV is reported too.

    python bench/etl_throughput.py                      # ~10k events per format, 3 reps
    python bench/etl_throughput.py --hours 4 --hosts 100 --reps 5
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def run_seclake(spark, landing: Path, home_dir: Path, expected: dict[str, int] | None) -> float:
    from pipelines import etl
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

    if home_dir.exists():
        shutil.rmtree(home_dir)
    common.link_tree(landing, home_dir / "landing")
    lake = Lake(Home.resolve(home_dir).create())
    started = time.perf_counter()
    reports = run_once(spark, lake, Settings(), only=[etl.QUERY_NAME])
    seconds = time.perf_counter() - started
    if reports[0].error:
        raise RuntimeError(f"seclake ETL failed: {reports[0].error}")
    if expected:
        got = {t: common.table_rows(lake.path(t)) for t in expected}
        if got != expected:
            raise RuntimeError(f"silver rows {got} differ from the manifest's {expected}")
    shutil.rmtree(home_dir)
    return seconds


def run_plain_parse(spark, landing: Path, out: Path, zeek_format: str) -> float:
    if out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()
    zeek = landing / "zeek"
    for kind in ("conn", "dns", "dhcp"):
        files = str(zeek / f"{kind}.*.log")
        if zeek_format == "json":
            frame = spark.read.json(files)
        else:
            frame = spark.read.option("sep", "\t").option("comment", "#").csv(files)
        frame.write.parquet(str(out / f"zeek_{kind}"))
    spark.read.json(str(landing / "suricata" / "eve.*.json")).write.parquet(str(out / "eve"))
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return seconds


def run_plain_text(spark, landing: Path, out: Path) -> float:
    if out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()
    spark.read.text([str(landing / "zeek"), str(landing / "suricata")]).write.parquet(str(out))
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=0.5, help="simulated hours to generate (default 0.5)")
    parser.add_argument("--hosts", type=int, default=100, help="devices (default 100: ~25k events/hour at noon)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per side (median reported)")
    parser.add_argument("--formats", default="json,tsv", help="Zeek formats to run (json,tsv)")
    parser.add_argument("--work", default=None, help="scratch folder (default $TMPDIR/seclake-bench-etl)")
    parser.add_argument("--quick", action="store_true", help="0.25 simulated hours, TSV only, 1 rep")
    args = parser.parse_args(argv)
    if args.quick:
        args.hours, args.formats, args.reps = 0.25, "tsv", 1
    work = common.work_dir("etl", args.work)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    t0 = time.monotonic()

    inputs = {}
    for fmt in formats:
        manifest = common.generate(work / f"gen-{fmt}", hours=args.hours, hosts=args.hosts, seed=args.seed,
                                   zeek_format=fmt)
        inputs[fmt] = manifest
        size = sum(f["bytes"] for f in manifest["files"])
        print(f"input {fmt}: {manifest['totals']['events']:,} events, {manifest['totals']['lines']:,} lines, "
              f"{manifest['totals']['files']} files, {size / 1e6:.1f} MB", flush=True)
    warm = common.generate(work / "gen-warm", hours=0.1, hosts=5, seed=args.seed, zeek_format="json")
    del warm

    spark = common.spark_session()
    print("warm-up (untimed) ...", flush=True)
    run_seclake(spark, work / "gen-warm" / "landing", work / "home", None)
    run_plain_parse(spark, work / "gen-warm" / "landing", work / "plain", "json")
    run_plain_parse(spark, work / "gen-warm" / "landing", work / "plain", "tsv")
    run_plain_text(spark, work / "gen-warm" / "landing", work / "plain")

    rows, raw = [], {}
    for fmt in formats:
        landing = work / f"gen-{fmt}" / "landing"
        expected = common.expected_silver(inputs[fmt])
        print(f"measuring zeek_format={fmt}", flush=True)
        # interleaved() calls these before the loop moves on; the defaults bind this iteration's values anyway.
        times = common.interleaved(args.reps, {
            "seclake": lambda rep, landing=landing, expected=expected: run_seclake(
                spark, landing, work / "home", expected),
            "plain_parse": lambda rep, landing=landing, fmt=fmt: run_plain_parse(spark, landing, work / "plain", fmt),
            "plain_text": lambda rep, landing=landing: run_plain_text(spark, landing, work / "plain"),
        })
        raw[fmt] = times
        events = inputs[fmt]["totals"]["events"]
        med = {k: common.median(v) for k, v in times.items()}
        rows.append([fmt, events, med["seclake"], med["plain_parse"], med["plain_text"],
                     f"{med['seclake'] / med['plain_parse']:.1f}x", f"{med['seclake'] / med['plain_text']:.1f}x",
                     events / med["seclake"], events / med["plain_parse"], events / med["plain_text"]])
    spark.stop()

    print()
    common.print_table(
        ["zeek", "events", "seclake s", "parse s", "text s", "seclake/parse", "seclake/text",
         "seclake ev/s", "parse ev/s", "text ev/s"], rows,
        title=f"ETL throughput, median of {args.reps} (landing -> 7 Delta tables vs read -> write.parquet)")
    path = common.save_results("etl_throughput", {
        "args": vars(args), "events": {f: inputs[f]["totals"]["events"] for f in formats},
        "times_s": raw, "wall_s": time.monotonic() - t0})
    print(f"\nraw times in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    # ours over plain Spark's read -> write.parquet, in events/s (higher is better), per Zeek format
    print("RESULT " + " ".join(f"etl_ratio_{r[0]}={r[3] / r[2]:.3f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
