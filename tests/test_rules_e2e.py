"""End to end over a generated day: landing files -> ETL -> attribution -> every rule, then
the backtest of each rule scored against the generator's ground truth.

Checks: every injected scenario raises its rule's alert (recall 100%), at least 95% of all
alerts belong to an injected incident, both in the backtest and in what run-once streamed (it
marks the end of its input, so every window up to the last event is closed), and for every
window the stream's watermark has closed, the streamed alert ids equal the backtest's. Threat
intel: the generator's planted feed, half loaded before the run (the stream's intel rules find
it), half after (the sweep finds it): every planted indicator found once, no decoy, no repeat.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pipelines import jobs
from pipelines.home import Home
from pipelines.intel.store import intel_rules, load
from pipelines.lake.read import read_table
from pipelines.lake.registry import Lake
from pipelines.rules.backtest import GROUND_TRUTH, backtest, load_ground_truth, score
from pipelines.rules.pack import scan_rules
from pipelines.rules.tables import ALERTS_TABLE, PLATFORM_RULE_PREFIX
from pipelines.stages import stages
from sample_data.generator import PLANTED_FEED, generate

RULES_DIR = Path(__file__).resolve().parents[1] / "rules"

# Which rule must catch which scenario (roaming_laptop is not an attack: no rule).
SCENARIO_RULES = {
    "dns_exfiltration": "dns_exfiltration",
    "dns_tunneling": "dns_tunneling",
    "dga": "dga_nxdomain_burst",
    "port_scan": "internal_port_scan",
    "c2_beaconing": "c2_beaconing",
    "ids_alert_reused_ip": "high_severity_ids_alert",
    "dhcp_starvation": "dhcp_starvation",
    "new_device": "unknown_device",
    "c2_retry": "repeated_failed_connections",
    "exploit_static_host": "high_severity_ids_alert_unknown_host",
}


@pytest.mark.slow
def test_a_generated_day_raises_every_scenario_and_stream_equals_backtest(spark, tmp_path):
    home = Home.resolve(tmp_path / "home").create()
    generate(home.root, hours=24, hosts=50, seed=7)
    lake = Lake(home)
    pack = scan_rules(RULES_DIR)
    # The feed of the C2 incident goes in before the run: its matches are the stream's to find.
    planted = [line for line in (home.root / PLANTED_FEED).read_text().splitlines() if not line.startswith("#")]
    before, after = tmp_path / "c2.txt", tmp_path / "rest.txt"
    before.write_text("".join(f"{line}\n" for line in planted if "c2_beaconing" in line))
    after.write_text("".join(f"{line}\n" for line in planted if "c2_beaconing" not in line))
    assert load(spark, lake, before).indicators == 2
    assert [s.name for s in stages() if s.name.startswith("rule_")] == [r.query_name for r in pack.rules]
    reports = {r.name: r for r in jobs.run_once(spark, lake)}  # ETL, attribution, every rule: `seclake run-once`
    assert all(r.error is None for r in reports.values()), [r.line() for r in reports.values() if r.error]

    incidents = load_ground_truth(home.root / GROUND_TRUTH)
    # Detections only: a platform alert (a rule disabled, rows dropped) is about seclake, not the network.
    streamed = [a for a in read_table(spark, home.table(ALERTS_TABLE)).collect()
                if not a.rule_id.startswith(PLATFORM_RULE_PREFIX)]
    everything = []
    for rule in pack.rules:
        result = backtest(spark, lake, rule, ground_truth=home.root / GROUND_TRUTH)
        everything += result.alerts
        for scenario, slug in SCENARIO_RULES.items():
            if slug == rule.slug:
                got, total = result.scores.recall[scenario]
                assert total >= 1 and got == total, f"{rule.slug} missed {scenario}: {result.lines()}"
        # Stream == backtest for every window the stream's watermark has closed; a rule that
        # alerts when crossed may also have alerted on the window still open.
        assert reports[rule.query_name].watermark, f"{rule.slug} never set a watermark"
        watermark = datetime.fromisoformat(reports[rule.query_name].watermark.replace("Z", "+00:00"))
        closed = {a["alert_id"] for a in result.alerts if a["window_end"] <= watermark}
        live = {a.alert_id for a in streamed if a.rule_id == rule.id}
        assert closed <= live <= {a["alert_id"] for a in result.alerts}, rule.slug
        if rule.emit == "closed":
            assert live == closed, rule.slug

    overall = score(everything, incidents)
    assert overall.precision >= 0.95, f"{overall.true_alerts}/{overall.alerts} alerts belong to an incident"
    scored = score([{**a.asDict(), "window_start": a.window_start.replace(tzinfo=timezone.utc),
                   "window_end": a.window_end.replace(tzinfo=timezone.utc)} for a in streamed], incidents)
    assert all(scored.recall[s][0] == scored.recall[s][1] for s in SCENARIO_RULES), scored.recall
    assert scored.precision >= 0.95, f"{scored.true_alerts}/{scored.alerts} streamed alerts belong to an incident"

    # A second run-once with nothing new starts no query, not even Spark, and changes nothing.
    def no_spark():
        raise AssertionError("run-once started Spark with nothing new in landing or in any table")

    again = jobs.run_once(no_spark, lake)
    assert [r.name for r in again] == [s.name for s in stages()]
    assert all(r.skipped for r in again), [r.line() for r in again]
    assert read_table(spark, home.table(ALERTS_TABLE)).count() == len(streamed)

    # The rest of the feed: the sweep finds the IDS incident's domain and IP in history.
    streamed_intel = [a for a in streamed if a.rule_id in {r.id for r in intel_rules()}]
    swept = load(spark, lake, after)
    alerts = read_table(spark, home.table(ALERTS_TABLE)).collect()
    assert swept.alerts >= 2 and len(alerts) == len(streamed) + swept.alerts
    assert load(spark, lake, home.root / PLANTED_FEED).alerts == 0  # everything again: nothing new
    assert len({a.alert_id for a in alerts}) == len(alerts)
    found = [(json.loads(a.details)["indicator"], a.mac) for a in alerts if a.rule_id in {r.id for r in intel_rules()}]
    by_id = {i.id: i for i in incidents}
    wanted = []
    for line in planted:
        value, _, note = line.partition("#")
        if "decoy" not in note:
            wanted.append((value.strip(), by_id[note.split()[0]].mac))
    assert sorted(found) == sorted(wanted)  # recall 100%, one alert each, the incident's device, no decoy
    assert {json.loads(a.details)["indicator"] for a in streamed_intel} == {
        line.split()[0] for line in planted if "c2_beaconing" in line}


def alerts_of_real_logs(spark, tmp_path, files: dict[str, Path], enriched: str, slugs: tuple[str, ...]) -> list:
    """`files` (landing name -> a real log) through run-once's ETL, attribution into `enriched`
    and the rules `slugs` only; the alerts, after checking that no stage failed."""
    lake = Lake(Home.resolve(tmp_path / "home").create())
    for name, path in files.items():
        (lake.home.landing / name).parent.mkdir(parents=True, exist_ok=True)
        (lake.home.landing / name).write_bytes(path.read_bytes())
    pack = {r.slug: r for r in scan_rules(RULES_DIR).rules}
    wanted = ["etl", "end_of_input", "dhcp_leases", enriched, *(pack[slug].query_name for slug in slugs)]
    reports = jobs.run_once(spark, lake, only=wanted)
    assert all(r.error is None for r in reports), [r.line() for r in reports if r.error]
    return read_table(spark, lake.path(ALERTS_TABLE)).collect()


def rule_id(slug: str) -> str:
    return next(r.id for r in scan_rules(RULES_DIR).rules if r.slug == slug)


def test_the_real_captures_inbound_exploits_raise_an_alert_naming_the_server(spark, tmp_path, real_logs):
    """The real Suricata capture: two priority-1 alerts, inbound exploits of 192.168.1.129:80, a host no
    DHCP line names (and no device inventory). The rule for hosts without an inventory device raises
    one alert per signature; the one for inventory devices raises none."""
    eve = {"suricata/eve.json": real_logs / "suricata" / "eve.json"}
    alerts = alerts_of_real_logs(spark, tmp_path, eve, "enriched_ids_alerts",
                                 ("high_severity_ids_alert", "high_severity_ids_alert_unknown_host"))
    found = sorted((a.rule_id, a.src_ip, a.mac, json.loads(a.details)["signature_id"]) for a in alerts)
    unknown = rule_id("high_severity_ids_alert_unknown_host")
    assert found == [(unknown, "192.168.1.129", None, 2019309), (unknown, "192.168.1.129", None, 2020899)]
    assert all("192.168.1.129 (no DHCP lease held it" in a.evidence for a in alerts)


def test_the_real_remcos_hosts_refused_c2_retries_raise_one_alert_naming_its_device(spark, tmp_path, real_logs):
    """The labelled capture: 192.168.1.107 (RemcosRAT) is refused 718 times in eight minutes by
    66.63.168.35:5888, all in one ten-minute window; its one DHCP renewal names the MAC. No other
    host and server pair of the capture fails 30 times, and c2_beaconing, which times connections,
    finds nothing."""
    labelled = real_logs / "zeek-tsv-labeled"
    zeek = {f"zeek/{n}.log": labelled / f"{n}.log.labeled" for n in ("conn", "dhcp")}
    [alert] = alerts_of_real_logs(spark, tmp_path, zeek, "enriched_conn",
                                  ("repeated_failed_connections", "c2_beaconing"))
    details = json.loads(alert.details)
    assert (alert.rule_id, alert.src_ip, alert.mac) == (rule_id("repeated_failed_connections"), "192.168.1.107",
                                                        "08:00:27:5e:9a:a6")
    assert (details["dst_ip"], details["dst_port"]) == ("66.63.168.35", 5888)
    # A connection is its 5-tuple (community_id): the host reuses source ports, so 719 log rows are
    # fewer connections, and the one S0 reuses a port refused half a second before.
    rows = [line.split("\t") for line in (labelled / "conn.log.labeled").read_text().splitlines()
            if not line.startswith("#")]
    ports = {r[3] for r in rows if r[4:6] == ["66.63.168.35", "5888"] and r[11] in ("REJ", "S0")}
    assert details["failed"] == details["refused"] == len(ports) >= 30

