"""Threat intelligence: feeds parsed, indicators MERGEd, history swept into alerts once."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipelines.home import Home
from pipelines.intel.feeds import parse_feed, read_feed
from pipelines.intel.store import INDICATORS_TABLE, INTEL_RULE_ID, load
from pipelines.lake.registry import Lake

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
EVENT = datetime(2026, 11, 20, 9, 30, tzinfo=timezone.utc)


def _rows(spark, lake: Lake, table: str, values: list[dict]) -> None:
    schema = lake.spec(table).schema
    rows = [{**{f: None for f in schema.fieldNames()}, "event_time": EVENT, "event_date": EVENT.date(), **v}
            for v in values]
    lake.ensure(spark, table)
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path(table)))


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    lake = Lake(Home.resolve(tmp_path / "home").create())
    _rows(spark, lake, "enriched_dns", [
        {"event_id": "d1", "src_ip": "10.0.0.5", "query": "cdn.evil.test", "device": "laptop-5"},
        {"event_id": "d2", "src_ip": "10.0.0.5", "query": "evil.test", "device": "laptop-5"},
        {"event_id": "d3", "src_ip": "10.0.0.6", "query": "notevil.test", "device": "laptop-6"},
    ])
    _rows(spark, lake, "enriched_conn", [
        {"event_id": "c1", "src_ip": "10.0.0.6", "dst_ip": "203.0.113.9", "device": "laptop-6"},
        {"event_id": "c2", "src_ip": "10.0.0.7", "dst_ip": "198.51.100.1"},
    ])
    return lake


def test_feed_formats_of_abuse_ch_and_plain_lists():
    threatfox = ('################\n# ThreatFox IOCs\n################\n'
                 '# "first_seen_utc","ioc_id","ioc_value","ioc_type","threat_type"\n'
                 '"2026-11-01 10:00:00", "1", "evil.test", "domain", "botnet_cc"\n'
                 '"2026-11-01 10:00:00", "2", "203.0.113.9:443", "ip:port", "botnet_cc"\n')
    assert parse_feed(threatfox).indicators == [("domain", "evil.test"), ("ip", "203.0.113.9")]
    urlhaus = '# id,dateadded,url,url_status\n"1","2026-11-01","http://Bad.Example.org/x.exe","online"\n'
    assert parse_feed(urlhaus).indicators == [("domain", "bad.example.org")]
    plain = parse_feed("evil.test\nevil.test\n2001:db8::1 # v6\n???\n")
    assert plain.indicators == [("domain", "evil.test"), ("ip", "2001:db8::1")] and plain.skipped == ["???"]


def test_a_file_without_indicators_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="missing.txt does not exist"):
        read_feed(tmp_path / "missing.txt")
    (tmp_path / "junk.txt").write_text("# nothing\nnot one\n")
    with pytest.raises(ValueError, match=r"junk.txt: no IP address or domain found \(1 line"):
        read_feed(tmp_path / "junk.txt")


def test_load_merges_indicators_and_sweeps_each_match_once(spark, lake, tmp_path):
    feed = tmp_path / "feed.txt"
    feed.write_text("evil.test\n203.0.113.9\n")
    first = load(spark, lake, feed, now=NOW)
    assert (first.indicators, first.skipped, first.alerts) == (2, 0, 2)
    alerts = {a.src_ip: a for a in lake.read(spark, "alerts").where(f"rule_id = '{INTEL_RULE_ID}'").collect()}
    # laptop-5 asked for evil.test and a sub-domain of it: one alert; notevil.test matches nothing.
    assert sorted(alerts) == ["10.0.0.5", "10.0.0.6"]
    assert alerts["10.0.0.5"].device == "laptop-5" and "evil.test" in alerts["10.0.0.5"].evidence
    assert "2 event(s)" in alerts["10.0.0.5"].evidence
    assert "203.0.113.9" in alerts["10.0.0.6"].evidence and alerts["10.0.0.6"].severity == "high"
    # Loaded again a day later: the same indicators (validity moved on), no new alert.
    again = load(spark, lake, feed, now=NOW + timedelta(days=1))
    assert again.alerts == 0 and again.version == first.version + 1
    indicators = lake.read(spark, INDICATORS_TABLE).collect()
    assert len(indicators) == 2
    assert {i.valid_until for i in indicators} == {(NOW + timedelta(days=31)).replace(tzinfo=None)}
    # An expired indicator matches nothing; the sweep only looks back sweep_days.
    old = tmp_path / "old.txt"
    old.write_text("198.51.100.1\n")
    assert load(spark, lake, old, now=NOW, valid_days=1, sweep_days=90).alerts == 1
    assert load(spark, lake, old, now=NOW + timedelta(days=100), sweep_days=90).alerts == 0


def test_a_feed_dropped_in_the_intel_folder_runs_the_load_job_once_per_version(spark, lake):
    import os

    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

    from assets import intel
    from assets.definitions import build_definitions
    from assets.resources import LakeResource, SparkResource

    resource = LakeResource(home=str(lake.home.root))
    instance = DagsterInstance.ephemeral()

    def tick(cursor):
        return intel.intel_sensor(build_sensor_context(cursor=cursor, instance=instance,
                                                       resources={"lake": resource}))

    assert isinstance(tick(None), SkipReason)  # no intel folder yet
    lake.home.intel.mkdir()
    feed = lake.home.intel / "threatfox.csv"
    feed.write_text('# "first_seen_utc","ioc_value","ioc_type"\n"2026-11-01","evil.test","domain"\n')
    (lake.home.intel / ".partial.csv").write_text("x")
    first = tick(None)
    assert isinstance(first, SensorResult) and [r.tags["seclake/feed"] for r in first.run_requests] == ["threatfox.csv"]
    assert isinstance(tick(first.cursor), SkipReason)  # unchanged: no second run
    os.utime(feed, (1, 2))
    assert len(tick(first.cursor).run_requests) == 1  # a new version of the feed runs again

    # The job the sensor requests, run with its config.
    defs = build_definitions(resources={"spark": SparkResource(ui=False), "lake": resource})
    done = defs.resolve_job_def(intel.INTEL_JOB).execute_in_process(
        run_config=first.run_requests[0].run_config, instance=instance)
    assert done.success
    found = lake.read(spark, "alerts").where("rule_id = 'seclake.intel_match'").collect()
    assert [a.src_ip for a in found] == ["10.0.0.5"] and "threatfox.csv" in found[0].evidence
