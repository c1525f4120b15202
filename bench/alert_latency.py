"""Alert latency in `seclake stream` under a live generator, next to an empty query's trigger floor.

What runs, all at once:

- `seclake stream --home H --set trigger_interval=<T>` (every stage `jobs.stages()` returns:
  ETL, and attribution and rules once they are wired in);
- the generator in live mode (`python -m sample_data.generator --out H --rate R`), which
  renames a complete hourly file into `H/landing/` every few seconds;
- in this process, the *floor* query: a text-file stream -> `DeltaSink`, same trigger, doing
  nothing else. Each time a landing file appears, a one-line probe file is dropped into its
  input folder, so both see the same moments and the same machine load.

Latency is measured from file modification times to Delta commit-file modification times
(one clock, no polling error): a landing file's rows are *readable* when the commit that
adds them is in the log. Reported, p50/p95/max:

- floor: probe file -> its row committed by the floor query (trigger wait + one minimal batch);
- landing -> silver: a landing file -> the last silver table holding its rows committed;
- landing -> alert (evidence): an alert -> the latest-landed file of the hour holding the
  alert's `last_seen` event; this includes the rule's event-time watermark wait;
- landing -> alert (emission): an alert -> the newest landing file before its commit, i.e.
  the pipeline's own latency once the watermark let the alert out.

If no alert is committed during the run (a rule emits a window only once the event-time
watermark has passed its end, 2 hours by default, longer than a short live feed covers),
only the floor and landing -> silver are reported, and the output says so.

    python bench/alert_latency.py                          # ~6 min
    python bench/alert_latency.py --duration 600 --rate 100 --hosts 20
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


class LogTail:
    """Follows a Delta table's commit files; yields (commit mtime in s, [added file paths])."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.next_version = 0

    def poll(self) -> list[tuple[float, list[Path]]]:
        out = []
        log = self.path / "_delta_log"
        while True:
            commit = log / f"{self.next_version:020d}.json"
            try:
                text = commit.read_text()
                mtime = commit.stat().st_mtime
            except FileNotFoundError:
                break
            adds = []
            for line in text.splitlines():
                if line.strip():
                    action = json.loads(line)
                    if "add" in action and action["add"].get("dataChange", True):
                        adds.append(self.path / unquote(action["add"]["path"]))
            out.append((mtime, adds))
            self.next_version += 1
        return out


def read_column(files: list[Path], columns: list[str]) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for f in files:
        try:
            table = pq.read_table(f, columns=columns)
        except Exception:  # noqa: BLE001 - a file vacuumed meanwhile: nothing to learn from it
            continue
        rows += table.to_pylist()
    return rows


def start_floor_query(spark, folder: Path, table: Path, checkpoint: Path, trigger: str):
    from pipelines.lake.sink import DeltaSink

    folder.mkdir(parents=True, exist_ok=True)
    sink = DeltaSink(table, app_id="floor")
    query = (spark.readStream.format("text").load(str(folder))
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=trigger).start())
    return query


def hour_of(ts) -> str:
    if isinstance(ts, datetime):
        ts = ts.astimezone(timezone.utc)
    return ts.strftime("%Y-%m-%d-%H")


