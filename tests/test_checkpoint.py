"""pipelines.checkpoint: a checkpoint's batches read from its files (no Spark); restarts after a kill before batch 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.checkpoint import clear_unstarted, newest, next_watermark_ms, numbered, read_batch
from pipelines.settings import Settings


def checkpoint(root: Path, planned: int, committed: int) -> Path:
    """A checkpoint laid out as Spark writes it: batches 0..planned in offsets/, 0..committed in commits/."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for n in range(planned + 1):
        metadata = f'{{"batchWatermarkMs":{n * 10},"batchTimestampMs":1}}'
        (root / "offsets" / str(n)).write_text(f'v1\n{metadata}\n{{"logOffset":{n}}}\n{{"zeek.dns":{{"0":{n}}}}}')
        (root / "offsets" / f".{n}.crc").write_text("x")
    for n in range(committed + 1):
        (root / "commits" / str(n)).write_text(f'v1\n{{"nextBatchWatermarkMs":{n * 10 + 5}}}')
    return root


def test_newest_planned_and_committed_batches_ignore_crc_files(tmp_path):
    cp = checkpoint(tmp_path / "cp", planned=11, committed=10)
    assert newest(cp) == 11
    assert newest(cp, committed=True) == 10
    assert sorted(numbered(cp / "offsets")) == list(range(12))
    assert newest(tmp_path / "empty") is None and newest(tmp_path / "empty", committed=True) is None


def test_read_batch_gives_metadata_and_offsets_in_plan_order(tmp_path):
    cp = checkpoint(tmp_path / "cp", planned=3, committed=2)
    batch = read_batch(cp, 3)
    assert (batch.number, batch.metadata["batchWatermarkMs"]) == (3, 30)
    assert batch.offsets == [{"logOffset": 3}, {"zeek.dns": {"0": 3}}]
    assert next_watermark_ms(cp, 2) == 25


def test_compacted_logs_are_numbered_by_their_batch(tmp_path):
    folder = tmp_path / "sources" / "0"
    folder.mkdir(parents=True)
    for name in ("8", "9.compact", "10", ".10.crc", "metadata"):
        (folder / name).write_text("v1")
    assert {n: p.name for n, p in numbered(folder).items()} == {8: "8", 9: "9.compact", 10: "10"}


@pytest.mark.parametrize("text", ["v1", 'v1\n{"batchWatermarkMs":0}\nnot json'])
def test_a_damaged_offset_file_is_named(tmp_path, text):
    cp = checkpoint(tmp_path / "cp", planned=0, committed=0)
    (cp / "offsets" / "0").write_text(text)
    with pytest.raises(ValueError, match=r"offsets/0: not a Spark offset log"):
        read_batch(cp, 0)
    with pytest.raises(ValueError, match=r"offsets/7: no such batch"):
        read_batch(cp, 7)


