"""Fault injection: SIGKILL at random points, malformed input, a full disk, an unwritable table.

Run alone with `pytest -m faults` (15-20 minutes on 2 cores; the kill test is most
of it). Every check compares against the generator's manifest and against a clean reference
run over the same files, and reads the Delta tables with delta-rs (not with seclake's own
read path), so a bug in the product's read path cannot hide a bug in its write path.

Knobs (environment): SECLAKE_FAULT_RESTARTS (default 20) and SECLAKE_FAULT_SEED (default 20261120).
"""
from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from urllib.parse import unquote

from pipelines import etl
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake
from pipelines.settings import Settings
from sample_data.generator import generate

# Each fault test runs a stream for minutes; a larger per-test limit than the suite default (600 s).
pytestmark = [pytest.mark.faults, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
RESTARTS = int(os.environ.get("SECLAKE_FAULT_RESTARTS", "20"))
SEED = int(os.environ.get("SECLAKE_FAULT_SEED", "20261120"))
STAGING = "_staging-"
# Which (sensor, kind) counts of the manifest feed each silver table.
SILVER_FEEDS = {
    "silver_dns": [("zeek", "dns"), ("suricata", "dns")],
    "silver_dhcp": [("zeek", "dhcp"), ("suricata", "dhcp")],
    "silver_conn": [("zeek", "conn"), ("suricata", "flow")],
    "silver_ids_alerts": [("suricata", "alert")],
}


# ---- helpers ----------------------------------------------------------------------------------

def seclake(*args: str) -> list[str]:
    """The CLI, run with this interpreter (so the test never picks up another install)."""
    return [sys.executable, "-m", "pipelines.cli", *args]


def deliver(src: Path, landing: Path, sensor: str) -> Path:
    """Place a landing file atomically, as sensors do: `.name.tmp`, then rename."""
    folder = landing / sensor
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{src.name}.tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, folder / src.name)
    return folder / src.name


def tables_in(home: Home) -> list[str]:
    if not home.tables.is_dir():
        return []
    return sorted(p.name for p in home.tables.iterdir() if (p / "_delta_log").is_dir())


def version(path: Path) -> int | None:
    return DeltaTable(str(path)).version() if (path / "_delta_log").is_dir() else None


def read_columns(path: Path, columns: list[str]) -> dict[str, list]:
    """Columns of the latest snapshot, read with delta-rs/pyarrow."""
    table = DeltaTable(str(path))
    present = [c for c in columns if c in table.schema().to_arrow().names]
    return table.to_pyarrow_table(columns=present).to_pydict()


def row_keys(path: Path, name: str) -> collections.Counter:
    """The multiset of each row's identity: event_id for silver/enriched, (file name, line) for
    bronze and quarantine (the home folder differs between runs), alert_id for alerts,
    the whole row otherwise."""
    schema_names = DeltaTable(str(path)).schema().to_arrow().names
    if name.startswith(("bronze_", "quarantine")):
        cols = read_columns(path, ["file", "line_number"])
        return collections.Counter(zip((f.rsplit("/", 1)[-1] for f in cols["file"]), cols["line_number"]))
    if "alert_id" in schema_names:
        return collections.Counter(read_columns(path, ["alert_id"])["alert_id"])
    if "event_id" in schema_names:
        return collections.Counter(read_columns(path, ["event_id"])["event_id"])
    table = DeltaTable(str(path)).to_pyarrow_table()
    return collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def duplicates(keys: collections.Counter) -> list:
    return [k for k, n in keys.items() if n > 1]


def leftovers(path: Path) -> tuple[set[str], set[str]]:
    """(staging folders, Parquet files no commit references) in a table folder."""
    staging = {p.name for p in path.glob(f"{STAGING}*")}
    referenced = set()
    if (path / "_delta_log").is_dir():
        adds = DeltaTable(str(path)).get_add_actions(flatten=True).column("path").to_pylist()
        referenced = {os.path.normpath(unquote(p)) for p in adds}
    on_disk = set()
    for p in path.rglob("*.parquet"):
        rel = p.relative_to(path)
        if rel.parts[0].startswith(("_", ".")):
            continue
        on_disk.add(os.path.normpath(str(rel)))
    return staging, on_disk - referenced


def staged(folder: Path) -> bool:
    """True when a staging folder holds the batch's finished Parquet files (Spark's job commit
    moved them out of `_temporary`): the write is done, the delta-rs commit is not."""
    try:
        return any(p for p in folder.rglob("*.parquet") if "_temporary" not in p.relative_to(folder).parts)
    except FileNotFoundError:  # Spark removed `_temporary` (or the sink the folder) while we looked
        return False


