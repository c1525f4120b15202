"""seclake's sample-data generator: realistic Zeek and Suricata logs with labelled attacks.

Writes, under ``out``::

    landing/zeek/{conn,dns,dhcp}.<YYYY-MM-DD-HH>-00-00.log   hourly, Zeek TSV (or JSON)
    landing/suricata/eve.<YYYY-MM-DD-HH>.json                 hourly, Suricata EVE lines
    reference/devices.csv                                     the device inventory
    ground_truth.jsonl                                        one line per injected incident
    threat_intel/planted.txt                                  a threat feed: the incidents' C2 and malware hosts
    manifest.json                                             counts to check nothing is lost

Every file appears atomically (written as ``.<name>.tmp`` beside its final name, then
renamed), in delivery order. The same arguments give byte-identical output.

>>> import tempfile, pathlib
>>> m = generate(pathlib.Path(tempfile.mkdtemp()), hours=0.5, hosts=6, seed=1)  # doctest: +SKIP
>>> sorted(m["events"]["zeek"])  # doctest: +SKIP
['conn', 'dhcp', 'dns']

See docs/sample-data.md for the formats, the scenarios and the signals they leave.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from operator import itemgetter
from pathlib import Path

from .mess import apply_mess
from .org import DHCP_SERVER, Org, build_org, devices_csv
from .scenarios import SCENARIOS, Incident, emit_scenarios, plan_scenarios
from .sensors import EVE_KINDS, ZEEK_KINDS, Sink, iso, zeek_footer, zeek_header, zeek_stamp
from .timeline import Plan, plan_presence, simulate_dhcp
from .traffic import Traffic

US = 1_000_000
HOUR = 3600 * US

DEFAULT_START = "2026-11-20T00:00:00Z"
DEFAULTS = {
    "hours": 24.0, "hosts": 50, "seed": 7, "start": DEFAULT_START, "zeek_format": "tsv",
    "malformed_rate": 0.0005, "duplicate_rate": 0.001, "late_rate": 0.05, "out_of_order_rate": 0.001,
}
MIN_HOURS = 0.1
# Ten years of feed: more is a typo, not a data set.
MAX_HOURS = 24 * 366 * 10
MAX_HOSTS = 5000
_first = itemgetter(0)
STREAMS = (("zeek", "conn"), ("zeek", "dns"), ("zeek", "dhcp"), ("suricata", "eve"))


# --- arguments ---------------------------------------------------------------------------------

def parse_start(start: str) -> int:
    """ISO-8601 instant -> epoch µs (UTC). A value without offset is taken as UTC.

    >>> parse_start("2026-11-20T00:00:00Z")
    1795132800000000
    """
    try:
        dt = datetime.fromisoformat(start.strip())
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"start {start!r} is not an ISO-8601 date-time (e.g. {DEFAULT_START})") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp()) * US + dt.microsecond


def _check_hours(hours: object) -> None:
    """ValueError naming `hours` unless it is a number of hours the generator makes (NaN, inf and
    centuries would fail later as an OverflowError, or never end)."""
    if (not isinstance(hours, (int, float)) or isinstance(hours, bool) or not math.isfinite(hours)
            or not MIN_HOURS <= hours <= MAX_HOURS):
        raise ValueError(f"hours must be a number from {MIN_HOURS} to {MAX_HOURS}, got {hours!r}")


def _validate(hours, hosts, seed, start, zeek_format, rates: dict[str, float], rate, workers) -> int:
    _check_hours(hours)
    if not isinstance(hosts, int) or isinstance(hosts, bool) or not 5 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be an integer between 5 and {MAX_HOSTS}, got {hosts!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if zeek_format not in ("tsv", "json"):
        raise ValueError(f"zeek_format must be 'tsv' or 'json', got {zeek_format!r}")
    for name, v in rates.items():
        if not isinstance(v, (int, float)) or not 0 <= v <= 0.5:
            raise ValueError(f"{name} must be between 0 and 0.5, got {v!r}")
    if rate is not None and (not isinstance(rate, (int, float)) or rate <= 0):
        raise ValueError(f"rate must be a positive number of events per second, got {rate!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers must be a non-negative integer, got {workers!r}")
    return parse_start(start)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the generator's options to ``parser`` (used by ``seclake generate``)."""
    parser.add_argument("--out", "--home", dest="out", default=None,
                        help="output folder (landing/, reference/, ...): the home `run-once --home` reads "
                             "(default $SECLAKE_HOME, else ./seclake-home, as every command)")
    parser.add_argument("--hours", type=float, default=DEFAULTS["hours"], help="simulated hours (default 24)")
    parser.add_argument("--hosts", type=int, default=DEFAULTS["hosts"], help="inventory devices (>= 5, default 50)")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="random seed (default 7)")
    parser.add_argument("--start", default=DEFAULT_START, help=f"simulated start, ISO-8601 (default {DEFAULT_START})")
    parser.add_argument("--rate", type=float, default=None,
                        help="live mode: keep writing files, paced at this many events/s, until Ctrl-C")
    parser.add_argument("--zeek-format", choices=("tsv", "json"), default="tsv", help="Zeek log format")
    parser.add_argument("--malformed-rate", type=float, default=DEFAULTS["malformed_rate"],
                        help="malformed extra lines per good line (default 0.0005)")
    parser.add_argument("--duplicate-rate", type=float, default=DEFAULTS["duplicate_rate"],
                        help="byte-identical duplicate lines per good line (default 0.001)")
    parser.add_argument("--late-rate", type=float, default=DEFAULTS["late_rate"],
                        help="share of hourly files delivered after the next hour's file (default 0.05)")
    parser.add_argument("--out-of-order-rate", type=float, default=DEFAULTS["out_of_order_rate"],
                        help="lines swapped with a neighbour up to 10 s later, per line (default 0.001)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for generation (default: up to 2; output does not depend on it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous generator output in --out instead of refusing")


