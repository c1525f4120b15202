"""The sample-data generator: determinism, exact manifest counts, ground truth, atomic files.

No Spark here: the logs are read back with the standard library only.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from sample_data import generator as gen
from sample_data.community_id import community_id_v1
from sample_data.scenarios import SCENARIOS
from sample_data.sensors import DNS_FIELDS

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "sample"
SAMPLE_ARGS = dict(hours=2, hosts=20, seed=7, start="2026-11-20T08:00:00Z")

ZEEK_NAME = re.compile(r"^(conn|dns|dhcp)\.(\d{4}-\d{2}-\d{2}-\d{2})-00-00\.log$")
EVE_NAME = re.compile(r"^eve\.(\d{4}-\d{2}-\d{2}-\d{2})\.json$")
EVE_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+0000$")


# --- reading the output back -------------------------------------------------------------------

def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def parse_line(raw: bytes, tsv_fields: list[str] | None):
    """A data line -> dict, or None when it is not a valid event."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if tsv_fields is not None:
        vals = text.split("\t")
        if len(vals) != len(tsv_fields):
            return None
        return dict(zip(tsv_fields, vals))
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def read_output(root: Path) -> dict:
    """Every data line of every landing file, classified like an ETL would."""
    counts = {key: defaultdict(Counter) for key in ("good", "dup", "bad", "lines")}
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    uids: set[str] = set()
    flow_ids: set[str] = set()
    bad_per_file: dict[str, int] = {}
    for sensor in ("zeek", "suricata"):
        for path in sorted((root / "landing" / sensor).iterdir()):
            assert not path.name.startswith("."), f"temp file left behind: {path}"
            data = path.read_bytes()
            fields = None
            lines = data.split(b"\n")
            assert lines[-1] == b"", f"{path.name} does not end with a newline"
            lines = lines[:-1]
            if sensor == "zeek" and data.startswith(b"#separator"):
                fields = next(line for line in lines if line.startswith(b"#fields")).decode().split("\t")[1:]
                assert lines[-1].startswith(b"#close\t"), f"{path.name} has no #close"
            seen: set[bytes] = set()
            nbad = 0
            for raw in lines:
                if sensor == "zeek" and raw.startswith(b"#"):
                    continue
                obj = parse_line(raw, fields)
                if obj is None:
                    nbad += 1
                    continue
                if sensor == "zeek":
                    kind = path.name.split(".")[0]
                    if fields is None:
                        assert isinstance(obj["ts"], float), obj
                else:
                    kind = obj["event_type"]
                    assert EVE_TS.match(obj["timestamp"]), obj["timestamp"]
                counts["lines"][sensor][kind] += 1
                if raw in seen:
                    counts["dup"][sensor][kind] += 1
                    continue
                seen.add(raw)
                counts["good"][sensor][kind] += 1
                rows[(sensor, kind)].append(obj)
                if sensor == "zeek":
                    if "uid" in obj:
                        uids.add(obj["uid"])
                    if "uids" in obj:
                        u = obj["uids"]
                        uids.update(u if isinstance(u, list) else u.split(","))
                else:
                    flow_ids.add(str(obj["flow_id"]))
            bad_per_file[f"landing/{sensor}/{path.name}"] = nbad
            counts["bad"][sensor]["_total"] += nbad
    return {"counts": counts, "rows": rows, "uids": uids, "flow_ids": flow_ids, "bad_per_file": bad_per_file}


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    """The acceptance-criteria run: 2 h, 50 hosts, seed 7, with enough mess to count."""
    out = tmp_path_factory.mktemp("gen") / "a"
    manifest = gen.generate(out, hours=2, hosts=50, seed=7, malformed_rate=0.003, duplicate_rate=0.005,
                            late_rate=0.2, out_of_order_rate=0.005)
    return out, manifest, read_output(out)


# --- tests -----------------------------------------------------------------------------------

def test_community_id_matches_spec_vectors():
    assert community_id_v1("1.2.3.4", "5.6.7.8", 1122, 3344, 6) == "1:wCb3OG7yAFWelaUydu0D+125CLM="
    assert community_id_v1("1.2.3.4", "5.6.7.8", 1122, 3344, 17) == "1:0Mu9InQx6z4ZiCZM/7HXi2WMhOg="
    # the Zeek documentation's DHCP example
    assert community_id_v1("192.168.1.102", "192.168.1.1", 68, 67, 17) == "1:aWZfLIquYlCxKGuJ62fQGlgFzAI="
    assert community_id_v1("5.6.7.8", "1.2.3.4", 3344, 1122, 6) == community_id_v1("1.2.3.4", "5.6.7.8", 1122, 3344, 6)


