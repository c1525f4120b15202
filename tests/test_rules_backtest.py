"""Backtest scoring against ground truth, versions from git, and the `seclake rules` commands (no Spark)."""
from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pipelines.cli import build_parser
from pipelines.rules.backtest import Backtest, Incident, load_ground_truth, parse_when, rule_at_revision, score
from pipelines.rules.spec import validate_rule

RULES = Path(__file__).resolve().parents[1] / "rules"
UTC = timezone.utc


def at(hh_mm: str) -> datetime:
    return datetime.fromisoformat(f"2026-11-20T{hh_mm}:00+00:00")


def alert(start: str, end: str, src_ip: str | None = None, mac: str | None = None) -> dict:
    return {"window_start": at(start), "window_end": at(end), "src_ip": src_ip, "mac": mac}


INCIDENTS = [
    Incident("w0-1-dga", "dga", "10.0.1.14", "f4:8e:38:02:83:59", at("13:40"), at("13:42")),
    Incident("w0-2-port_scan", "port_scan", "10.0.1.20", "6c:4b:90:d7:4b:ba", at("18:33"), at("18:37")),
    Incident("w0-3-dhcp_starvation", "dhcp_starvation", "10.0.2.16", "a4:34:d9:6c:1c:9a", at("20:39"), at("20:41")),
    Incident("w0-4-roaming_laptop", "roaming_laptop", "10.0.2.11", "8c:16:45:ac:ff:36", at("00:00"), at("23:59")),
]


def test_alerts_match_incidents_by_host_and_time():
    scores = score([
        alert("13:40", "13:45", src_ip="10.0.1.14"),          # the DGA host, in time
        alert("13:45", "13:50", mac="f4:8e:38:02:83:59"),      # by MAC, but after the incident: no
        alert("18:30", "18:40", src_ip="10.0.9.9"),            # in time, another host: no
    ], INCIDENTS)
    assert (scores.alerts, scores.true_alerts) == (3, 1)
    assert scores.recall["dga"] == (1, 1) and scores.recall["port_scan"] == (0, 1)
    assert scores.precision == pytest.approx(1 / 3)


def test_an_alert_without_a_host_counts_for_the_incident_it_covers_best():
    scores = score([alert("20:40", "20:45")], INCIDENTS)
    assert scores.true_alerts == 1
    assert scores.recall["dhcp_starvation"] == (1, 1) and "roaming_laptop" not in scores.recall  # not an attack
    on_the_laptop = score([alert("12:00", "12:05", src_ip="10.0.2.11")], INCIDENTS)
    assert on_the_laptop.true_alerts == 0  # an alert on the roaming laptop is a false one
    assert score([], INCIDENTS).precision is None


def test_ground_truth_file_and_time_arguments(tmp_path):
    path = tmp_path / "ground_truth.jsonl"
    path.write_text(json.dumps({"id": "w0-00-dga", "scenario": "dga", "host_ip": "10.0.1.14", "mac": "aa",
                                "start": "2026-11-20T13:40:00.5Z", "end": "2026-11-20T13:41:00Z"}) + "\n\n")
    [incident] = load_ground_truth(path)
    assert incident.start == datetime(2026, 11, 20, 13, 40, 0, 500000, tzinfo=UTC)
    path.write_text('{"scenario": "dga"}\n')
    with pytest.raises(ValueError, match="ground_truth.jsonl:1: not a ground-truth record"):
        load_ground_truth(path)
    assert parse_when("2026-11-20") == datetime(2026, 11, 20, tzinfo=UTC)
    assert parse_when("2026-11-20T08:00:00Z") == datetime(2026, 11, 20, 8, tzinfo=UTC)
    with pytest.raises(ValueError, match="is not a date"):
        parse_when("yesterday")


def test_a_rule_version_from_git():
    rule = rule_at_revision(RULES / "dns" / "dga_nxdomain_burst.sql", "HEAD")
    assert rule.slug == "dga_nxdomain_burst" and rule.path is None
    with pytest.raises(ValueError, match="at git revision 'no-such-rev'"):
        rule_at_revision(RULES / "dns" / "dga_nxdomain_burst.sql", "no-such-rev")