def run(args: argparse.Namespace) -> int:
    """Run :func:`generate` from parsed arguments; 0 on success, 2 on bad arguments.

    Progress: one step per simulated hour (a bar on a terminal, plain lines otherwise).
    """
    started = time.monotonic()
    with _sigterm_as_ctrl_c():
        return _run(args, started)


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """A service manager (or `kill`) stops a live feed with SIGTERM: the same clean stop as Ctrl-C
    while this holds, where it ended the process with the manifest behind the files."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _as_ctrl_c(signum: int, frame: object) -> None:
    # What Ctrl-C does now: raise KeyboardInterrupt, or be held back by `_deferred_interrupt`. A
    # process started with Ctrl-C ignored (`cmd &` in a script) stops too.
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signal.SIGINT, frame)


def _run(args: argparse.Namespace, started: float) -> int:
    from pipelines.home import Home, home_folder
    from pipelines.terminal import Progress

    try:
        out = home_folder(args.out)
        Home(out).folder()  # only landing/ is written: the lake's settings are not asked
        hours = None if args.rate is not None else hour_files(parse_start(args.start), args.hours)
        with Progress("generate", total=hours) as progress:
            manifest = generate(
                out, hours=args.hours, hosts=args.hosts, seed=args.seed, start=args.start,
                zeek_format=args.zeek_format, malformed_rate=args.malformed_rate,
                duplicate_rate=args.duplicate_rate, late_rate=args.late_rate,
                out_of_order_rate=args.out_of_order_rate, rate=args.rate,
                workers=getattr(args, "workers", None), overwrite=getattr(args, "overwrite", False),
                progress=progress.step,
            )
        print(done_line(manifest, out, time.monotonic() - started), file=sys.stderr)
    except ValueError as e:
        print(f"seclake generate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seclake generate: interrupted; every file written so far is complete and "
              "manifest.json describes them", file=sys.stderr)
        return 0
    return 0


# --- writing ---------------------------------------------------------------------------------

def write_atomic(path: Path, data: bytes, mtime_after: int | None = None) -> int:
    """Write ``data`` to ``.<name>.tmp`` beside ``path``, then rename it to ``path``.

    Spark's file source ignores names starting with ``.`` so a reader never sees a partial
    file. ``mtime_after`` (ns): bump the file's mtime past it so files delivered one after
    the other have strictly increasing mtimes. Returns the mtime in ns.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        mt = os.stat(tmp).st_mtime_ns
        if mtime_after is not None and mt <= mtime_after:
            mt = mtime_after + 1_000_000
            os.utime(tmp, ns=(mt, mt))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return mt