def test_same_seed_gives_byte_identical_trees(day, tmp_path):
    out, _, _ = day
    again = tmp_path / "b"
    gen.generate(again, hours=2, hosts=50, seed=7, malformed_rate=0.003, duplicate_rate=0.005,
                 late_rate=0.2, out_of_order_rate=0.005, workers=1)   # serial vs parallel too
    assert tree_hashes(out) == tree_hashes(again)
    other = tmp_path / "c"
    gen.generate(other, hours=2, hosts=50, seed=8)
    assert tree_hashes(out)["ground_truth.jsonl"] != tree_hashes(other)["ground_truth.jsonl"]


def test_layout_and_names(day):
    out, manifest, _ = day
    assert (out / "reference" / "devices.csv").is_file()
    zeek = sorted(p.name for p in (out / "landing" / "zeek").iterdir())
    eve = sorted(p.name for p in (out / "landing" / "suricata").iterdir())
    assert all(ZEEK_NAME.match(n) for n in zeek), zeek
    assert all(EVE_NAME.match(n) for n in eve), eve
    assert len(zeek) == 3 * 2 and len(eve) == 2
    assert eve == ["eve.2026-11-20-00.json", "eve.2026-11-20-01.json"]
    head = (out / "landing" / "zeek" / "dns.2026-11-20-01-00-00.log").read_text().splitlines()
    assert head[:5] == ["#separator \\x09", "#set_separator\t,", "#empty_field\t(empty)", "#unset_field\t-",
                        "#path\tdns"]
    assert head[5] == "#open\t2026-11-20-01-00-00" and head[-1] == "#close\t2026-11-20-02-00-00"
    assert head[6].split("\t")[1:] == list(DNS_FIELDS)
    conn = (out / "landing" / "zeek" / "conn.2026-11-20-00-00-00.log").read_text().splitlines()
    fields = conn[6].split("\t")[1:]
    for f in ("uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "service", "duration",
              "orig_bytes", "resp_bytes", "conn_state", "missed_bytes", "history", "orig_pkts", "orig_ip_bytes",
              "resp_pkts", "resp_ip_bytes", "tunnel_parents", "community_id"):
        assert f in fields
    dhcp = (out / "landing" / "zeek" / "dhcp.2026-11-20-00-00-00.log").read_text().splitlines()
    assert dhcp[6].split("\t")[1:] == ["ts", "uids", "client_addr", "server_addr", "mac", "host_name",
                                       "client_fqdn", "domain", "requested_addr", "assigned_addr", "lease_time",
                                       "client_message", "server_message", "msg_types", "duration"]
    with open(out / "reference" / "devices.csv") as f:
        inv = list(csv.DictReader(f))
    assert len(inv) == 50
    assert {"mac", "device", "owner", "device_type", "first_seen"} <= set(inv[0])
    assert manifest["params"]["start"] == "2026-11-20T00:00:00.000000Z"


def test_manifest_counts_equal_lines_in_files(day):
    out, manifest, got = day
    assert json.loads((out / "manifest.json").read_text()) == manifest
    c = got["counts"]
    for sensor, kinds in manifest["events"].items():
        for kind in kinds:
            assert c["good"][sensor][kind] == manifest["events"][sensor][kind], (sensor, kind)
            assert c["dup"][sensor][kind] == manifest["duplicates"][sensor][kind], (sensor, kind)
            assert manifest["lines"][sensor][kind] == (manifest["events"][sensor][kind]
                                                       + manifest["duplicates"][sensor][kind]
                                                       + manifest["malformed"][sensor][kind])
        assert c["bad"][sensor]["_total"] == sum(manifest["malformed"][sensor].values()), sensor
    for entry in manifest["files"]:
        assert got["bad_per_file"][entry["path"]] == sum(entry["malformed"].values()), entry["path"]
    # every kind is present, and the mess is there to be found
    assert all(v > 0 for s in manifest["events"].values() for v in s.values())
    assert manifest["totals"]["duplicates"] > 0 and manifest["totals"]["malformed"] > 0
    assert sum(sum(s.values()) for s in manifest["out_of_order"].values()) > 0
    total_data_lines = sum(sum(s.values()) for s in manifest["lines"].values())
    assert total_data_lines == manifest["totals"]["lines"]