def manifest_silver(manifest: dict) -> dict[str, int]:
    return {t: sum(manifest["events"][s][k] for s, k in feeds) for t, feeds in SILVER_FEEDS.items()}


def compare_with_reference(run: Home, reference: Home, manifest: dict | None = None,
                           exact: tuple[str, ...] | None = None) -> dict[str, int]:
    """Every table of `reference` named in `exact` (default: all of them) must hold exactly the
    same rows (by identity key, as a multiset) in `run`; every other table (attribution: event-time
    state whose segments may depend on how the input was cut into batches) must hold no row twice.
    Returns the rows checked per table."""
    checked = {}
    ref_tables = [t for t in tables_in(reference) if exact is None or t in exact]
    assert ref_tables, "the reference run wrote no table"
    for name in ref_tables:
        ref = row_keys(reference.table(name), name)
        got = row_keys(run.table(name), name) if (run.table(name) / "_delta_log").is_dir() else collections.Counter()
        missing = ref - got
        extra = got - ref
        assert not missing and not extra, (
            f"{name}: {sum(missing.values())} rows lost (e.g. {list(missing)[:3]}), "
            f"{sum(extra.values())} rows extra or duplicated (e.g. {list(extra)[:3]})")
        checked[name] = sum(got.values())
    for name in tables_in(run):
        if name in ref_tables:
            continue
        got = row_keys(run.table(name), name)
        assert not duplicates(got), f"{name}: rows written twice: {duplicates(got)[:3]}"
        checked[name] = sum(got.values())
    if manifest is not None:
        for table, expected in manifest_silver(manifest).items():
            assert checked.get(table, 0) == expected, f"{table}: {checked.get(table)} rows, manifest says {expected}"
    return checked


def landing_files(gen: Path, manifest: dict) -> list[tuple[Path, str]]:
    """The generator's files in delivery order, with their sensor folder."""
    return [(gen / f["path"], f["sensor"]) for f in manifest["files"]]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A small generated input: 6 night hours of 5 devices (~30k events, 24+ files)."""
    out = tmp_path_factory.mktemp("faults-gen")
    manifest = generate(out, hours=6, hosts=5, seed=SEED % 1000, start="2026-11-20T00:00:00Z")
    return out, manifest


# ---- SIGKILL at random points while files keep arriving ------------------------------------

class Deliverer:
    """Delivers the remaining landing files one by one at random moments from a thread."""

    def __init__(self, files: list[tuple[Path, str]], landing: Path, rng: random.Random) -> None:
        self.files = list(files)
        self.landing = landing
        self.rng = rng
        self.lock = threading.Lock()
        self.delivered: list[str] = []

    def deliver_next(self, n: int = 1) -> None:
        with self.lock:
            for _ in range(n):
                if not self.files:
                    return
                src, sensor = self.files.pop(0)
                deliver(src, self.landing, sensor)
                self.delivered.append(src.name)

    def during(self, stop: threading.Event, delays: list[float]) -> threading.Thread:
        def work():
            for delay in delays:
                if stop.wait(delay):
                    return
                self.deliver_next()
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        return thread


def _wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if log.exists() and text in log.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.1)
    return None


def _data_files(home: Home) -> set[str]:
    """Parquet files in the tables' partition folders (not staging, not the log)."""
    found = set()
    if not home.tables.is_dir():
        return found
    for table in os.scandir(home.tables):
        if not table.is_dir() or table.name.startswith("."):
            continue
        stack = [table.path]
        while stack:
            for entry in os.scandir(stack.pop()):
                if entry.is_dir():
                    if not entry.name.startswith(("_", ".")):
                        stack.append(entry.path)
                elif entry.name.endswith(".parquet"):
                    found.add(entry.path)
    return found


def _wait_for_sink_step(home: Home, known: set[str], nth: int, proc: subprocess.Popen, timeout: float) -> float:
    """Poll (every ~10 ms) until the sink reached its write -> commit window `nth` times: a
    staging folder whose Parquet files are finished, or new data files in a table's partitions
    (moved there right before the commit). Return the seconds waited."""
    started = time.monotonic()
    events: set[str] = set()
    while time.monotonic() - started < timeout and proc.poll() is None:
        for folder in home.tables.glob(f"*/{STAGING}*"):
            if str(folder) not in events and staged(folder):
                events.add(str(folder))
        new = _data_files(home) - known
        if new:
            events.add(min(new))  # one event per appearance of a batch's files
            known |= new
        if len(events) >= nth:
            break
        time.sleep(0.01)
    return time.monotonic() - started


