"""Parsers: whole files -> data lines -> bronze, quarantine and silver rows.

Real logs (../shared/real-logs), a hand-written malformed corpus, the sample generator's
output and Community ID vectors from a pure-Python reference of the spec. Every parse of a
file set runs once per session (cached DataFrames) to keep the suite short.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
import json
import struct
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.parsers import PARSED_COLUMNS, parse, split_lines, to_bronze, to_quarantine, to_silver
from pipelines.parsers.common import MAX_LINE_BYTES
from pipelines.parsers.community_id import with_community_id
from pipelines.parsers.zeek import OLD_DHCP
from pipelines.schemas import BRONZE_SCHEMA, QUARANTINE_SCHEMA, SILVER_SCHEMAS

ROOT = Path(__file__).resolve().parents[1]
REAL_ZEEK = ["zeek-tsv/dns.log.gz", "zeek-json/dns.json.gz", "zeek-json/dhcp.log",
             "zeek-tsv-labeled/conn.log.labeled", "zeek-tsv-labeled/dns.log.labeled",
             "zeek-tsv-labeled/dhcp.log.labeled"]
REAL_EVE = ["suricata/eve.json"]


# --- helpers ---------------------------------------------------------------------------------

def read_files(spark, paths: list[Path]) -> DataFrame:
    """Whole files exactly as the ETL reads them (text source, wholetext, file path from _metadata)."""
    return (spark.read.schema("value STRING").format("text").option("wholetext", True)
            .load([str(p) for p in paths])
            .select(F.col("_metadata.file_path").alias("file"), F.col("value").alias("text")))


def data_lines(path: Path, source: str) -> int:
    """Data lines counted independently of Spark: physical lines, minus the empty string after a final
    newline, minus Zeek '#' header lines."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    data = data.removeprefix("\ufeff".encode())  # a byte-order mark is not part of the first line
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return sum(1 for line in lines if not (source == "zeek" and line.startswith(b"#")))


_PARSED: dict[tuple, DataFrame] = {}


def parsed_files(spark, source: str, paths: list[Path]) -> DataFrame:
    """parse(split_lines(...)) of these files, computed once per session."""
    key = (source, tuple(map(str, paths)))
    if key not in _PARSED:
        _PARSED[key] = parse(split_lines(read_files(spark, paths), source), source).cache()
    return _PARSED[key]


def by_line(parsed: DataFrame, *columns: str) -> dict[tuple[str, int], object]:
    """{(file name, line number): row} for the given columns."""
    rows = parsed.select(F.regexp_extract("file", r"([^/]*)$", 1).alias("name"), "line_number", *columns).collect()
    return {(r["name"], r["line_number"]): r for r in rows}


def micros(iso: str) -> int:
    return int(datetime.fromisoformat(iso).astimezone(timezone.utc).timestamp() * 1_000_000)


def write(path: Path, lines: list[str | bytes], end: bytes = b"\n") -> Path:
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + end)
    return path


# --- Community ID: a pure-Python reference of the spec ----------------------------------------

REF_ICMP4 = {0: 8, 8: 0, 9: 10, 10: 9, 13: 14, 14: 13, 15: 16, 16: 15, 17: 18, 18: 17}
REF_ICMP6 = {128: 129, 129: 128, 130: 131, 131: 130, 133: 134, 134: 133, 135: 136, 136: 135,
             139: 140, 140: 139, 144: 145, 145: 144}


def community_id_ref(saddr: str, daddr: str, sport: int | None, dport: int | None, proto: str) -> str:
    """Community ID v1, seed 0, per https://github.com/corelight/community-id-spec."""
    src, dst = ipaddress.ip_address(saddr), ipaddress.ip_address(daddr)
    v6 = src.version == 6
    number = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 58 if v6 else 1}.get(proto) or int(proto)
    has_ports = proto in ("tcp", "udp", "sctp", "icmp")
    one_way = False
    if proto == "icmp":
        counterpart = (REF_ICMP6 if v6 else REF_ICMP4).get(sport)
        if counterpart is None:
            one_way = True
        else:
            dport = counterpart
    s, d = src.packed, dst.packed
    if has_ports and not (one_way or s < d or (s == d and sport < dport)):
        s, d, sport, dport = d, s, dport, sport
    elif not has_ports and not s < d:
        s, d = d, s
    data = struct.pack("!H", 0) + s + d + struct.pack("!BB", number, 0)
    if has_ports:
        data += struct.pack("!HH", sport, dport)
    return "1:" + base64.b64encode(hashlib.sha1(data).digest()).decode()


# Published by the spec's reference implementation (pycommunityid tests): they check the
# Python reference above, which then checks the Spark expressions on many more tuples.
PUBLISHED = [
    ("128.232.110.120", "66.35.250.204", 34855, 80, "tcp", "1:LQU9qZlK+B5F3KDmev6m5PMibrg="),
    ("192.168.1.52", "8.8.8.8", 54585, 53, "udp", "1:d/FP5EW3wiY1vCndhwleRRKHowQ="),
    ("192.168.0.89", "192.168.0.1", 8, 0, "icmp", "1:X0snYXpgwiv9TZtqg64sgzUn6Dk="),
    ("fe80::200:86ff:fe05:80da", "fe80::260:97ff:fe07:69ea", 135, 0, "icmp", "1:dGHyGvjMfljg6Bppwm3bg0LO8TY="),
    ("2001:470:e5bf:dead:4957:2174:e82c:4887", "2607:f8b0:400c:c03::1a", 63943, 25, "tcp",
     "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4="),
]

