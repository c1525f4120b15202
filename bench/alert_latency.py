"""Alert latency in `seclake stream` under a trickled feed, next to an empty query's trigger floor.

The feed is the generator's output cut into the files sensors deliver (`common.trickle`):
Suricata EVE flushed every `--eve-every` s and Zeek rotated every `--zeek-every` s of wall
time, one file per interval and kind, on a clock `--speed` times faster than the events' own
(default 12: an hour of a 10-host network's traffic in 300 s, about 25 events/s). The first
`--warm` s of event time (devices come up, leases are granted) land before the stream starts
and are processed before the measured feed begins. Then, all at once:

- `seclake stream --home H --set trigger_interval=<T>` (every stage `pipelines.stages.stages()`
  returns: ETL, attribution and the rules);
- this process renames each feed file into `H/landing/` when it is due;
- in this process, the *floor* query: a text-file stream -> `DeltaSink`, same trigger, doing
  nothing else. Each time a feed file lands, a one-line probe file is dropped into its input
  folder, so both see the same moments and the same machine load.

Latency is measured from file modification times to Delta commit-file modification times
(one clock, no polling error): a line has *landed* when the file holding it is renamed into
landing/, and a row is *committed* when the commit that adds it is in the log. Reported,
p50/p95/max:

- floor: probe file -> its row committed by the floor query (trigger wait + one minimal batch);
- landing -> silver: a landing file -> the last silver table holding its rows committed;
- landing -> enriched: per enriched row of a feed file, the file's landing -> the row's commit
  (mostly the wait for attribution: the DHCP clock's move after the ETL's batch, then a lease cut
  and `dhcp_log_delay` of event time, shortened `--speed` times);
- per-event rules (a rule whose query has no count threshold, i.e. no `HAVING` and no
  `>= n` in its SQL: high_severity_ids_alert, unknown_device and the two threat-intel rules):
  from the landing of the event's line to the alert row's first commit. The event is the alert's `first_seen` as first
  committed, found in the rule's silver table by event time (and address when the alert has
  one), and its line's landing file via `source_file`;
- threshold rules (all others): from the landing of the crossing event's line to the alert
  row's first commit. The crossing event is taken to be the alert's `last_seen` as first
  committed: exact when a rule emits in the micro-batch that crosses its threshold (the
  latest event counted is the one that crossed); for a rule that emits only when its window
  closes (`c2_beaconing`), the real crossing event landed earlier, so the figure is a lower
  bound, and the wait for its watermark is shortened `--speed` times.

`--speed` changes two things, and the figures must be read with both in mind. The load: at 24
the stream takes in 12 times the events per second of the same network in real time (a
120-host network's rate). And the waits in event time, shortened `--speed` times: attribution
emits an event once the lease piece holding it is final (docs/attribution.md: 5 to 15 minutes
of event time after the event with the defaults), so a per-event alert's latency at real time
is at least that, whatever this bench prints at a higher speed. The generator injects one
incident of each kind at fractions of the span it generates; the span is the feed's (at least
four times the warm-up, so that the IDS alert on a reused address, at a quarter of it, falls after
the warm-up), so the measured feed holds incidents of both classes. Until 2026-11-29 an hour was
generated and `--quick` fed minutes 10 to 34 of it, which held no threshold incident. The drain
is waited in full, for alerts. If no alert of a class is committed during the run, its key is
`nan` and the line before RESULT says why.

RESULT keys (the last line): `per_event_p95_s`, `threshold_p95_s` as above; extra keys
`silver_p95_s` (landing -> all of a file's silver rows committed), `enriched_p95_s` (landing ->
enriched row committed) and `floor_p95_s`.

    python bench/alert_latency.py --quick                  # 100 s of feed (20 event minutes), 90 s drain: ~5 min
    python bench/alert_latency.py                          # 300 s of feed (an event hour), 60 s drain: ~9 min
    python bench/alert_latency.py --hosts 40 --speed 4
    python bench/alert_latency.py --quick --set lease_cut='10 minutes'   # the cut before 2026-11-28
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# Event seconds between the warm-up's end and the first incident (a jitter of up to 0.8% of the span).
SCENARIO_MARGIN_S = 30.0


class LogTail:
    """Follows a Delta table's commit files; yields (commit mtime in s, [added file paths])."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.next_version = 0
        self.files: list[Path] = []  # every data file added so far

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
            self.files += adds
            self.next_version += 1
        return out