def _commits(home: Home) -> dict[str, int]:
    """Commit files per table (a cheap directory listing: polled while the stream runs)."""
    if not home.tables.is_dir():
        return {}
    return {t.name: sum(1 for f in os.scandir(t.path + "/_delta_log") if f.name.endswith(".json"))
            for t in os.scandir(home.tables) if os.path.isdir(t.path + "/_delta_log")}


def _wait_for_commit(home: Home, before: dict[str, int], proc: subprocess.Popen, timeout: float) -> float:
    """Poll until any table has a commit it did not have in `before`; return the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout and proc.poll() is None:
        now = _commits(home)
        if any(n > before.get(t, 0) for t, n in now.items()):
            break
        time.sleep(0.05)
    return time.monotonic() - started


def test_sigkill_at_random_points_loses_and_duplicates_nothing(spark, generated, tmp_path):
    gen, manifest = generated
    test_started = time.monotonic()
    timings = {}
    rng = random.Random(SEED)
    home = Home.resolve(tmp_path / "home").create()
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    files = landing_files(gen, manifest)
    feed = Deliverer(files, home.landing, rng)
    feed.deliver_next(2)
    # The first files go through the ETL once, so the kills start on a home that has data, as a
    # deployed one would.
    boot = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])
    assert boot[0].error is None, boot[0].line()
    timings["bootstrap_s"] = round(time.monotonic() - test_started)
    # One file per micro-batch: many batches, so many commit points to land a kill on.
    cmd = seclake("stream", "--home", str(home.root), "--set", "trigger_interval=1 second",
                  "--set", "max_files_per_trigger=1", "--report-every", "5")
    kills = []
    seen_staging: dict[str, set] = collections.defaultdict(set)
    seen_orphans: dict[str, set] = collections.defaultdict(set)
    for restart in range(RESTARTS):
        log = tmp_path / f"stream-{restart}.log"
        # Kill points, in a cycle of four:
        #   "from start" (x2): 2-25 s after the process starts: JVM start-up, query start, batches;
        #   "after Spark up": 2-25 s after the session is up: query start, replay, batches, commits;
        #   "in the write -> commit window": the k-th time (k = 1..4) the sink is between its
        #   Parquet write and its delta-rs commit: a staging folder holds finished files, or
        #   new files appear in a table's partitions (moved there right before the commit).
        #   "after a commit": 0-3 s after the first commit of this run (any table), so that
        #   every cycle makes progress and later kills land on new batches, not the same replay.
        mode = ("after a commit", "from start", "in the write -> commit window", "after Spark up")[restart % 4]
        delay = rng.uniform(2, 25)
        nth_file = rng.randint(1, 4)
        arrivals = [rng.uniform(0.5, 8) for _ in range(rng.randint(1, 2))]
        known_files = _data_files(home)
        commits_before = _commits(home)
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        stop = threading.Event()
        thread = feed.during(stop, arrivals)
        up = None
        try:
            if mode == "from start":
                time.sleep(delay)
            else:
                up = _wait_for_line(log, "seclake stream: home", proc, timeout=300)
                assert up is not None, f"seclake stream did not come up:\n{log.read_text(errors='replace')[-3000:]}"
                if mode == "after Spark up":
                    time.sleep(delay)
                elif mode == "after a commit":
                    extra = rng.uniform(0, 3)
                    delay = _wait_for_commit(home, commits_before, proc, timeout=240) + extra
                    time.sleep(extra)
                else:
                    delay = _wait_for_sink_step(home, known_files, nth_file, proc, timeout=180)
            assert proc.poll() is None, f"seclake stream exited by itself:\n{log.read_text(errors='replace')[-3000:]}"
            os.killpg(proc.pid, signal.SIGKILL)  # the whole process group: Python driver and JVM
            proc.wait()
        finally:
            stop.set()
            thread.join()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # What did this kill leave behind? New staging folders = killed while Spark wrote the
        # batch's Parquet; new unreferenced files in the partitions = killed after the files
        # were moved into place and before delta-rs committed them.
        # A staging folder with finished files or new unreferenced files = the kill landed after
        # the batch's Parquet write and before its commit; a staging folder with only Spark's
        # `_temporary` output = during the write.
        new_staging, new_staged, new_orphans, where = 0, 0, 0, []
        for name in sorted({p.name for p in home.tables.iterdir() if p.is_dir() and p.name[0] != "."}):
            path = home.table(name)
            staging, orphans = leftovers(path)
            for folder in staging - seen_staging[name]:
                if staged(path / folder):
                    new_staged += 1
                    where.append(f"{name}: staged, not committed")
                else:
                    new_staging += 1
                    where.append(f"{name}: writing")
            if orphans - seen_orphans[name]:
                new_orphans += len(orphans - seen_orphans[name])
                where.append(f"{name}: moved, not committed")
            seen_staging[name] |= staging
            seen_orphans[name] |= orphans
        # No duplicate may ever be visible, not even between restarts.
        for name in tables_in(home):
            dups = duplicates(row_keys(home.table(name), name))
            assert not dups, f"restart {restart}: {name} has duplicated rows {dups[:3]}"
        commits_after = _commits(home)
        kills.append({"restart": restart, "mode": mode, "delay_s": round(delay, 2),
                      "commits": sum(n - commits_before.get(t, 0) for t, n in commits_after.items()),
                      "at_s": round(time.monotonic() - started, 1),
                      "startup_s": round(up - started, 1) if up else None,
                      "killed_during_write": new_staging, "killed_after_write_in_staging": new_staged,
                      "killed_after_move_unreferenced_files": new_orphans, "where": where,
                      "versions": {n: version(home.table(n)) for n in tables_in(home)}})
    timings["kill_phase_s"] = round(time.monotonic() - test_started - timings["bootstrap_s"])
    # Everything else arrives; one clean run drains it (the same CLI, run-once this time).
    feed.deliver_next(len(feed.files))
    # The kills must have hit a pipeline that was making progress, not the same replay 20 times.
    progressed = sum(k["commits"] for k in kills)
    assert progressed >= RESTARTS // 4, f"only {progressed} commits during the kill phase: {kills}"
    drained = subprocess.run(seclake("run-once", "--home", str(home.root)), cwd=REPO,
                             capture_output=True, text=True, timeout=1800)
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]

    timings["drain_s"] = round(time.monotonic() - test_started - timings["bootstrap_s"] - timings["kill_phase_s"])
    # The reference: the same files, one clean run in this process.
    reference = Home.resolve(tmp_path / "reference").create()
    shutil.copytree(gen / "reference", reference.reference, dirs_exist_ok=True)
    for src, sensor in files:
        deliver(src, reference.landing, sensor)
    # The whole pipeline. ETL tables and alerts (a stable alert_id per rule, entity and window)
    # must match exactly; attribution tables are checked for uniqueness (see compare_with_reference).
    reports = run_once(spark, Lake(reference), Settings())
    assert all(r.error is None for r in reports), [r.line() for r in reports]
    reference_alerts = row_keys(reference.table("alerts"), "alerts")
    assert reference_alerts, "the reference run raised no alert: the alert check would be vacuous"
    checked = compare_with_reference(home, reference, manifest, exact=(*etl.ETL_TABLES, "alerts"))

    # What the crashed batches left behind is unreferenced; vacuum removes it and no row changes.
    from pipelines.lake.maintenance import vacuum
    left = {}
    for name in tables_in(home):
        staging, orphans = leftovers(home.table(name))
        if staging or orphans:
            left[name] = (len(staging), len(orphans))
            keys = row_keys(home.table(name), name)
            vacuum(home.table(name), retention_hours=0)
            assert leftovers(home.table(name)) == (set(), set()), name
            assert row_keys(home.table(name), name) == keys, name
    timings["total_s"] = round(time.monotonic() - test_started)

    between = sum(1 for k in kills if k["killed_after_write_in_staging"] or k["killed_after_move_unreferenced_files"])
    during_write = sum(1 for k in kills if k["killed_during_write"])
    summary = {"restarts": len(kills), "commits_during_kill_phase": progressed,
               "kills_between_write_and_commit": between,
               "kills_during_parquet_write": during_write, "rows_checked": checked,
               "landing_files": len(files), "vacuumed_leftovers": left, "timings": timings, "kills": kills}
    (tmp_path / "kills.json").write_text(json.dumps(summary, indent=1))
    print("\nSIGKILL summary:", json.dumps({k: v for k, v in summary.items() if k != "kills"}))
    for k in kills:
        print("  ", k)
    assert len(kills) >= RESTARTS


# ---- malformed input ---------------------------------------------------------------------------

HUGE = 5 * 1024 * 1024


def _data_lines(path: Path, sensor: str) -> int:
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return sum(1 for line in lines if not (sensor == "zeek" and line.startswith(b"#")))


def _malformed_corpus(gen: Path, landing: Path) -> dict[str, dict]:
    """Hand-made hostile files next to real ones; returns {file name: {sensor, good, bad}} where
    `good`/`bad` are line numbers that must parse / must be quarantined (others: either)."""
    corpus = {}
    conn_src = next((gen / "landing" / "zeek").glob("conn.*.log")).read_bytes().split(b"\n")
    header = [line for line in conn_src if line.startswith(b"#") and not line.startswith(b"#close")]
    rows = [line for line in conn_src if line and not line.startswith(b"#")][:3]
    good = rows[0].split(b"\t")

    def field(i: int, value: bytes) -> bytes:
        return b"\t".join(good[:i] + [value] + good[i + 1:])

    body = [
        (rows[0], "good"), (rows[1], "good"),
        (b"\t".join(good[:5]), "bad"),                         # truncated: too few fields
        (rows[2] + b"\tEXTRA", "bad"),                         # one field too many
        (field(0, b"not-a-time"), None),                       # wrong type: ts
        (field(3, b"http"), None),                             # wrong type: port
        (field(8, b"abc"), None),                              # wrong type: interval
        (field(1, b"C\xff\xfe\xfdbad"), "bad"),                # invalid UTF-8
        (field(1, b"C\x00nul\x00"), None),                     # NUL bytes
        (field(7, b"a" * HUGE), None),                         # a 5 MB line
        (b"", None),                                           # a blank line
        (rows[1].replace(b"\t", b"\t", 1) + b"\r", None),      # CRLF line ending
    ]
    text = b"\n".join(header + [line for line, _ in body]) + b"\n#close\t2026-11-20-01-00-00\n"
    (landing / "zeek").mkdir(parents=True, exist_ok=True)
    (landing / "zeek" / "conn.hostile.log").write_bytes(text)
    first = len(header) + 1
    corpus["conn.hostile.log"] = {
        "sensor": "zeek", "good": [first + i for i, (_, k) in enumerate(body) if k == "good"],
        "bad": [first + i for i, (_, k) in enumerate(body) if k == "bad"]}

    eve_src = [line for line in next((gen / "landing" / "suricata").glob("eve.*.json")).read_bytes().split(b"\n") if line]
    ev = json.loads(eve_src[0])
    wrong = dict(ev, src_port="abc", timestamp=12345, flow_id="x")
    huge = dict(ev, host="h" * HUGE)
    eve_body = [
        (eve_src[0], "good"), (eve_src[1], "good"),
        (eve_src[2][: len(eve_src[2]) // 2], "bad"),                            # truncated JSON
        (json.dumps(wrong).encode(), None),                                      # wrong types
        (eve_src[3][:40] + b"\xc3\x28\xff" + eve_src[3][40:], "bad"),            # invalid UTF-8
        (eve_src[4][:30] + b"\x00\x00" + eve_src[4][30:], None),                 # raw NUL bytes
        (json.dumps(huge).encode(), None),                                       # a 5 MB line
        (b"[1, 2, 3]", "bad"), (b"42", "bad"), (b'"text"', "bad"), (b"{}", None),  # not an event
        (json.dumps(dict(ev, alert="not an object")).encode(), None),            # wrong nested type
        (b"", None), (b"   ", None),                                             # blank lines
        (eve_src[5] + b"\r", None),                                              # CRLF
    ]
    (landing / "suricata").mkdir(parents=True, exist_ok=True)
    (landing / "suricata" / "eve.hostile.json").write_bytes(b"\n".join(line for line, _ in eve_body) + b"\n")
    corpus["eve.hostile.json"] = {
        "sensor": "suricata", "good": [1 + i for i, (_, k) in enumerate(eve_body) if k == "good"],
        "bad": [1 + i for i, (_, k) in enumerate(eve_body) if k == "bad"]}
    # Zeek JSON, empty files, a header-only TSV file, a file of newlines.
    dns_json = [line for line in next((gen / "json" / "landing" / "zeek").glob("dns.*.log")).read_bytes().split(b"\n") if line]
    zj = json.loads(dns_json[0])
    zeek_json_body = [(dns_json[0], "good"), (dns_json[1][:25], "bad"),
                      (json.dumps(dict(zj, ts="yesterday", **{"id.orig_p": "x"})).encode(), None),
                      (dns_json[2][:20] + b"\xff" + dns_json[2][20:], "bad"),
                      (json.dumps(dict(zj, query="q" * HUGE)).encode(), None)]
    (landing / "zeek" / "dns.hostile-json.log").write_bytes(b"\n".join(line for line, _ in zeek_json_body) + b"\n")
    corpus["dns.hostile-json.log"] = {
        "sensor": "zeek", "good": [1 + i for i, (_, k) in enumerate(zeek_json_body) if k == "good"],
        "bad": [1 + i for i, (_, k) in enumerate(zeek_json_body) if k == "bad"]}
    for name, sensor, data in [("conn.empty.log", "zeek", b""), ("eve.empty.json", "suricata", b""),
                               ("dns.headers-only.log", "zeek", b"\n".join(header).replace(b"#path\tconn", b"#path\tdns")
                                + b"\n#close\t2026-11-20-01-00-00\n"),
                               ("eve.newlines.json", "suricata", b"\n\n\n")]:
        (landing / sensor / name).write_bytes(data)
        corpus[name] = {"sensor": sensor, "good": [], "bad": []}
    return corpus


@pytest.fixture(scope="module")
def small_json(generated):
    """The first hour of the fault input again, with Zeek in JSON."""
    gen, _ = generated
    generate(gen / "json", hours=0.2, hosts=5, seed=SEED % 1000, start="2026-11-20T00:00:00Z", zeek_format="json")
    return gen


def test_malformed_corpus_good_plus_quarantined_equals_lines_read(spark, small_json, tmp_path):
    gen = small_json
    home = Home.resolve(tmp_path / "home").create()
    corpus = _malformed_corpus(gen, home.landing)
    report = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
    assert report.error is None, report.line()

    bronze = collections.Counter()
    parsed_ok = collections.Counter()
    for name in tables_in(home):
        if name.startswith("bronze_"):
            cols = read_columns(home.table(name), ["file", "line_number", "parse_ok"])
            for f, line, ok in zip(cols["file"], cols["line_number"], cols["parse_ok"]):
                bronze[(f.rsplit("/", 1)[-1], line)] += 1
                parsed_ok[f.rsplit("/", 1)[-1]] += bool(ok)
    quarantine = collections.Counter()
    q = read_columns(home.table("quarantine"), ["file", "line_number", "reason"])
    for f, line in zip(q["file"], q["line_number"]):
        quarantine[(f.rsplit("/", 1)[-1], line)] += 1
    assert not duplicates(bronze) and not duplicates(quarantine)
    assert all(r for r in q["reason"]), "every quarantined line carries a reason"
    for name, spec in corpus.items():
        path = home.landing / spec["sensor"] / name
        lines = _data_lines(path, spec["sensor"])
        in_bronze = sum(1 for (f, _) in bronze if f == name)
        quarantined = sum(1 for (f, _) in quarantine if f == name)
        assert in_bronze == lines, f"{name}: {in_bronze} lines in bronze, the file has {lines}"
        assert parsed_ok[name] + quarantined == lines, f"{name}: {parsed_ok[name]} good + {quarantined} quarantined != {lines}"
        for line in spec["bad"]:
            assert (name, line) in quarantine, f"{name} line {line} should be quarantined"
        for line in spec["good"]:
            assert (name, line) not in quarantine, f"{name} line {line} should parse"
    # The good lines reached silver; the 5 MB lines did not break anything on the way.
    silver_files = collections.Counter()
    for name in tables_in(home):
        if name.startswith("silver_"):
            for f in read_columns(home.table(name), ["source_file"])["source_file"]:
                silver_files[f.rsplit("/", 1)[-1]] += 1
    for name, spec in corpus.items():
        assert silver_files[name] >= len(spec["good"]), name


# ---- a landing file deleted after it was listed, before it was read ---------------------------

def _deleting_writer(monkeypatch, victim: Path, batch: int):
    original = etl.EtlWriter.__call__

    def call(self, files, batch_id):
        if batch_id == batch and victim.exists():
            # The batch is planned (its file list is in the offset log), its rows not read yet:
            # the first action inside the batch reads the file.
            victim.unlink()
        return original(self, files, batch_id)

    monkeypatch.setattr(etl.EtlWriter, "__call__", call)


def _deleted_file_run(spark, generated, tmp_path, monkeypatch):
    gen, manifest = generated
    home = Home.resolve(tmp_path / "home").create()
    eve = [gen / f["path"] for f in manifest["files"] if f["sensor"] == "suricata"][:3]
    for i, src in enumerate(eve):
        dest = deliver(src, home.landing, "suricata")
        os.utime(dest, (1_800_000_000 + i, 1_800_000_000 + i))  # read in this order
    victim = home.landing / "suricata" / eve[1].name
    _deleting_writer(monkeypatch, victim, batch=1)  # one file per batch, in mtime order
    first = run_once(spark, Lake(home), Settings(max_files_per_trigger=1), only=[etl.QUERY_NAME])[0]
    monkeypatch.undo()
    return home, eve, victim, first


def test_file_deleted_while_being_read_then_restart_recovers(spark, generated, tmp_path, monkeypatch):
    home, eve, victim, first = _deleted_file_run(spark, generated, tmp_path, monkeypatch)
    again = run_once(spark, Lake(home), Settings(max_files_per_trigger=1), only=[etl.QUERY_NAME])[0]
    assert again.error is None, again.line()
    cols = read_columns(home.table("bronze_suricata"), ["file", "line_number"])
    keys = collections.Counter(zip((f.rsplit("/", 1)[-1] for f in cols["file"]), cols["line_number"]))
    assert not duplicates(keys)
    for src in (eve[0], eve[2]):
        lines = _data_lines(src, "suricata")
        assert sum(1 for (f, _) in keys if f == src.name) == lines, src.name
    assert not any(f == victim.name for (f, _) in keys)
    print(f"\nfirst run: {first.line()}\nsecond run: {again.line()}")


def test_file_deleted_while_being_read_does_not_fail_the_run(spark, generated, tmp_path, monkeypatch):
    _, _, _, first = _deleted_file_run(spark, generated, tmp_path, monkeypatch)
    assert first.error is None, first.line()


# ---- full disk, unwritable table -----------------------------------------------------------------

@pytest.fixture(scope="module")
def two_files(generated, spark, tmp_path_factory):
    """Two EVE hours and the clean reference run over both."""
    gen, manifest = generated
    eve = [gen / f["path"] for f in manifest["files"] if f["sensor"] == "suricata"][:2]
    reference = Home.resolve(tmp_path_factory.mktemp("faults-ref") / "home").create()
    for src in eve:
        deliver(src, reference.landing, "suricata")
    rep = run_once(spark, Lake(reference), Settings(), only=[etl.QUERY_NAME])[0]
    assert rep.error is None, rep.line()
    return eve, reference


def _snapshot(home: Home) -> dict[str, tuple[int, int]]:
    out = {}
    for name in tables_in(home):
        table = DeltaTable(str(home.table(name)))
        rows = sum(table.get_add_actions(flatten=True).column("num_records").to_pylist() or [0])
        out[name] = (table.version(), rows)
    return out


def _check_no_partial_commit(before: dict, after: dict, failed_table: str | None) -> None:
    for name, (ver, rows) in before.items():
        new_ver, new_rows = after.get(name, (ver, rows))
        assert new_ver in (ver, ver + 1), f"{name}: version {ver} -> {new_ver} in one failed batch"
        if new_ver == ver:
            assert new_rows == rows, f"{name}: rows changed without a commit"
    if failed_table is not None:
        assert after[failed_table] == before[failed_table], f"{failed_table} committed despite the failure"


def _run_failing(spark, home: Home) -> tuple[str, str]:
    """Run the ETL expecting it to fail; return (report line, full exception text)."""
    from pipelines import jobs

    texts = []
    original = jobs.report

    def report(running, started):
        exc = running.query.exception()
        texts.append("" if exc is None else str(exc))
        return original(running, started)

    jobs.report = report
    try:
        rep = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
    finally:
        jobs.report = original
    assert rep.error is not None, f"the run should have failed: {rep.line()}"
    return rep.line(), texts[0]


def _tmpfs(mountpoint: Path, size: str) -> bool:
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class DiskFiller:
    """Fills a file system to the last byte at a chosen moment (as another process writing a
    big file would), and frees it again."""

    def __init__(self, mountpoint: Path) -> None:
        self.path = mountpoint / "filler.bin"

    def fill(self) -> None:
        st = os.statvfs(self.path.parent)
        with open(self.path, "ab") as handle:
            try:
                os.posix_fallocate(handle.fileno(), self.path.stat().st_size, st.f_bavail * st.f_frsize)
            except OSError:
                pass
            try:  # whatever fallocate left, byte by page
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
            except OSError:
                pass

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


def test_full_disk_fails_clearly_commits_nothing_partial_and_resumes(spark, two_files, tmp_path, monkeypatch):
    """The disk fills up in the middle of an ETL batch, twice: first right before silver_dns's
    Parquet write, then (on the replay) between silver_conn's Parquet write and its delta-rs
    commit. Each time the run fails with ENOSPC, no table gets a partial commit, and after the
    space is freed the stream resumes exactly once."""
    from pipelines.lake.sink import DeltaSink

    eve, reference = two_files
    disk = tmp_path / "disk"
    if not _tmpfs(disk, "64m"):
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN); "
                    "test_unwritable_table_... covers the write-failure path")
    filler = DiskFiller(disk)
    try:
        home = Home.resolve(disk / "home").create()
        deliver(eve[0], home.landing, "suricata")
        first = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
        assert first.error is None, first.line()
        deliver(eve[1], home.landing, "suricata")
        write_batch, commit = DeltaSink.write_batch, DeltaSink._commit
        phases = [("before silver_dns's Parquet write", "write_batch", "silver_dns"),
                  ("between silver_conn's Parquet write and its commit", "_commit", "silver_conn")]
        for label, method, table in phases:
            def hook(self, *args, _method=method, _table=table, **kwargs):
                if self.name == _table:
                    filler.fill()
                return (write_batch if _method == "write_batch" else commit)(self, *args, **kwargs)
            monkeypatch.setattr(DeltaSink, method, hook)
            before = _snapshot(home)
            try:
                line, text = _run_failing(spark, home)
            finally:
                monkeypatch.undo()
                filler.free()
            assert "No space left on device" in text or "os error 28" in text, text[-2000:]
            after = _snapshot(home)
            _check_no_partial_commit(before, after, failed_table=table)
            staging, orphans = leftovers(home.table(table))
            print(f"\ndisk full {label}: {line}\n  committed before the failure: "
                  f"{sorted(n for n in before if after[n] != before[n])}; {table}: version unchanged, "
                  f"{len(staging)} staging folder(s), {len(orphans)} unreferenced file(s) left")
        # Space is back: the replay commits what is missing, exactly once.
        again = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
        assert again.error is None, again.line()
        checked = compare_with_reference(home, reference)
        print(f"  after freeing space: {again.line()}; rows checked {checked}")
    finally:
        filler.free()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _make_unwritable(path: Path) -> tuple[str, callable]:
    """Make a folder refuse new entries, also for root: chattr +i when root, chmod 0555 otherwise."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"running as root and chattr +i failed ({done.stderr.strip()}): no way to block writes")
        return "chattr +i", lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    mode = path.stat().st_mode
    path.chmod(0o555)
    return "chmod 0555", lambda: path.chmod(mode)


