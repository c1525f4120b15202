"""ETL throughput: seclake's landing -> bronze/quarantine/silver (AvailableNow) vs plain Spark.

Both sides read the same generated landing files in the same SparkSession, interleaved,
median of --reps repetitions after one untimed warm-up of each side:

- seclake: `jobs.run_once(spark, lake, only=["etl"])` into a fresh home (the real query:
  whole-file source, parse, 7 Delta tables committed by delta-spark, de-duplication).
- plain parse: `spark.read.json` of each Zeek kind (Zeek JSON) or `spark.read.csv(sep=TAB,
  comment=#)` (Zeek TSV) and of the EVE files, each written with `write.parquet`.
- plain text: `spark.read.text` of every file -> `write.parquet` (the I/O floor).

Zeek JSON (`--zeek-format json`) makes `read.json` a like-for-like parse; TSV is reported too.

With history (`--history-days`, default 7; 0 turns it off), for the first format of
`--formats` a fourth side runs in the same interleaving:

- seclake 7d: the same `run_once(only=["etl"])` over the same new files, but on a home that
  already holds `--history-days` days of feed (`--history-hosts` devices, default 5, the
  generator's minimum: a low rate, so building it stays cheap; `--history-keep N` keeps one
  data line in N of every history file, for an even lower rate): its hourly landing files
  stay in landing/ (every trigger lists them: 672 for 7 days), its rows are in bronze/silver
  (de-duplication reads them), its checkpoint knows them. The history home is built once
  before any timing, by the ETL itself with `max_files_per_trigger` = `--history-batch-files`
  (96, per sensor folder: 6 micro-batches for 7 days; the time it took is printed), and
  restored from a pristine copy before every timed repetition.

RESULT keys: `etl_ratio` = seclake events/s divided by plain parse events/s on the same files
(first format of `--formats`), higher is better; `etl_ratio_7d` = the same with seclake on the
home with history; `etl_ratio_<format>` per format measured.

    python bench/etl_throughput.py --quick              # 0.25 h of 100 hosts, TSV, 1 rep; history: 7 days
                                                        # x 5 hosts, one line in 4 kept (~3 min, 2 cores)
    python bench/etl_throughput.py                      # ~10k events per format, 3 reps
    python bench/etl_throughput.py --hours 4 --hosts 100 --reps 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def thin(landing: Path, keep: int) -> int:
    """Keep one data line in `keep` of every file under `landing` (Zeek `#` lines all kept); the data lines left."""
    left = 0
    for f in sorted(landing.rglob("*")):
        if not f.is_file():
            continue
        lines = f.read_bytes().splitlines(keepends=True)
        data = [line for line in lines if not line.startswith(b"#")]
        left += len(data[::keep])
        if keep > 1:
            mtime = f.stat().st_mtime_ns
            header = [line for line in lines if line.startswith(b"#") and not line.startswith(b"#close")]
            footer = [line for line in lines if line.startswith(b"#close")]
            f.write_bytes(b"".join(header + data[::keep] + footer))
            os.utime(f, ns=(mtime, mtime))  # keep the delivery order
    return left


def build_history(spark, landing: Path, home_dir: Path, files_per_batch: int) -> dict[str, int]:
    """A home whose ETL has processed `landing` in micro-batches of `files_per_batch` files; its silver rows."""
    from pipelines import etl
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

    common.link_tree(landing, home_dir / "landing")
    lake = Lake(Home.resolve(home_dir).create())
    reports = run_once(spark, lake, Settings().with_overrides({"max_files_per_trigger": files_per_batch}),
                       only=[etl.QUERY_NAME])
    if reports[0].error:
        raise RuntimeError(f"seclake ETL failed on the history: {reports[0].error}")
    print(f"  {reports[0].batches} ETL micro-batches", flush=True)
    return {t: common.table_rows(lake.path(t)) or 0 for t in common.SILVER_FEEDS}


def restore(pristine: Path, home_dir: Path) -> None:
    """`home_dir` as `pristine` holds it: landing by hard links, tables and checkpoints copied.

    The history is built at `home_dir` itself and copied aside, because a streaming checkpoint
    records the absolute paths of the files it has seen.
    """
    if home_dir.exists():
        shutil.rmtree(home_dir)
    home_dir.mkdir(parents=True)
    for entry in pristine.iterdir():
        if entry.name == "landing":
            common.link_tree(entry, home_dir / "landing")
        elif entry.is_dir():
            shutil.copytree(entry, home_dir / entry.name)
        else:
            shutil.copy2(entry, home_dir / entry.name)


def _timed_etl(spark, home_dir: Path, expected: dict[str, int] | None, what: str) -> float:
    """Run seclake's ETL stage once on `home_dir`; its seconds. Checks the silver row counts
    against `expected` (when given), so a fast run that lost rows is an error, not a figure."""
    from pipelines import etl
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings

    lake = Lake(Home.resolve(home_dir).create())
    started = time.perf_counter()
    reports = run_once(spark, lake, Settings(), only=[etl.QUERY_NAME])
    seconds = time.perf_counter() - started
    if reports[0].error:
        raise RuntimeError(f"seclake ETL ({what}) failed: {reports[0].error}")
    if expected:
        got = {t: common.table_rows(lake.path(t)) for t in expected}
        if got != expected:
            raise RuntimeError(f"silver rows ({what}) {got} differ from the expected {expected}")
    return seconds


def run_seclake_history(spark, landing: Path, pristine: Path, home_dir: Path, expected: dict[str, int]) -> float:
    """Time the ETL of `landing`'s files on a copy of the history home; `expected` = history + new rows."""
    restore(pristine, home_dir)
    for sensor in landing.iterdir():
        for f in sensor.iterdir():
            os.link(f, home_dir / "landing" / sensor.name / f.name)
    return _timed_etl(spark, home_dir, expected, "with history")