def test_duplicates_are_near_their_original(day):
    out, manifest, _ = day
    found = 0
    for path in (out / "landing" / "suricata").iterdir():
        lines = path.read_bytes().split(b"\n")
        first: dict[bytes, int] = {}
        for i, raw in enumerate(lines):
            if raw in first and raw:
                found += 1
                a = json.loads(lines[first[raw]])["timestamp"]
                assert i - first[raw] <= 8
                b = json.loads(raw)["timestamp"]
                assert a == b
            else:
                first[raw] = i
    assert found == sum(manifest["duplicates"]["suricata"].values()) > 0  # each duplicate looked at


def test_late_files_arrive_after_the_next_hour(day):
    out, manifest, _ = day
    late = [f for f in manifest["files"] if f["late"]]
    assert late and manifest["totals"]["late_files"] == len(late)
    order = [f["path"] for f in manifest["files"]]   # delivery order
    for f in late:
        nxt = next(g for g in manifest["files"] if g["sensor"] == f["sensor"] and g["kind"] == f["kind"]
                   and g["hour"] > f["hour"])
        assert order.index(f["path"]) > order.index(nxt["path"])
        assert (out / f["path"]).stat().st_mtime_ns > (out / nxt["path"]).stat().st_mtime_ns
        assert f["delivered_at"] > nxt["delivered_at"]
    s = manifest["late"]
    assert sum(sum(v.values()) for v in s.values()) == sum(sum(f["events"].values()) for f in late)


def test_every_scenario_has_ground_truth_with_existing_ids(day):
    out, manifest, got = day
    records = [json.loads(line) for line in (out / "ground_truth.jsonl").read_text().splitlines()]
    assert sorted(r["scenario"] for r in records) == sorted(SCENARIOS)
    assert manifest["scenarios"] == {s: 1 for s in SCENARIOS}
    lo, hi = manifest["params"]["start"], manifest["params"]["end"]
    for r in records:
        for key in ("scenario", "host_ip", "mac", "start", "end", "event_ids"):
            assert r[key], (r["scenario"], key)
        assert re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", r["mac"])
        assert lo <= r["start"] <= r["end"] <= hi, r["scenario"]
        datetime.fromisoformat(r["start"].replace("Z", "+00:00"))
        missing = [i for i in r["event_ids"] if i not in got["uids"] and i not in got["flow_ids"]]
        assert not missing, (r["scenario"], missing[:5])
        assert set(r["zeek_uids"]) <= got["uids"] and {str(f) for f in r["suricata_flow_ids"]} <= got["flow_ids"]
        assert r["zeek_uids"] and r["suricata_flow_ids"], r["scenario"]


def _leases(rows) -> list[tuple[float, str, str]]:
    out = []
    for r in rows[("zeek", "dhcp")]:
        if r["assigned_addr"] != "-" and "ACK" in r["msg_types"]:
            out.append((float(r["ts"]), r["assigned_addr"], r["mac"]))
    return sorted(out)


def test_reused_ip_alert_follows_the_lease_not_the_last_owner(day):
    out, _, got = day
    rec = next(json.loads(line) for line in (out / "ground_truth.jsonl").read_text().splitlines()
               if '"ids_alert_reused_ip"' in line)
    alert_ts = datetime.fromisoformat(rec["details"]["alert_time"].replace("Z", "+00:00")).timestamp()
    alerts = [a for a in got["rows"][("suricata", "alert")] if str(a["flow_id"]) in rec["event_ids"]]
    assert alerts and alerts[0]["alert"]["severity"] == 1 and alerts[0]["src_ip"] == rec["host_ip"]
    acks = [(t, mac) for t, ip, mac in _leases(got["rows"]) if ip == rec["host_ip"]]
    holder_then = [mac for t, mac in acks if t <= alert_ts][-1]
    holder_last = acks[-1][1]
    assert holder_then == rec["mac"]
    assert holder_last != rec["mac"] and holder_last == rec["details"]["ip_later_held_by"]


def test_roaming_laptop_and_new_device(day):
    out, _, got = day
    recs = {json.loads(line)["scenario"]: json.loads(line)
            for line in (out / "ground_truth.jsonl").read_text().splitlines()}
    roam = recs["roaming_laptop"]
    ips = {ip for _, ip, mac in _leases(got["rows"]) if mac == roam["mac"]}
    assert len(ips) >= 2 and roam["details"]["distinct_ips"] == len(ips)
    new = recs["new_device"]
    inventory = (out / "reference" / "devices.csv").read_text()
    assert new["mac"] not in inventory and not new["in_inventory"]
    assert any(mac == new["mac"] for _, _, mac in _leases(got["rows"]))


