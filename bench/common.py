"""Helpers shared by the benchmarks: input generation, homes, timing, process CPU, tables.

Not a benchmark itself. Every benchmark measures both sides of a ratio in the same run,
interleaved (the order alternates between repetitions), and reports medians: the
development machine has 2 cores shared with other Spark jobs, so single timings are noise.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.parsers.sources import silver_feeds  # noqa: E402  (the repository on the path first)
from pipelines.schemas import SILVER_SCHEMAS  # noqa: E402

PYTHON = sys.executable
# A weekday noon: the generator's diurnal curve is at its peak, so few hosts give many events.
BUSY_START = "2026-11-20T12:00:00Z"

# Which (sensor, kind) counts of the generator's manifest feed each silver table.
SILVER_FEEDS = {table: silver_feeds(table) for table in SILVER_SCHEMAS}


def stage_report(line: str | bytes) -> dict | None:
    """A stage's report from a line of `seclake run-once --json` (its `QueryReport` fields by name),
    or None for any other line (progress, logs, JSON that is not a report).

    >>> stage_report('{"name": "etl", "batches": 1}')["batches"], stage_report("{not json"), stage_report('{"a": 1}')
    (1, None, None)
    """
    if not line.lstrip().startswith(b"{" if isinstance(line, bytes) else "{"):
        return None
    try:
        report = json.loads(line)
    except ValueError:
        return None
    return report if isinstance(report, dict) and "name" in report and "batches" in report else None


def work_dir(name: str, given: str | None = None) -> Path:
    """`given`, else a fresh folder under $TMPDIR named after the benchmark (emptied first)."""
    path = Path(given) if given else Path(tempfile.gettempdir()) / f"seclake-bench-{name}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def generate(out: Path, **kwargs) -> dict:
    """Run the sample-data generator into `out` (quietly) and return its manifest."""
    from sample_data.generator import generate as gen

    kwargs.setdefault("start", BUSY_START)
    return gen(out, overwrite=True, **kwargs)


def expected_silver(manifest: dict) -> dict[str, int]:
    """Rows each silver table must hold for a generator output (distinct events per feed)."""
    return {table: sum(manifest["events"][s][k] for s, k in feeds) for table, feeds in SILVER_FEEDS.items()}


def link_tree(src: Path, dest: Path) -> None:
    """Copy a folder by hard links (instant, no extra disk), falling back to copies."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dest, copy_function=link)


