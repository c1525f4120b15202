"""CPU cost of an hourly `seclake run-once` against an always-on `seclake stream` (1 s trigger),
on a trickled low-rate feed, and the CPU of a run-once with no new input.

The feed is the generator's output cut into the files sensors really deliver: Suricata EVE
flushed every `--eve-every` seconds (5) and Zeek rotated every `--zeek-every` seconds (60),
one file per interval and kind (an interval without events gives no file; Zeek files keep
their `#` header). Its first `--skip` seconds (180: the generator's devices are still coming
up) are left out; the rest is split, in event time, into three consecutive parts:

1. warm-up (`--warm` s of feed): landed before the stream starts; not measured.
2. always-on (`--window` s of feed): `seclake stream --set trigger_interval='1 second'` runs
   under `bench/cputime.py`, and this script delivers each file at its real time (one second
   of feed = one second of wall time: the trickle), sampling the stream's process-tree CPU
   (`common.tree_cpu`: JVM and Python workers included) twice a second. Before the window,
   once the warm-up is processed (every rule query of the rules' application, which starts after
   the table queries, has started, and every query's last micro-batch ended and none started for
   `--quiet` s, from their checkpoints' offsets/ and commits/), the idle rate is sampled over
   `--idle` s. Then:
   - if the stream has processed the window's files within `--catch-up` s after the window,
     its CPU for the window's feed is the CPU from the window's start to its last micro-batch,
     less the idle rate times the catch-up time; per second of feed that is divided by the
     window, but never counted above the busy rate below (a stream that needs longer than
     real time is busy all the time);
   - if not, it cannot keep up with the trickle on this machine: it would be busy all hour,
     taking more files per trigger, so its CPU per second of feed is its measured busy rate
     (CPU / wall seconds since the window's start). An estimate: with bigger batches it may run
     more or less parallel than measured.
   Then the stream is killed and its JVMs reaped (its clean stop would wait for the batches it
   is behind with, which measures nothing).
3. run-once (`--runonce-feed` s of feed), with nothing else running, on a copy of the home taken
   once the stream had processed the warm-up and was quiet (no batch running or started during
   the copy): the state an hourly run-once starts from, without waiting for the stream to stop
   or for a run-once to take in what it left undone.
   - run-once's Spark session started and stopped alone, under `bench/cputime.py`: the start-up
     a run-once with new input pays once;
   - the part's files all landed at once, then `seclake run-once` under `bench/cputime.py`;
   - then `seclake run-once` with nothing new in landing, under `bench/cputime.py`:
     `noinput_run_once_cpu_s` (every stage found idle from files; no JVM is started).
   The fed run's process-tree CPU is also sampled when the `etl` stage reports, which splits it
   into "start-up + ETL" and "the later stages". The fed run also closes the warm-up's last
   windows and lease pieces (end of input), as every hourly run closes the hour before's: no
   micro-batch more.

The run-once and the stream are never measured while the other runs. Per hour of feed:

    always-on CPU/hour = stream CPU per second of feed (above) x 3600
    hourly    CPU/hour = Spark start + (fed run's CPU at its etl report - Spark start)
                         x 3600 / runonce-feed s + fed run's later-stages CPU

An hourly run-once always has new input (a trickled feed lands files every minute), so it
always pays the Spark start, once. With `--runonce-feed 3600` (the default, `--quick` too) this is
the fed run's CPU: nothing is extrapolated on that side. The later stages are never scaled: a
run-once reads all of their new input in one micro-batch. A shorter `--runonce-feed` scales the
ETL part to the hour, which overstates the hourly side twice over: the ETL query's fixed cost
(its start and the cold JVM's compilation, most of a small batch) is multiplied with it, and the
generator places its scenarios at fractions of the span it generates (sample_data/scenarios.py),
so a short feed packs an hour's incidents into minutes. Until 2026-11-29 `--quick` fed the
run-once 180 s of a 7-minute generation and multiplied its ETL by 20: 4,743 lines, taken for
95,000 an hour, where the same generator's hour holds 7,462. The stream's window is the feed
that follows the warm-up: with an hour generated it falls in a quieter stretch than the
run-once's hour (both line rates are printed), which favours the stream. Most of either side's
cost is per micro-batch and per trigger, not per line.

RESULT keys (the last line): `hourly_over_always_on_cpu` = hourly CPU/hour divided by
always-on CPU/hour. Unlike the other benches' ratios this is a **cost** ratio, ours (run-once)
over the baseline (always-on): **lower is better** (issue 16's goal: <= 0.2).
`noinput_run_once_cpu_s` = CPU seconds of the no-input run-once (goal: <= 15).

    python bench/run_once_cost.py --quick    # 10 hosts: 30 s warm-up, 5 s idle sample, 30 s stream
                                             # window (+30 s at most to catch up), run-once over
                                             # a full hour of trickled feed
    python bench/run_once_cost.py            # 10 hosts: 120 s warm-up, 30 s idle, 300 s stream window
                                             # (+240 s), run-once over a full hour of trickled feed (502 s)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

HOUR_S = 3600.0


def deliver(files: list[dict], home: Path) -> int:
    lines = 0
    for f in files:
        common.deliver(f["path"], home / "landing" / f["sensor"])
        lines += f["lines"]
    return lines


# ---- measuring -------------------------------------------------------------------------------

def spark_start_cpu(work: Path) -> float:
    """CPU seconds to start run-once's Spark session (JVM, Delta, Python) and stop it: what a
    run-once with new input pays once, however much input there is."""
    out = work / "cpu-spark-start.json"
    subprocess.run([common.PYTHON, str(common.REPO / "bench" / "cputime.py"), "--out", str(out), "--",
                    common.PYTHON, "-c", "from pipelines.spark import get_spark; "
                    "get_spark(app_name='seclake-run-once').stop()"], cwd=common.REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(json.loads(out.read_text())["cpu"])


def run_once_measured(home: Path, work: Path, label: str) -> dict:
    """`seclake run-once` under cputime.py; also the tree's CPU when the etl stage reports ("cpu_etl")."""
    out = work / f"cpu-{label}.json"
    cmd = [common.PYTHON, str(common.REPO / "bench" / "cputime.py"), "--out", str(out), "--",
           common.PYTHON, "-m", "pipelines.cli", "run-once", "--json", "--home", str(home)]
    cpu_etl = None
    with open(work / f"run-once-{label}.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=common.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:
            if cpu_etl is None and (common.stage_report(line) or {}).get("name") == "etl":  # the ETL is done
                cpu_etl = common.tree_cpu(proc.pid)
            log.write(line)
        rc = proc.wait()
    result = json.loads(out.read_text())
    result["cpu_etl"] = cpu_etl
    if rc != 0:
        print(f"  warning: run-once {label} exited {rc}; see {work / f'run-once-{label}.log'}", flush=True)
    return result


def copy_quiet(home: Path, to: Path, attempts: int = 5) -> bool:
    """Copy `home` to `to` while its stream is quiet: no micro-batch running or started during the
    copy (its checkpoints' offsets/ and commits/ unchanged), so tables and checkpoints agree.
    The stream's writer lock is left out: the copy has no stream."""
    for _ in range(attempts):
        before = activity(home)
        shutil.copytree(home, to, ignore=shutil.ignore_patterns("writer.lock"))
        if not before[0] and activity(home) == before:
            return True
        shutil.rmtree(to)
        time.sleep(1)
    return False


def bronze_lines(home: Path) -> int:
    return sum(common.table_rows(home / "tables" / t) or 0 for t in ("bronze_zeek", "bronze_suricata"))


def activity(home: Path) -> tuple[bool, float]:
    """(a micro-batch is running, newest batch or commit time) over every query of the home.

    A query writes `offsets/N` when batch N starts and `commits/N` when it ends, whether or not
    the batch commits rows to a table (a stateful query that only updates its state does not),
    so this, not the tables' logs, tells when the whole stream has nothing left to do.
    """
    busy, newest = False, 0.0
    tables = home / "tables"
    if tables.is_dir():
        for t in os.scandir(tables):
            log = Path(t.path) / "_delta_log"
            if log.is_dir():
                newest = max([newest, *(e.stat().st_mtime for e in os.scandir(log) if e.name.endswith(".json"))])
    queries = []  # every checkpoint folder (one with offsets/), however deep: rules nest theirs per version
    for root, dirs, _files in os.walk(home / "checkpoints"):
        if "offsets" in dirs:
            queries.append(Path(root))
            dirs[:] = []
        else:
            dirs[:] = [d for d in dirs if d not in ("state", "sources")]
    for q in queries:
        last = {}
        for kind in ("offsets", "commits"):
            try:
                entries = [e for e in os.scandir(q / kind) if e.name.isdigit()]
            except FileNotFoundError:
                continue
            last[kind] = max((int(e.name) for e in entries), default=-1)
            newest = max([newest, *(e.stat().st_mtime for e in entries)])
        busy |= last.get("offsets", -1) > last.get("commits", -1)
    return busy, newest


class CpuSampler:
    """(wall clock, CPU seconds) samples of a process tree; `at(t)` interpolates between them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> float:
        cpu = common.tree_cpu(self.pid)
        self.samples.append((time.time(), cpu))
        return cpu

    def at(self, t: float) -> float:
        before = [s for s in self.samples if s[0] <= t]
        after = [s for s in self.samples if s[0] >= t]
        if not before:
            return after[0][1]
        if not after:
            return before[-1][1]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def rule_query_marks(home: Path) -> list[Path]:
    """The file each rule of the pack's query writes as it starts (its checkpoint's `metadata`):
    all there = the stream's rules application, which starts after the table queries, is up.
    Read once: the pack is not re-parsed on every sample."""
    from pipelines.rules.pack import default_rules_dir, scan_rules

    return [home / "checkpoints" / rule.checkpoint_name / "metadata" for rule in scan_rules(default_rules_dir()).rules]


def wait_processed(home: Path, lines: int, quiet: float, limit: float, proc: subprocess.Popen,
                   sampler: CpuSampler, started_marks: list[Path]) -> bool:
    """Sample CPU until bronze holds `lines` lines, every file of `started_marks` exists (every rule
    query started) and no query ran a batch for `quiet` s; False on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < limit and proc.poll() is None:
        sampler.sample()
        if bronze_lines(home) >= lines and all(mark.is_file() for mark in started_marks):
            busy, newest = activity(home)
            if not busy and time.time() - newest >= quiet:
                return True
        time.sleep(0.5)
    return False