def test_scenario_signals(day):
    """The thresholds docs/sample-data.md promises to detection-rule authors."""
    out, _, got = day
    recs = {json.loads(line)["scenario"]: json.loads(line)
            for line in (out / "ground_truth.jsonl").read_text().splitlines()}
    dns = got["rows"][("zeek", "dns")]
    ex = recs["dns_exfiltration"]
    q = [r for r in dns if r["id.orig_h"] == ex["host_ip"] and r["query"].endswith("." + ex["details"]["apex"])]
    assert len(q) == 320 and all(len(r["query"]) > 100 for r in q)
    tun = recs["dns_tunneling"]
    q = [r for r in dns if r["query"].endswith("." + tun["details"]["domain"])]
    assert len(q) >= 230 and {r["qtype_name"] for r in q} == {"TXT", "NULL"}
    dga = recs["dga"]
    nx = [r for r in dns if r["id.orig_h"] == dga["host_ip"] and r["rcode_name"] == "NXDOMAIN"
          and r["uid"] in set(dga["event_ids"])]
    assert len(nx) == 3 * 45 - 1
    scan = recs["port_scan"]
    conns = [r for r in got["rows"][("zeek", "conn")] if r["uid"] in set(scan["event_ids"])]
    assert len({r["id.resp_h"] for r in conns}) >= 20 and len({r["id.resp_p"] for r in conns}) >= 40
    assert sum(r["conn_state"] in ("REJ", "S0") for r in conns) > 0.8 * len(conns)
    c2 = recs["c2_beaconing"]
    ts = sorted(float(r["ts"]) for r in got["rows"][("zeek", "conn")]
                if r["uid"] in set(c2["event_ids"]) and r["id.resp_h"] == c2["details"]["c2_ip"])
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert len(ts) >= 55 and all(57 <= g <= 63 for g in gaps)
    st = recs["dhcp_starvation"]
    spoof = [r for r in got["rows"][("zeek", "dhcp")] if r["uids"].split(",")[0] in set(st["event_ids"])]
    assert len({r["mac"] for r in spoof}) == 150


def test_zeek_json_format(tmp_path):
    out = tmp_path / "j"
    m = gen.generate(out, hours=0.5, hosts=8, seed=3, zeek_format="json")
    got = read_output(out)
    assert got["counts"]["good"]["zeek"]["conn"] == m["events"]["zeek"]["conn"]
    line = (out / "landing" / "zeek" / "conn.2026-11-20-00-00-00.log").read_text().splitlines()[0]
    obj = json.loads(line)
    assert isinstance(obj["ts"], float) and "id.orig_h" in obj and "community_id" in obj
    dhcp = (out / "landing" / "zeek" / "dhcp.2026-11-20-00-00-00.log").read_text().splitlines()
    assert all(isinstance(json.loads(line)["msg_types"], list)
               for line in dhcp if line.startswith("{") and line.endswith("}"))


def test_no_final_name_is_ever_partial(tmp_path, monkeypatch):
    out = tmp_path / "atomic"
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def checked_replace(src, dst):
        src, dst = Path(src), Path(dst)
        assert src.name.startswith(".") and src.name.endswith(".tmp") and src.parent == dst.parent
        assert src.name == f".{dst.name}.tmp"
        assert src.read_bytes().endswith(b"\n")          # complete before it gets its name
        renames.append((src.name, dst.name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", checked_replace)
    partial: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for p in list(out.rglob("*")) if out.exists() else []:
                if p.is_file() and not p.name.startswith("."):
                    try:
                        data = p.read_bytes()
                    except FileNotFoundError:
                        continue
                    if not data.endswith(b"\n") or (p.suffix == ".log" and data.startswith(b"#sep")
                                                     and b"\n#close\t" not in data):
                        partial.append(p.name)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        gen.generate(out, hours=1, hosts=10, seed=5)
    finally:
        stop.set()
        watcher.join()
    assert not partial
    final = {p.name for p in out.rglob("*") if p.is_file()}
    assert final == {dst for _, dst in renames}
    assert not [p for p in out.rglob(".*")]


@pytest.mark.parametrize("kwargs, bad", [
    ({"hours": -1}, "-1"), ({"hours": 0}, "0"), ({"hosts": 3}, "3"),
    ({"start": "yesterday"}, "yesterday"), ({"zeek_format": "xml"}, "xml"), ({"malformed_rate": 2.0}, "2.0"),
])
def test_invalid_arguments_name_the_bad_value(tmp_path, kwargs, bad):
    with pytest.raises(ValueError, match=re.escape(bad)):
        gen.generate(tmp_path / "x", **{"hours": 1, "hosts": 5, **kwargs})
    assert not (tmp_path / "x").exists()


def test_run_turns_bad_arguments_into_exit_code_2(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    gen.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "x"), "--hours", "-2"])
    assert gen.run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-2" in err[0]
    # --home, as every other command names the folder, is the same as --out.
    assert parser.parse_args(["--home", str(tmp_path / "h")]).out == str(tmp_path / "h")


