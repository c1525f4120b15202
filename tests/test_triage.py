"""Alert triage (`alert_triage`, `seclake alerts ...`): real Delta MERGE on a lake with alerts."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from conftest import waits_for_lock
from pipelines.cli import main
from pipelines.home import Home
from pipelines.lake.registry import Lake
from pipelines.rules.pack import RULES_DIR, scan_rules
from pipelines.triage.store import TRIAGE_TABLE, Change, apply, queue, resolve_ids, triaged_alerts

T0 = datetime(2026, 11, 20, 6, 0, tzinfo=timezone.utc)
ALERTS = [  # alert_id, rule (file name), severity, src_ip, mac, device, window start (hours after T0)
    ("aaaa11110" + "0" * 55, "dga_nxdomain_burst", "medium", "10.0.0.5", "aa:bb:cc:00:00:05", "laptop-5", 0),
    ("aaaa11119" + "0" * 55, "dns_exfiltration", "high", "10.0.0.6", "aa:bb:cc:00:00:06", "laptop-6", 1),
    ("bbbb22220" + "0" * 55, "internal_port_scan", "medium", "10.0.0.5", "aa:bb:cc:00:00:05", "laptop-5", 2),
    ("cccc33330" + "0" * 55, "high_severity_ids_alert", "critical", "10.0.0.7", None, None, 3),
]
RULE_IDS = {rule.slug: rule.id for rule in scan_rules(RULES_DIR).rules}  # alerts hold ids, users give names


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = lake.spec("alerts").schema
    rows = []
    for alert_id, rule, severity, ip, mac, device, hours in ALERTS:
        start = T0 + timedelta(hours=hours)
        row = {f: None for f in schema.fieldNames()}
        row.update(alert_id=alert_id, rule_id=RULE_IDS[rule], rule_name=rule, rule_version=1, severity=severity,
                   src_ip=ip, mac=mac,
                   device=device, window_start=start, window_end=start + timedelta(minutes=5),
                   evidence=f"{rule} on {ip}", event_date=start.date())
        rows.append(row)
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    return lake


def test_changes_merge_into_one_row_per_alert_and_notes_accumulate(spark, lake):
    first = apply(spark, lake, ["aaaa11110"], Change(status="acknowledged", note="looking", by="ana"), now=T0).version
    apply(spark, lake, ["aaaa11110", "bbbb22220"], Change(assignee="bo", by="ana"), now=T0 + timedelta(minutes=1))
    last = apply(spark, lake, ["aaaa11110"], Change(status="closed", note="benign: updater", by="bo"),
                 now=T0 + timedelta(minutes=2)).version
    assert first is not None and last == first + 2
    state = {r.alert_id[:9]: r for r in lake.read(spark, TRIAGE_TABLE).collect()}
    assert sorted(state) == ["aaaa11110", "bbbb22220"]  # one row per touched alert
    closed = state["aaaa11110"]
    assert (closed.status, closed.assignee, closed.updated_by) == ("closed", "bo", "bo")
    assert [(n.by, n.text) for n in closed.notes] == [("ana", "looking"), ("bo", "benign: updater")]
    assert (state["bbbb22220"].status, state["bbbb22220"].assignee, state["bbbb22220"].notes) == ("open", "bo", [])
    # Every change is a MERGE commit: the earlier state is one time travel away.
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(lake.path(TRIAGE_TABLE))).history().collect()
    assert [h.operation for h in history if h.version >= first] == ["MERGE"] * 3
    before = {r.alert_id[:9]: r.status for r in lake.read(spark, TRIAGE_TABLE, version=first).collect()}
    assert before == {"aaaa11110": "acknowledged"}
    # A change that would leave an alert as it is writes nothing for it: no commit of nothing.
    again = apply(spark, lake, ["aaaa11110", "bbbb22220"], Change(assignee="bo", by="ana"))
    assert (again.version, again.changed, len(again.unchanged)) == (None, [], 2)
    reopened = apply(spark, lake, ["aaaa11110", "cccc33330"], Change(status="open", by="ana"))
    assert (reopened.version, [i[:9] for i in reopened.changed]) == (last + 1, ["aaaa11110"])
    assert [i[:9] for i in reopened.unchanged] == ["cccc33330"]  # never triaged: open already
    assert apply(spark, lake, ["cccc33330"], Change(status="open", note="seen", by="ana")).version == last + 2


def test_a_triage_change_waits_while_another_process_holds_the_tables_lock(spark, lake):
    # Two commands' MERGEs of one state table (two analysts, the CLI beside a Dagster run) take
    # turns on the home's lock: on object storage Delta's commit is atomic within one driver only.
    apply(spark, lake, ["aaaa11110"], Change(status="acknowledged", by="ana"), now=T0)
    log = lake.path(TRIAGE_TABLE) / "_delta_log"
    result = waits_for_lock(lake.home.root / "locks" / f"{TRIAGE_TABLE}.lock",
                            lambda: apply(spark, lake, ["aaaa11110"], Change(assignee="bo", by="ana"), now=T0),
                            lambda: len(list(log.glob("*.json"))))
    assert [i[:9] for i in result.changed] == ["aaaa11110"]
    assert lake.read(spark, TRIAGE_TABLE).first().assignee == "bo"


def test_an_ack_waiting_for_the_lock_is_refused_when_a_close_commits_first(spark, lake):
    # The ack read the alert's state before it waited for the lock: a close committed meanwhile was
    # then overwritten, the closed alert back in the queue.
    import threading
    from contextlib import nullcontext

    from pipelines.lake.merge import upsert

    apply(spark, lake, ["aaaa11110"], Change(status="acknowledged", by="ana"), now=T0)
    outcome: list[object] = []

    def ack() -> None:
        try:
            outcome.append(apply(spark, lake, ["aaaa11110"], Change(status="acknowledged", note="mine", by="bo")))
        except ValueError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=ack)
    with lake.home.commit_lock(TRIAGE_TABLE):
        worker.start()
        worker.join(4)
        assert worker.is_alive()  # waiting for the lock
        full_id = lake.read(spark, TRIAGE_TABLE).first().alert_id
        closed = spark.createDataFrame([(full_id, "closed", None, [], "cy", T0)], lake.spec(TRIAGE_TABLE).schema)
        upsert(spark, lake.path(TRIAGE_TABLE), closed, "alert_id", update={"status": "s.status"}, insert={},
               lock=nullcontext())
    worker.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError) and "closed" in str(outcome[0]), outcome
    assert lake.read(spark, TRIAGE_TABLE).first().status == "closed"


def test_ids_must_name_exactly_one_alert(spark, lake):
    assert resolve_ids(spark, lake, ["cccc3333", ALERTS[0][0]]) == [ALERTS[3][0], ALERTS[0][0]]
    with pytest.raises(ValueError, match=r"aaaa \(give at least 8 characters\); dddd4444 \(no such alert\)"):
        resolve_ids(spark, lake, ["aaaa", "dddd4444"])  # each bad id named
    with pytest.raises(ValueError, match=r"aaaa1111 \(2 alerts match\); dddd4444 \(no such alert\)"):
        resolve_ids(spark, lake, ["aaaa1111", "cccc33330", "dddd4444"])
    with pytest.raises(ValueError, match="dddd4444"):
        apply(spark, lake, ["dddd4444"], Change(status="closed"))
    assert not lake.exists(TRIAGE_TABLE)  # a refused change writes nothing
    with pytest.raises(ValueError, match="status 'done'"):
        Change(status="done")


def test_queue_filters_and_puts_the_most_severe_and_newest_first(spark, lake):
    apply(spark, lake, ["bbbb22220"], Change(status="closed", by="ana"))
    apply(spark, lake, ["aaaa11119"], Change(status="acknowledged", by="ana"))
    ids = lambda frame: [r.alert_id[:9] for r in frame.collect()]  # noqa: E731
    assert ids(queue(spark, lake)) == ["cccc33330", "aaaa11119", "aaaa11110"]  # closed left out
    assert ids(queue(spark, lake, ("closed",))) == ["bbbb22220"]
    assert ids(queue(spark, lake, ("open",))) == ["cccc33330", "aaaa11110"]
    assert ids(queue(spark, lake, ("open", "acknowledged", "closed"), host="laptop-5")) == ["bbbb22220", "aaaa11110"]
    assert ids(queue(spark, lake, host="AA:BB:CC:00:00:06")) == ["aaaa11119"]
    assert ids(queue(spark, lake, ("closed",), host="LAPTOP-5")) == ["bbbb22220"]  # names in any case, as MACs
    assert ids(queue(spark, lake, rule=RULE_IDS["dga_nxdomain_burst"])) == ["aaaa11110"]
    assert ids(queue(spark, lake, severity="critical")) == ["cccc33330"]
    assert ids(queue(spark, lake, since=T0 + timedelta(hours=1))) == ["cccc33330", "aaaa11119"]
    assert triaged_alerts(spark, lake).count() == len(ALERTS)  # never triaged: still there, open


def test_a_finding_a_newer_rule_version_raised_again_is_listed_once(spark, lake):
    from pipelines.triage.incidents import incidents

    schema = lake.spec("alerts").schema
    again = lake.read(spark, "alerts").where("alert_id LIKE 'aaaa11110%'").first().asDict()
    again.update(alert_id="eeee5555" + "0" * 56, rule_version=2)  # v2's backfill: same window and host
    spark.createDataFrame([again], schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    ids = [r.alert_id[:9] for r in queue(spark, lake).collect()]
    assert "eeee55550" in ids and "aaaa11110" not in ids and len(ids) == len(ALERTS)
    five = next(r for r in incidents(spark, lake).collect() if r.entity == "laptop-5")
    assert five.alerts == 2 and "eeee5555" + "0" * 56 in five.alert_ids
    assert resolve_ids(spark, lake, ["aaaa11110"]) == [ALERTS[0][0]]  # still there, for alerts show


def test_a_finding_closed_under_an_earlier_rule_version_stays_closed_under_the_new_one(spark, lake):
    # The new version's alert had no triage row: it came back open, its notes and assignee gone.
    schema = lake.spec("alerts").schema
    apply(spark, lake, ["aaaa11110"], Change(status="closed", assignee="raj", note="benign updater", by="ana"), now=T0)
    again = lake.read(spark, "alerts").where("alert_id LIKE 'aaaa11110%'").first().asDict()
    sibling = {**again, "alert_id": "ffff6666" + "0" * 56}  # v1's other finding in that window (other keys)
    again.update(alert_id="eeee5555" + "0" * 56, rule_version=2)
    spark.createDataFrame([again, sibling], schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    states = {r.alert_id[:9]: r.status for r in triaged_alerts(spark, lake).collect()}
    assert (states["eeee55550"], states["ffff66660"]) == ("closed", "open")  # not from a finding of its version
    assert "eeee55550" not in [r.alert_id[:9] for r in queue(spark, lake).collect()]
    [closed] = [r for r in queue(spark, lake, statuses=("closed",)).collect() if r.alert_id.startswith("eeee")]
    assert (closed.assignee, [n.text for n in closed.notes]) == ("raj", ["benign updater"])
    with pytest.raises(ValueError, match="closed: `seclake alerts reopen` first"):
        apply(spark, lake, ["eeee55550"], Change(status="acknowledged", by="ana"))
    assert apply(spark, lake, ["eeee55550"], Change(status="closed", by="ana")).changed == []
    # Its own first row starts from the finding's triage.
    apply(spark, lake, ["eeee55550"], Change(note="same under v2", by="ana"), now=T0 + timedelta(hours=1))
    [own] = lake.read(spark, TRIAGE_TABLE).where("alert_id LIKE 'eeee5555%'").collect()
    assert (own.status, own.assignee, [n.text for n in own.notes]) == ("closed", "raj",
                                                                        ["benign updater", "same under v2"])


def test_cli_acks_lists_and_shows(spark, lake, capsys):
    home = ["--home", str(lake.home.root)]
    assert main(["alerts", "ack", "aaaa11110", "cccc33330", "--note", "on it", "--by", "ana", *home]) == 0
    assert "2 alerts (aaaa11110000, cccc33330000): status acknowledged with a note" in capsys.readouterr().out
    assert main(["alerts", "list", "--status", "acknowledged", *home]) == 0
    out = capsys.readouterr()
    rows = [line.split() for line in out.out.splitlines()[2:]]
    assert [r[0][:9] for r in rows] == ["cccc33330", "aaaa11110"] and all("acknowledged" in r for r in rows)
    assert "2 alert(s)" in out.err
    assert main(["alerts", "show", "cccc33330", *home]) == 0
    shown = capsys.readouterr().out
    assert "status" in shown and "acknowledged" in shown and "ana: on it" in shown
    assert main(["alerts", "incidents", "--min-risk", "50", *home]) == 0
    out = capsys.readouterr()
    assert [line.split()[:3] for line in out.out.splitlines()[2:]] == [["10.0.0.7", "100", "critical"],
                                                                       ["laptop-6", "50", "high"]]
    assert "2 incident(s)" in out.err
    assert main(["alerts", "close", "zzzz9999", *home]) == 2
    assert "zzzz9999 (no such alert)" in capsys.readouterr().err
    # An id typed in capitals is the same id; acknowledging a closed alert is refused (reopen says it).
    assert main(["alerts", "close", "CCCC33330", "--by", "ana", *home]) == 0
    capsys.readouterr()
    assert main(["alerts", "ack", "cccc33330", "aaaa11110", *home]) == 2
    assert "cccc33330000 closed: `seclake alerts reopen` first; nothing written" in capsys.readouterr().err
    assert main(["alerts", "list", "--status", "closed", *home]) == 0
    assert [line.split()[0][:9] for line in capsys.readouterr().out.splitlines()[2:]] == ["cccc33330"]


def test_incidents_group_an_entitys_alerts_in_time_and_score_distinct_rules(spark, lake):
    from pipelines.triage.incidents import incidents

    apply(spark, lake, ["bbbb22220"], Change(status="closed", by="ana"))
    day = {r.entity: r for r in incidents(spark, lake).collect()}
    # laptop-5: two medium rules 2 h apart -> one incident, 20 + 20; 10.0.0.7 (unattributed) by IP.
    assert sorted(day) == ["10.0.0.7", "laptop-5", "laptop-6"]
    five = day["laptop-5"]
    assert (five.alerts, five.open_alerts, five.risk, five.max_severity) == (2, 1, 40, "medium")
    assert five.rules == sorted([RULE_IDS["dga_nxdomain_burst"], RULE_IDS["internal_port_scan"]])
    assert (day["10.0.0.7"].risk, day["10.0.0.7"].max_severity) == (100, "critical")
    assert [r.entity for r in incidents(spark, lake).collect()][0] == "10.0.0.7"  # riskiest first
    hourly = [r for r in incidents(spark, lake, timedelta(hours=1)).collect() if r.entity == "laptop-5"]
    assert sorted((r.alerts, r.risk) for r in hourly) == [(1, 20), (1, 20)]  # 2 h apart: two incidents
    # An alert about no one host (DHCP starvation from made-up MACs) is the network's incident.
    schema = lake.spec("alerts").schema
    row = {**{f: None for f in schema.fieldNames()}, "alert_id": "dddd4444" + "0" * 56, "severity": "high",
           "rule_id": RULE_IDS["dhcp_starvation"], "window_start": T0, "event_date": T0.date()}
    spark.createDataFrame([row], schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    network = [r for r in incidents(spark, lake).collect() if r.entity == "(network)"]
    assert [(r.alerts, r.risk, r.rules) for r in network] == [(1, 50, [RULE_IDS["dhcp_starvation"]])]



def test_the_incidents_asset_writes_the_incidents_as_a_table_and_rebuilds_it_whole(spark, lake):
    from dagster import materialize

    from assets import triage
    from assets.resources import LakeResource, SparkResource
    from pipelines.triage.incidents import INCIDENTS_TABLE, incidents

    resources = {"spark": SparkResource(ui=False), "lake": LakeResource(home=str(lake.home.root))}
    first = materialize([triage.incidents], resources=resources)
    assert first.success
    meta = first.asset_materializations_for_node("gold__incidents")[0].metadata
    assert meta["incidents"].value == 3 and "10.0.0.7: risk 100" in meta["riskiest"].value
    table = {r.entity: r for r in lake.read(spark, INCIDENTS_TABLE).collect()}
    assert table == {r.entity: r for r in incidents(spark, lake).collect()}
    # Nothing changed in alerts or alert_triage: a scheduled run writes no identical version.
    same = materialize([triage.incidents], resources=resources).asset_materializations_for_node("gold__incidents")[0]
    assert (same.metadata["written"].value, same.metadata["version"].value) == (False, meta["version"].value)
    assert same.metadata["incidents"].value == 3 and same.metadata["table_version"].value == meta["version"].value
    assert "10.0.0.7: risk 100" in same.metadata["riskiest"].value
    # ... found from the tables' logs alone: no Spark session is asked for
    from pipelines.triage.incidents import refresh

    assert not refresh(lambda: pytest.fail("refresh asked for Spark with nothing to build"), lake).written
    # Closing an alert changes the next build; the table is replaced, never appended to.
    apply(spark, lake, ["cccc33330"], Change(status="closed", by="ana"))
    again = materialize([triage.incidents], resources=resources).asset_materializations_for_node("gold__incidents")[0]
    assert again.metadata["written"].value and again.metadata["version"].value == meta["version"].value + 1
    rebuilt = lake.read(spark, INCIDENTS_TABLE).collect()
    assert len(rebuilt) == 3 and [r.open_alerts for r in rebuilt if r.entity == "10.0.0.7"] == [0]


def test_suppressions_mark_matching_alerts_and_only_while_active(spark, lake):
    from pipelines.triage.suppressions import Suppression, add, expire, mark

    scan, _ = add(spark, lake, Suppression("cidr", "10.0.0.4/31", "lab scanner",
                                           rule_id=RULE_IDS["internal_port_scan"]), now=T0)
    mac, _ = add(spark, lake, Suppression("mac", "AA:BB:CC:00:00:06", "test laptop"), now=T0)
    gone, _ = add(spark, lake, Suppression("device", "laptop-5", "ended", expires_at=T0 + timedelta(hours=1)), now=T0)
    device, _ = add(spark, lake, Suppression("device", "LAPTOP-5", "a name in another case",
                                             rule_id=RULE_IDS["dga_nxdomain_burst"]), now=T0)
    ended, _ = add(spark, lake, Suppression("ip", "10.0.0.7", "ended early"), now=T0)
    # The same one again (a command run twice): the one in force, nothing added; once it has ended, a new one.
    assert add(spark, lake, Suppression("mac", "aa:bb:cc:00:00:06", "again"), now=T0) == (mac, False)
    assert add(spark, lake, Suppression("device", "Laptop-5", "again", rule_id=RULE_IDS["dga_nxdomain_burst"]),
               now=T0) == (device, False)  # matched in any case: the same device
    version = expire(spark, lake, ended, now=T0 + timedelta(minutes=5))
    assert isinstance(version, int)
    # Ended already (by hand, or past its expires_at): said with when, nothing written.
    assert expire(spark, lake, ended, now=T0 + timedelta(minutes=9)) == T0 + timedelta(minutes=5)
    assert expire(spark, lake, gone, now=T0 + timedelta(hours=2)) == T0 + timedelta(hours=1)
    from delta.tables import DeltaTable

    assert DeltaTable.forPath(spark, str(lake.path("suppressions"))).history(1).first().version == version
    again, new = add(spark, lake, Suppression("ip", "10.0.0.7", "back"), now=T0 + timedelta(minutes=6))
    assert new and again != ended
    assert lake.read(spark, "suppressions").count() == 6
    expire(spark, lake, again, now=T0 + timedelta(minutes=7))
    later = T0 + timedelta(hours=2)
    marked = {r.alert_id[:9]: r.suppressed_by for r in mark(lake.read(spark, "alerts"), lake, at=later).collect()}
    # the CIDR covers .4-.5 for one rule; the MAC one every rule; the expired ones nothing.
    assert marked == {"aaaa11110": device, "aaaa11119": mac, "bbbb22220": scan, "cccc33330": None}
    assert gone not in marked.values()
    with pytest.raises(ValueError, match="only IPv4"):
        Suppression("cidr", "2001:db8::/64", "v6")
    with pytest.raises(ValueError, match=r"cidr 192.168.10.0/2: host bits set; that network is 192.0.0.0/2"):
        Suppression("cidr", "192.168.10.0/2", "a typo of /24 once stored as a quarter of IPv4")
    for bad in ("not a domain;;", "com"):
        with pytest.raises(ValueError, match="expected a domain name with a dot"):
            Suppression("domain", bad, "typo")
    with pytest.raises(ValueError, match="device: give the device's name"):
        Suppression("device", " ", "blank")
    with pytest.raises(ValueError, match="no suppression 'nope'"):
        expire(spark, lake, "nope")


def test_a_domain_suppression_marks_the_domain_and_its_subdomains_not_look_alikes(spark, lake):
    # Matched as a substring, suppressing paypal.com also hid alerts on paypal.com.evil.test; given
    # with the root's dot, it matched nothing.
    from pipelines.triage.suppressions import Suppression, add, mark

    ident, _ = add(spark, lake, Suppression("domain", "PayPal.com.", "known sender"), now=T0)
    schema = lake.spec("alerts").schema
    texts = {"exact": "dns_exfiltration: paypal.com", "sub": "queries for www.paypal.com.", "json": None,
             "lookalike": "queries for paypal.com.evil.test", "prefix": "queries for notpaypal.com",
             "longer": "queries for paypal.community"}
    rows = []
    for name, text in texts.items():
        row = {f: None for f in schema.fieldNames()}
        row.update(alert_id=name, rule_id="r", evidence=text, event_date=T0.date(),
                   details='{"query": "login.paypal.com"}' if name == "json" else None)
        rows.append(row)
    marked = {r.alert_id: r.suppressed_by for r in mark(spark.createDataFrame(rows, schema), lake).collect()}
    assert marked == {"exact": ident, "sub": ident, "json": ident, "lookalike": None, "prefix": None, "longer": None}


def test_an_ipv6_suppression_matches_the_address_as_either_sensor_writes_it(spark, lake):
    # Compared as text, --ip 2001:DB8::5 matched neither Zeek's 2001:db8::5 nor Suricata's full form.
    from pipelines.triage.suppressions import Suppression, add, mark

    ident, _ = add(spark, lake, Suppression("ip", "2001:DB8:0::5", "lab host"), now=T0)
    schema = lake.spec("alerts").schema
    ips = {"zeek": "2001:db8::5", "suricata": "2001:0db8:0000:0000:0000:0000:0000:0005", "other": "2001:db8::50",
           "v4": "10.0.0.5"}
    rows = []
    for name, ip in ips.items():
        row = {f: None for f in schema.fieldNames()}
        row.update(alert_id=name, rule_id="r", src_ip=ip, event_date=T0.date())
        rows.append(row)
    marked = {r.alert_id: r.suppressed_by for r in mark(spark.createDataFrame(rows, schema), lake).collect()}
    assert marked == {"zeek": ident, "suricata": ident, "other": None, "v4": None}


def test_a_suppressed_alert_is_written_with_suppressed_by_and_left_out_of_the_queue(spark, lake, capsys, tmp_path):
    from pipelines.intel.store import intel_rules, load

    home = ["--home", str(lake.home.root)]
    assert main(["suppress", "add", "--all-rules", "--domain", "Evil.test", "--reason", "sinkhole", "--by", "ana",
                 *home]) == 0
    ident = capsys.readouterr().out.split()[1].rstrip(":")
    dns = lake.spec("enriched_dns").schema
    seen = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(days=1)  # inside the sweep's 90 days
    row = {**{f: None for f in dns.fieldNames()}, "event_id": "d1", "event_time": seen, "event_date": seen.date(),
           "src_ip": "10.0.0.9", "query": "evil.test"}
    lake.ensure(spark, "enriched_dns")
    spark.createDataFrame([row], dns).write.format("delta").mode("append").save(str(lake.path("enriched_dns")))
    (tmp_path / "feed.txt").write_text("evil.test\n")
    assert load(spark, lake, tmp_path / "feed.txt").alerts == 1
    written = lake.read(spark, "alerts").where(f"rule_id = '{intel_rules()[0].id}'").collect()
    assert [a.suppressed_by for a in written] == [ident]  # written, marked, not dropped
    assert "10.0.0.9" not in [r.src_ip for r in queue(spark, lake).collect()]
    assert "10.0.0.9" in [r.src_ip for r in queue(spark, lake, suppressed=True).collect()]
    assert main(["suppress", "expire", ident, *home]) == 0
    assert main(["suppress", "list", *home]) == 0
    assert "expired" in capsys.readouterr().out.splitlines()[-1]


def test_cli_names_rules_by_file_name_or_id_and_shows_their_names(spark, lake, capsys):
    home = ["--home", str(lake.home.root)]
    rule_of = lambda out: [line.split()[2] for line in out.splitlines()[2:]]  # noqa: E731
    for given in ("dga_nxdomain_burst", RULE_IDS["dga_nxdomain_burst"]):
        assert main(["alerts", "list", "--rule", given, *home]) == 0
        out = capsys.readouterr()
        assert rule_of(out.out) == ["dga_nxdomain_burst"] and "1 alert(s)" in out.err
    assert main(["alerts", "list", *home]) == 0
    assert rule_of(capsys.readouterr().out) == ["high_severity_ids_alert", "dns_exfiltration", "internal_port_scan",
                                                "dga_nxdomain_burst"]
    assert main(["alerts", "incidents", *home]) == 0
    assert "dga_nxdomain_burst, internal_port_scan" in capsys.readouterr().out  # laptop-5's two rules


def test_a_suppression_given_a_rule_by_file_name_is_stored_by_id_and_matches(spark, lake, capsys):
    from pipelines.triage.suppressions import SUPPRESSIONS_TABLE, mark

    home = ["--home", str(lake.home.root)]
    assert main(["suppress", "add", "--rule", "internal_port_scan", "--ip", "10.0.0.5", "--reason", "lab scanner",
                 "--by", "ana", *home]) == 0
    out = capsys.readouterr()
    ident = out.out.split()[1].rstrip(":")
    assert f"internal_port_scan ({RULE_IDS['internal_port_scan']}) on ip 10.0.0.5" in out.out
    assert "alerts already in the queue stay there" in out.err
    assert [r.rule_id for r in lake.read(spark, SUPPRESSIONS_TABLE).collect()] == [RULE_IDS["internal_port_scan"]]
    marked = {r.alert_id[:9]: r.suppressed_by for r in mark(lake.read(spark, "alerts"), lake).collect()}
    assert marked == {"aaaa11110": None, "aaaa11119": None, "bbbb22220": ident, "cccc33330": None}  # that rule only
    assert main(["suppress", "list", *home]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[:2] == [ident, "internal_port_scan"]
    assert main(["suppress", "add", "--rule", "internal_port_scan", "--ip", "10.0.0.5", "--reason", "lab scanner",
                 "--by", "ana", *home]) == 0  # the same again: nothing added, so nothing it would mark
    again = capsys.readouterr()
    assert f"suppression {ident} (already in force, not added again)" in again.out and not again.err


@pytest.mark.parametrize("command", [["alerts", "list", "--rule", "port_scan"],
                                     ["suppress", "add", "--rule", "port_scan", "--ip", "10.0.0.5", "--reason", "x"]])
def test_an_unknown_rule_is_refused_naming_it_and_the_valid_names(lake, capsys, command):
    assert main([*command, "--home", str(lake.home.root)]) == 2
    err = capsys.readouterr().err
    assert "no rule 'port_scan'" in err and "did you mean 'internal_port_scan'?" in err and len(err.splitlines()) == 1
    assert not lake.exists("suppressions")  # nothing written


def test_an_assignee_or_author_left_blank_and_a_padded_device_are_refused():
    # Each was accepted: an alert "assigned" to no one, a change by no one, a suppression matching nothing.
    from pipelines.triage.suppressions import Suppression

    with pytest.raises(ValueError, match="--to: give the name"):
        Change(assignee=" ", by="ana")
    with pytest.raises(ValueError, match="--by: give a name"):
        Change(status="closed", by="")
    with pytest.raises(ValueError, match="--by: give a name"):
        Suppression("ip", "10.0.0.1", "scanner", author=" ")
    with pytest.raises(ValueError, match="device ' laptop-5 ': no spaces around the name"):
        Suppression("device", " laptop-5 ", "padded")


def test_the_queue_of_a_home_without_alerts_says_to_run_the_pipeline(spark, tmp_path, capsys):
    home = Home.resolve(tmp_path / "home").create()  # tables/ made, no table in it yet
    for command in (["alerts", "list"], ["alerts", "incidents"], ["alerts", "ack", "abcdef12"]):
        assert main([*command, "--home", str(home.root)]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"seclake alerts: no alerts table in {home.root}: run the pipeline first"), command


def test_a_suppression_on_a_malformed_mac_is_refused(lake, capsys):
    assert main(["suppress", "add", "--rule", "internal_port_scan", "--mac", "dc:a6:32:0b:38", "--reason", "x",
                 "--home", str(lake.home.root)]) == 2
    assert "mac dc:a6:32:0b:38: expected six hex pairs" in capsys.readouterr().err
    assert not lake.exists("suppressions")


def test_a_suppression_that_would_already_have_ended_is_refused(lake, capsys):
    assert main(["suppress", "add", "--rule", "internal_port_scan", "--ip", "10.0.0.5", "--reason", "x",
                 "--expires", "2020-01-01", "--home", str(lake.home.root)]) == 2
    err = capsys.readouterr().err
    assert "--expires 2020-01-01: that is past (2020-01-01 00:00 UTC)" in err and len(err.splitlines()) == 1
    assert not lake.exists("suppressions")


def test_a_bad_severity_is_refused_by_the_parser_naming_the_allowed_values(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["alerts", "list", "--severity", "hihg", "--home", "unused"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'hihg'" in err and "'low', 'medium', 'high', 'critical'" in err


def test_a_suppression_saved_by_rule_name_before_is_listed_as_matching_nothing(spark, lake, capsys):
    from pipelines.triage.suppressions import Suppression, add

    old, _ = add(spark, lake, Suppression("ip", "10.0.0.5", "lab scanner", rule_id="internal_port_scan",
                                          author="ana"))
    assert main(["suppress", "list", "--home", str(lake.home.root)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(old))
    assert row.endswith("matches nothing (saved by rule name): expire it and add it again"), row


def test_a_rule_file_being_edited_still_names_its_alerts(tmp_path):
    import shutil

    from pipelines.rules.pack import rule_names
    from pipelines.triage.cli import rule_id

    shutil.copytree(RULES_DIR, tmp_path / "rules")
    tunneling = tmp_path / "rules" / "dns" / "dns_tunneling.sql"
    deployed = next(r for r in scan_rules(RULES_DIR).rules if r.slug == "dns_tunneling")
    tunneling.write_text(tunneling.read_text().replace("FROM enriched_dns", "FROM enriched_dnss"))  # a typo mid-edit
    assert tunneling in scan_rules(tmp_path / "rules").errors
    assert rule_id("dns_tunneling", tmp_path / "rules") == deployed.id
    assert rule_names(tmp_path / "rules")[deployed.id] == "dns_tunneling"
