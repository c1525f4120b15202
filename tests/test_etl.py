"""Streaming ETL end to end: landing files -> bronze, quarantine, silver; nothing lost, nothing doubled."""
from __future__ import annotations

import gzip
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import etl
from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.log import commits
from pipelines.lake.registry import Lake
from pipelines.settings import Settings

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "sample"
SILVER_FEEDS = {  # silver table -> (sensor, kind) counts from the generator's manifest
    "silver_dns": [("zeek", "dns"), ("suricata", "dns")],
    "silver_dhcp": [("zeek", "dhcp"), ("suricata", "dhcp")],
    "silver_conn": [("zeek", "conn"), ("suricata", "flow")],
    "silver_ids_alerts": [("suricata", "alert")],
}


def _count(spark, lake: Lake, name: str) -> int:
    return lake.read(spark, name).count()


@pytest.fixture(scope="module")
def sample_run(spark, tmp_path_factory):
    """The committed generator sample, run once through the ETL."""
    home = Home.resolve(tmp_path_factory.mktemp("etl") / "home")
    shutil.copytree(SAMPLE, home.root)
    lake = Lake(home.create())
    # 2 MB per sensor folder and micro-batch: the six Zeek files (1.1 MB) and the first EVE file
    # (1.6 MB) go in one, the second EVE file (3.4 MB, over the cap on its own) alone in the next.
    reports = run_once(spark, lake, Settings(max_bytes_per_trigger=2_000_000), only=["etl"])
    return lake, reports, json.loads((home.root / "manifest.json").read_text())


def test_silver_counts_equal_generated_events(spark, sample_run):
    lake, reports, manifest = sample_run
    assert reports[0].error is None
    for table, feeds in SILVER_FEEDS.items():
        expected = sum(manifest["events"][sensor][kind] for sensor, kind in feeds)
        assert _count(spark, lake, table) == expected, table
    # Every event id is unique within its table: duplicated sensor lines were dropped.
    dns = lake.read(spark, "silver_dns")
    assert dns.select("event_id").distinct().count() == dns.count()


def test_quarantine_holds_exactly_the_malformed_lines(spark, sample_run):
    lake, _, manifest = sample_run
    malformed = manifest["totals"]["malformed"]
    quarantine = lake.read(spark, "quarantine")
    assert quarantine.count() == malformed
    assert quarantine.where("reason IS NULL OR raw IS NULL OR file IS NULL OR line_number IS NULL").count() == 0
    # good + quarantined = lines read: bronze keeps every data line.
    lines = sum(n for sensor in manifest["lines"].values() for n in sensor.values())
    bronze = sum(_count(spark, lake, f"bronze_{s}") for s in ("zeek", "suricata"))
    assert bronze == lines
    assert lake.read(spark, "bronze_zeek").where("NOT parse_ok").count() + \
        lake.read(spark, "bronze_suricata").where("NOT parse_ok").count() == malformed


def test_progress_is_reported(sample_run):
    _, reports, manifest = sample_run
    etl = reports[0]
    assert etl.batches == 2  # the byte cap (sample_run): a file over it is read, alone
    # Files and data lines are counted as what they are (Spark's numInputRows counts each whole
    # file once per source branch that scans it).
    lines = sum(n for sensor in manifest["lines"].values() for n in sensor.values())
    assert etl.read == {"files": manifest["totals"]["files"], "data lines": lines}
    assert etl.rows_out["quarantine"] == manifest["totals"]["malformed"]
    assert "silver_dns" in etl.versions
    assert etl.line().startswith(f"etl: 2 batches, {manifest['totals']['files']} files, {lines:,} data lines in -> ")


def test_rerun_adds_nothing_and_new_files_are_picked_up(spark, sample_run):
    lake, _, manifest = sample_run
    before = {t: _count(spark, lake, t) for t in SILVER_FEEDS}
    again = run_once(spark, lake, Settings(), only=["etl"])[0]
    assert again.skipped and again.batches == 0  # nothing new in landing: not even started
    assert {t: _count(spark, lake, t) for t in SILVER_FEEDS} == before
    # A sensor's temp file is not input (Spark's file source ignores it too).
    (lake.home.landing / "zeek" / ".dns.log.tmp").write_text("partial")
    assert etl.idle(lake, Settings())
    # A file re-shipped under a new name is input; every line a duplicate, it adds no silver row.
    # Its name has a space, which Spark's file log records URI-encoded: once read, it is known.
    src = next((lake.home.landing / "zeek").glob("dns.*.log"))
    shutil.copy(src, src.with_name("dns reshipped.log"))
    assert not etl.idle(lake, Settings())
    assert run_once(spark, lake, Settings(), only=["etl"])[0].batches == 1
    assert _count(spark, lake, "silver_dns") == before["silver_dns"]
    # That batch (id 2) had Zeek DNS lines only: the tables it has no row for got no commit.
    newest = {t: commits(lake.path(t), limit=1)[0]["batch_id"]
              for t in ("bronze_zeek", "bronze_suricata", "silver_conn")}
    assert newest["bronze_zeek"] == 2 and newest["bronze_suricata"] < 2 and newest["silver_conn"] < 2, newest
    assert etl.idle(lake, Settings())