def test_without_out_the_home_is_written_as_every_command_finds_it(tmp_path, monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    gen.add_arguments(parser)
    monkeypatch.setenv("SECLAKE_HOME", str(tmp_path / "env-home"))
    assert gen.run(parser.parse_args(["--hours", "0.2", "--hosts", "5"])) == 0
    assert (tmp_path / "env-home" / "manifest.json").is_file()
    assert str(tmp_path / "env-home") in capsys.readouterr().err


def test_refuses_to_mix_with_a_previous_output(tmp_path):
    gen.generate(tmp_path, hours=0.2, hosts=5, seed=1)
    with pytest.raises(ValueError, match="already holds"):
        gen.generate(tmp_path, hours=0.2, hosts=5, seed=1)
    gen.generate(tmp_path, hours=0.2, hosts=5, seed=2, overwrite=True)


def test_short_window_and_few_hosts_still_hold_every_scenario(tmp_path):
    m = gen.generate(tmp_path, hours=0.5, hosts=5, seed=11, start="2026-11-21T13:45:00Z")
    assert m["scenarios"] == {s: 1 for s in SCENARIOS}
    names = sorted(p.name for p in (tmp_path / "landing" / "zeek").iterdir())
    assert names[0] == "conn.2026-11-21-13-00-00.log" and len(names) == 6
    head = (tmp_path / "landing" / "zeek" / names[0]).read_text().splitlines()
    assert head[5] == "#open\t2026-11-21-13-45-00"


def test_no_mess_when_rates_are_zero(tmp_path):
    m = gen.generate(tmp_path, hours=1, hosts=10, seed=4, malformed_rate=0, duplicate_rate=0, late_rate=0,
                     out_of_order_rate=0)
    t = m["totals"]
    assert t["duplicates"] == t["malformed"] == t["late_files"] == 0
    assert t["lines"] == t["events"]


def test_committed_sample_is_what_the_generator_makes(tmp_path):
    assert SAMPLE.is_dir(), f"{SAMPLE} is committed: the ETL's and the DHCP clock's tests read it"
    gen.generate(tmp_path, **SAMPLE_ARGS)
    assert tree_hashes(tmp_path) == tree_hashes(SAMPLE)


@pytest.mark.parametrize(("stop", "ctrl_c"), [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                              (signal.SIGTERM, signal.SIG_IGN)],
                         ids=["ctrl_c", "sigterm", "sigterm_started_in_the_background"])
def test_live_mode_stops_cleanly_on_ctrl_c_or_a_service_managers_sigterm(tmp_path, stop, ctrl_c):
    out = tmp_path / "live"
    # Started as from a terminal (Ctrl-C at its default), or as `cmd &` from a script (ignored).
    proc = subprocess.Popen(
        [sys.executable, "-m", "sample_data.generator", "--out", str(out), "--hours", "0.2", "--hosts", "6",
         "--rate", "3000"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, ctrl_c))
    deadline = time.time() + 60
    while time.time() < deadline and len(list((out / "landing" / "suricata").glob("eve.*"))) < 2:
        time.sleep(0.2)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "interrupted" in err and "Traceback" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["files"] == len(list((out / "landing").rglob("*.*")))
    assert not list(out.rglob(".*"))


def test_live_mode_delivers_an_hours_files_together(tmp_path):
    """Sensors rotating on the hour deliver together: Suricata's file paced behind Zeek's made a
    stream take most of its rows for late (docs/attribution.md, "Sensors that share a table")."""
    out = tmp_path / "live"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sample_data.generator", "--out", str(out), "--hours", "1", "--hosts", "6",
         "--rate", "2000", "--late-rate", "0"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(list((out / "landing" / "suricata").glob("eve.*"))) < 3:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    by_hour: dict[str, list[float]] = {}
    for path in (out / "landing").rglob("*.*"):
        hour = re.search(r"\d{4}-\d{2}-\d{2}-\d{2}", path.name).group()
        by_hour.setdefault(hour, []).append(path.stat().st_mtime)
    whole = {h: t for h, t in by_hour.items() if len(t) == 4}
    assert len(whole) >= 3, by_hour
    first = sorted(whole)
    # An hour of 6 hosts is ~4,000 Zeek events: 2 s at 2,000 events/s between its files when paced one by one.
    assert all(max(whole[h]) - min(whole[h]) < 0.5 for h in first), {h: max(t) - min(t) for h, t in whole.items()}
    assert min(whole[first[2]]) - max(whole[first[1]]) > 1.0  # the hours themselves are still paced


def _real_fields(path: Path) -> list[str]:
    import gzip
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("#fields"):
                return line.rstrip("\n").split("\t")[1:]
    raise AssertionError(f"no #fields in {path}")


def test_formats_match_the_real_sensor_logs(real_logs, day):
    """Same headers, field sets and EVE layouts as the captured Zeek and Suricata logs."""
    out, _, got = day
    ours = (out / "landing" / "zeek" / "dhcp.2026-11-20-00-00-00.log").read_text().splitlines()
    with open(real_logs / "zeek-tsv-labeled" / "dhcp.log.labeled") as f:
        real = f.read().splitlines()
    assert ours[:4] == real[:4]                                        # #separator .. #unset_field
    labels = ["label", "detailedlabel"]
    assert ours[6].split("\t")[1:] + labels == real[6].split("\t")[1:]
    assert ours[7].split("\t")[1:] == real[7].split("\t")[1:-2]       # #types
    assert list(DNS_FIELDS) == _real_fields(real_logs / "zeek-tsv" / "dns.log.gz")
    real_conn = _real_fields(real_logs / "zeek-tsv-labeled" / "conn.log.labeled")[:-2]
    our_conn = (out / "landing" / "zeek" / "conn.2026-11-20-00-00-00.log").read_text().splitlines()[6].split("\t")[1:]
    assert our_conn[:len(real_conn)] == real_conn and our_conn[len(real_conn):] == ["ip_proto", "community_id"]
    real_eve: dict[str, dict] = {}
    with open(real_logs / "suricata" / "eve.json") as f:
        for line in f:
            obj = json.loads(line)
            key = obj["event_type"] + ("/" + obj["dns"]["type"] if obj["event_type"] == "dns" else "")
            real_eve.setdefault(key, obj)
    mine: dict[str, dict] = {}
    for (sensor, kind), rows in got["rows"].items():
        if sensor == "suricata":
            for obj in rows:
                key = kind + ("/" + obj["dns"]["type"] if kind == "dns" else "")
                mine.setdefault(key, obj)
    for key in ("alert", "flow", "dns/query", "dns/answer"):
        r, m = real_eve[key], mine[key]
        assert set(r) - {"pcap_cnt"} <= set(m), (key, set(r) - set(m))
        sub = key.split("/")[0]
        assert set(r[sub]) - {"metadata"} <= set(m[sub]), (key, set(r[sub]) - set(m[sub]))
    assert set(real_eve["dns/answer"]["dns"]["answers"][0]) == set(mine["dns/answer"]["dns"]["answers"][0])
    real_dhcp = [json.loads(line) for line in open(real_logs / "zeek-json" / "dhcp.log")]
    keys = set().union(*real_dhcp)
    assert keys <= set(ours[6].split("\t")[1:])


def test_a_beacons_connections_never_share_a_source_port(tmp_path):
    # Seed 9 drew one port twice a minute apart: two beacons with one 5-tuple, so one community_id,
    # and c2_beaconing counted 29 connections with a 2-minute gap instead of 30 (it missed the scenario).
    gen.generate(tmp_path, hours=1, hosts=15, seed=9)
    truth = [json.loads(line) for line in (tmp_path / "ground_truth.jsonl").read_text().splitlines()]
    uids = set(next(t for t in truth if t["scenario"] == "c2_beaconing")["zeek_uids"])
    ports = {}
    for path in (tmp_path / "landing" / "zeek").glob("conn*"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if not line.startswith("#") and fields[1] in uids:
                ports[fields[1]] = fields[3]
    assert len(ports) == len(uids) >= 20 and len(set(ports.values())) == len(ports)
