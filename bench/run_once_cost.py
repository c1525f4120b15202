"""CPU cost per million events: hourly `seclake run-once` (AvailableNow) vs an always-on
`seclake stream` with a 1-second trigger, on a low-rate feed.

Both homes get the same generated files, one simulated hour at a time, side by side:

- hourly: for each hour, `seclake run-once --home A` runs under `bench/cputime.py`, which
  counts the CPU of the process and every descendant (the JVM and its Python workers
  included: it is a child subreaper and reaps them all);
- always-on: one `seclake stream --home B --set trigger_interval='1 second'` runs for the
  whole benchmark; its process tree's CPU (`/proc`) is sampled before each hour's files
  land and after the stream has processed them and gone quiet (processing cost), and over an
  idle window with no new files (cost of triggering every second with nothing to do).

A real deployment's hour is 3,600 s, far longer than this benchmark waits, so the always-on
cost per hour is extrapolated from the measured parts:

    always-on CPU/hour = processing CPU of an hour's files + idle CPU/s x (3600 - processing wall s)
    hourly    CPU/hour = CPU of one run-once over an hour's files (JVM start-up included)

and both are divided by the feed's events per hour. Both sides run every stage that
`jobs.stages()` returns (ETL, attribution, rules).

    python bench/run_once_cost.py                     # ~12 min on 2 busy cores
    python bench/run_once_cost.py --hours 4 --hosts 20 --idle 120
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

HOUR_S = 3600.0


def hour_chunks(manifest: dict) -> list[list[dict]]:
    """The generator's files grouped by the simulated hour they are delivered in, in order."""
    chunks: dict[str, list[dict]] = {}
    for f in manifest["files"]:
        chunks.setdefault(f["delivered_at"][:13], []).append(f)
    return [chunks[k] for k in sorted(chunks)]


def deliver_chunk(gen: Path, chunk: list[dict], home: Path) -> int:
    lines = 0
    for f in chunk:
        common.deliver(gen / f["path"], home / "landing" / f["sensor"])
        lines += f["lines"]
    return lines