def read_rows(files: list[Path], columns: list[str]) -> list[dict]:
    """The `columns` of the Parquet `files` that have them (timestamps as epoch microseconds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for f in files:
        try:
            names = pq.read_schema(f).names
            table = pq.read_table(f, columns=[c for c in columns if c in names])
        except Exception:  # noqa: BLE001 - a file vacuumed meanwhile: nothing to learn from it
            continue
        for i, field in enumerate(table.schema):
            if pa.types.is_timestamp(field.type):
                micros = table.column(i).cast(pa.timestamp("us", tz=field.type.tz), safe=False).cast(pa.int64())
                table = table.set_column(i, field.name, micros)
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


THRESHOLD = re.compile(r"\bHAVING\b|>=?\s*\d", re.IGNORECASE)


def rule_classes() -> dict[str, dict]:
    """rule_id -> {slug, class ("per-event" or "threshold"), tables, watermark, emit} of the rules the stream runs."""
    from pipelines.rules.pack import load_rules
    from pipelines.settings import Settings

    default = Settings().rule_watermark
    return {r.id: {"slug": r.slug, "class": "threshold" if THRESHOLD.search(r.sql) else "per-event",
                   "tables": list(r.tables), "watermark": r.watermark or default, "emit": r.emit,
                   "checkpoint": r.checkpoint_name}
            for r in load_rules()}


def silver_of(table: str) -> str | None:
    """The silver table a rule's input table is built from (enriched_conn -> silver_conn)."""
    if table.startswith("silver_"):
        return table
    if table.startswith("enriched_"):
        return "silver_" + table.removeprefix("enriched_")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 s of feed and a 90 s drain (~5 min)")
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--speed", type=float, default=12.0,
                        help="seconds of event time delivered per second of wall time (default 12)")
    parser.add_argument("--eve-every", type=float, default=2.0, help="EVE flush interval, wall seconds (default 2)")
    parser.add_argument("--zeek-every", type=float, default=5.0,
                        help="Zeek rotation interval, wall seconds (default 5)")
    parser.add_argument("--warm", type=float, default=600.0,
                        help="event seconds landed before the stream starts, not measured (default 600)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trigger", default="1 second", help="processing-time trigger of both queries")
    parser.add_argument("--duration", type=float, default=300.0, help="wall seconds of feed to measure")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds to wait for the last files and alerts after the feed stops")
    parser.add_argument("--work", default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="another setting for the stream, e.g. --set lease_cut='10 minutes' (repeatable)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.drain = 100.0, 90.0
    work = common.work_dir("alert-latency", args.work)
    home = work / "home"
    t0 = time.monotonic()
    rules = rule_classes()

    feed_s = args.warm + args.duration * args.speed  # event seconds the run needs
    gen = work / "gen"
    # The generator places its incidents at fractions of the span it generates (the IDS alert on a
    # reused address at 0.25, the threshold scenarios from 0.50 on: sample_data/scenarios.py), so
    # the span is the feed's, and long enough that the first falls after the warm-up.
    span = max(feed_s, 4 * (args.warm + SCENARIO_MARGIN_S))
    manifest = common.generate(gen, hours=span / 3600, hosts=args.hosts, seed=args.seed, late_rate=0.0)
    files = common.trickle(gen, manifest, work / "feed", args.eve_every * args.speed, args.zeek_every * args.speed)
    warm = [f for f in files if f["due"] <= args.warm]
    feed = [f for f in files if args.warm < f["due"] <= feed_s]
    # The inventory is there before the stream starts, as in a deployment (attribution reads it
    # once per query start): without it every enriched row has device NULL.
    (home / "reference").mkdir(parents=True)
    (home / "reference" / "devices.csv").write_bytes((gen / "reference" / "devices.csv").read_bytes())
    for f in warm:
        common.deliver(f["path"], home / "landing" / f["sensor"])
    warm_names = {f["path"].name for f in warm}
    print(f"feed: {len(warm)} warm-up files, then {len(feed)} files ({sum(f['lines'] for f in feed):,} lines) "
          f"over {args.duration:g} s ({args.hosts} hosts, {args.speed:g}x event time, EVE every {args.eve_every:g} s, "
          f"Zeek every {args.zeek_every:g} s)", flush=True)

    stream_log = open(work / "stream.log", "wb")
    stream = subprocess.Popen([common.PYTHON, "-m", "pipelines.cli", "stream", "--home", str(home),
                               "--set", f"trigger_interval={args.trigger}", "--report-every", "10",
                               *(a for o in args.overrides for a in ("--set", o))],
                              cwd=common.REPO, stdout=stream_log, stderr=subprocess.STDOUT, start_new_session=True)
    spark = common.spark_session()
    floor_query = start_floor_query(spark, work / "floor-in", work / "floor", work / "floor-ck", args.trigger)

    landed: dict[str, float] = {}       # feed file name -> mtime
    probes: dict[str, float] = {}       # probe text -> mtime
    floor_seen: dict[str, float] = {}   # probe text -> commit mtime
    silver_seen: dict[str, dict[str, float]] = {}  # landing file -> {table: first commit mtime}
    enriched_s: list[float] = []        # per enriched row of a feed file: landing -> its commit
    alerts: dict[str, dict] = {}        # alert_id -> row as first committed + commit mtime
    tails: dict[str, LogTail] = {}
    floor_tail = LogTail(work / "floor")
    silver_tables = list(common.SILVER_FEEDS)
    enriched_tables = ["enriched_conn", "enriched_dns", "enriched_ids_alerts"]

    def poll_tables():
        tables_dir = home / "tables"
        if tables_dir.is_dir():
            for name in os.listdir(tables_dir):
                if (name in silver_tables or name in enriched_tables or name == "alerts") and name not in tails:
                    tails[name] = LogTail(tables_dir / name)
        for name, tail in tails.items():
            for mtime, added in tail.poll():
                if name == "alerts":
                    for row in read_rows(added, ["alert_id", "rule_id", "src_ip", "first_seen", "last_seen"]):
                        alerts.setdefault(row["alert_id"], {**row, "commit": mtime})
                elif name in enriched_tables:
                    for row in read_rows(added, ["source_file"]):
                        f = row["source_file"].rsplit("/", 1)[-1]
                        if f in landed:
                            enriched_s.append(mtime - landed[f])
                else:
                    for row in read_rows(added, ["source_file"]):
                        f = row["source_file"].rsplit("/", 1)[-1]
                        silver_seen.setdefault(f, {}).setdefault(name, mtime)
        for mtime, added in floor_tail.poll():
            for row in read_rows(added, ["value"]):
                floor_seen.setdefault(row["value"], mtime)

    # The measured feed starts once every query is up (the ETL and every rule of the rules'
    # application, which starts after the table queries, past its first micro-batch) and the
    # warm-up is in silver, so its first files queue neither behind the warm-up nor behind a JVM's
    # start. A query is past its first micro-batch when its checkpoint holds a commit: read from
    # the home, not from the stream's output, whose wording is for people.
    from pipelines.checkpoint import newest
    from pipelines.etl import QUERY_NAME as ETL
    from pipelines.home import Home

    deadline = time.monotonic() + 600
    stream_home = Home.resolve(home)
    checkpoints = {name: stream_home.checkpoint(folder) for name, folder in
                   [(ETL, ETL), *((f"rule_{r['slug']}", r["checkpoint"]) for r in rules.values())]}

    def not_up() -> set[str]:
        """The queries with no micro-batch committed yet."""
        return {name for name, folder in checkpoints.items() if newest(folder, committed=True) is None}

    while not_up() or not warm_names <= silver_seen.keys():
        if stream.poll() is not None or time.monotonic() > deadline:
            print((work / "stream.log").read_text(errors="replace")[-3000:])
            waiting = f"; not up or in a first micro-batch: {', '.join(sorted(not_up()))}" if not_up() else ""
            print(f"seclake stream did not take in the warm-up within 600 s ({len(warm_names & silver_seen.keys())} "
                  f"of {len(warm_names)} files in silver{waiting}): nothing measured")
            print("RESULT per_event_p95_s=nan threshold_p95_s=nan silver_p95_s=nan enriched_p95_s=nan floor_p95_s=nan")
            common.stop_gracefully(stream, timeout=60)
            return 1
        poll_tables()
        time.sleep(0.5)
    alerts.clear()  # alerts of the warm-up are not measured
    print(f"stream up and warm-up in silver after {time.monotonic() - t0:.0f} s; feeding", flush=True)

    feed_started = time.monotonic()
    pending = list(feed)
    end = feed_started + args.duration + args.drain
    probe_no = 0
    while time.monotonic() < end:
        now = time.monotonic()
        while pending and feed_started + (pending[0]["due"] - args.warm) / args.speed <= now:
            f = pending.pop(0)
            landed[f["path"].name] = common.deliver(f["path"], home / "landing" / f["sensor"]).stat().st_mtime
            probe_no += 1
            text = f"probe-{probe_no}"
            tmp = work / "floor-in" / f".{text}.tmp"
            tmp.write_text(text + "\n")
            os.replace(tmp, work / "floor-in" / f"{text}.txt")
            probes[text] = (work / "floor-in" / f"{text}.txt").stat().st_mtime
        poll_tables()
        time.sleep(0.1)
    feed_wall = time.monotonic() - feed_started
    poll_tables()
    common.kill_now(stream)
    floor_query.stop()
    spark.stop()

    floor = [floor_seen[p] - probes[p] for p in probes if p in floor_seen]
    silver_first = [min(v.values()) - landed[f] for f, v in silver_seen.items() if f in landed]
    # A file is fully in silver when every silver table it feeds has committed it; the tables
    # a file feeds are the ones that hold any of its rows by the end of the run.
    silver_all = [max(v.values()) - landed[f] for f, v in silver_seen.items() if f in landed]
    never = [f for f in landed if f not in silver_seen]

    # Where each silver event's line landed: {table: {event_time_us: [(src_ip, dst_ip, landing file)]}}.
    events: dict[str, dict[int, list[tuple]]] = {}
    for name, tail in tails.items():
        if name not in silver_tables:
            continue
        index = events.setdefault(name, {})
        for row in read_rows(tail.files, ["event_time", "src_ip", "dst_ip", "source_file"]):
            index.setdefault(row["event_time"], []).append(
                (row.get("src_ip"), row.get("dst_ip"), row["source_file"].rsplit("/", 1)[-1]))

    def landing_of(rule: dict, event_us: int | None, ip: str | None) -> float | None:
        if event_us is None:
            return None
        found = [c for t in rule["tables"] if silver_of(t) for c in events.get(silver_of(t), {}).get(event_us, [])]
        if ip:
            found = [c for c in found if ip in (c[0], c[1])] or found
        times = [landed[c[2]] for c in found if c[2] in landed]
        return min(times) if times else None

    latency: dict[str, list[float]] = {"per-event": [], "threshold": []}
    unmatched: dict[str, int] = {"per-event": 0, "threshold": 0}
    by_rule: dict[str, list[float]] = {}
    for alert in alerts.values():
        rule = rules.get(alert["rule_id"])
        if rule is None:
            continue
        event = alert["first_seen"] if rule["class"] == "per-event" else alert["last_seen"]
        landing = landing_of(rule, event, alert.get("src_ip"))
        if landing is None:
            unmatched[rule["class"]] += 1
        else:
            latency[rule["class"]].append(alert["commit"] - landing)
            by_rule.setdefault(rule["slug"], []).append(round(alert["commit"] - landing, 1))

    def stats(values):
        return [len(values), common.percentile(values, 50), common.percentile(values, 95),
                max(values) if values else float("nan")]

    rows = [["floor: probe -> committed (text -> DeltaSink)", *stats(floor)],
            ["landing -> first silver table committed", *stats(silver_first)],
            ["landing -> all its silver rows committed", *stats(silver_all)],
            ["landing -> enriched row committed (attributed or not)", *stats(enriched_s)],
            ["per-event rule: event's line landed -> alert committed", *stats(latency["per-event"])],
            ["threshold rule: crossing event landed -> alert committed", *stats(latency["threshold"])]]
    print()
    common.print_table(["latency (s)", "n", "p50", "p95", "max"], rows,
                       title=f"seclake stream, trigger {args.trigger}, {args.hosts} hosts at {args.speed:g}x, "
                             f"{len(landed)} files in {min(feed_wall, args.duration):.0f} s")
    classes = {c: sorted(r["slug"] for r in rules.values() if r["class"] == c) for c in ("per-event", "threshold")}
    print(f"\nrules: per-event {', '.join(classes['per-event'])}; threshold {', '.join(classes['threshold'])}")
    print(f"alerts committed during the feed, seconds from landing by rule: {by_rule or 'none'}")
    if floor and silver_all:
        ratio = common.percentile(silver_all, 50) / common.percentile(floor, 50)
        print(f"landing -> silver p50 / floor p50 = {ratio:.1f}x")
    for cls, n in unmatched.items():
        if n:
            print(f"{n} {cls} alert(s) whose event was not found in the measured feed (not counted)")
    if never:
        print(f"{len(never)} landed file(s) never reached silver within the run: {never[:4]}")
    enriched = {t: common.table_rows(home / "tables" / t) for t in
                ("enriched_conn", "enriched_dns", "enriched_ids_alerts")}
    path = common.save_results("alert_latency", {
        "args": vars(args), "files": len(landed), "alerts": len(alerts), "alerts_by_rule": by_rule,
        "floor_s": floor, "silver_first_s": silver_first, "silver_all_s": silver_all, "enriched_s": enriched_s,
        "per_event_s": latency["per-event"], "threshold_s": latency["threshold"], "unmatched": unmatched,
        "enriched_rows": enriched, "never_in_silver": never, "wall_s": time.monotonic() - t0})
    print(f"\nraw results in {path}; stream log {work / 'stream.log'}; total {time.monotonic() - t0:.0f} s", flush=True)
    missing = [c for c in ("per-event", "threshold") if not latency[c]]
    if missing:
        print(f"nan for {' and '.join(missing)}: no such alert was committed within the {args.duration:g} s feed "
              f"(+{args.drain:g} s drain). Enriched rows committed: {enriched}")
    print(f"RESULT per_event_p95_s={common.percentile(latency['per-event'], 95):.2f} "
          f"threshold_p95_s={common.percentile(latency['threshold'], 95):.2f} "
          f"silver_p95_s={common.percentile(silver_all, 95):.2f} "
          f"enriched_p95_s={common.percentile(enriched_s, 95):.2f} floor_p95_s={common.percentile(floor, 95):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