def _per_million(cpu_per_hour: float, lines_per_hour: float) -> float:
    return cpu_per_hour * 1e6 / lines_per_hour if lines_per_hour else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="30 s warm-up, 5 s idle sample, 30 s stream window (+30 s at most to catch up), "
                             "run-once over a full hour of feed")
    parser.add_argument("--hosts", type=int, default=10, help="devices (default 10: a low-rate feed)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip", type=float, default=180.0,
                        help="seconds at the feed's start left out (the generator's devices are still coming up)")
    parser.add_argument("--warm", type=float, default=120.0, help="seconds of feed landed before the stream starts")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle stream sampled before the window")
    parser.add_argument("--window", type=float, default=300.0,
                        help="seconds of feed trickled in real time into the running stream (measured)")
    parser.add_argument("--catch-up", type=float, default=240.0,
                        help="seconds the stream may need after the window before it counts as not keeping up")
    parser.add_argument("--runonce-feed", type=float, default=3600.0,
                        help="seconds of feed processed by the measured run-once (3600: no extrapolation)")
    parser.add_argument("--eve-every", type=float, default=5.0, help="EVE flush interval, seconds")
    parser.add_argument("--zeek-every", type=float, default=60.0, help="Zeek rotation interval, seconds")
    parser.add_argument("--quiet", type=float, default=8.0, help="no micro-batch for this long = the stream is done")
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.warm, args.idle, args.window, args.catch_up, args.quiet = 30, 5, 30, 30, 5
    work = common.work_dir("run-once-cost", args.work)
    t0 = time.monotonic()
    w0 = args.skip + args.warm  # feed second at which the measured window starts
    feed_s = w0 + args.window + args.runonce_feed
    gen = work / "gen"
    manifest = common.generate(gen, hours=max(0.1, math.ceil(feed_s / 60) / 60), hosts=args.hosts, seed=args.seed,
                               late_rate=0.0)
    files = common.trickle(gen, manifest, work / "trickle", args.eve_every, args.zeek_every)
    parts = {"warm": [f for f in files if args.skip < f["due"] <= w0],
             "window": [f for f in files if w0 < f["due"] <= w0 + args.window],
             "runonce": [f for f in files if w0 + args.window < f["due"] <= feed_s]}
    lines = {k: sum(f["lines"] for f in v) for k, v in parts.items()}
    for name, part in parts.items():
        print(f"feed part {name}: {len(part)} files, {lines[name]:,} lines", flush=True)
    lines_per_hour = lines["runonce"] / args.runonce_feed * HOUR_S
    window_lines_per_hour = lines["window"] / args.window * HOUR_S
    print(f"feed rate: {window_lines_per_hour:,.0f} lines/hour in the stream's window, {lines_per_hour:,.0f} in the "
          f"run-once's part (the generator's traffic is bursty; both sides are scaled per hour of feed)", flush=True)
    home = work / "home"
    (home / "reference").mkdir(parents=True)
    (home / "reference" / "devices.csv").write_bytes((gen / "reference" / "devices.csv").read_bytes())
    results: dict = {"args": vars(args), "files": {k: len(v) for k, v in parts.items()}, "lines": lines}

    # -- always-on ------------------------------------------------------------------------------
    landed = deliver(parts["warm"], home)
    stream_log = open(work / "stream.log", "wb")
    stream = subprocess.Popen([common.PYTHON, str(common.REPO / "bench" / "cputime.py"), "--out",
                               str(work / "cpu-stream.json"), "--", common.PYTHON, "-m", "pipelines.cli", "stream",
                               "--home", str(home), "--set", f"trigger_interval={args.trigger}",
                               "--report-every", "3600"],
                              cwd=common.REPO, stdout=stream_log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = CpuSampler(stream.pid)
    started = time.monotonic()
    rules_up = rule_query_marks(home)
    if not wait_processed(home, landed, args.quiet, 400, stream, sampler, rules_up):
        common.stop_gracefully(stream, timeout=120)
        print((work / "stream.log").read_text(errors="replace")[-3000:])
        print("the stream did not process the warm-up feed within 400 s: nothing measured")
        print("RESULT hourly_over_always_on_cpu=nan noinput_run_once_cpu_s=nan")
        return 1
    print(f"stream up, warm-up processed and quiet after {time.monotonic() - started:.0f} s "
          f"({sampler.sample():.1f} CPU s, not counted)", flush=True)
    runonce_home = work / "runonce-home"
    if not copy_quiet(home, runonce_home):
        common.kill_now(stream, keep_root=True)
        print("the stream never stayed quiet through a copy of its home: nothing measured")
        print("RESULT hourly_over_always_on_cpu=nan noinput_run_once_cpu_s=nan")
        return 1
    i_start = time.time()
    while time.time() < i_start + args.idle:
        sampler.sample()
        time.sleep(0.5)
    i_end = sampler.samples[-1][0]
    idle_rate = max(0.0, (sampler.at(i_end) - sampler.at(i_start)) / max(1e-6, i_end - i_start))
    print(f"  idle: {idle_rate:.3f} CPU s per second over {i_end - i_start:.0f} s", flush=True)
    print(f"trickling {len(parts['window'])} files over {args.window:g} s of wall time", flush=True)
    w_start = time.time()
    sampler.sample()
    for f in parts["window"]:
        while time.time() < w_start + f["due"] - w0:
            sampler.sample()
            time.sleep(min(0.5, max(0.0, w_start + f["due"] - w0 - time.time())))
        landed += deliver([f], home)
    while time.time() < w_start + args.window:
        sampler.sample()
        time.sleep(0.2)
    kept_up = wait_processed(home, landed, args.quiet, args.catch_up + args.quiet, stream, sampler, rules_up)
    w_end = activity(home)[1] if kept_up else sampler.samples[-1][0]
    cpu_window = sampler.at(w_end) - sampler.at(w_start)
    busy_rate = cpu_window / max(1e-6, w_end - w_start)
    drain = max(0.0, w_end - w_start - args.window)
    if kept_up:
        # CPU for the window's feed: what it used until its last batch, less the idle share of the catch-up.
        stream_cpu = cpu_window - idle_rate * drain
        per_s = min(stream_cpu / args.window, busy_rate)
        how = (f"{stream_cpu:.1f} CPU s for {args.window:g} s of trickled feed"
               + (f" (caught up {drain:.0f} s after the window)" if drain >= 1 else ""))
    else:
        # Still busy with the window's files: a stream that cannot keep up is busy all the time, and
        # it takes more files per trigger, so its hour costs its busy CPU rate x 3600 (the measured rate).
        stream_cpu = float("nan")
        per_s = busy_rate
        how = (f"not caught up {args.catch_up:g} s after the window: busy rate "
               f"{busy_rate:.2f} CPU s/s over {w_end - w_start:.0f} s")
    print(f"  stream: {cpu_window:.1f} CPU s over {w_end - w_start:.0f} s from the window's start "
          + ("to its last batch" if kept_up else "(still processing it)"), flush=True)
    common.kill_now(stream, keep_root=True)  # the wrapper reaps the JVMs and writes its report
    stream_log.close()
    stream_total = json.loads((work / "cpu-stream.json").read_text()) if (work / "cpu-stream.json").exists() else {}

    # -- run-once, alone, on the copy taken after the warm-up -------------------------------------
    start_cpu = spark_start_cpu(work)
    print(f"starting run-once's Spark session alone: {start_cpu:.1f} CPU s", flush=True)
    runonce_landed = lines["warm"] + deliver(parts["runonce"], runonce_home)
    print(f"run-once over {len(parts['runonce'])} files ({args.runonce_feed:g} s of feed)", flush=True)
    run = run_once_measured(runonce_home, work, "feed")
    print(f"  {run['cpu']:.1f} CPU s, {run['wall']:.0f} s wall", flush=True)
    missing = runonce_landed - bronze_lines(runonce_home)
    print("run-once with nothing new in landing", flush=True)
    noinput = run_once_measured(runonce_home, work, "noinput")
    print(f"  {noinput['cpu']:.1f} CPU s, {noinput['wall']:.0f} s wall", flush=True)

    stream_per_hour = per_s * HOUR_S
    scale = HOUR_S / args.runonce_feed
    # A run-once with new input starts Spark once (a no-input one starts none): the start is
    # counted once, the ETL's work scaled to the hour, the later stages counted once.
    if run["cpu_etl"] is not None:
        etl_extra = max(run["cpu_etl"] - start_cpu, 0.0)
        later_extra = run["cpu"] - run["cpu_etl"]
        hourly_how = (f"{start_cpu:.1f} Spark start + {etl_extra:.1f} ETL x {scale:.1f} "
                      f"+ {later_extra:.1f} later stages")
    else:  # no "etl:" report line seen: scale everything above the start
        etl_extra, later_extra = max(run["cpu"] - start_cpu, 0.0), 0.0
        hourly_how = f"{start_cpu:.1f} Spark start + {etl_extra:.1f} x {scale:.1f} (no etl report line: all scaled)"
    hourly_per_hour = start_cpu + etl_extra * scale + later_extra
    ratio = hourly_per_hour / stream_per_hour if stream_per_hour > 0 else float("nan")
    print()
    common.print_table(
        ["mode", "CPU s / hour", "CPU s / 1M lines", "measured from"],
        [["hourly run-once (AvailableNow)", hourly_per_hour, _per_million(hourly_per_hour, lines_per_hour),
          hourly_how],
         [f"always-on stream ({args.trigger})", stream_per_hour,
          _per_million(stream_per_hour, window_lines_per_hour), how]],
        title=f"CPU per hour of a trickled feed ({args.hosts} hosts, EVE every "
              f"{args.eve_every:g} s, Zeek every {args.zeek_every:g} s), every stage of pipelines.stages.stages()")
    if not kept_up or drain > 0.25 * args.window:
        print(f"the stream did not keep up with the trickle here (it was busy {w_end - w_start:.0f} s for "
              f"{args.window:g} s of feed): its hour is counted at its busy CPU rate, {busy_rate:.2f} CPU s/s "
              f"(busy all hour; an estimate: with bigger batches it may run more or less parallel)")
    if missing:
        print(f"WARNING: {missing} landed lines are not in bronze at the end")
    path = common.save_results("run_once_cost", {
        **results, "lines_per_hour": {"window": window_lines_per_hour, "runonce": lines_per_hour},
        "noinput": noinput, "spark_start_cpu": start_cpu, "run": run,
        "hourly_parts": {"etl_extra": etl_extra, "later_extra": later_extra, "etl_scale": scale},
        "stream": {"cpu_window": cpu_window, "busy_s": w_end - w_start, "busy_cpu_per_s": busy_rate,
                   "idle_cpu_per_s": idle_rate, "drain_s": drain, "cpu": stream_cpu, "kept_up": kept_up,
                   "total": stream_total},
        "cpu_per_hour": {"hourly": hourly_per_hour, "stream": stream_per_hour}, "missing_lines": missing,
        "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; total {time.monotonic() - t0:.0f} s", flush=True)
    print("hourly_over_always_on_cpu is a cost ratio, run-once over always-on: lower is better")
    print(f"RESULT hourly_over_always_on_cpu={ratio:.3f} noinput_run_once_cpu_s={noinput['cpu']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