def test_the_etl_is_idle_only_when_a_committed_batch_read_every_landing_file(tmp_path):
    from pipelines import etl
    from pipelines.home import Home
    from pipelines.lake.registry import Lake

    lake = Lake(Home.resolve(tmp_path / "home").create())
    zeek = lake.home.landing / "zeek"
    (zeek / "2026-11-20").mkdir(parents=True)
    first, second = zeek / "dns a.log", zeek / "2026-11-20" / "conn.log"
    for path in (first, second, zeek / ".conn.log.tmp", zeek / "_SUCCESS"):
        path.write_text("x")
    cp = checkpoint(lake.home.checkpoint(etl.QUERY_NAME), planned=1, committed=0)
    (cp / "sources" / "0").mkdir(parents=True)
    # What Spark writes: URIs, a space encoded; batch 1 planned, not committed.
    for batch, path in ((0, first), (1, second)):
        uri = path.as_uri()
        (cp / "sources" / "0" / str(batch)).write_text(f'v1\n{{"path":"{uri}","timestamp":1,"batchId":{batch}}}')
    assert "%20" in first.as_uri()
    assert etl.processed_files(lake) == {str(first)}
    assert not etl.idle(lake, Settings())  # batch 1 may replay: its file is not processed yet
    (cp / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert etl.processed_files(lake) == {str(first), str(second)}
    assert etl.idle(lake, Settings())  # the temp files are not input
    (zeek / "dns b.log").write_text("x")
    assert not etl.idle(lake, Settings())


def test_a_file_of_an_open_batch_is_not_processed_when_its_sources_log_numbers_lag(tmp_path):
    """A file source numbers its own log: batch 1 took EVE alone, so batch 2's Zeek file is Zeek's
    log batch 1. With batch 2 planned, not committed, that file is not processed (retention would
    delete it before a replay of batch 2 reads it), whatever the query's committed batch id."""
    from pipelines import etl
    from pipelines.checkpoint import newest_source_files
    from pipelines.home import Home
    from pipelines.lake.registry import Lake

    lake = Lake(Home.resolve(tmp_path / "home").create())
    zeek_0, eve_0, eve_1, zeek_1 = (lake.home.landing / s / n for s, n in (
        ("zeek", "conn.08.log"), ("suricata", "eve.08.json"), ("suricata", "eve.09.json"), ("zeek", "conn.09.log")))
    cp = lake.home.checkpoint(etl.QUERY_NAME)
    for n, offsets in enumerate(([0, 0], [0, 1], [1, 1])):
        (cp / "offsets").mkdir(parents=True, exist_ok=True)
        (cp / "offsets" / str(n)).write_text("v1\n{}\n" + "\n".join(f'{{"logOffset":{o}}}' for o in offsets))
    for n in (0, 1):
        (cp / "commits").mkdir(exist_ok=True)
        (cp / "commits" / str(n)).write_text("v1\n{}")
    for source, log_batch, path in ((0, 0, zeek_0), (1, 0, eve_0), (1, 1, eve_1), (0, 1, zeek_1)):
        (cp / "sources" / str(source)).mkdir(parents=True, exist_ok=True)
        (cp / "sources" / str(source) / str(log_batch)).write_text(
            f'v1\n{{"path":"{path.as_uri()}","timestamp":1000,"batchId":{log_batch}}}')
    assert set(newest_source_files(cp)) == {zeek_1.as_uri(), eve_1.as_uri()}  # batch 2's file, and EVE's last
    # EVE's last file, committed, may be left out too while batch 2 is open (the log cannot tell).
    assert {str(zeek_0), str(eve_0)} <= etl.processed_files(lake) <= {str(zeek_0), str(eve_0), str(eve_1)}
    (cp / "commits" / "2").write_text("v1\n{}")
    assert etl.processed_files(lake) == {str(p) for p in (zeek_0, eve_0, eve_1, zeek_1)}


def test_leftovers_of_a_kill_before_batch_0_are_cleared_and_nothing_else(tmp_path):
    cp = tmp_path / "cp"
    for folder in ("offsets", "commits", "state"):
        (cp / folder).mkdir(parents=True)
    (cp / "offsets" / ".0.6c1e.tmp").write_text("v1")
    (cp / "offsets" / "..0.6c1e.tmp.crc").write_text("x")
    (cp / "state" / "notes.txt").write_text("someone's file")
    (cp / "metadata").write_text('{"id":"q"}')
    assert clear_unstarted(cp) == ["offsets/..0.6c1e.tmp.crc", "offsets/.0.6c1e.tmp"]
    assert not list((cp / "offsets").iterdir())
    assert (cp / "state" / "notes.txt").exists() and (cp / "metadata").exists()
    # Once a batch is planned the checkpoint is Spark's: nothing is touched.
    started = checkpoint(tmp_path / "started", planned=0, committed=-1)
    (started / "offsets" / ".1.77aa.tmp").write_text("v1")
    assert clear_unstarted(started) == [] and (started / "offsets" / ".1.77aa.tmp").exists()


def test_a_stateful_query_killed_while_planning_batch_0_starts_again(spark, tmp_path):
    from pyspark.sql import functions as F

    from pipelines.query import start_query

    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text(json.dumps({"ts": "2026-11-20T10:00:00Z"}))
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / ".0.9b2f4c.tmp").write_text("v1")  # what a SIGKILL mid-write leaves
    counts = (spark.readStream.schema("ts timestamp").json(str(source))
              .withWatermark("ts", "1 second")
              .groupBy(F.window("ts", "1 second")).count())
    seen: list[int] = []

    def write(frame, batch: int) -> None:
        frame.count()  # a stateful batch commits its state only when its plan runs
        seen.append(batch)

    query = start_query(counts, "killed_before_batch_0", write, cp, {"availableNow": True})
    assert query.awaitTermination(300), "the query did not end"
    assert query.exception() is None and seen[0] == 0
    assert newest(cp, committed=True) is not None


def test_landing_files_changed_after_the_etl_read_them_are_named_and_a_copied_home_is_not(tmp_path):
    import os
    import shutil

    from pipelines import etl
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.operations.relocate import follow_move

    lake = Lake(Home.resolve(tmp_path / "home").create())
    zeek = lake.home.landing / "zeek"
    zeek.mkdir(parents=True)
    kept, appended, replaced = (zeek / name for name in ("conn.log", "dns.log", "dhcp.log"))
    for path in (kept, appended, replaced):
        path.write_text("line 1\n")
        os.utime(path, (1.7e9, 1.7e9))
    cp = checkpoint(lake.home.checkpoint(etl.QUERY_NAME), planned=0, committed=0)
    (cp / "sources" / "0").mkdir(parents=True)
    (cp / "sources" / "0" / "0").write_text("v1\n" + "\n".join(
        f'{{"path":"{p.as_uri()}","timestamp":{int(os.stat(p).st_mtime * 1000)},"batchId":0}}'
        for p in (kept, appended, replaced)))
    assert etl.changed_after_read(lake) == []
    with appended.open("a") as f:
        f.write("line 2\n")
    replaced.unlink()
    replaced.write_text("another hour\n")
    assert etl.changed_after_read(lake) == sorted([str(appended), str(replaced)])
    # A copy of the home (times not kept) reads its own files as they are there now: none changed.
    copy = Lake(Home.resolve(tmp_path / "copy"))
    shutil.copytree(lake.home.root, copy.home.root, copy_function=shutil.copy)
    assert follow_move(copy.home) == 3
    assert etl.changed_after_read(copy) == []