def _file_name(sensor: str, kind: str, hour_us: int) -> str:
    stamp = zeek_stamp(hour_us)
    if sensor == "zeek":
        return f"{kind}.{stamp}.log"
    return f"eve.{stamp[:13]}.json"


def _clean(out: Path, overwrite: bool) -> None:
    ours = []
    for sub, pat in (("landing/zeek", "*.log"), ("landing/suricata", "eve.*.json")):
        d = out / sub
        if d.is_dir():
            ours += [p for p in d.glob(pat)]
    for name in ("ground_truth.jsonl", "manifest.json", "reference/devices.csv", PLANTED_FEED):
        if (out / name).exists():
            ours.append(out / name)
    if ours and not overwrite:
        raise ValueError(f"out {str(out)!r} already holds generator output ({ours[0].name}, ...); "
                         "use an empty folder, or --overwrite to replace it; to add hours to it, generate them "
                         "into another folder (same --seed and --hosts, a later --start) and move its landing "
                         "files in (docs/sample-data.md)")
    for p in ours:
        p.unlink()


# --- per-hour background generation (runs in worker processes) -------------------------------

_CTX: dict = {}


def _init_worker(ctx: dict) -> None:
    """Worker start-up: the window's context arrives pickled, since spawned workers share no memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _CTX.clear()
    _CTX.update(ctx)


def _bucket(items, base: int, n: int) -> dict[int, list]:
    """Split lines by the hourly file their write time falls in (clamped to the window)."""
    out: dict[int, list] = {}
    for it in items:
        i = (it[0] - base) // HOUR
        i = 0 if i < 0 else (n - 1 if i >= n else i)
        b = out.get(i)
        if b is None:
            b = out[i] = []
        b.append(it)
    return out


def _background_hour(j: int):
    ctx = _CTX
    org: Org = ctx["org"]
    plan: Plan = ctx["plan"]
    base, n = ctx["base"], ctx["n_files"]
    h0 = max(plan.start, base + j * HOUR)
    h1 = min(plan.end, base + (j + 1) * HOUR)
    rng = random.Random(f"{ctx['seed']}:background:{ctx['window']}:{j}")
    sink = Sink(random.Random(f"{ctx['seed']}:ids:{ctx['window']}:{j}"), ctx["zeek_json"])
    tr = Traffic(org, sink, rng)
    hod = (h0 // HOUR) % 24
    tracked: dict[int, list[str]] = {}
    for dev in org.devices:
        spans = [(max(h.start, h0), min(h.end, h1), h.ip) for h in plan.holdings.get(dev.idx, ())
                 if h.start < h1 and h.end > h0]
        spans = [s for s in spans if s[1] > s[0]]
        if not spans:
            continue
        tr.cache = {}
        if dev.idx in ctx["tracked"]:
            tr.track = tracked.setdefault(dev.idx, [])
        tr.device_hour(dev, spans, h0, hod)
        tr.track = None
    zk = [_bucket(sink.conn, base, n), _bucket(sink.dns_z, base, n),
          _bucket(sink.dhcp_z, base, n)]
    return j, zk, _bucket(sink.eve, base, n), tracked


# --- the generator ---------------------------------------------------------------------------

def _zero() -> dict:
    return {"zeek": {k: 0 for k in ZEEK_KINDS}, "suricata": {k: 0 for k in EVE_KINDS}}


def generate(
    out: Path | str,
    hours: float = 24,
    hosts: int = 50,
    seed: int = 7,
    start: str = DEFAULT_START,
    zeek_format: str = "tsv",
    malformed_rate: float = DEFAULTS["malformed_rate"],
    duplicate_rate: float = DEFAULTS["duplicate_rate"],
    late_rate: float = DEFAULTS["late_rate"],
    out_of_order_rate: float = DEFAULTS["out_of_order_rate"],
    rate: float | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Generate ``hours`` of logs for an organisation of ``hosts`` devices into ``out``.

    Returns the manifest (also written to ``out/manifest.json``). With ``rate`` (events/s)
    it runs as a live feed: windows of ``hours`` follow one another, files are paced in real
    time, and it returns only when interrupted (KeyboardInterrupt propagates after the
    manifest is brought up to date). Raises ValueError on bad arguments.

    Example::

        m = generate("/tmp/g", hours=2, hosts=50, seed=7)
        m["events"]["zeek"]["dns"]      # distinct DNS events written by Zeek
    """
    rates = {"malformed_rate": malformed_rate, "duplicate_rate": duplicate_rate,
             "late_rate": late_rate, "out_of_order_rate": out_of_order_rate}
    start_us = _validate(hours, hosts, seed, start, zeek_format, rates, rate, workers)
    out = Path(out)
    say = progress or (lambda _m: None)
    _clean(out, overwrite)
    (out / "landing" / "zeek").mkdir(parents=True, exist_ok=True)
    (out / "landing" / "suricata").mkdir(parents=True, exist_ok=True)
    (out / "reference").mkdir(parents=True, exist_ok=True)

    W = int(round(hours * HOUR))
    org = build_org(seed, hosts, start_us)
    write_atomic(out / "reference" / "devices.csv", devices_csv(org).encode())

    manifest = {
        "generator": "seclake sample_data", "format_version": 1,
        "params": {"hours": float(hours), "hosts": hosts, "seed": seed, "start": iso(start_us),
                   "end": iso(start_us + W), "zeek_format": zeek_format,
                   **{k: float(v) for k, v in rates.items()}, "rate": None if rate is None else float(rate)},
        "events": _zero(), "duplicates": _zero(), "malformed": _zero(), "out_of_order": _zero(),
        "late": _zero(), "lines": _zero(),
        "totals": {"events": 0, "duplicates": 0, "malformed": 0, "lines": 0, "files": 0, "late_files": 0},
        "devices": {"inventory": len(org.devices), "not_in_inventory": 0},
        "scenarios": {s: 0 for s in SCENARIOS},
        "files": [],
    }
    gt: list[dict] = []
    state = {"mtime": None, "events_written": 0, "t0": time.monotonic(), "out": out}
    prev_ips: dict[str, str] | None = None
    window = 0
    S, E = start_us, start_us + W
    if rate is not None:
        # live mode: whole-hour windows back to back, so hourly file names never repeat
        W = max(1, -(-W // HOUR)) * HOUR
        E = -(-(start_us + W) // HOUR) * HOUR
    try:
        while True:
            prev_ips = _window(out, org, seed, window, S, E, zeek_format == "json", rates, rate,
                               workers, manifest, gt, state, say, prev_ips)
            window += 1
            if rate is None:
                break
            S, E = E, E + W
    finally:
        _write_meta(out, manifest, gt)
    return manifest


def append_as_current(out: Path, entry: dict, root: Path) -> Path:
    """Append one generated file (a manifest `files` entry of the output in `out`) to the file its
    sensor would still be writing, under `root/<sensor>/`: Zeek `<kind>.log`, Suricata `eve.json`
    (the folders `seclake ship` tails). Returns that sensor's folder.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "landing").mkdir(); _ = Path(tmp, "landing", "dns.2026-11-20-00-00-00.log").write_text("a\\n")
    ...     folder = append_as_current(Path(tmp), {"path": "landing/dns.2026-11-20-00-00-00.log", "sensor": "zeek"},
    ...                                Path(tmp, "sensors"))
    ...     sorted(p.name for p in folder.iterdir())
    ['dns.log']
    """
    name = Path(entry["path"]).name
    folder = root / entry["sensor"]
    folder.mkdir(parents=True, exist_ok=True)
    current = "eve.json" if entry["sensor"] == "suricata" else name.split(".")[0] + ".log"
    with open(folder / current, "ab") as log:
        log.write((out / entry["path"]).read_bytes())
    return folder


def done_line(manifest: dict, out: str | os.PathLike, seconds: float) -> str:
    """What `seclake generate` (and `seclake demo`) say when the files are written."""
    totals = manifest["totals"]
    return (f"generated {totals['events']:,} events in {totals['files']} files ({totals['late_files']} late) "
            f"in {seconds:.1f} s -> {out}")


def hour_files(start_us: int, hours: float) -> int:
    """Hourly files per log that `hours` from `start_us` take: the steps `generate` reports progress for.

    >>> hour_files(parse_start("2026-11-20T00:30:00Z"), 1)
    2
    """
    _check_hours(hours)
    end = start_us + int(round(hours * HOUR))
    return -(-(end - (start_us - start_us % HOUR)) // HOUR)


# Known-bad infrastructure each scenario contacts, as (indicator kind, `details` key): what a threat
# feed would list. `planted_feed` writes them with decoys that no traffic touches.
PLANTED_FEED = "threat_intel/planted.txt"  # not intel/: in a home, intel_sensor would load it unasked
PLANTED: dict[str, tuple[tuple[str, str], ...]] = {
    "c2_beaconing": (("domain", "domain"), ("ip", "c2_ip")),
    "ids_alert_reused_ip": (("domain", "domain"), ("ip", "remote_ip")),
}
# Documentation addresses (RFC 5737) and a reserved TLD (RFC 2606): never in generated traffic.
DECOYS = ("192.0.2.10", "198.51.100.23", "c2-panel.example", "update-check.example")


def planted_feed(gt: list[dict]) -> str:
    """A plain-list threat feed (`seclake intel load` reads it): per incident of PLANTED its
    domain and IP, commented with the incident id, then the decoys.

    >>> print(planted_feed([{"id": "w0-04-c2_beaconing", "scenario": "c2_beaconing",
    ...                      "details": {"domain": "x-y.com", "c2_ip": "5.6.7.8"}}]), end="")
    # seclake sample_data: known-bad infrastructure of the injected incidents (ground_truth.jsonl)
    x-y.com  # w0-04-c2_beaconing domain
    5.6.7.8  # w0-04-c2_beaconing ip
    192.0.2.10  # decoy
    198.51.100.23  # decoy
    c2-panel.example  # decoy
    update-check.example  # decoy
    """
    lines = ["# seclake sample_data: known-bad infrastructure of the injected incidents (ground_truth.jsonl)"]
    for record in gt:
        for kind, key in PLANTED.get(record["scenario"], ()):
            lines.append(f"{record['details'][key]}  # {record['id']} {kind}")
    lines += [f"{decoy}  # decoy" for decoy in DECOYS]
    return "\n".join(lines) + "\n"


def _write_meta(out: Path, manifest: dict, gt: list[dict]) -> None:
    gt_sorted = sorted(gt, key=lambda r: (r["start"], r["id"]))
    write_atomic(out / "ground_truth.jsonl",
                 "".join(json.dumps(r, sort_keys=False) + "\n" for r in gt_sorted).encode())
    (out / PLANTED_FEED).parent.mkdir(exist_ok=True)
    write_atomic(out / PLANTED_FEED, planted_feed(gt_sorted).encode())
    write_atomic(out / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())


def _window(out: Path, org: Org, seed: int, window: int, S: int, E: int, zeek_json: bool, rates: dict,
            rate: float | None, workers: int | None, manifest: dict, gt: list[dict], state: dict,
            say: Callable[[str], None], prev_ips: dict[str, str] | None) -> dict[str, str]:
    base = S - S % HOUR
    n_files = hour_files(S, (E - S) / HOUR)

    # 1. presence, scenarios, DHCP
    plan = plan_presence(org, S, E, seed, window)
    incidents, spoofed = plan_scenarios(org, plan, seed, window)
    simulate_dhcp(org, plan, seed, window, spoofed, prev_ips)
    manifest["devices"]["not_in_inventory"] = sum(1 for d in org.devices if not d.in_inventory)

    # 2. DHCP transactions and scenario traffic, in this process
    main = Sink(random.Random(f"{seed}:main-ids:{window}"), zeek_json)
    by_dev: dict[int, list[Incident]] = {}
    starv = None
    for inc in incidents:
        if inc.scenario in ("roaming_laptop", "new_device"):
            by_dev.setdefault(inc.dev.idx, []).append(inc)
        if inc.scenario == "dhcp_starvation":
            starv = inc
    gw = {s.idx: s.gateway for s in org.subnets}
    n_spoof = {"offer": 0, "dora": 0, "discover": 0}
    for tx in plan.dhcp:
        if tx.ts < S or tx.ts >= E:
            continue
        uids, fids = main.dhcp(tx.ts, tx.kind, tx.mac, gw[tx.subnet], DHCP_SERVER, ip=tx.ip,
                               hostname=tx.hostname, fqdn=tx.fqdn, domain=org.zone, lease_time=tx.lease_time,
                               duration=tx.duration)
        ids = uids + [str(f) for f in fids]
        if tx.tag == "dhcp_starvation" and starv is not None:
            starv.ids += ids
            n_spoof[tx.kind] += 1
        elif tx.dev is not None:
            for inc in by_dev.get(tx.dev, ()):
                inc.ids += ids
    if starv is not None:
        starv.details = {"spoofed_macs": sum(n_spoof.values()), "discover_offer": n_spoof["offer"],
                         "full_dora": n_spoof["dora"], "unanswered": n_spoof["discover"],
                         "subnet": org.subnets[starv.extra["subnet"]].name,
                         "window_s": (starv.end - starv.start) // US,
                         "note": "spoofed DISCOVERs come from 0.0.0.0 with random MACs; host_ip/mac "
                                 "name the attacking laptop, which the DHCP logs do not show"}
    emit_scenarios(org, plan, incidents, main, seed, window)
    main_z = [_bucket(main.conn, base, n_files), _bucket(main.dns_z, base, n_files),
              _bucket(main.dhcp_z, base, n_files)]
    main_e = _bucket(main.eve, base, n_files)

    # 3. background traffic per hour, possibly in parallel; files assembled in hour order
    tracked = set(by_dev)
    _CTX.clear()
    _CTX.update(org=org, plan=plan, base=base, n_files=n_files, seed=seed, window=window,
                zeek_json=zeek_json, tracked=tracked)
    nproc = workers if workers else min(2, os.cpu_count() or 1)
    if n_files * len(org.devices) < 400:
        nproc = 1
    pend_z: dict[int, list[list]] = {}
    pend_e: dict[int, list] = {}
    late_rng = random.Random(f"{seed}:late:{window}")
    candidates = [(s, k, i) for i in range(n_files - 1) for s, k in STREAMS]
    n_late = 0
    if rates["late_rate"] > 0 and candidates:
        n_late = max(1, round(rates["late_rate"] * len(candidates)))
    late = set(late_rng.sample(candidates, min(n_late, len(candidates))))
    held: list[tuple] = []

    def results():
        if nproc <= 1:
            for j in range(n_files):
                yield _background_hour(j)
        else:
            # spawn, never fork: the caller may already run a JVM and Py4J threads, and a forked
            # child can wait for ever on a lock one of those threads held at fork time.
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(nproc, initializer=_init_worker, initargs=(dict(_CTX),)) as pool:
                yield from pool.imap(_background_hour, range(n_files))

    t_start = time.monotonic()
    for j, zk, ev, trk in results():
        for dev_idx, ids in trk.items():
            for inc in by_dev.get(dev_idx, ()):
                inc.ids += ids
        for i, b in ev.items():
            pend_e.setdefault(i, []).extend(b)
        for z in range(3):
            for i, b in zk[z].items():
                pend_z.setdefault(i, [[], [], []])[z].extend(b)
        # file j is complete now
        i = j
        h_us = base + i * HOUR
        close_us = min(E, h_us + HOUR)
        zl = pend_z.pop(i, [[], [], []])
        el = pend_e.pop(i, [])
        for z in range(3):
            zl[z].extend(main_z[z].get(i, ()))
        el.extend(main_e.get(i, ()))
        hour_events = 0
        rotation = []
        for (sensor, kind), items in zip(STREAMS, (zl[0], zl[1], zl[2], el)):
            items.sort(key=_first)
            mrng = random.Random(f"{seed}:mess:{window}:{sensor}:{kind}:{i}")
            tsv = sensor == "zeek" and not zeek_json
            lines, stats = apply_mess(items, mrng, tsv, rates["duplicate_rate"], rates["malformed_rate"],
                                      rates["out_of_order_rate"], kind=kind if sensor == "zeek" else None)
            body = "\n".join(lines) + ("\n" if lines else "")
            if tsv:
                body = zeek_header(kind, max(h_us, S)) + body + zeek_footer(close_us)
            data = body.encode("utf-8", "surrogateescape")
            name = _file_name(sensor, kind, h_us)
            is_late = (sensor, kind, i) in late
            deliver = close_us + (2 * US if sensor == "zeek" else US)
            if is_late:
                deliver = close_us + HOUR + 30 * US + late_rng.randrange(600 * US)
            entry = {"path": f"landing/{sensor}/{name}", "sensor": sensor, "kind": kind,
                     "hour": iso(h_us), "window": window, "late": is_late, "delivered_at": iso(deliver),
                     "events": {k: s["events"] for k, s in stats.items()},
                     "duplicates": {k: s["duplicates"] for k, s in stats.items()},
                     "malformed": {k: s["malformed"] for k, s in stats.items()},
                     "out_of_order": {k: s["out_of_order"] for k, s in stats.items()},
                     "lines": len(lines), "bytes": len(data)}
            ev_count = sum(s["events"] for s in stats.values())
            hour_events += ev_count
            job = (out / "landing" / sensor / name, data, entry, stats, ev_count)
            if is_late:
                held.append((i, job))
            else:
                rotation.append(job)
        # The hour's files land together, as sensors rotating on the hour deliver them: paced one by
        # one, Suricata's file landed a rotation's worth of events after Zeek's, and the stream
        # took its rows for late (docs/sample-data.md, "Live mode").
        _pace(state, rate, sum(job[4] for job in rotation))
        for job in rotation:
            _deliver(job, manifest, state, rate)
        # late files of the previous hour go after this hour's files
        for item in [h for h in held if h[0] < i]:
            held.remove(item)
            _pace(state, rate, item[1][4])
            _deliver(item[1], manifest, state, rate)
        say(f"{iso(h_us)[:16]}Z  {hour_events:,} events  "
            f"({time.monotonic() - t_start:.1f} s)")
    for _, job in held:
        _pace(state, rate, job[4])
        _deliver(job, manifest, state, rate)

    for k, inc in enumerate(incidents):
        manifest["scenarios"][inc.scenario] += 1
        gt.append(inc.record(k, window))
    if rate is not None:
        _write_meta(out, manifest, gt)
    return {org.devices[d].mac: hs[-1].ip for d, hs in plan.holdings.items() if hs and hs[-1].end >= E}


def _pace(state: dict, rate: float | None, events: int) -> None:
    """Live mode: wait until `events` more events are due at `rate` events/s."""
    if rate is not None:
        delay = state["t0"] + (state["events_written"] + events) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _deliver(job, manifest: dict, state: dict, rate: float | None) -> None:
    path, data, entry, stats, ev_count = job
    with _deferred_interrupt(rate is not None):
        state["mtime"] = write_atomic(path, data, state["mtime"])
        _count(entry, stats, ev_count, manifest, state)
    if rate is not None and manifest["totals"]["files"] % 4 == 0:
        write_atomic(state["out"] / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())


@contextlib.contextmanager
def _deferred_interrupt(active: bool):
    """Hold back Ctrl-C while a file is renamed into place and counted, so the manifest
    always describes exactly the files that exist; the interrupt is raised right after."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    hit: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit:
        raise KeyboardInterrupt


def _count(entry: dict, stats: dict, ev_count: int, manifest: dict, state: dict) -> None:
    sensor = entry["sensor"]
    for kind, s in stats.items():
        for key in ("events", "duplicates", "malformed", "out_of_order"):
            manifest[key][sensor][kind] += s[key]
        manifest["lines"][sensor][kind] += s["events"] + s["duplicates"] + s["malformed"]
        if entry["late"]:
            manifest["late"][sensor][kind] += s["events"]
        manifest["totals"]["events"] += s["events"]
        manifest["totals"]["duplicates"] += s["duplicates"]
        manifest["totals"]["malformed"] += s["malformed"]
    manifest["totals"]["lines"] += entry["lines"]
    manifest["totals"]["files"] += 1
    manifest["totals"]["late_files"] += int(entry["late"])
    manifest["files"].append(entry)
    state["events_written"] += ev_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sample_data.generator", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