VECTOR_TUPLES = [
    ("10.0.0.1", "10.0.0.2", 51234, 443, "tcp"),
    ("192.168.1.107", "66.63.168.35", 65164, 5888, "tcp"),
    ("10.47.1.100", "10.0.0.100", 41772, 53, "udp"),
    ("10.0.0.5", "10.0.0.5", 1000, 2000, "udp"),
    ("192.168.170.8", "192.168.170.56", 7, 80, "sctp"),
    ("192.168.0.89", "192.168.0.1", 8, 0, "icmp"),       # echo request
    ("192.168.0.1", "192.168.0.89", 0, 8, "icmp"),       # its reply
    ("10.0.0.1", "10.0.0.2", 3, 1, "icmp"),              # unreachable: one way, code hashed
    ("10.0.0.1", "10.0.0.2", 11, 0, "icmp"),
    ("fe80::200:86ff:fe05:80da", "fe80::260:97ff:fe07:69ea", 135, 0, "icmp"),
    ("2001:db8::1", "2001:db8::2", 128, 0, "icmp"),
    ("2001:db8::1", "2001:db8::2", 1, 4, "icmp"),
    ("2001:db8::ff00:42:8329", "::ffff:10.0.0.1", 40000, 22, "tcp"),
    ("fe80:0000:0000:0000:0a00:27ff:fe5e:9aa6", "ff02::fb", 5353, 5353, "udp"),
    ("10.1.24.4", "10.1.12.1", None, None, "46"),        # port-less protocol
]


def test_community_id_reference_matches_published_vectors():
    for saddr, daddr, sport, dport, proto, expected in PUBLISHED:
        assert community_id_ref(saddr, daddr, sport, dport, proto) == expected


def reverse(s: str, d: str, sp: int | None, dp: int | None, p: str) -> tuple | None:
    """The same flow seen from the other end; for ICMP the reply type (None when the type has none)."""
    if p != "icmp":
        return d, s, dp, sp, p
    counterpart = (REF_ICMP6 if ":" in s else REF_ICMP4).get(sp)
    return None if counterpart is None else (d, s, counterpart, dp, p)


def test_community_id_spark_matches_reference_both_directions(spark):
    rows = [*VECTOR_TUPLES, *filter(None, (reverse(*t) for t in VECTOR_TUPLES))]
    rows += [("10.0.0.1", "not-an-ip", 1, 2, "tcp"), ("10.0.0.1", "10.0.0.2", None, 80, "tcp"),
             ("10.0.0.1", "2001:db8::1", 1, 2, "tcp"), ("10.0.0.1", "10.0.0.2", 70000, 80, "tcp")]
    df = spark.createDataFrame(rows, "s string, d string, sp int, dp int, p string")
    got = {(r.s, r.d, r.sp, r.dp, r.p): r.cid
           for r in with_community_id(df, "cid", "s", "d", "sp", "dp", "p").collect()}
    for flow in VECTOR_TUPLES:
        expected = community_id_ref(*flow)
        assert got[flow] == expected, flow
        if reverse(*flow):
            assert got[reverse(*flow)] == community_id_ref(*reverse(*flow)) == expected, ("reverse", flow)
    assert got[("10.0.0.1", "not-an-ip", 1, 2, "tcp")] is None
    assert got[("10.0.0.1", "10.0.0.2", None, 80, "tcp")] is None
    assert got[("10.0.0.1", "2001:db8::1", 1, 2, "tcp")] is None
    assert got[("10.0.0.1", "10.0.0.2", 70000, 80, "tcp")] is None


# --- real logs -----------------------------------------------------------------------------------

@pytest.fixture
def real(spark, real_logs) -> dict[str, DataFrame]:
    """The real logs parsed per source; the Zeek files (TSV and JSON mixed) in one DataFrame."""
    return {"zeek": parsed_files(spark, "zeek", [real_logs / p for p in REAL_ZEEK]),
            "suricata": parsed_files(spark, "suricata", [real_logs / p for p in REAL_EVE])}


def test_real_logs_every_data_line_is_good_or_quarantined(real, real_logs):
    for source, names in (("zeek", REAL_ZEEK), ("suricata", REAL_EVE)):
        parsed = real[source]
        stats = {r.name: r for r in to_bronze(parsed).groupBy(
            F.regexp_extract("file", r"([^/]*)$", 1).alias("name")).agg(
            F.count("*").alias("lines"), F.count_if("parse_ok").alias("good")).collect()}
        quarantined = {r.name: r.n for r in to_quarantine(parsed).groupBy(
            F.regexp_extract("file", r"([^/]*)$", 1).alias("name")).agg(F.count("*").alias("n")).collect()}
        for name in names:
            expected = data_lines(real_logs / name, source)
            s, bad = stats[Path(name).name], quarantined.get(Path(name).name, 0)
            print(f"{name}: {s.good}/{expected} data lines parsed ({s.good / expected:.2%}), {bad} quarantined")
            assert s.good + bad == expected == s.lines, name
            assert s.good / expected >= 0.99, name


def silver_stats(rows: DataFrame, **checks: str) -> dict[str, int]:
    """One aggregation: the row count and, per check, how many rows match its SQL condition."""
    row = rows.agg(F.count("*").alias("rows"), *[F.count_if(F.expr(cond)).alias(name)
                                                  for name, cond in checks.items()]).first()
    return row.asDict()


