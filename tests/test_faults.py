"""Fault injection: malformed input, a file deleted while read, a full disk, an unwritable table,
bad rules; and the helpers of the SIGKILL tests (tests/test_sigkill.py, test_s3.py, test_kafka.py).

Run with `pytest -m faults` (23.5 minutes on 2 workers in CI, this file on one of them). Every
check compares against the generator's manifest and against a clean reference run over the same
files, and reads the Delta tables with delta-rs (not with seclake's own read path), so a bug in
the product's read path cannot hide a bug in its write path.

Knob (environment): SECLAKE_FAULT_SEED (default 20261120).
"""
from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from deltalake import DeltaTable

from pipelines import etl
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake
from pipelines.objectstore.path import ObjectPath, storage_options
from pipelines.rules.tables import PLATFORM_RULE_PREFIX, RULE_DISABLED_ID
from pipelines.settings import Settings
from sample_data.generator import generate

# Each fault test runs a stream for minutes; a larger per-test limit than the suite default (900 s).
pytestmark = [pytest.mark.faults, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
# The SIGKILL tests' stream and drain (here and tests/test_s3.py). The ETL takes one file per source
# per batch, so after a kill that left files waiting, Suricata's hourly EVE files run hours ahead
# of Zeek's three files an hour, and Zeek's DHCP would come later than a 5-minute lease watermark:
# dropped and counted as late (streaming semantics, not a loss), leases and alerts then differing
# from the run-once reference. The same for the DHCP clock: Zeek's conn file of an hour can move it
# before that hour's DHCP file is read. Watermarks of 3 hours (the inputs are 3 and 6 hours) keep
# every row on time while pieces and alerts still commit during the kills.
KILL_WATERMARKS = ("--set", "lease_watermark=3 hours", "--set", "event_watermark=3 hours",
                   "--set", "dhcp_log_delay=3 hours")
SEED = int(os.environ.get("SECLAKE_FAULT_SEED", "20261120"))
PARQUET_MAGIC = b"PAR1"
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


def commit_files(path: Path) -> int:
    """Commit files in a table's log (a cheap listing). delta-spark creates `_delta_log` before
    it writes the first commit, so the folder alone does not make a table."""
    if isinstance(path, ObjectPath):
        return sum(1 for _ in (path / "_delta_log").glob("*.json"))
    try:
        return sum(1 for f in os.scandir(path / "_delta_log")
                   if f.name.endswith(".json") and not f.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return 0


def committed(path: Path) -> bool:
    """True once the table has its first commit."""
    return commit_files(path) > 0


def assert_nothing_late(home: Home) -> None:
    """No row came later than a watermark: otherwise a comparison with a clean run is void."""
    late_table = home.table("late_events")
    late = read_columns(late_table, ["query", "late_rows"]) if committed(late_table) else {}
    assert not any(late.get("late_rows", [])), f"rows came later than the watermarks, the comparison is void: {late}"


def tables_in(home: Home) -> list[str]:
    if not home.tables.is_dir():
        return []
    return sorted(p.name for p in home.tables.iterdir() if committed(p))


def delta(path: Path) -> DeltaTable:
    """delta-rs's view of a table, local or on the S3 server (tests/test_s3.py reuses these checks)."""
    return DeltaTable(str(path), storage_options=storage_options() if isinstance(path, ObjectPath) else None)


def version(path: Path) -> int | None:
    return delta(path).version() if committed(path) else None


def read_columns(path: Path, columns: list[str]) -> dict[str, list]:
    """Columns of the latest snapshot, read with delta-rs/pyarrow."""
    table = delta(path)
    present = [c for c in columns if c in table.schema().to_arrow().names]
    return table.to_pyarrow_table(columns=present).to_pydict()


def row_keys(path: Path, name: str) -> collections.Counter:
    """The multiset of each row's identity: event_id for silver/enriched, (file name, line) for
    bronze and quarantine (the home folder differs between runs), alert_id for alerts (the
    detections: platform alerts, `seclake.*`, are notices about one run, e.g. a rule's late rows),
    the whole row otherwise."""
    schema_names = delta(path).schema().to_arrow().names
    if name.startswith(("bronze_", "quarantine")):
        cols = read_columns(path, ["file", "line_number"])
        # A Kafka message's file is its topic and partition (kafka://zeek.dns/0): kept whole.
        files = (f if f.startswith("kafka://") else f.rsplit("/", 1)[-1] for f in cols["file"])
        return collections.Counter(zip(files, cols["line_number"]))
    if {"alert_id", "rule_id"} <= set(schema_names):
        cols = read_columns(path, ["alert_id", "rule_id"])
        return collections.Counter(a for a, r in zip(cols["alert_id"], cols["rule_id"])
                                   if not (r or "").startswith(PLATFORM_RULE_PREFIX))
    if "alert_id" in schema_names:
        return collections.Counter(read_columns(path, ["alert_id"])["alert_id"])
    if "event_id" in schema_names:
        return collections.Counter(read_columns(path, ["event_id"])["event_id"])
    table = delta(path).to_pyarrow_table()
    return collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def duplicates(keys: collections.Counter) -> list:
    return [k for k, n in keys.items() if n > 1]


def assert_no_duplicates(home: Home, when: str) -> None:
    """No table of `home` shows a row twice (by its key, `row_keys`); `when` names the moment."""
    for name in tables_in(home):
        dups = duplicates(row_keys(home.table(name), name))
        assert not dups, f"{when}: {name} has duplicated rows {dups[:3]}"


def kill_group(proc: subprocess.Popen, log: Path | None = None) -> None:
    """SIGKILL `proc`'s process group (a `seclake stream`: the Python driver and its JVM) unless it
    has ended. With `log`, the kill is the test's fault: the stream must still be running then."""
    if log is not None:
        assert proc.poll() is None, f"seclake stream exited by itself:\n{log.read_text(errors='replace')[-3000:]}"
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def table_files(path: Path) -> set[str]:
    """The Parquet data files on disk in a table folder (its partition folders, or the folder
    itself when unpartitioned), relative to it; not the log's checkpoints, not hidden files."""
    on_disk = set()
    for p in path.rglob("*.parquet"):
        rel = p.relative_to(path)
        if any(part.startswith(("_", ".")) for part in rel.parts):
            continue
        on_disk.add(os.path.normpath(str(rel)))
    return on_disk


def referenced(path: Path) -> set[str]:
    """The data files the table's latest version references (its add actions, read with delta-rs)."""
    if not committed(path):
        return set()
    adds = DeltaTable(str(path)).get_add_actions(flatten=True).column("path").to_pylist()
    return {os.path.normpath(unquote(p)) for p in adds}


def leftovers(path: Path) -> set[str]:
    """Parquet files in a table's partition folders that no commit references: delta-spark writes
    a batch's files straight into the partitions, then commits; a crash or a failed commit in
    between leaves them (readers never see them, VACUUM removes them)."""
    return table_files(path) - referenced(path)


def complete(file: Path) -> bool:
    """True when `file` is a whole Parquet file (magic at both ends): its writer closed it. A
    file a task is still writing (or was killed writing) has no footer yet."""
    try:
        with open(file, "rb") as handle:
            head = handle.read(4)
            if handle.seek(0, os.SEEK_END) < 12:
                return False
            handle.seek(-4, os.SEEK_END)
            return head == PARQUET_MAGIC and handle.read(4) == PARQUET_MAGIC
    except FileNotFoundError:
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
        got = row_keys(run.table(name), name) if committed(run.table(name)) else collections.Counter()
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


def wait_for_commit(home: Home, before: dict[str, int], proc: subprocess.Popen, timeout: float = 240,
                    poll_s: float = 0.3) -> float:
    """Poll until a table of `before` (its name -> its commit files then) has a commit more, `proc`
    exits or `timeout` passes; the seconds waited. A lake on object storage too."""
    started = time.monotonic()
    while (time.monotonic() - started < timeout and proc.poll() is None
           and all(commit_files(home.table(t)) <= n for t, n in before.items())):
        time.sleep(poll_s)
    return time.monotonic() - started


def wait_to_kill(mode: str, proc: subprocess.Popen, log: Path, home: Home, before: dict[str, int],
                 rng: random.Random, *, up_line: str, after_up_s: tuple[float, float]) -> None:
    """Wait for the moment `mode` names to SIGKILL a `seclake stream` just started: "from start",
    5-20 s after the launch (JVM start, queries resuming); else once `up_line` is in its `log`:
    "after Spark up", `after_up_s` seconds later, or any other mode 0-3 s after a commit of one of
    `before`'s tables (so every cycle of kills makes progress)."""
    if mode == "from start":
        time.sleep(rng.uniform(5, 20))
        return
    up = _wait_for_line(log, up_line, proc, timeout=300)
    assert up is not None, f"seclake stream did not come up:\n{log.read_text(errors='replace')[-3000:]}"
    if mode == "after Spark up":
        time.sleep(rng.uniform(*after_up_s))
        return
    wait_for_commit(home, before, proc)
    time.sleep(rng.uniform(0, 3))


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

    eve_file = next((gen / "landing" / "suricata").glob("eve.*.json"))
    eve_src = [line for line in eve_file.read_bytes().split(b"\n") if line]
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
    dns_file = next((gen / "json" / "landing" / "zeek").glob("dns.*.log"))
    dns_json = [line for line in dns_file.read_bytes().split(b"\n") if line]
    zj = json.loads(dns_json[0])
    zeek_json_body = [(dns_json[0], "good"), (dns_json[1][:25], "bad"),
                      (json.dumps(dict(zj, ts="yesterday", **{"id.orig_p": "x"})).encode(), None),
                      (dns_json[2][:20] + b"\xff" + dns_json[2][20:], "bad"),
                      (json.dumps(dict(zj, query="q" * HUGE)).encode(), None)]
    (landing / "zeek" / "dns.hostile-json.log").write_bytes(b"\n".join(line for line, _ in zeek_json_body) + b"\n")
    corpus["dns.hostile-json.log"] = {
        "sensor": "zeek", "good": [1 + i for i, (_, k) in enumerate(zeek_json_body) if k == "good"],
        "bad": [1 + i for i, (_, k) in enumerate(zeek_json_body) if k == "bad"]}
    headers_only = (b"\n".join(header).replace(b"#path\tconn", b"#path\tdns")
                    + b"\n#close\t2026-11-20-01-00-00\n")
    for name, sensor, data in [("conn.empty.log", "zeek", b""), ("eve.empty.json", "suricata", b""),
                               ("dns.headers-only.log", "zeek", headers_only),
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
        assert parsed_ok[name] + quarantined == lines, \
            f"{name}: {parsed_ok[name]} good + {quarantined} quarantined != {lines}"
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
    _, _, victim, first = _deleted_file_run(spark, generated, tmp_path, monkeypatch)
    assert not victim.exists(), "the file was never deleted: the batch the fault waits for did not come"
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
    from pipelines import stages

    texts = []
    original = stages.report

    def report(running, started):
        exc = running.query.exception()
        texts.append("" if exc is None else str(exc))
        return original(running, started)

    stages.report = report
    try:
        rep = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
    finally:
        stages.report = original
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

    def __init__(self, mountpoint: Path, name: str = "filler.bin") -> None:
        self.path = mountpoint / name

    def fill(self) -> None:
        """Never raises ENOSPC itself: the failure under test must be the pipeline's own."""
        st = os.statvfs(self.path.parent)
        # Unbuffered: a buffered file would retry its last write on close and raise ENOSPC here.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, st.f_bavail * st.f_frsize)
            except OSError:
                pass
            for chunk in (b"\0" * 4096, b"\0"):  # whatever fallocate left: by page, then by byte
                try:
                    while os.write(fd, chunk):
                        pass
                except OSError:
                    pass
        finally:
            os.close(fd)

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


def _tmpfs_over(folder: Path, size: str) -> bool:
    """Mount a small tmpfs on an existing folder, keeping its contents (copied in)."""
    saved = folder.with_name(folder.name + ".saved")
    shutil.copytree(folder, saved)
    if not _tmpfs(folder, size):
        shutil.rmtree(saved)
        return False
    shutil.copytree(saved, folder, dirs_exist_ok=True)
    shutil.rmtree(saved)
    return True


def test_full_disk_fails_clearly_commits_nothing_partial_and_resumes(spark, two_files, tmp_path, monkeypatch):
    """The disk fills up in the middle of an ETL batch, twice: first right before silver_dns's
    Parquet write, then (on the replay) where silver_conn's Parquet write succeeds and its Delta
    commit does not. Each time the run fails with ENOSPC, no table gets a partial commit, and
    after the space is freed the stream resumes exactly once.

    delta-spark writes and commits inside one `save()`, so nothing in Python runs between the two.
    For the second point, silver_conn's `_delta_log` is a file system of its own (a second small
    tmpfs), filled before the batch: the Parquet files go to the home's disk, which has room,
    and the commit (Delta writes nothing to the log before it) is the first write that hits the
    full one."""
    from pipelines.lake.sink import DeltaSink

    eve, reference = two_files
    disk = tmp_path / "disk"
    if not _tmpfs(disk, "64m"):
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN); "
                    "test_unwritable_table_... covers the write-failure path")
    mounts = [disk]
    filler = DiskFiller(disk)
    try:
        home = Home.resolve(disk / "home").create()
        deliver(eve[0], home.landing, "suricata")
        first = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
        assert first.error is None, first.line()
        conn_log = home.table("silver_conn") / "_delta_log"
        assert committed(home.table("silver_conn")) and _tmpfs_over(conn_log, "4m"), "second tmpfs"
        mounts.insert(0, conn_log)
        log_filler = DiskFiller(conn_log, ".filler.bin")  # a hidden name: Delta's log listing skips it
        deliver(eve[1], home.landing, "suricata")
        write_batch = DeltaSink.write_batch
        phases = [("before silver_dns's Parquet write", filler, "silver_dns"),
                  ("between silver_conn's Parquet write and its commit", log_filler, "silver_conn")]
        for label, which, table in phases:
            def hook(self, *args, _which=which, _table=table, **kwargs):
                if self.name == _table:
                    _which.fill()
                return write_batch(self, *args, **kwargs)
            monkeypatch.setattr(DeltaSink, "write_batch", hook)
            before = _snapshot(home)
            orphans_before = leftovers(home.table(table))
            try:
                line, text = _run_failing(spark, home)
            finally:
                monkeypatch.undo()
                which.free()
            assert "No space left on device" in text, text[-2000:]
            assert "in fill" not in text, "the filler failed, not the pipeline: " + text[-2000:]
            after = _snapshot(home)
            _check_no_partial_commit(before, after, failed_table=table)
            orphans = leftovers(home.table(table)) - orphans_before
            if which is log_filler:
                # The fault really came between the two steps: the batch's files were written.
                assert orphans and all(complete(home.table(table) / f) for f in orphans), orphans
            print(f"\ndisk full {label}: {line}\n  committed before the failure: "
                  f"{sorted(n for n in before if after[n] != before[n])}; {table}: version unchanged, "
                  f"{len(orphans)} unreferenced file(s) left")
        # Space is back: the replay commits what is missing, exactly once.
        again = run_once(spark, Lake(home), Settings(), only=[etl.QUERY_NAME])[0]
        assert again.error is None, again.line()
        checked = compare_with_reference(home, reference)
        print(f"  after freeing space: {again.line()}; rows checked {checked}")
    finally:
        filler.free()
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _make_unwritable(path: Path) -> tuple[str, callable]:
    """Make a folder and every folder under it refuse new entries, also for root: chattr +i when
    root, chmod 0555 otherwise. (delta-spark writes into the existing partition folders and
    `_delta_log`, so blocking the table folder alone would block nothing.)"""
    folders = [path, *sorted(p for p in path.rglob("*") if p.is_dir())]
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", *map(str, folders)], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["chattr", "-i", *map(str, folders)], capture_output=True)
            pytest.skip(f"running as root and chattr +i failed ({done.stderr.strip()}): no way to block writes")
        return "chattr +i", lambda: subprocess.run(["chattr", "-i", *map(str, folders)], check=True)
    modes = {f: f.stat().st_mode for f in folders}
    for f in folders:
        f.chmod(0o555)

    def undo():
        for f, mode in modes.items():
            f.chmod(mode)
    return "chmod 0555", undo


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
        for folder in (target, target / "_delta_log", *target.glob("event_date=*")):
            with pytest.raises(OSError):
                (folder / "probe").mkdir()  # the method really blocks writes here
        line, text = _run_failing(spark, home)
    finally:
        undo()
    # Hadoop's local file system reports a refused mkdir as "Mkdirs failed to create <path>", a
    # refused file in an existing partition folder with the OS's reason.
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
    # delta-spark cannot create the table's log: "[DELTA_CANNOT_CREATE_LOG_PATH] Cannot create <path>/_delta_log".
    causes = ("Mkdirs failed", "Permission denied", "Operation not permitted", "Cannot create")
    assert "quarantine" in line and any(c in line for c in causes), line


# ---- broken and hostile rules next to the rule pack (issue 22) --------------------------------

# Valid under the static limits (sequence() bounded by size(<array>)), but per hour of DNS it
# builds n x n strings of all n query names: with ~1,800 names, terabytes.
HEAP_BOMB = """/*
id: 7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f
name: Heap bomb (test)
version: 1
severity: low
mitre: [T1071]
description: >
  Joins all query names of an hour into one string, n x n times.
false_positives:
  - none
tables: [enriched_dns]
event_time: event_time
window: 1 hour
keys: []
emit: crossed
*/
WITH per_hour AS (
    SELECT max(src_ip) AS src_ip, window(event_time, '1 hour') AS w, collect_list(query) AS qs,
           min(event_time) AS first_seen, max(event_time) AS last_seen
    FROM enriched_dns
    GROUP BY (window(event_time, '1 hour'))
)
SELECT src_ip, NULL AS mac, NULL AS device, NULL AS owner, w.start AS window_start, w.end AS window_end,
       first_seen, last_seen, 'x' AS evidence
FROM per_hour
WHERE length(array_join(transform(sequence(1, size(qs)),
                                  i -> array_join(transform(sequence(1, size(qs)), j -> array_join(qs, ',')), ',')),
                        ',')) > 0
"""


def _bad_rules(folder: Path) -> dict[str, str]:
    """The rule pack plus six bad rules in `folder`; bad rule slug -> what must happen to it.

    Three are refused before they run (the issue's memory bomb, catastrophic regex and join
    without an equality); three pass validation and fail at run time: a CAST that fails on real
    data, a batch far over its time budget, and a memory blow-up that depends on the data (the
    square of an hour's query names, joined per name: the JVM dies of OutOfMemoryError).
    """
    shutil.copytree(REPO / "rules", folder)
    dga = (REPO / "rules" / "dns" / "dga_nxdomain_burst.sql").read_text()
    bad = folder / "bad"
    bad.mkdir()

    def variant(slug: str, old: str, new: str, **meta: str) -> None:
        text = dga.replace("f6097087-51a0-4890-829e-23f828e73b08", str(uuid.uuid5(uuid.NAMESPACE_URL, slug)))
        for key, value in meta.items():
            text = re.sub(rf"(?m)^{key}: .*$", f"{key}: {value}", text)
        assert old in text, old
        (bad / f"{slug}.sql").write_text(text.replace(old, new))

    variant("memory_bomb", "AND query LIKE '%.%'", "AND size(sequence(1, 2000000000)) > 0")
    variant("regex_bomb", "AND query LIKE '%.%'", "AND query RLIKE '(a+)+$'")
    variant("cross_join", "    FROM enriched_dns\n    WHERE rcode_name",
            "    FROM enriched_dns JOIN (SELECT event_time AS t FROM enriched_conn) c\n"
            "      ON enriched_dns.event_time > c.t\n    WHERE rcode_name")
    variant("casts_names", "WHERE rcode_name = 'NXDOMAIN'", "WHERE CAST(query AS INT) > 0 AND rcode_name = 'NXDOMAIN'")
    variant("slow_hashing", "WHERE rcode_name = 'NXDOMAIN'",
            "WHERE aggregate(sequence(1, 1000), 0L, (acc, x) -> acc + aggregate(sequence(1, 1000), 0L,\n"
            "          (a, y) -> a + length(sha2(concat(query, x, y), 512)))) > 0\n"
            "      AND rcode_name = 'NXDOMAIN'")
    (bad / "heap_bomb.sql").write_text(HEAP_BOMB)
    return {"memory_bomb": "invalid", "regex_bomb": "invalid", "cross_join": "invalid",
            "casts_names": "CAST_INVALID_INPUT", "slow_hashing": "over its budget", "heap_bomb": "stopped"}


def _rule_states(home: Home) -> dict[str, tuple[str, str]]:
    """rule -> (state, reason) from the newest rule_status row, read with delta-rs."""
    cols = read_columns(home.table("rule_status"), ["rule", "state", "reason", "changed_at"])
    newest: dict[str, tuple] = {}
    for rule, state, reason, at in zip(cols["rule"], cols["state"], cols["reason"], cols["changed_at"]):
        if rule not in newest or at >= newest[rule][2]:
            newest[rule] = (state, reason or "", at)
    return {rule: (state, reason) for rule, (state, reason, _) in newest.items()}


def _rule_alert_ids(home: Home) -> collections.Counter:
    """The alerts of the rule pack's rules. A bad rule may write alerts before it fails (the heap
    bomb's first micro-batch of a stream can be small enough to pass): not the pack's concern."""
    from pipelines.rules.pack import scan_rules

    pack = {rule.id for rule in scan_rules(REPO / "rules").rules}
    cols = read_columns(home.table("alerts"), ["alert_id", "rule_id"])
    return collections.Counter(a for a, r in zip(cols["alert_id"], cols["rule_id"]) if r in pack)


def _check_bad_rules_outcome(home: Home, reference: Home, expected: dict[str, str]) -> None:
    """The bad rules ended as `expected` (invalid, or disabled with that in the reason), every
    other rule is ok, and the rest of the lake equals the reference."""
    states = _rule_states(home)
    for slug, why in expected.items():
        state, reason = states.get(slug, ("-", ""))
        want = "invalid" if why == "invalid" else "disabled"
        assert state == want and (why == "invalid" or why in reason), (slug, state, reason)
    assert all(state == "ok" for slug, (state, _) in states.items() if slug not in expected), states
    platform = read_columns(home.table("alerts"), ["rule_id", "rule_name"])
    disabled = {n.removeprefix("Rule disabled: ") for r, n in zip(platform["rule_id"], platform["rule_name"])
                if r == RULE_DISABLED_ID}
    wanted = {s for s, why in expected.items() if why != "invalid"}
    assert disabled == wanted, disabled
    compare_with_reference(home, reference, exact=(*etl.etl_tables(), "enriched_conn", "enriched_dns",
                                                   "enriched_ids_alerts"))
    assert _rule_alert_ids(home) == _rule_alert_ids(reference)


@pytest.fixture(scope="module")
def one_hour(tmp_path_factory):
    """One hour of 5 devices with every attack scenario (~6k events), and the pack's alerts on it."""
    out = tmp_path_factory.mktemp("bad-rules-gen")
    manifest = generate(out, hours=1, hosts=5, seed=SEED % 1000, start="2026-11-20T00:00:00Z")
    return out, manifest


def _home_with(gen: Path, manifest: dict, root: Path) -> Home:
    home = Home.resolve(root).create()
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    for src, sensor in landing_files(gen, manifest):
        deliver(src, home.landing, sensor)
    return home


# Every rule of the pack takes seconds per batch here; the slow rule would take an hour. While the
# heap bomb fills the heap, the JVM collects garbage for minutes before it dies, and the rules
# beside it in the wave stall too: 3 minutes keeps them inside their budget under CI's load.
BAD_RULE_SETTINGS = ("--set", "rule_retry=5 seconds", "--set", "rule_batch_budget=3 minutes")


def bad_rules_env(rules: Path) -> dict[str, str]:
    """The environment of a run beside the bad rules in `rules`. (Not a smaller heap to make the
    heap bomb die sooner: with 2 GB, under CI's load, the JVM spent minutes collecting garbage
    before it died, and three innocent rules of the wave ran over their batch budget meanwhile.)"""
    return {**os.environ, "SECLAKE_RULES": str(rules)}


@pytest.fixture(scope="module")
def bad_rules_reference(spark, one_hour, tmp_path_factory) -> Home:
    """`one_hour` through the whole pipeline with the rule pack alone: what the rest of a lake
    beside bad rules must equal."""
    gen, manifest = one_hour
    reference = _home_with(gen, manifest, tmp_path_factory.mktemp("bad-rules-reference"))
    assert not any(r.error for r in run_once(spark, Lake(reference), Settings()))
    assert _rule_alert_ids(reference), "the pack raised no alert: the comparison would be vacuous"
    return reference


# The two bad-rules tests are classes of their own so that `--dist loadscope` (CI) can give each
# its own worker: together they take a third of the fault suite.
class TestBadRulesInRunOnce:
    def test_bad_rules_end_disabled_and_the_others_lose_nothing(self, one_hour, bad_rules_reference, tmp_path):
        gen, manifest = one_hour
        env = bad_rules_env(tmp_path / "rules")
        expected = _bad_rules(tmp_path / "rules")
        # The heap bomb kills the application (exit 2, one line) in the rules' wave; the next
        # run-once charges the rules it left in a batch as suspects and probes each alone, where the
        # heap bomb kills it again; the run after charges it in full. One failure disables
        # (rule_max_failures=1), so three runs settle everything (two if it was alone in a batch when it died).
        home = _home_with(gen, manifest, tmp_path / "run-once")
        runs = []
        for attempt in range(3):
            # Once the heap bomb has died in a wave, the later runs probe it alone or leave it out
            # (disabled), so no garbage-collecting neighbour stalls a batch there. The pack's rules
            # take 11-21 s each alone, but beside the slow rule on 2 cores shared with another test
            # worker, three of them ran past 90 s in both CIs of 2026-12-06 (disabled with it); 150 s
            # still stops the slow rule (3 minutes alone) and costs 150 s instead of 3 minutes.
            budget = () if attempt == 0 else ("--set", "rule_batch_budget=150 seconds")
            done = subprocess.run(seclake("run-once", "--home", str(home.root), *BAD_RULE_SETTINGS, *budget,
                                          "--set", "rule_max_failures=1"),
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
            runs.append(done)
            if done.returncode != 2:
                break
        assert runs[0].returncode == 2 and "the Spark application stopped during stage" in runs[0].stderr, \
            runs[0].stderr[-3000:]
        assert "rule_heap_bomb" in runs[0].stderr.split("stopped during", 1)[1].splitlines()[0], runs[0].stderr[-3000:]
        # The JVM names its death in one line (-XX:+ExitOnOutOfMemoryError, pipelines/spark.py), with
        # no stack trace of Spark's shutdown nor traceback of the Python side's lost connection around it.
        said = runs[0].stdout + runs[0].stderr
        assert "Terminating due to java.lang.OutOfMemoryError" in said, said[-3000:]
        assert "Traceback" not in said and "RpcEnvStoppedException" not in said, said[-3000:]
        assert runs[-1].returncode == 1, runs[-1].stdout[-3000:] + runs[-1].stderr[-3000:]  # invalid files: exit 1
        _check_bad_rules_outcome(home, bad_rules_reference, expected)


class TestBadRulesInAStream:
    def test_bad_rules_end_disabled_and_the_others_lose_nothing(self, one_hour, bad_rules_reference, tmp_path):
        # The rules run in their own application; its deaths never stop the ETL, rules charged
        # with a death are probed one at a time, so only the heap bomb reaches 2 in a row. (The
        # batch budget is run-once's part: the slow rule sits this one out.)
        # A stream never closes the last windows of a bounded input (watermarks), so once the bad
        # rules have ended, a run-once drains the rest, as after the SIGKILL test, and the whole
        # lake must equal the clean reference.
        gen, manifest = one_hour
        env = bad_rules_env(tmp_path / "rules")
        expected = _bad_rules(tmp_path / "rules")
        (tmp_path / "rules" / "bad" / "slow_hashing.sql").unlink()
        del expected["slow_hashing"]
        home = _home_with(gen, manifest, tmp_path / "stream")
        log = tmp_path / "stream.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(seclake("stream", "--home", str(home.root), *BAD_RULE_SETTINGS,
                                            "--set", "rule_max_failures=2", "--set", "trigger_interval=2 seconds"),
                                    cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        silver_dns = manifest_silver(manifest)["silver_dns"]

        def settled() -> bool:
            try:
                states = _rule_states(home)
                ingested = sum(row_keys(home.table("silver_dns"), "silver_dns").values()) == silver_dns
            except Exception:  # a table not written yet
                return False
            ended = all(states.get(s, ("",))[0] == ("invalid" if why == "invalid" else "disabled")
                        for s, why in expected.items())
            # Innocent rules charged with a death are cleared by their probe or their next batch (the drain's).
            return ended and ingested and all(state != "disabled" for s, (state, _) in states.items()
                                              if s not in expected)

        try:
            deadline = time.monotonic() + 1200
            while not settled():
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(5)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=180) == 0, log.read_text(errors="replace")[-3000:]
        finally:
            kill_group(proc)
        text = log.read_text(errors="replace")
        assert "the rules application stopped" in text and "heap_bomb" in text, text[-3000:]
        drained = subprocess.run(seclake("run-once", "--home", str(home.root), *BAD_RULE_SETTINGS),
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
        assert drained.returncode == 1, drained.stdout[-3000:] + drained.stderr[-3000:]  # the invalid files
        # Exact, with the stream part too: a rule holds its watermark to what attribution has written
        # (pipelines/attribution.py, held_to_attribution), so a backlog caught up loses no alert.
        _check_bad_rules_outcome(home, bad_rules_reference, expected)