def deliver(src: Path, dest_dir: Path) -> Path:
    """Place `src` into `dest_dir` atomically, as sensors do: write `.<name>.tmp`, then rename."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f".{src.name}.tmp"
    shutil.copyfile(src, tmp)
    final = dest_dir / src.name
    os.replace(tmp, final)
    return final


def _eve_time(line: bytes) -> float | None:
    try:
        return datetime.strptime(json.loads(line)["timestamp"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except (ValueError, KeyError, TypeError):
        return None


def _zeek_time(line: bytes) -> float | None:
    try:
        if line.startswith(b"{"):
            return float(json.loads(line)["ts"])
        return float(line.split(b"\t", 1)[0])
    except (ValueError, KeyError, TypeError):
        return None


def trickle(gen: Path, manifest: dict, out: Path, eve_every: float, zeek_every: float) -> list[dict]:
    """Cut the generator's hourly files into one file per flush interval and kind.

    Lines go to the interval of their own timestamp (a malformed line follows the line
    before it); a Zeek TSV file keeps its header block and gets a `#close` line. Returns the
    files in delivery order: {"due": seconds after the feed's start, "sensor", "path", "lines"}.
    """
    if min(eve_every, zeek_every) < 1:  # file names carry the interval's start to the second
        raise ValueError(f"flush intervals must be at least 1 s of event time, got EVE {eve_every:g} s, "
                         f"Zeek {zeek_every:g} s")
    start = datetime.fromisoformat(manifest["params"]["start"].replace("Z", "+00:00")).timestamp()
    end_s = (datetime.fromisoformat(manifest["params"]["end"].replace("Z", "+00:00")).timestamp() - start)
    chunks: dict[tuple[str, str, int], dict] = {}
    for f in manifest["files"]:
        sensor = f["sensor"]
        kind = Path(f["path"]).name.split(".")[0]
        every = eve_every if sensor == "suricata" else zeek_every
        when = _eve_time if sensor == "suricata" else _zeek_time
        header: list[bytes] = []
        last, data = 0, False
        # Bytes, not text: the generator writes some malformed lines that are not valid UTF-8.
        for line in (gen / f["path"]).read_bytes().splitlines(keepends=True):
            if line.startswith(b"#"):
                if not data:  # the header block above the first data line; later ones (#close) are dropped
                    header.append(line)
                continue
            data = True
            t = when(line)
            bucket = last if t is None else min(max(0, int((t - start) // every)), int((end_s - 1) // every))
            last = bucket
            chunk = chunks.setdefault((sensor, kind, bucket), {"lines": [], "header": header})
            chunk["lines"].append(line)
    files = []
    for (sensor, kind, bucket), chunk in chunks.items():
        every = eve_every if sensor == "suricata" else zeek_every
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(start + bucket * every))
        name = f"{kind}.{stamp}.json" if sensor == "suricata" else f"{kind}.{stamp}.log"
        path = out / sensor / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tail = b"" if sensor == "suricata" or not chunk["header"] else f"#close\t{stamp}\n".encode()
        path.write_bytes(b"".join(chunk["header"]) + b"".join(chunk["lines"]) + tail)
        files.append({"due": (bucket + 1) * every, "sensor": sensor, "path": path, "lines": len(chunk["lines"])})
    files.sort(key=lambda f: (f["due"], str(f["path"])))
    return files


def table_rows(path: Path) -> int | None:
    """Rows of the Delta table at `path` from the log's file stats (no Spark); None if no table."""
    from pipelines.lake.log import summary

    if next((path / "_delta_log").glob("*.json"), None) is None:
        return None
    return summary(path).rows


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    values = sorted(values)
    if not values:
        return float("nan")
    rank = max(1, min(len(values), math.ceil(p / 100 * len(values))))
    return values[rank - 1]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def interleaved(reps: int, sides: dict[str, Callable[[int], float]], log=print) -> dict[str, list[float]]:
    """Run each side once per repetition, alternating the order (ABAB.. then BABA..); return the times."""
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            seconds = sides[name](rep)
            times[name].append(seconds)
            log(f"  rep {rep + 1}/{reps} {name}: {seconds:.2f} s")
    return times


def spark_session():
    """The seclake SparkSession (same settings as the product), without the UI."""
    from pipelines.spark import get_spark

    return get_spark(app_name="seclake-bench", ui=False)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> None:
    """Print `rows` as the CLI lays out a table (`terminal.format_table`), each float to the digits a
    measurement carries (`_fmt`: the CLI's one decimal would print a ratio of 0.234 as 0.2)."""
    from pipelines.terminal import format_table

    print(format_table(headers, [[_fmt(c) if isinstance(c, float) else c for c in row] for row in rows], title),
          flush=True)


def _fmt(value: float) -> str:
    if value != value:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def save_results(name: str, results: dict) -> Path:
    """Write the results as JSON beside the benchmark output (`bench/results/<name>.json`)."""
    folder = REPO / "bench" / "results"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    results = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "cpus": os.cpu_count(), "load_avg": os.getloadavg(), **results}
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return path


# ---- CPU time of a process tree (Linux /proc) ---------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    try:
        out = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                out += [int(p) for p in handle.read().split()]
        return out
    except OSError:
        return []


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and all its live descendants, plus
    the descendants they already reaped. Good for deltas while a process tree runs."""
    total = 0.0
    stack = [pid]
    seen = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[11:15] = utime, stime, cutime, cstime (fields 14-17 of proc(5))
        total += sum(int(x) for x in fields[11:15]) / _TICK
        stack += _children(p)
    return total


def tree_pids(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack += _children(p)
    return out


def stop_gracefully(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM `proc` (a clean stop lets its batch commit); SIGKILL its process group after `timeout` s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_now(proc: subprocess.Popen, *, keep_root: bool = False) -> None:
    """SIGKILL `proc`'s descendants (and `proc` unless `keep_root`), then wait for `proc`.

    For a stream whose measurement is over: its clean stop waits for the micro-batches in flight
    (a minute when it is behind), which measures nothing. What a killed stream was writing is
    taken up exactly once by the next run on the home. `keep_root` spares a `bench/cputime.py`
    wrapper, which then reaps the rest and writes its report.
    """
    for _ in range(3):  # a process spawned while the first pass ran is caught by the next
        pids = [p for p in tree_pids(proc.pid) if p != proc.pid]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if not keep_root:
        proc.kill()
    proc.wait()