def test_real_logs_key_fields_populated(real):
    zeek, eve = real["zeek"], real["suricata"]
    lineage = ("event_time IS NULL OR event_date IS NULL OR event_id IS NULL OR sensor IS NULL "
               "OR source_file IS NULL OR line_number IS NULL")
    flow = "src_ip IS NULL OR dst_ip IS NULL OR proto IS NULL OR community_id IS NULL OR uid IS NULL"
    dns = silver_stats(to_silver(zeek, "silver_dns").unionByName(to_silver(eve, "silver_dns")),
                       lineage=lineage, flow=flow, no_query="query IS NULL")
    # Zeek logs a few query-less rows (responses it could not match); those are the only gaps.
    assert dns["rows"] == 2 * 53615 + 22 + 680 and dns["lineage"] == dns["flow"] == 0
    assert dns["no_query"] < 0.01 * dns["rows"]
    conn = silver_stats(to_silver(zeek, "silver_conn").unionByName(to_silver(eve, "silver_conn")),
                        lineage=lineage, flow=flow, no_bytes="orig_bytes IS NULL")
    # Six Zeek conn rows log orig_bytes as '-' (unset): NULL, not 0.
    assert conn == {"rows": 766 + 3512, "lineage": 0, "flow": 0, "no_bytes": 6}
    dhcp = silver_stats(to_silver(zeek, "silver_dhcp"), lineage=lineage,
                        bad_mac="mac IS NULL OR mac NOT RLIKE '^([0-9a-f]{2}:){5}[0-9a-f]{2}$'",
                        no_uid="uid IS NULL OR size(uids) = 0")
    assert dhcp == {"rows": 517 + 1, "lineage": 0, "bad_mac": 0, "no_uid": 0}
    alerts = silver_stats(to_silver(eve, "silver_ids_alerts"), lineage=lineage, flow=flow,
                          no_signature="signature IS NULL OR signature_id IS NULL OR severity IS NULL",
                          other_sensor="sensor != 'stratosphere.org'")
    assert alerts == {"rows": 745, "lineage": 0, "flow": 0, "no_signature": 0, "other_sensor": 0}
    # Event types without a silver table are good lines that live only in bronze.
    kinds = {r.kind: r.n
             for r in to_bronze(eve).where("parse_ok").groupBy("kind").agg(F.count("*").alias("n")).collect()}
    assert kinds == {"flow": 3512, "alert": 745, "dns": 680, "http": 56, "fileinfo": 3, "anomaly": 3, "tls": 1}


def test_remcos_rat_capture_parses_and_joins(real):
    zeek = real["zeek"].where(F.col("file").endswith(".labeled"))
    dhcp = to_silver(zeek, "silver_dhcp").collect()
    assert [(r.mac, r.assigned_addr, r.hostname, r.lease_time, r.msg_types) for r in dhcp] == [
        ("08:00:27:5e:9a:a6", "192.168.1.107", "NWin3", 600.0, ["REQUEST", "REQUEST", "ACK", "ACK"])]
    conn = to_silver(zeek, "silver_conn")
    first = conn.where("line_number = 9").first()
    assert (first.uid, first.src_port, first.dst_ip, first.dst_port, first.proto, first.conn_state) == (
        "C6SgKom3WB2KEL2ae", 65164, "66.63.168.35", 5888, "tcp", "REJ")
    assert first.community_id == community_id_ref("192.168.1.107", "66.63.168.35", 65164, 5888, "tcp")
    # DHCP joins conn and dns on the leased address: the infected host's MAC on every flow it made.
    leases = to_silver(zeek, "silver_dhcp").select(F.col("assigned_addr").alias("src_ip"), "mac")
    flows = (to_silver(zeek, "silver_conn").select("src_ip", F.lit("conn").alias("t"))
             .unionByName(to_silver(zeek, "silver_dns").select("src_ip", F.lit("dns").alias("t"))))
    joined = {(r.t, r.mac): r.n for r in flows.join(leases, "src_ip", "left").groupBy("t", "mac")
              .agg(F.count("*").alias("n")).collect()}
    assert joined[("dns", "08:00:27:5e:9a:a6")] == 22
    assert joined[("conn", "08:00:27:5e:9a:a6")] > 700
    assert sum(n for (t, _), n in joined.items() if t == "conn") == 766


def test_zeek_tsv_and_json_of_the_same_dns_events_agree(real):
    dns = to_silver(real["zeek"], "silver_dns")
    keys = ["uid", "query", "event_time", "src_ip", "src_port", "dst_ip", "dst_port", "proto", "rcode_name",
            "answers", "ttls", "community_id"]
    tsv = dns.where(F.col("source_file").endswith("dns.log.gz")).select(keys)
    js = dns.where(F.col("source_file").endswith("dns.json.gz")).select(keys)
    # Same multiset of rows both ways (so the same count and the same (uid, query) pairs).
    diff = tsv.exceptAll(js).select(F.lit("only_tsv").alias("side")).unionByName(
        js.exceptAll(tsv).select(F.lit("only_json").alias("side")))
    assert diff.count() == 0
    counts = {r.tsv: r.n for r in dns.where(F.col("source_file").rlike("dns\\.(log|json)\\.gz$"))
              .groupBy(F.col("source_file").endswith(".log.gz").alias("tsv")).agg(F.count("*").alias("n")).collect()}
    assert counts == {True: 53615, False: 53615}


def test_eve_timestamps_with_offsets_become_utc(real):
    first = real["suricata"].where("line_number = 1").select(
        F.unix_micros("event_time").alias("t"), "event_date").first()
    assert first.t == micros("2021-06-06T15:59:46.457984+02:00")
    assert str(first.event_date) == "2021-06-06"


