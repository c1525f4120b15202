"""Threat intelligence: feeds parsed, indicators MERGEd, history swept into alerts once."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from pipelines.home import Home
from pipelines.intel.feeds import parse_feed, read_feed
from pipelines.intel.store import INDICATORS_TABLE, intel_rules, load
from pipelines.lake.registry import Lake

# Indicators are valid from the moment they are loaded, so the events are dated from today.
EVENT = datetime.now(timezone.utc).replace(hour=9, minute=30, second=0, microsecond=0) - timedelta(days=3)
INTEL_RULE_IDS = "', '".join(r.id for r in intel_rules())


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
    plain = parse_feed("evil.test\nevil.test\n2001:db8::1 # v6\n???\n198.51.100.9/24\nBücher.test\n"
                       "10.0.0.0/7\n2001:db8::/32\n203.0.113.7/32\n")
    # Zeek logs a query for bücher.test as xn--bcher-kva.test: the indicator must be that to match.
    # A range is kept as its network; a /32 is its address.
    assert plain.indicators == [("domain", "evil.test"), ("ip", "2001:db8::1"), ("cidr", "198.51.100.0/24"),
                                ("domain", "xn--bcher-kva.test"), ("ip", "203.0.113.7")]
    # Each skipped line is named, and a range not matched says why: a user would otherwise think it is.
    assert plain.skipped == ["'???'", "'10.0.0.0/7': a range wider than /8",
                             "'2001:db8::/32': an IPv6 range (IPv6 is matched by address)"]


def test_stix_bundle_gives_its_domain_and_ip_indicators_and_reports_the_rest(tmp_path):
    import stix2

    valid = "2026-01-01T00:00:00Z"
    bundle = stix2.Bundle(
        stix2.Indicator(pattern="[domain-name:value = 'C2.Evil.test'] OR [ipv4-addr:value = '203.0.113.9']",
                        pattern_type="stix", valid_from=valid),
        stix2.Indicator(pattern="[url:value = 'http://drop.evil.test/a.exe' AND network-traffic:dst_port = 80]",
                        pattern_type="stix", valid_from=valid),
        stix2.Indicator(pattern="[file:hashes.'SHA-256' = '" + "ab" * 32 + "']", pattern_type="stix", valid_from=valid),
        stix2.Indicator(pattern="[ipv6-addr:value = '2001:db8::7']", pattern_type="stix", valid_from=valid,
                        valid_until="2026-02-01T00:00:00Z"),
        stix2.Indicator(pattern="[ipv4-addr:value = '198.51.100.1']", pattern_type="stix", valid_from=valid,
                        revoked=True),
        stix2.Indicator(pattern="alert tcp any any -> any any (sid:1;)", pattern_type="snort", valid_from=valid),
        stix2.Malware(name="IcedID", is_family=True),
    )
    path = tmp_path / "feed.json"
    path.write_text(bundle.serialize(pretty=True))
    feed = read_feed(path)
    assert feed.indicators == [("domain", "c2.evil.test"), ("ip", "203.0.113.9"), ("domain", "drop.evil.test")]
    reasons = " | ".join(feed.skipped)
    assert len(feed.skipped) == 4 and "no domain or IP compared for equality" in reasons
    assert "expired 2026-02-01" in reasons and "revoked" in reasons and "pattern type 'snort'" in reasons
    path.write_text('{"type": "bundle", "objects": [{"type": "indicator"}]}')
    with pytest.raises(ValueError, match="not a STIX 2.1 bundle"):
        read_feed(path)


def test_a_csv_with_a_domain_and_an_ip_column_loads_both():
    # Only the first indicator column was read: the IPs vanished, and a row with only an IP was "skipped: ''".
    feed = parse_feed("domain,ip\nevil.test,203.0.113.9\n,198.51.100.7\n,\n")
    assert feed.indicators == [("domain", "evil.test"), ("ip", "203.0.113.9"), ("ip", "198.51.100.7")]
    assert len(feed.skipped) == 1  # the row with neither


def test_a_file_without_indicators_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="missing.txt does not exist"):
        read_feed(tmp_path / "missing.txt")
    (tmp_path / "junk.txt").write_text("# nothing\nnot one\n")
    with pytest.raises(ValueError, match=r"junk.txt: no IP address or domain found \(1 entry not loaded: 'not one'\)"):
        read_feed(tmp_path / "junk.txt")
    # A STIX 2.0 bundle's indicators have no pattern_type: each was skipped as "pattern type None", unsaid.
    (tmp_path / "v20.json").write_text(json.dumps({
        "type": "bundle", "id": "bundle--5d0092c5-5f74-4287-9642-33f4c354e56d", "spec_version": "2.0",
        "objects": [{"type": "indicator", "id": "indicator--a932fcc6-e032-476c-826f-cb970a5a1ade",
                     "created": "2017-01-01T00:00:00.000Z", "modified": "2017-01-01T00:00:00.000Z",
                     "labels": ["malicious-activity"], "pattern": "[domain-name:value = 'evil.test']",
                     "valid_from": "2017-01-01T00:00:00Z"}]}))
    with pytest.raises(ValueError, match=r"a STIX 2.0 indicator \(only STIX 2.1 bundles are read\)"):
        read_feed(tmp_path / "v20.json")


def test_a_feed_saved_with_a_byte_order_mark_loads_its_first_value(tmp_path):
    (tmp_path / "bom.txt").write_bytes("\ufeff198.51.100.7\nevil.test\n".encode())
    assert read_feed(tmp_path / "bom.txt").indicators == [("ip", "198.51.100.7"), ("domain", "evil.test")]


def test_load_merges_indicators_and_sweeps_each_match_once(spark, lake, tmp_path):
    feed = tmp_path / "feed.txt"
    feed.write_text("evil.test\n203.0.113.9\n")
    first = load(spark, lake, feed)
    assert (first.indicators, first.skipped, first.alerts) == (2, (), 2)
    assert first.rules == ("threat_intel_domain", "threat_intel_ip")
    alerts = {a.src_ip: a for a in lake.read(spark, "alerts").where(f"rule_id IN ('{INTEL_RULE_IDS}')").collect()}
    # laptop-5 asked for evil.test and a sub-domain of it: one alert; notevil.test matches nothing.
    assert sorted(alerts) == ["10.0.0.5", "10.0.0.6"]
    assert alerts["10.0.0.5"].device == "laptop-5" and "evil.test" in alerts["10.0.0.5"].evidence
    assert "2 lookup(s)" in alerts["10.0.0.5"].evidence
    assert "203.0.113.9" in alerts["10.0.0.6"].evidence and alerts["10.0.0.6"].severity == "high"
    # Loaded again: the same indicators (validity moved on), no new alert.
    again = load(spark, lake, feed, valid_days=40)
    assert again.alerts == 0 and again.version == first.version + 1
    indicators = lake.read(spark, INDICATORS_TABLE).collect()
    assert len(indicators) == 2
    assert all(i.valid_until - i.loaded_at == timedelta(days=40) and i.valid_from < i.loaded_at for i in indicators)
    # The sweep only looks back sweep_days (whole days: from midnight UTC); then the full range finds it.
    old = tmp_path / "old.txt"
    old.write_text("198.51.100.1\n")
    # Days back from today as the sweep counts them: a suite that crosses midnight moves it by one.
    days_back = (datetime.now(timezone.utc).date() - EVENT.date()).days
    assert load(spark, lake, old, sweep_days=days_back - 1).alerts == 0
    assert load(spark, lake, old, sweep_days=days_back).alerts == 1
    # A range (Spamhaus DROP's format) matches the address inside it: a new indicator, a new alert.
    drop = tmp_path / "drop.txt"
    drop.write_text("; Spamhaus DROP List\n198.51.100.0/24 ; SBL000001\n203.0.112.0/24 ; SBL000002\n")
    ranged = load(spark, lake, drop, sweep_days=days_back)
    assert (ranged.indicators, ranged.skipped, ranged.alerts) == (2, (), 1)
    [hit] = lake.read(spark, "alerts").where("evidence LIKE '%/24%'").collect()
    assert hit.src_ip == "10.0.0.7" and "to 198.51.100.1 in 198.51.100.0/24" in hit.evidence, hit.evidence


def test_an_expired_indicator_matches_nothing(spark, lake, tmp_path):
    past = datetime.now(timezone.utc) - timedelta(days=1)
    lake.ensure(spark, INDICATORS_TABLE)
    spark.createDataFrame([("old\u001fdomain\u001fevil.test", "old", "domain", "evil.test", past - timedelta(days=30),
                            past, past)], lake.spec(INDICATORS_TABLE).schema) \
        .write.format("delta").mode("append").save(str(lake.path(INDICATORS_TABLE)))
    feed = tmp_path / "other.txt"
    feed.write_text("unrelated.test\n")
    assert load(spark, lake, feed).alerts == 0  # evil.test was seen, but its indicator expired yesterday


def test_rules_folder_without_intel_rules_loads_but_sweeps_nothing(spark, lake, tmp_path):
    (tmp_path / "rules").mkdir()
    feed = tmp_path / "feed.txt"
    feed.write_text("evil.test\n")
    result = load(spark, lake, feed, rules_dir=tmp_path / "rules")
    assert (result.indicators, result.rules, result.alerts) == (1, (), 0)
    assert lake.read(spark, INDICATORS_TABLE).count() == 1


def test_a_feed_dropped_in_the_intel_folder_runs_the_load_job_once_per_version(spark, lake, monkeypatch):
    import os

    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SensorResult, SkipReason, build_sensor_context

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
    feed.write_text('# "first_seen_utc","ioc_value","ioc_type"\n"2026-11-01","evil.test","domain"\n'
                    '"2026-11-01","sha256:ab12","hash"\n')
    (lake.home.intel / ".partial.csv").write_text("x")
    first = tick(None)
    assert isinstance(first, SensorResult) and [r.tags["seclake/feed"] for r in first.run_requests] == ["threatfox.csv"]
    assert isinstance(tick(first.cursor), SkipReason)  # unchanged: no second run
    os.utime(feed, (1, 2))
    assert len(tick(first.cursor).run_requests) == 1  # a new version of the feed runs again
    # While a run writes the lake (the sweep appends to alerts beside the rules), the feed waits.
    busy = DagsterInstance.ephemeral()
    busy.add_run(DagsterRun(job_name="run_once_job", run_id="b" * 36, status=DagsterRunStatus.STARTED))
    waiting = intel.intel_sensor(build_sensor_context(cursor=first.cursor, instance=busy, resources={"lake": resource}))
    assert isinstance(waiting, SkipReason) and "wait for run" in waiting.skip_message
    # Not behind stream_job, which never finishes (the feed waited for ever while the stream ran).
    streaming = DagsterInstance.ephemeral()
    streaming.add_run(DagsterRun(job_name="stream_job", run_id="s" * 36, status=DagsterRunStatus.STARTED))
    beside = intel.intel_sensor(build_sensor_context(cursor=first.cursor, instance=streaming,
                                                     resources={"lake": resource}))
    assert isinstance(beside, SensorResult) and len(beside.run_requests) == 1
    # So do they while a rollback waits to be finished: its run would be refused, the cursor past the feed.
    from pipelines.operations.running import PENDING

    (lake.home.root / PENDING).write_text('{"command": "seclake rollback alerts --to-version 3"}')
    held = tick(first.cursor)
    (lake.home.root / PENDING).unlink()
    assert isinstance(held, SkipReason) and "seclake rollback alerts --to-version 3" in held.skip_message

    # The job the sensor requests, run with its config.
    defs = build_definitions(resources={"spark": SparkResource(ui=False), "lake": resource})
    done = defs.resolve_job_def(intel.INTEL_JOB).execute_in_process(
        run_config=first.run_requests[0].run_config, instance=instance)
    assert done.success
    logged = [entry.user_message for entry in instance.all_logs(done.run_id)]
    assert any("1 entry not loaded: 'sha256:ab12'" in m for m in logged), logged  # named in the run's log
    # The run recorded the versions it wrote: table_state_sensor does not report them again.
    from assets.table_state import table_state_sensor
    from assets.tables import table_key

    state = table_state_sensor(build_sensor_context(instance=instance, resources={"lake": resource}))
    reported = {e.asset_key for e in state.asset_events} if isinstance(state, SensorResult) else set()
    assert not reported & {table_key("indicators"), table_key("alerts")}, reported
    found = lake.read(spark, "alerts").where(f"rule_id IN ('{INTEL_RULE_IDS}')").collect()
    assert [a.src_ip for a in found] == ["10.0.0.5"] and "threatfox.csv" in found[0].evidence

    # A sweep that fails after the MERGE committed is retried (the sensor will not ask again), and
    # the retry adds no alert twice.
    from pipelines.intel import store

    sweep, calls = store.sweep, []

    def sweep_failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a commit conflict")
        return sweep(*args, **kwargs)

    monkeypatch.setattr(store, "sweep", sweep_failing_once)
    again = defs.resolve_job_def(intel.INTEL_JOB).execute_in_process(
        run_config=first.run_requests[0].run_config, instance=instance)
    assert again.success and len(calls) == 2
    assert "STEP_UP_FOR_RETRY" in [e.event_type_value for e in again.all_events]
    assert lake.read(spark, "alerts").where(f"rule_id IN ('{INTEL_RULE_IDS}')").count() == 1

    # A feed removed before its run: refused in one line, not retried (the job retries other failures).
    gone = {"ops": {"load_indicators": {"config": {"file": str(lake.home.intel / "gone.csv")}}}}
    refused = defs.resolve_job_def(intel.INTEL_JOB).execute_in_process(run_config=gone, instance=instance,
                                                                        raise_on_error=False)
    kinds = [e.event_type_value for e in refused.all_events]
    assert "STEP_FAILURE" in kinds and "STEP_UP_FOR_RETRY" not in kinds, kinds
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.event_specific_data.error.message.strip().endswith("gone.csv does not exist")