def test_unwritable_table_fails_clearly_commits_nothing_partial_and_resumes(spark, two_files, tmp_path):
    eve, reference = two_files
    home = Home.resolve(tmp_path / "home").create()
    deliver(eve[0], home.landing, "suricata")
    first = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
    assert first.error is None, first.line()
    before = _snapshot(home)
    deliver(eve[1], home.landing, "suricata")
    target = home.table("silver_dns")
    how, undo = _make_unwritable(target)
    try:
        with pytest.raises(OSError):
            (target / "probe").mkdir()  # the method really blocks writes here
        line, text = _run_failing(spark, home)
    finally:
        undo()
    # Hadoop's local file system reports a refused mkdir as "Mkdirs failed to create <path>".
    causes = ("Mkdirs failed", "Permission denied", "Operation not permitted")
    assert str(target) in text and any(c in text for c in causes), text[-2000:]
    after = _snapshot(home)
    _check_no_partial_commit(before, after, failed_table="silver_dns")
    print(f"\nunwritable silver_dns ({how}): {line}")
    again = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
    assert again.error is None, again.line()
    checked = compare_with_reference(home, reference)
    print(f"  after the fix: {again.line()}; rows checked {checked}")


def test_failed_run_names_its_cause(spark, two_files, tmp_path):
    eve, _ = two_files
    home = Home.resolve(tmp_path / "home").create()
    deliver(eve[0], home.landing, "suricata")
    home.tables.mkdir(parents=True, exist_ok=True)
    (home.tables / "quarantine").mkdir()
    how, undo = _make_unwritable(home.tables / "quarantine")
    try:
        line, _ = _run_failing(spark, home)
    finally:
        undo()
    causes = ("Mkdirs failed", "Permission denied", "Operation not permitted")
    assert "quarantine" in line and any(c in line for c in causes), line