def run_once_measured(home: Path, work: Path, label: str, only: str | None = None) -> dict:
    out = work / f"cpu-{label}.json"
    cmd = [common.PYTHON, str(common.REPO / "bench" / "cputime.py"), "--out", str(out), "--",
           common.PYTHON, "-m", "pipelines.cli", "run-once", "--home", str(home)]
    if only:
        cmd += ["--only", only]
    with open(work / f"run-once-{label}.log", "wb") as log:
        rc = subprocess.run(cmd, cwd=common.REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    result = json.loads(out.read_text())
    if rc != 0:
        print(f"  warning: run-once {label} exited {rc}; see {work / f'run-once-{label}.log'}", flush=True)
    return result


def bronze_lines(home: Path) -> int:
    return sum(common.table_rows(home / "tables" / t) or 0 for t in ("bronze_zeek", "bronze_suricata"))


def last_commit_time(home: Path) -> float:
    newest = 0.0
    tables = home / "tables"
    if tables.is_dir():
        for t in os.scandir(tables):
            log = Path(t.path) / "_delta_log"
            if log.is_dir():
                newest = max([newest, *(e.stat().st_mtime for e in os.scandir(log) if e.name.endswith(".json"))])
    return newest


def wait_processed(home: Path, lines: int, quiet: float, limit: float, proc: subprocess.Popen) -> float:
    """Wait until bronze holds `lines` lines and no table committed for `quiet` seconds; return the wait."""
    started = time.monotonic()
    while time.monotonic() - started < limit and proc.poll() is None:
        if bronze_lines(home) >= lines and time.time() - last_commit_time(home) >= quiet:
            break
        time.sleep(1.0)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=3, help="simulated hours of feed (default 3)")
    parser.add_argument("--hosts", type=int, default=10, help="devices (default 10: a low-rate feed)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle stream measured after each hour")
    parser.add_argument("--quiet", type=float, default=15.0, help="no commit for this long = the stream is done")
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)
    work = common.work_dir("run-once-cost", args.work)
    t0 = time.monotonic()
    gen = work / "gen"
    manifest = common.generate(gen, hours=args.hours, hosts=args.hosts, seed=args.seed)
    chunks = hour_chunks(manifest)
    events_per_hour = manifest["totals"]["events"] / args.hours
    print(f"feed: {manifest['totals']['events']:,} events in {len(chunks)} delivery hours "
          f"({events_per_hour:,.0f} events/hour, {events_per_hour / HOUR_S:.2f} events/s)", flush=True)
    homes = {"hourly": work / "hourly", "stream": work / "stream"}
    for home in homes.values():
        (home / "reference").mkdir(parents=True)
        (home / "reference" / "devices.csv").write_bytes((gen / "reference" / "devices.csv").read_bytes())

    # The stream cannot start before the silver tables exist (see docs/reliability.md), so its
    # home is bootstrapped with an ETL run over the first hour, like an operator would.
    lines_b = deliver_chunk(gen, chunks[0], homes["stream"])
    deliver_chunk(gen, chunks[0], homes["hourly"])
    print("hour 1: hourly run-once (measured) and the stream's bootstrap run-once --only etl", flush=True)
    boot = subprocess.Popen([common.PYTHON, "-m", "pipelines.cli", "run-once", "--home", str(homes["stream"]),
                             "--only", "etl"], cwd=common.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = [run_once_measured(homes["hourly"], work, "h1")]
    boot.wait()
    print(f"  run-once: {runs[-1]['cpu']:.1f} CPU s, {runs[-1]['wall']:.0f} s wall", flush=True)

    stream_log = open(work / "stream.log", "wb")
    stream = subprocess.Popen([common.PYTHON, str(common.REPO / "bench" / "cputime.py"), "--out",
                               str(work / "cpu-stream.json"), "--", common.PYTHON, "-m", "pipelines.cli", "stream",
                               "--home", str(homes["stream"]), "--set", f"trigger_interval={args.trigger}"],
                              cwd=common.REPO, stdout=stream_log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    wait_processed(homes["stream"], lines_b, args.quiet, 900, stream)
    print(f"stream up and quiet after {time.monotonic() - started:.0f} s "
          f"({common.tree_cpu(stream.pid):.1f} CPU s for start-up)", flush=True)
    processing, idle = [], []
    for h, chunk in enumerate(chunks[1:], start=2):
        print(f"hour {h}: {sum(f['events'].get(k, 0) for f in chunk for k in f['events']):,} events", flush=True)
        cpu0, wall0 = common.tree_cpu(stream.pid), time.monotonic()
        lines_b += deliver_chunk(gen, chunk, homes["stream"])
        deliver_chunk(gen, chunk, homes["hourly"])
        runs.append(run_once_measured(homes["hourly"], work, f"h{h}"))
        print(f"  run-once: {runs[-1]['cpu']:.1f} CPU s, {runs[-1]['wall']:.0f} s wall", flush=True)
        waited = wait_processed(homes["stream"], lines_b, args.quiet, 900, stream)
        # The quiet period at the end is idle time, not processing: leave it out.
        busy_wall = max(1.0, time.monotonic() - wall0 - args.quiet)
        cpu1 = common.tree_cpu(stream.pid)
        processing.append({"cpu": cpu1 - cpu0, "wall": time.monotonic() - wall0, "busy_wall": busy_wall,
                           "waited": waited})
        print(f"  stream: {cpu1 - cpu0:.1f} CPU s over {time.monotonic() - wall0:.0f} s to process it", flush=True)
        time.sleep(1.0)
        cpu2, wall2 = common.tree_cpu(stream.pid), time.monotonic()
        time.sleep(args.idle)
        idle.append((common.tree_cpu(stream.pid) - cpu2) / (time.monotonic() - wall2))
        print(f"  stream idle: {idle[-1]:.3f} CPU s per second", flush=True)
    common.stop_gracefully(stream, timeout=300)
    stream_total = json.loads((work / "cpu-stream.json").read_text()) if (work / "cpu-stream.json").exists() else {}
    # Cross-check: the same rows landed in both homes.
    rows = {name: (common.table_rows(homes["hourly"] / "tables" / name),
                   common.table_rows(homes["stream"] / "tables" / name))
            for name in common.SILVER_FEEDS}

    run_cpu = common.median(r["cpu"] for r in runs)
    proc_cpu = common.median(p["cpu"] for p in processing)
    proc_wall = common.median(p["busy_wall"] for p in processing)
    idle_rate = common.median(idle)
    hourly_per_hour = run_cpu
    stream_per_hour = proc_cpu + idle_rate * max(0.0, HOUR_S - proc_wall)
    per_million = 1e6 / events_per_hour
    print()
    common.print_table(
        ["mode", "CPU s / hour", "CPU s / 1M events", "measured from"],
        [["hourly run-once (AvailableNow)", hourly_per_hour, hourly_per_hour * per_million,
          f"median of {len(runs)} runs: {run_cpu:.1f} CPU s each, {common.median(r['wall'] for r in runs):.0f} s wall"],
         [f"always-on stream ({args.trigger})", stream_per_hour, stream_per_hour * per_million,
          f"{proc_cpu:.1f} CPU s to process an hour + {idle_rate:.3f} CPU s/s idle x {HOUR_S - proc_wall:.0f} s"]],
        title=f"CPU per million events, feed of {events_per_hour:,.0f} events/hour, {args.hosts} hosts, "
              f"every stage of jobs.stages()")
    print(f"\nalways-on / hourly = {stream_per_hour / hourly_per_hour:.1f}x CPU; "
          f"the stream's idle triggering alone costs {idle_rate * HOUR_S:.0f} CPU s per hour "
          f"({100 * idle_rate:.1f}% of a core)")
    print(f"silver rows (hourly, stream): {rows}")
    path = common.save_results("run_once_cost", {
        "args": vars(args), "events_per_hour": events_per_hour, "runs": runs, "processing": processing,
        "idle_cpu_per_s": idle, "stream_total": stream_total, "silver_rows": rows,
        "cpu_per_hour": {"hourly": hourly_per_hour, "stream": stream_per_hour}, "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