def run_cli(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    return args.func(args)


def test_rules_list_and_validate_commands(tmp_path, capsys):
    assert run_cli("rules", "list", "--rules", str(RULES)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("dns_exfiltration ") for line in listed)
    assert len({line.index(" v") for line in listed}) == 1, "the version column moves with the slug's length"
    assert run_cli("rules", "validate", str(RULES)) == 0
    (tmp_path / "bad.sql").write_text("/* id: x */ SELECT 1")
    assert run_cli("rules", "validate", str(RULES / "dns" / "dns_tunneling.sql"), str(tmp_path / "bad.sql")) == 1
    out = capsys.readouterr().out
    assert "ok      " in out and "INVALID " in out and "bad.sql: unknown metadata field" not in out
    assert "bad.sql: metadata field(s)" in out
    # A file validated alone is also checked against the pack it joins: a copy that kept its id.
    shutil.copy(RULES / "dns" / "dns_tunneling.sql", tmp_path / "my_tunnel.sql")
    assert run_cli("rules", "validate", str(tmp_path / "my_tunnel.sql"), "--rules", str(RULES)) == 1
    out = capsys.readouterr().out
    assert f"INVALID {tmp_path / 'my_tunnel.sql'}: duplicate id " in out and "dns_tunneling.sql: give this rule" in out
    # A draft of the rule's next version, outside the pack under the rule's own name: a new text of it.
    draft = tmp_path / "drafts" / "dns_tunneling.sql"
    draft.parent.mkdir()
    draft.write_text((RULES / "dns" / "dns_tunneling.sql").read_text().replace("version: 2", "version: 3"))
    assert run_cli("rules", "validate", str(draft), "--rules", str(RULES)) == 0
    out = capsys.readouterr().out
    assert f"ok      {draft} (dns_tunneling v3, high, a new text of {RULES / 'dns' / 'dns_tunneling.sql'})" in out, out
    # A stale draft (an older version), and an edit of the logic under the pack's version, would not deploy.
    deployed = (RULES / "dns" / "dns_tunneling.sql").read_text()
    draft.write_text(deployed.replace("version: 2", "version: 1"))
    assert run_cli("rules", "validate", str(draft), "--rules", str(RULES)) == 1
    assert f"INVALID {draft}: v1 is older than v2 of {RULES / 'dns' / 'dns_tunneling.sql'}" in capsys.readouterr().out
    assert "WHERE longest_label >= 30 " in deployed
    draft.write_text(deployed.replace("WHERE longest_label >= 30 ", "WHERE longest_label >= 40 "))
    assert run_cli("rules", "validate", str(draft), "--rules", str(RULES)) == 1
    assert "under the same v2: bump `version`" in capsys.readouterr().out


def test_report_prints_aligned_tables():
    alerts = [dict(alert("13:40", "13:50", "10.0.1.14", "f4:8e:38:02:83:59"), device="laptop-with-a-long-name",
                   owner="ana", evidence="x") for _ in range(2)]
    alerts.append(dict(alert("18:30", "18:40", "10.0.1.20", None), device=None, owner=None, evidence="y"))
    result = Backtest(validate_rule(RULES / "dns" / "dga_nxdomain_burst.sql"), None, None, alerts,
                      scores=score(alerts, INCIDENTS[:3]))
    lines = result.lines()
    assert lines[0] == f"dga_nxdomain_burst v{result.rule.version} (medium) over all history: 3 alerts"
    table = next(block for block in lines if block.startswith("src_ip")).splitlines()
    assert table[0].split() == ["src_ip", "mac", "device", "owner", "alerts"]
    assert table[2].split() == ["10.0.1.14", "f4:8e:38:02:83:59", "laptop-with-a-long-name", "ana", "2"]
    assert table[3].split() == ["10.0.1.20", "-", "-", "-", "1"]
    assert len(table[2]) == len(table[3])  # counts end in the same column
    assert any(line.split() == ["dga", "1", "1"] for block in lines for line in block.splitlines())
    assert lines[-1] == "not hit (1 of the ground truth's 3 scenarios): dhcp_starvation"


def test_a_span_and_an_empty_ground_truth_are_said_as_they_are():
    alerts = [dict(alert("13:40", "13:50", "10.0.1.14", None), device=None, owner=None, evidence="x")]
    rule = validate_rule(RULES / "dns" / "dga_nxdomain_burst.sql")
    since = datetime(2026, 11, 20, tzinfo=timezone.utc)
    lines = Backtest(rule, since, None, alerts, scores=score(alerts, [])).lines()
    assert lines[0].endswith("over 2026-11-20 00:00:00 .. the last event: 1 alerts"), lines[0]
    assert lines[-1] == "ground truth: it holds no incident, so nothing is scored"  # not "precision 0.0%"


def test_the_headline_counts_what_each_suppression_removes():
    when = datetime(2026, 11, 20, 10, tzinfo=timezone.utc)
    alerts = [{"window_start": when, "window_end": when, "src_ip": f"10.0.0.{n}", "mac": None, "device": None,
               "owner": None, "evidence": "x", "suppressed_by": by} for n, by in enumerate(["s1", "s1", "s2", None])]
    headline = Backtest(validate_rule(RULES / "dns" / "dga_nxdomain_burst.sql"), None, None, alerts).lines()[0]
    assert headline.endswith(": 4 alerts (3 suppressed: 2 by s1, 1 by s2)"), headline


def test_rules_status_without_spark_shows_unrun_rules_and_the_packs_verdict(tmp_path, capsys):
    import os

    from pipelines.home import Home

    home = Home.resolve(tmp_path / "home").create()
    shutil.copytree(RULES, tmp_path / "rules")
    copy = tmp_path / "rules" / "dns" / "a_copy.sql"
    shutil.copy(RULES / "dns" / "dns_tunneling.sql", copy)
    os.utime(copy, (2e9, 2e9))  # the newer file
    # A newer copy under the same file name in another folder: it took the deployed rule's line (invalid).
    (tmp_path / "rules" / "drafts").mkdir()
    shutil.copy(RULES / "dns" / "dns_tunneling.sql", tmp_path / "rules" / "drafts" / "dns_tunneling.sql")
    os.utime(tmp_path / "rules" / "drafts" / "dns_tunneling.sql", (2e9, 2e9))
    assert run_cli("rules", "status", "--home", str(home.root), "--rules", str(tmp_path / "rules")) == 1
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["a_copy"].split()[1] == "invalid:" and "duplicate id" in lines["a_copy"]
    assert lines["drafts/dns_tunneling"].split()[1] == "invalid:", lines
    # Every state starts in one column, after the longest rule name.
    assert len({len(line) - len(line.split(None, 1)[1]) for line in lines.values()}) == 1, list(lines.values())
    version = validate_rule(RULES / "dns" / "dns_tunneling.sql").version
    assert lines["dns_tunneling"].split(None, 1)[1] == f"ok (v{version} not run yet)"


def test_backtest_write_is_refused_before_spark_while_a_rollback_waits_to_be_finished(tmp_path, capsys):
    from pipelines.cli import main
    from pipelines.operations.running import PENDING

    home = tmp_path / "home"
    (home / "tables").mkdir(parents=True)
    (home / PENDING).write_text(json.dumps({"command": "seclake rollback alerts --to-version 3"}))
    assert main(["rules", "backtest", "dns_tunneling", "--write", "--home", str(home)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"a rollback was interrupted on {home}: `seclake rollback alerts --to-version 3` "
                            "finishes it; then add dns_tunneling's missing alerts"), err


def test_a_backtest_range_that_ends_before_it_starts_is_refused_as_typed_before_spark(tmp_path, capsys):
    from pipelines.cli import main

    home = tmp_path / "home"
    (home / "tables").mkdir(parents=True)  # no rule table: Spark would be needed only past the check
    assert main(["rules", "backtest", "dns_tunneling", "--from", "2026-11-21", "--to", "2026-11-20",
                 "--home", str(home)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--from 2026-11-21 must be before --to 2026-11-20")


def test_backtest_on_a_home_without_the_rules_tables_says_so_before_spark(tmp_path, capsys):
    from pipelines.cli import main

    home = tmp_path / "home"
    (home / "tables").mkdir(parents=True)
    assert main(["rules", "backtest", "dns_tunneling", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert f"no table(s) ['enriched_dns'] under {home}/tables: run the pipeline first" in err
    assert "Spark started" not in err  # said before the JVM's ~10 s start