def run_seclake(spark, landing: Path, home_dir: Path, expected: dict[str, int] | None) -> float:
    if home_dir.exists():
        shutil.rmtree(home_dir)
    common.link_tree(landing, home_dir / "landing")
    seconds = _timed_etl(spark, home_dir, expected, "fresh home")
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
    parser.add_argument("--history-days", type=float, default=7.0,
                        help="days of history in the home of the 'seclake 7d' side (0: no such side)")
    parser.add_argument("--history-hosts", type=int, default=5, help="devices of the history feed (default 5)")
    parser.add_argument("--history-batch-files", type=int, default=96,
                        help="max_files_per_trigger building the history, per sensor folder (96: 6 batches for 7 days)")
    parser.add_argument("--history-keep", type=int, default=1,
                        help="keep one data line in N of each history file (default 1: all)")
    parser.add_argument("--quick", action="store_true",
                        help="0.25 simulated hours, TSV only, 1 rep, history thinned to one line in 4")
    args = parser.parse_args(argv)
    if args.quick:
        args.hours, args.formats, args.reps, args.history_keep = 0.25, "tsv", 1, 4
    work = common.work_dir("etl", args.work)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    t0 = time.monotonic()

    history = None
    if args.history_days > 0:
        # Generated first, so the new input's files are newer than the history's, as in real life.
        start = datetime.fromisoformat(common.BUSY_START.replace("Z", "+00:00")) - timedelta(days=args.history_days)
        history = common.generate(work / "gen-history", hours=24 * args.history_days, hosts=args.history_hosts,
                                  seed=args.seed + 1, zeek_format=formats[0],
                                  start=start.strftime("%Y-%m-%dT%H:%M:%SZ"))
        kept = thin(work / "gen-history" / "landing", args.history_keep)
        history["totals"]["events"] = kept
        print(f"history ({formats[0]}): {kept:,} lines kept (one in {args.history_keep}) in "
              f"{history['totals']['files']} files over {args.history_days:g} days, {args.history_hosts} hosts",
              flush=True)
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
    history_rows, history_s = None, None
    if history is not None:
        print(f"building the history home (untimed by the ratio; {args.history_batch_files} files per batch) ...",
              flush=True)
        history_s, history_rows = common.timed(lambda: build_history(
            spark, work / "gen-history" / "landing", work / "home-7d", args.history_batch_files))
        shutil.copytree(work / "home-7d", work / "home-7d-pristine", copy_function=os.link)
        print(f"  history home built in {history_s:.0f} s: silver rows {history_rows}", flush=True)

    rows, raw, ratio_7d = [], {}, float("nan")
    for fmt in formats:
        landing = work / f"gen-{fmt}" / "landing"
        expected = common.expected_silver(inputs[fmt])
        print(f"measuring zeek_format={fmt}", flush=True)
        # interleaved() calls these before the loop moves on; the defaults bind this iteration's values anyway.
        sides = {
            "seclake": lambda rep, landing=landing, expected=expected: run_seclake(
                spark, landing, work / "home", expected),
            "plain_parse": lambda rep, landing=landing, fmt=fmt: run_plain_parse(spark, landing, work / "plain", fmt),
            "plain_text": lambda rep, landing=landing: run_plain_text(spark, landing, work / "plain"),
        }
        if history_rows is not None and fmt == formats[0]:
            total = {t: history_rows[t] + expected[t] for t in expected}
            sides["seclake_7d"] = lambda rep, landing=landing, total=total: run_seclake_history(
                spark, landing, work / "home-7d-pristine", work / "home-7d", total)
        times = common.interleaved(args.reps, sides)
        raw[fmt] = times
        events = inputs[fmt]["totals"]["events"]
        med = {k: common.median(v) for k, v in times.items()}
        rows.append([fmt, events, med["seclake"], med["plain_parse"], med["plain_text"],
                     f"{med['seclake'] / med['plain_parse']:.1f}x", f"{med['seclake'] / med['plain_text']:.1f}x",
                     events / med["seclake"], events / med["plain_parse"], events / med["plain_text"]])
        if "seclake_7d" in med:
            ratio_7d = med["plain_parse"] / med["seclake_7d"]
            rows_7d = [[f"{fmt}, {args.history_days:g} days of history", events, med["seclake_7d"], med["plain_parse"],
                        f"{med['seclake_7d'] / med['plain_parse']:.1f}x", events / med["seclake_7d"],
                        events / med["plain_parse"]]]
    spark.stop()

    print()
    common.print_table(
        ["zeek", "events", "seclake s", "parse s", "text s", "seclake/parse", "seclake/text",
         "seclake ev/s", "parse ev/s", "text ev/s"], rows,
        title=f"ETL throughput, median of {args.reps} (landing -> 7 Delta tables vs read -> write.parquet)")
    if history is not None:
        print()
        common.print_table(["zeek", "new events", "seclake 7d s", "parse s", "seclake 7d/parse", "seclake 7d ev/s",
                            "parse ev/s"], rows_7d,
                           title=f"the same new files on a home with {args.history_days:g} days of history "
                                 f"({history['totals']['events']:,} lines, {history['totals']['files']} landing "
                                 f"files; built in {history_s:.0f} s, not timed)")
    path = common.save_results("etl_throughput", {
        "args": vars(args), "events": {f: inputs[f]["totals"]["events"] for f in formats},
        "history": None if history is None else {"lines": history["totals"]["events"],
                                                 "files": history["totals"]["files"], "build_s": history_s,
                                                 "silver_rows": history_rows},
        "times_s": raw, "wall_s": time.monotonic() - t0})
    print(f"\nraw times in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    # ours over plain Spark's read -> write.parquet, in events/s (higher is better); etl_ratio = the first format's
    print(f"etl_ratio is for Zeek {formats[0]}; etl_ratio_7d for the same files on the home with history")
    print(f"RESULT etl_ratio={rows[0][3] / rows[0][2]:.3f} etl_ratio_7d={ratio_7d:.3f} "
          + " ".join(f"etl_ratio_{r[0]}={r[3] / r[2]:.3f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