def file_hour(name: str) -> str | None:
    # conn.2026-11-20-13-00-00.log / eve.2026-11-20-13.json
    parts = name.split(".")
    return parts[1][:13] if len(parts) >= 3 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--rate", type=float, default=40.0,
                        help="live generator events/s (default 40: a file every ~20 s)")
    parser.add_argument("--hours", type=float, default=1.0, help="generator window length (hours)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trigger", default="1 second", help="processing-time trigger of both queries")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of live feed to measure")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds to wait for the last files after the feed stops")
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)
    work = common.work_dir("alert-latency", args.work)
    home = work / "home"
    t0 = time.monotonic()

    stream_log = open(work / "stream.log", "wb")
    stream = subprocess.Popen([common.PYTHON, "-m", "pipelines.cli", "stream", "--home", str(home),
                               "--set", f"trigger_interval={args.trigger}", "--report-every", "30"],
                              cwd=common.REPO, stdout=stream_log, stderr=subprocess.STDOUT, start_new_session=True)
    spark = common.spark_session()
    floor_query = start_floor_query(spark, work / "floor-in", work / "floor", work / "floor-ck", args.trigger)
    deadline = time.monotonic() + 600
    while b"seclake stream: home" not in (work / "stream.log").read_bytes():
        if stream.poll() is not None or time.monotonic() > deadline:
            print((work / "stream.log").read_text(errors="replace")[-3000:])
            raise SystemExit("seclake stream did not start")
        time.sleep(0.5)
    time.sleep(5)  # let the queries start
    print(f"stream up after {time.monotonic() - t0:.0f} s; starting the live generator "
          f"({args.rate:g} events/s, {args.hosts} hosts) for {args.duration:g} s", flush=True)
    gen = subprocess.Popen([common.PYTHON, "-m", "sample_data.generator", "--out", str(home),
                            "--hours", str(args.hours), "--hosts", str(args.hosts), "--seed", str(args.seed),
                            "--rate", str(args.rate),
                            "--start", common.BUSY_START],
                           cwd=common.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    landed: dict[str, float] = {}       # landing file name -> mtime
    probes: dict[str, float] = {}       # probe text -> mtime
    floor_seen: dict[str, float] = {}   # probe text -> commit mtime
    silver_seen: dict[str, dict[str, float]] = {}  # landing file -> {table: first commit mtime}
    alerts: dict[str, dict] = {}        # alert_id -> row + commit mtime
    tails: dict[str, LogTail] = {}
    floor_tail = LogTail(work / "floor")
    feed_stops = time.monotonic() + args.duration
    stopped_feed = False
    end = feed_stops + args.drain
    silver_tables = [n for n in common.SILVER_FEEDS]

    def poll_tables():
        tables_dir = home / "tables"
        if tables_dir.is_dir():
            for name in os.listdir(tables_dir):
                if (name in silver_tables or name == "alerts") and name not in tails:
                    tails[name] = LogTail(tables_dir / name)
        for name, tail in tails.items():
            for mtime, files in tail.poll():
                if name == "alerts":
                    for row in read_column(files, ["alert_id", "rule_id", "first_seen", "last_seen"]):
                        alerts.setdefault(row["alert_id"], {**row, "commit": mtime})
                else:
                    for row in read_column(files, ["source_file"]):
                        f = row["source_file"].rsplit("/", 1)[-1]
                        silver_seen.setdefault(f, {}).setdefault(name, mtime)
        for mtime, files in floor_tail.poll():
            for row in read_column(files, ["value"]):
                floor_seen.setdefault(row["value"], mtime)

    probe_no = 0
    while time.monotonic() < end:
        if not stopped_feed and time.monotonic() >= feed_stops:
            gen.send_signal(signal.SIGINT)
            stopped_feed = True
        for sensor in ("zeek", "suricata"):
            folder = home / "landing" / sensor
            if not folder.is_dir():
                continue
            for name in os.listdir(folder):
                if name.startswith(".") or name in landed:
                    continue
                landed[name] = (folder / name).stat().st_mtime
                probe_no += 1
                text = f"probe-{probe_no}"
                tmp = work / "floor-in" / f".{text}.tmp"
                tmp.write_text(text + "\n")
                os.replace(tmp, work / "floor-in" / f"{text}.txt")
                probes[text] = (work / "floor-in" / f"{text}.txt").stat().st_mtime
        poll_tables()
        if stopped_feed and landed and all(len(silver_seen.get(f, {})) > 0 for f in landed) \
                and all(p in floor_seen for p in probes):
            break
        time.sleep(0.2)
    gen.wait(timeout=60)
    poll_tables()
    common.stop_gracefully(stream, timeout=180)
    floor_query.stop()
    spark.stop()

    floor = [floor_seen[p] - probes[p] for p in probes if p in floor_seen]
    silver_first = [min(v.values()) - landed[f] for f, v in silver_seen.items() if f in landed]
    # A file is fully in silver when every silver table it feeds has committed it; the tables
    # a file feeds are the ones that hold any of its rows by the end of the run.
    silver_all = [max(v.values()) - landed[f] for f, v in silver_seen.items() if f in landed]
    never = [f for f in landed if f not in silver_seen]
    evidence, emission = [], []
    for alert in alerts.values():
        commit = alert["commit"]
        before = {f: t for f, t in landed.items() if t <= commit}
        if not before:
            continue
        emission.append(commit - max(before.values()))
        hour = hour_of(alert["last_seen"]) if alert.get("last_seen") else None
        files = [t for f, t in before.items() if file_hour(f) == hour]
        if files:
            evidence.append(commit - max(files))

    def stats(values):
        return [len(values), common.percentile(values, 50), common.percentile(values, 95),
                max(values) if values else float("nan")]

    rows = [["floor: probe -> committed (text -> DeltaSink)", *stats(floor)],
            ["landing -> first silver table committed", *stats(silver_first)],
            ["landing -> all its silver rows committed", *stats(silver_all)]]
    if alerts:
        rows += [["landing -> alert (evidence file, incl. watermark)", *stats(evidence)],
                 ["landing -> alert (newest file before emission)", *stats(emission)]]
    print()
    common.print_table(["latency (s)", "n", "p50", "p95", "max"], rows,
                       title=f"seclake stream, trigger {args.trigger}, live feed {args.rate:g} events/s, "
                             f"{args.hosts} hosts, {len(landed)} files in {args.duration:g} s")
    if floor and silver_all:
        ratio = common.percentile(silver_all, 50) / common.percentile(floor, 50)
        print(f"\nlanding -> silver p50 / floor p50 = {ratio:.1f}x")
    if not alerts:
        print(f"\nno alert was committed during the run: a rule emits a window only once its event-time "
              f"watermark (event_watermark, default 2 hours) has passed the window's end, and the live feed "
              f"covered {args.hours:g} hour(s) of event time; landing -> silver is the latency measured here")
    if never:
        print(f"{len(never)} landed file(s) never reached silver within the run: {never[:4]}")
    path = common.save_results("alert_latency", {
        "args": vars(args), "files": len(landed), "alerts": len(alerts), "floor_s": floor,
        "silver_first_s": silver_first, "silver_all_s": silver_all, "alert_evidence_s": evidence,
        "alert_emission_s": emission, "never_in_silver": never, "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; stream log {work / 'stream.log'}; total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