# --- hand-written corpus: every malformation, every format trap --------------------------------

ZEEK_DNS_FIELDS = ("ts uid id.orig_h id.orig_p id.resp_h id.resp_p proto trans_id rtt query qclass qclass_name "
                   "qtype qtype_name rcode rcode_name AA TC RD RA Z answers TTLs rejected").split()
ZEEK_DNS_TYPES = ("time string addr port addr port enum count interval string count string count string count "
                  "string bool bool bool bool count vector[string] vector[interval] bool").split()


def zeek_header(path: str, fields: list[str], types: list[str], sep: str = "\t") -> list[str]:
    return ["#separator " + "".join(f"\\x{ord(c):02x}" for c in sep), f"#set_separator{sep},",
            f"#empty_field{sep}(empty)", f"#unset_field{sep}-", f"#path{sep}{path}", f"#open{sep}2026-11-20-13-00-00",
            f"#fields{sep}" + sep.join(fields), f"#types{sep}" + sep.join(types)]


def dns_values(ts: str = "1763643600.123456", uid: str = "CAbc1", query: str = "example.com",
               orig_p: str = "5353", answers: str = "93.184.216.34,example.net", ttls: str = "60.000000,30.000000"):
    return [ts, uid, "10.0.0.5", orig_p, "10.0.0.1", "53", "udp", "4242", "0.001", query, "1", "C_INTERNET", "1",
            "A", "0", "NOERROR", "F", "F", "T", "T", "0", answers, ttls, "F"]