def test_a_batch_is_parsed_once_into_blocks_freed_when_the_batch_ends(spark):
    def stored(rdd_id: int) -> bool:
        return any(info.id() == rdd_id for info in spark.sparkContext._jsc.sc().getRDDStorageInfo())

    frame = spark.range(1000).selectExpr("id", "id % 7 AS k")
    with etl._checkpointed(frame) as batch:
        plan = batch._jdf.queryExecution().logical()
        assert plan.nodeName() == "LogicalRDD" and plan.children().isEmpty()  # frames derive from one node
        assert batch.groupBy("k").count().count() == 7
        rdd = plan.rdd().id()
        assert stored(rdd)  # computed once, by the first job
        assert batch.where("k = 0").count() == 143
    assert not stored(rdd)


def _data_lines(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return sum(1 for line in lines if not line.startswith(b"#"))


def test_real_logs_lose_no_line(spark, real_logs, tmp_path):
    home = Home.resolve(tmp_path / "home").create()
    placed = {}
    for folder, source in [("zeek-tsv", "zeek"), ("zeek-json", "zeek"), ("zeek-tsv-labeled", "zeek"),
                           ("suricata", "suricata")]:
        for path in sorted((real_logs / folder).iterdir()):
            if path.name.endswith((".log", ".gz", ".labeled", ".json")):
                dest = home.landing / source / f"{folder}-{path.name}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest)
                placed[dest.name] = _data_lines(path)
    lake = Lake(home)
    report = run_once(spark, lake, Settings(), only=["etl"])[0]
    assert report.error is None
    bronze = lake.read(spark, "bronze_zeek").unionByName(lake.read(spark, "bronze_suricata"))
    per_file = {r.file.rsplit("/", 1)[-1]: (r.lines, r.good) for r in bronze.groupBy("file").agg(
        F.count("*").alias("lines"), F.sum(F.col("parse_ok").cast("int")).alias("good")).collect()}
    quarantined = lake.read(spark, "quarantine").groupBy("file").count().collect()
    quarantined = {r.file.rsplit("/", 1)[-1]: r["count"] for r in quarantined}
    for name, expected in placed.items():
        lines, good = per_file[name]
        assert lines == expected, name
        assert good + quarantined.get(name, 0) == expected, name
        print(f"{name}: {good}/{expected} parsed ({100 * good / expected:.1f}%)")


def test_stream_starts_on_a_fresh_home_and_restarts_a_failed_stage(spark, tmp_path, monkeypatch):
    """`seclake stream` on a home that has only landing files: every table is created empty so
    the downstream queries can start, and an ETL batch that fails once (as a Python worker that
    timed out under load would) is retried from the checkpoint: every event arrives once."""
    from pipelines import etl, jobs

    home = Home.resolve(tmp_path / "home")
    landing = home.root / "landing"
    for source in ("zeek", "suricata"):
        (landing / source).mkdir(parents=True)
        first = sorted((SAMPLE / "landing" / source).iterdir())[0]
        shutil.copy(first, landing / source / first.name)
    lake = Lake(home.create())
    expected = sum(_data_lines(path) for source in ("zeek", "suricata") for path in (landing / source).iterdir())
    monkeypatch.setattr(jobs, "RESTART_SECONDS", 1.0)
    calls = []
    original = etl.EtlWriter.__call__

    def fails_once(self, lines, batch_id):
        calls.append(batch_id)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return original(self, lines, batch_id)

    monkeypatch.setattr(etl.EtlWriter, "__call__", fails_once)
    stop = threading.Event()

    def stop_when_done():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not stop.is_set():
            if len(calls) >= 2 and lake.exists("bronze_zeek") and _bronze_lines(spark, lake) >= expected:
                break
            time.sleep(1)
        stop.set()

    watcher = threading.Thread(target=stop_when_done, daemon=True)
    watcher.start()
    reports = {r.name: r for r in jobs.stream(spark, lake, Settings(trigger_interval="1 second"), stop=stop)}
    watcher.join()
    assert set(lake.names()) <= {p.name for p in home.tables.iterdir()}, "every table exists"
    assert calls[:2] == [0, 0], "the failed batch is replayed with the same id"
    assert reports["etl"].error is None, reports["etl"].line()
    assert _bronze_lines(spark, lake) == expected


def _bronze_lines(spark: SparkSession, lake: Lake) -> int:
    return sum(lake.read(spark, f"bronze_{s}").count()
               for s in ("zeek", "suricata"))