@pytest.fixture(scope="module")
def corpus(spark, tmp_path_factory) -> dict[str, dict]:
    """Parsed rows of the hand-written corpus, keyed by (file name, line number)."""
    d = tmp_path_factory.mktemp("corpus")
    zeek, eve = d / "zeek", d / "suricata"
    zeek.mkdir()
    eve.mkdir()
    good = "\t".join(dns_values())
    huge = "\t".join(dns_values(query="a" * (MAX_LINE_BYTES + 10)))
    write(zeek / "dns.2026-11-20-13-00-00.log", [
        *zeek_header("dns", ZEEK_DNS_FIELDS, ZEEK_DNS_TYPES),
        good,                                                            # 9
        "\t".join(dns_values()[:22]),                                    # 10 wrong count
        "\t".join(dns_values(query="bad")).encode().replace(b"bad", b"b\xff\xfed"),  # 11 invalid UTF-8
        "\t".join(dns_values(query="nul\x00byte")),                      # 12 NUL
        "",                                                              # 13 empty
        "\t".join(dns_values(ts="abc")),                                 # 14 bad ts
        "\t".join(dns_values(orig_p="99999")),                           # 15 bad port
        huge,                                                            # 16 huge
        "   ",                                                           # 17 blank
        "\t".join(dns_values(ts="1763643600123456")),                    # 18 epoch micros, not seconds
        "\t".join(dns_values(answers="(empty)", ttls="-", query="-")),  # 19 empty set, unset
    ])  # no #close: a file still being written
    # Extra and reordered columns: _node_name first, labels last, query before uid.
    fields = ["_node_name", "ts", "query", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto",
              "trans_id", "rcode_name", "answers", "TTLs", "label"]
    write(zeek / "dns.reordered.log", [
        *zeek_header("dns", fields, ["string"] * len(fields)),
        "\t".join(["sensor-7", "1763643601.5", "reordered.example", "CRe1", "10.0.0.6", "1111", "10.0.0.1", "53",
                   "udp", "7", "NXDOMAIN", "(empty)", "(empty)", "Malicious"]),
        "#close\t2026-11-20-14-00-00",
    ], end=b"")                                                          # no final newline
    # Two logs concatenated: each header block governs the lines below it.
    write(zeek / "conn.concatenated.log", [
        *zeek_header("conn", ["ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto",
                              "orig_bytes", "resp_bytes"], ["time"] + ["string"] * 8),
        "1763643602.0\tCc1\t10.0.0.7\t1234\t10.0.0.8\t80\ttcp\t10\t20",
        "#close\t2026-11-20-14-00-00",
        *zeek_header("dns", ["uid", "ts", "query", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto"],
                     ["string"] * 8, sep="|"),
        "Cd1|1763643603.0|second.block|10.0.0.9|999|10.0.0.1|53|udp",
        "#close|2026-11-20-14-00-00",
    ])
    write(zeek / "conn.icmp.log", [
        *zeek_header("conn", ["ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "duration",
                              "orig_pkts"], ["time"] + ["string"] * 8),
        "1763643604.0\tCi1\t10.0.0.7\t8\t10.0.0.8\t0\ticmp\t1.5\t3",
        "1763643604.5\tCi2\t10.0.0.7\t8\t10.0.0.8\t0\ticmp\t-\tx",      # bad orig_pkts
    ])
    write(zeek / "dhcp.log", [                                           # Zeek < 2.6 schema
        *zeek_header("dhcp", ["ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "mac",
                              "assigned_ip", "lease_time", "trans_id"], ["time"] + ["string"] * 9),
        "1763643605.0\tCo1\t10.0.0.9\t68\t10.0.0.1\t67\t00:11:22:33:44:55\t10.0.0.9\t3600.000000\t42",
    ])
    write(zeek / "dns.noheader.log", ["\t".join(dns_values())])
    write(zeek / "dns.bom.log", ["\ufeff" + zeek_header("dns", ZEEK_DNS_FIELDS, ZEEK_DNS_TYPES)[0],
                                 *zeek_header("dns", ZEEK_DNS_FIELDS, ZEEK_DNS_TYPES)[1:], good])
    # A separator spelled as a byte that is no character: its decoding failed the whole batch.
    write(zeek / "dns.badsep.log", ["#separator \\xff", *zeek_header("dns", ZEEK_DNS_FIELDS, ZEEK_DNS_TYPES)[1:],
                                    good])
    write(zeek / "dns.json", [
        json.dumps({"ts": 1763643606.25, "uid": "CJ1", "id.orig_h": "10.0.0.10", "id.orig_p": 1000,
                    "id.resp_h": "10.0.0.1", "id.resp_p": 53, "proto": "udp", "query": "epoch.example",
                    "answers": ["1.2.3.4"], "TTLs": [30.0]}),
        json.dumps({"_path": "dns", "ts": "2026-11-20T13:00:07.5+01:00", "uid": "CJ2", "id.orig_h": "10.0.0.10",
                    "id.orig_p": 1000, "id.resp_h": "10.0.0.1", "id.resp_p": 53, "proto": "udp",
                    "query": "iso.example"}),
        '{"ts": 1763643606.25, "uid": "CJ3", "query": "trunc',             # 3 truncated
        json.dumps({"ts": "abc", "uid": "CJ4", "id.orig_h": "10.0.0.10", "id.orig_p": 1, "id.resp_h": "10.0.0.1",
                    "id.resp_p": 53, "proto": "udp"}),                    # 4 wrong type
        json.dumps({"uid": "CJ5"}),                                        # 5 no ts
        json.dumps({"ts": 1763643606.0, "uid": "CJ6", "id.orig_h": "10.0.0.10", "id.orig_p": 1,
                    "id.resp_h": "10.0.0.1", "id.resp_p": 53, "proto": "udp", "answers": "1.2.3.4"}),  # 6
        json.dumps({"ts": 1763643606.0, "uid": "CJ7", "id.orig_h": "999.0.0.1", "id.orig_p": 1,
                    "id.resp_h": "10.0.0.1", "id.resp_p": 53, "proto": "udp"}),                        # 7 bad IP
    ])
    write(zeek / "dhcp.old.json", [json.dumps({"ts": 1763643605.0, "uid": "Co2", "id.orig_h": "10.0.0.9",
                                               "mac": "00:11:22:33:44:55", "assigned_ip": "10.0.0.9",
                                               "lease_time": 3600.0, "trans_id": 42})])
    write(zeek / "dhcp.2026-11-20-13-00-00.json", [json.dumps(
        {"ts": 1763643608.0, "uids": ["CD1", "CD2"], "client_addr": "10.0.0.11", "server_addr": "10.0.0.1",
         "mac": "AA-BB-CC-DD-EE-0F", "host_name": "laptop", "assigned_addr": "10.0.0.11", "lease_time": 86400.0,
         "msg_types": ["REQUEST", "ACK"], "_node_name": "zeek-east"})])

    ts = "2026-11-20T13:00:00.000001+0200"
    flow5 = {"src_ip": "10.0.0.5", "src_port": 5353, "dest_ip": "10.0.0.1", "dest_port": 53, "proto": "UDP"}
    alert = {"timestamp": ts, "flow_id": 1234567890123456789, "event_type": "alert", "src_ip": "203.0.113.9",
             "src_port": 4444, "dest_ip": "10.0.0.5", "dest_port": 445, "proto": "TCP", "host": "ids-1",
             "alert": {"action": "allowed", "gid": 1, "signature_id": 2403388, "rev": 3,
                       "signature": "ET SCAN test", "category": "Misc Attack", "severity": 2}}
    write(eve / "eve.json", [
        json.dumps(alert),                                                                         # 1
        json.dumps({**alert, "timestamp": "2026-11-20T23:30:00.5-0500"}),                          # 2 next UTC day
        json.dumps(alert)[:80],                                                                    # 3 truncated
        json.dumps({**alert, "timestamp": "abc"}),                                                 # 4
        json.dumps({k: v for k, v in alert.items() if k != "event_type"}),                        # 5
        json.dumps({**alert, "host": "nul\x00"}).replace("\\u0000", "\x00"),                       # 6 NUL byte
        json.dumps(alert).encode().replace(b"test", b"t\xc3(t"),                                   # 7 invalid UTF-8
        json.dumps({**alert, "src_port": "x"}),                                                    # 8
        json.dumps({**alert, "src_ip": "999.1.1.1"}),                                              # 9
        json.dumps({**alert, "alert": {**alert["alert"], "signature_id": "abc"}}),                 # 10
        json.dumps({"timestamp": ts, "event_type": "http", "http": {"url": "/"}}),                 # 11 bronze only
        "",                                                                                        # 12
        "[1, 2]",                                                                                  # 13
        json.dumps({"timestamp": ts, "flow_id": 1, "event_type": "dns", **flow5,                   # 14 v1 query
                    "dns": {"type": "query", "id": 7, "rrname": "v1.example", "rrtype": "A", "tx_id": 0}}),
        json.dumps({"timestamp": ts, "flow_id": 1, "event_type": "dns", **flow5,                   # 15 v1 answer
                    "dns": {"type": "answer", "id": 7, "rcode": "NOERROR", "rrname": "v1.example", "rrtype": "A",
                            "ttl": 300, "rdata": "192.0.2.1"}}),
        json.dumps({"timestamp": ts, "flow_id": 2, "event_type": "dns", **flow5,                   # 16 v2 answers
                    "dns": {"version": 2, "type": "answer", "id": 8, "rcode": "NOERROR", "rrname": "v2.example",
                            "rrtype": "A", "answers": [
                                {"rrname": "v2.example", "rrtype": "CNAME", "ttl": 60, "rdata": "cdn.example"},
                                {"rrname": "cdn.example", "rrtype": "A", "ttl": 30, "rdata": "192.0.2.2"}],
                            "grouped": {"A": ["192.0.2.2"], "CNAME": ["cdn.example"]}}}),
        json.dumps({"timestamp": ts, "flow_id": 3, "event_type": "dns", **flow5,                   # 17 grouped only
                    "dns": {"version": 2, "type": "answer", "id": 9, "rcode": "NOERROR", "rrname": "g.example",
                            "rrtype": "A", "grouped": {"A": ["192.0.2.3"]}}}),
        json.dumps({"timestamp": ts, "flow_id": 4, "event_type": "dns", **flow5,                   # 18 v3
                    "dns": {"version": 3, "type": "request", "id": 10,
                            "queries": [{"rrname": "v3.example", "rrtype": "AAAA"}]}}),
        json.dumps({"timestamp": ts, "flow_id": 5, "event_type": "flow", "src_ip": "10.0.0.5",     # 19 ICMP flow
                    "dest_ip": "10.0.0.1", "proto": "ICMP", "icmp_type": 8, "icmp_code": 0,
                    "flow": {"pkts_toserver": 1, "pkts_toclient": 1, "bytes_toserver": 98, "bytes_toclient": 98,
                             "start": "2026-11-20T12:59:59.000000+0200", "end": "2026-11-20T13:00:01.500000+0200",
                             "state": "established"}}),
        json.dumps({"timestamp": ts, "flow_id": 6, "event_type": "dhcp", "src_ip": "10.0.0.1",     # 20 dhcp ack
                    "src_port": 67, "dest_ip": "10.0.0.12", "dest_port": 68, "proto": "UDP",
                    "dhcp": {"type": "reply", "id": 99, "client_mac": "00:0C:29:AA:BB:CC",
                             "assigned_ip": "10.0.0.12", "client_ip": "0.0.0.0", "dhcp_type": "ack",
                             "lease_time": 7200, "hostname": "printer"}}),
        json.dumps({**alert, "community_id": "1:sensor-provided="}),                               # 21
        json.dumps({"timestamp": ts, "flow_id": 7, "event_type": "dns", **flow5,                   # 22 IPv6
                    "src_ip": "fe80:0000:0000:0000:0a00:27ff:fe5e:9aa6", "dest_ip": "ff02::fb",
                    "dns": {"type": "query", "id": 1, "rrname": "v6.local", "rrtype": "PTR"}}),
        json.dumps(alert) + json.dumps({**alert, "flow_id": 2}),                                   # 23 two joined
        json.dumps({**alert, "timestamp": "13:00:00.000001+0200"}),                                # 24 no date
        json.dumps({"timestamp": ts, "flow_id": 8, "event_type": "flow", **flow5,                  # 25 overflow
                    "flow": {"start": -9000000000000, "end": 9000000000000}}),
        json.dumps({**alert, "alert": {**alert["alert"], "signature": "ET braces }{ in a string"}}),  # 26
    ])
    zeek_parsed = parse(split_lines(read_files(spark, sorted(zeek.iterdir())), "zeek"), "zeek")
    eve_parsed = parse(split_lines(read_files(spark, [eve / "eve.json"]), "suricata"), "suricata")
    columns = [c for c in PARSED_COLUMNS if c not in ("file", "line_number")]
    extra = [F.unix_micros("event_time").alias("micros")]
    return {"zeek": by_line(zeek_parsed, *columns, *extra), "suricata": by_line(eve_parsed, *columns, *extra),
            "zeek_dir": zeek, "eve_dir": eve}


def reasons(rows: dict, name: str) -> dict[int, str | None]:
    return {line: row.error for (file, line), row in rows.items() if file == name}


def test_corpus_every_data_line_is_accounted_for(corpus):
    for source, folder in (("zeek", corpus["zeek_dir"]), ("suricata", corpus["eve_dir"])):
        for path in folder.iterdir():
            assert len(reasons(corpus[source], path.name)) == data_lines(path, source), path.name


def test_zeek_tsv_malformations_are_quarantined_with_their_reason(corpus):
    got = reasons(corpus["zeek"], "dns.2026-11-20-13-00-00.log")
    assert got == {
        9: None,
        10: "wrong field count: 22 values for 24 #fields",
        11: "invalid UTF-8",
        12: "NUL byte",
        13: "empty line",
        14: "bad ts value",
        15: "bad id.orig_p value",
        16: f"line too long: {len(huge_line_bytes())} bytes (limit {MAX_LINE_BYTES})",
        17: "empty line",
        18: "bad ts value",
        19: None,
    }
    assert reasons(corpus["zeek"], "dns.noheader.log") == {1: "no #fields header"}
    assert reasons(corpus["zeek"], "dns.bom.log") == {9: None}
    assert reasons(corpus["zeek"], "dns.badsep.log")[9] is not None
    assert reasons(corpus["zeek"], "dhcp.log") == {9: OLD_DHCP}
    assert reasons(corpus["zeek"], "dhcp.old.json") == {1: OLD_DHCP}
    assert reasons(corpus["zeek"], "conn.icmp.log") == {9: None, 10: "bad orig_pkts value"}


def huge_line_bytes() -> bytes:
    return "\t".join(dns_values(query="a" * (MAX_LINE_BYTES + 10))).encode()


def test_zeek_json_malformations_are_quarantined_with_their_reason(corpus):
    assert reasons(corpus["zeek"], "dns.json") == {
        1: None, 2: None, 3: "invalid JSON", 4: "bad ts value", 5: "missing ts value", 6: "bad answers value",
        7: "bad id.orig_h value"}


def test_zeek_values_are_mapped_by_header_name(corpus):
    rows = corpus["zeek"]
    good = rows[("dns.2026-11-20-13-00-00.log", 9)]
    assert (good.kind, good.uid, good.src_ip, good.src_port, good.dst_port, good.proto, good.query, good.trans_id,
            good.rcode_name, good.answers, good.ttls, good.dns_type, good.sensor) == (
        "dns", "CAbc1", "10.0.0.5", 5353, 53, "udp", "example.com", 4242, "NOERROR",
        ["93.184.216.34", "example.net"], [60.0, 30.0], "query+answer", "zeek")
    assert good.micros == 1763643600123456
    assert good.community_id == community_id_ref("10.0.0.5", "10.0.0.1", 5353, 53, "udp")
    unset = rows[("dns.2026-11-20-13-00-00.log", 19)]
    assert (unset.answers, unset.ttls, unset.query) == ([], None, None)
    reordered = rows[("dns.reordered.log", 9)]
    assert (reordered.error, reordered.sensor, reordered.query, reordered.uid, reordered.src_port,
            reordered.rcode_name, reordered.answers) == (None, "sensor-7", "reordered.example", "CRe1", 1111,
                                                         "NXDOMAIN", [])
    # Concatenated logs: line numbers count every physical line; each block's own #fields and
    # #separator ('|') apply.
    conn = rows[("conn.concatenated.log", 9)]
    assert (conn.kind, conn.uid, conn.orig_bytes, conn.resp_bytes) == ("conn", "Cc1", 10, 20)
    second = rows[("conn.concatenated.log", 19)]
    assert (second.error, second.kind, second.uid, second.query, second.src_port) == (
        None, "dns", "Cd1", "second.block", 999)
    icmp = rows[("conn.icmp.log", 9)]
    assert (icmp.proto, icmp.src_port, icmp.dst_port, icmp.duration, icmp.orig_pkts) == ("icmp", 8, 0, 1.5, 3)
    assert icmp.community_id == community_id_ref("10.0.0.7", "10.0.0.8", 8, 0, "icmp")


def test_zeek_json_epoch_and_iso_times_and_kind_from_file_name(corpus):
    rows = corpus["zeek"]
    epoch, iso = rows[("dns.json", 1)], rows[("dns.json", 2)]
    assert (epoch.kind, epoch.micros, epoch.answers, epoch.ttls) == ("dns", 1763643606250000, ["1.2.3.4"], [30.0])
    assert (iso.kind, iso.micros) == ("dns", micros("2026-11-20T13:00:07.5+01:00"))
    dhcp = rows[("dhcp.2026-11-20-13-00-00.json", 1)]
    assert (dhcp.error, dhcp.kind, dhcp.mac, dhcp.uid, dhcp.uids, dhcp.msg_types, dhcp.lease_time, dhcp.sensor,
            dhcp.assigned_addr) == (None, "dhcp", "aa:bb:cc:dd:ee:0f", "CD1", ["CD1", "CD2"], ["REQUEST", "ACK"],
                                    86400.0, "zeek-east", "10.0.0.11")


def test_eve_malformations_are_quarantined_with_their_reason(corpus):
    got = reasons(corpus["suricata"], "eve.json")
    bad = {line: reason for line, reason in got.items() if reason is not None}
    assert bad == {3: "invalid JSON", 4: "bad timestamp value", 5: "missing event_type", 6: "NUL byte",
                   7: "invalid UTF-8", 8: "bad src_port value", 9: "bad src_ip value",
                   10: "bad alert.signature_id value", 12: "empty line", 13: "invalid JSON",
                   23: "text after the JSON value (two records on one line?)", 24: "bad timestamp value",
                   25: "bad flow.start value"}
    assert len(got) == 26


def test_eve_events_are_normalised(corpus):
    rows = corpus["suricata"]
    alert = rows[("eve.json", 1)]
    assert (alert.kind, alert.sensor, alert.uid, alert.proto, alert.signature_id, alert.severity, alert.micros,
            str(alert.event_date)) == ("alert", "ids-1", "1234567890123456789", "tcp", 2403388, 2,
                                       micros("2026-11-20T11:00:00.000001+00:00"), "2026-11-20")
    assert alert.community_id == community_id_ref("203.0.113.9", "10.0.0.5", 4444, 445, "tcp")
    late = rows[("eve.json", 2)]
    assert (late.micros, str(late.event_date)) == (micros("2026-11-21T04:30:00.5+00:00"), "2026-11-21")
    assert rows[("eve.json", 11)].kind == "http" and rows[("eve.json", 11)].error is None
    assert rows[("eve.json", 21)].community_id == "1:sensor-provided="
    layouts = {line: (rows[("eve.json", line)].dns_type, rows[("eve.json", line)].query,
                      rows[("eve.json", line)].qtype_name, rows[("eve.json", line)].answers,
                      rows[("eve.json", line)].ttls) for line in (14, 15, 16, 17, 18)}
    assert layouts == {
        14: ("query", "v1.example", "A", None, None),
        15: ("answer", "v1.example", "A", ["192.0.2.1"], [300.0]),
        16: ("answer", "v2.example", "A", ["cdn.example", "192.0.2.2"], [60.0, 30.0]),
        17: ("answer", "g.example", "A", ["192.0.2.3"], None),
        18: ("query", "v3.example", "AAAA", None, None),
    }
    flow = rows[("eve.json", 19)]
    assert (flow.kind, flow.proto, flow.src_port, flow.dst_port, flow.duration, flow.orig_bytes, flow.conn_state,
            flow.micros) == ("flow", "icmp", 8, 0, 2.5, 98, "established", micros("2026-11-20T10:59:59+00:00"))
    assert flow.community_id == community_id_ref("10.0.0.5", "10.0.0.1", 8, 0, "icmp")
    dhcp = rows[("eve.json", 20)]
    assert (dhcp.mac, dhcp.assigned_addr, dhcp.client_addr, dhcp.server_addr, dhcp.msg_types, dhcp.lease_time,
            dhcp.hostname) == ("00:0c:29:aa:bb:cc", "10.0.0.12", None, "10.0.0.1", ["ACK"], 7200.0, "printer")
    v6 = rows[("eve.json", 22)]
    assert v6.community_id == community_id_ref("fe80::a00:27ff:fe5e:9aa6", "ff02::fb", 5353, 53, "udp")


# --- the table functions -------------------------------------------------------------------------

def test_table_functions_match_the_schemas(spark):
    files = spark.createDataFrame([("file:///x/eve.json", '{"timestamp":"2026-11-20T13:00:00Z"}\n')],
                                  "file string, text string")
    parsed = parse(split_lines(files, "suricata"), "suricata")
    assert tuple(parsed.columns) == PARSED_COLUMNS
    for table, schema in SILVER_SCHEMAS.items():
        assert to_silver(parsed, table).schema.simpleString() == schema.simpleString(), table
    ingest = ("batch_id", "ingest_time")
    assert [f.name for f in to_quarantine(parsed).schema] == [f.name for f in QUARANTINE_SCHEMA if f.name not in ingest]
    assert ([(f.name, f.dataType) for f in to_bronze(parsed).schema]
            == [(f.name, f.dataType) for f in BRONZE_SCHEMA if f.name not in ingest])
    bronze = to_bronze(parsed).first()
    assert (bronze.kind, bronze.parse_ok, bronze.event_date) == (None, False, None)
    assert to_quarantine(parsed).first().reason == "missing event_type"
    with pytest.raises(ValueError, match="'silver_http'"):
        to_silver(parsed, "silver_http")
    with pytest.raises(ValueError, match="'bro'"):
        split_lines(files, "bro")


def test_parsers_run_on_a_stream(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    text = "\n".join([*zeek_header("dns", ZEEK_DNS_FIELDS, ZEEK_DNS_TYPES), "\t".join(dns_values()),
                      "\t".join(dns_values()[:3])]) + "\n"
    (landing / "dns.log.gz").write_bytes(gzip.compress(text.encode()))
    files = (spark.readStream.schema("value STRING").format("text").option("wholetext", True).load(str(landing))
             .select(F.col("_metadata.file_path").alias("file"), F.col("value").alias("text")))
    assert files.isStreaming
    bronze = to_bronze(parse(split_lines(files, "zeek"), "zeek"))
    query = (bronze.writeStream.format("memory").queryName("parsers_stream_test")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        rows = spark.table("parsers_stream_test").orderBy("line_number").collect()
    finally:
        query.stop()
    assert [(r.line_number, r.kind, r.parse_ok, str(r.event_date)) for r in rows] == [
        (9, "dns", True, "2025-11-20"), (10, "dns", False, "None")]


# --- the sample generator ------------------------------------------------------------------------

def test_generator_output_parses(spark, tmp_path):
    from sample_data.generator import generate

    manifest = generate(tmp_path / "gen", hours=1, hosts=10, seed=11)
    landing = tmp_path / "gen" / "landing"
    zeek = parse(split_lines(read_files(spark, sorted((landing / "zeek").iterdir())), "zeek"), "zeek")
    eve = parse(split_lines(read_files(spark, sorted((landing / "suricata").iterdir())), "suricata"), "suricata")
    parsed = zeek.unionByName(eve).cache()
    try:
        lines = sum(n for kinds in manifest["lines"].values() for n in kinds.values())
        assert parsed.count() == lines
        assert to_quarantine(parsed).count() == manifest["totals"]["malformed"]
        for table, feeds in {"silver_dns": [("zeek", "dns"), ("suricata", "dns")],
                             "silver_dhcp": [("zeek", "dhcp"), ("suricata", "dhcp")],
                             "silver_conn": [("zeek", "conn"), ("suricata", "flow")],
                             "silver_ids_alerts": [("suricata", "alert")]}.items():
            rows = to_silver(parsed, table)
            expected = sum(manifest["events"][s][k] + manifest["duplicates"][s][k] for s, k in feeds)
            assert rows.count() == expected, table
            assert rows.where("event_time IS NULL OR sensor IS NULL OR uid IS NULL").count() == 0, table
        assert to_silver(parsed, "silver_dns").where("query IS NULL OR community_id IS NULL").count() == 0
        assert to_silver(parsed, "silver_conn").where("src_ip IS NULL OR community_id IS NULL").count() == 0
        assert to_silver(parsed, "silver_dhcp").where("mac IS NULL").count() == 0
        assert to_silver(parsed, "silver_ids_alerts").where("signature IS NULL").count() == 0
    finally:
        parsed.unpersist()
