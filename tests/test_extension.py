"""A new log source and a new rule added through the public extension points only, end to end.

A source is a `Source` (`pipelines/parsers/source.py`) given to `register_source`; a rule is a
file in the rules folder (`$SECLAKE_RULES`). Nothing else in the code base is edited: the ETL
reads the source's landing folder, writes its bronze table and feeds silver_dns, and the rule's
query turns those rows into alerts.
"""
from __future__ import annotations

import pytest

from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake
from pipelines.parsers.common import Query, bad_time, first_error, line_checks, lit, to_time
from pipelines.parsers.source import Source
from pipelines.parsers.sources import register_source, unregister_source
from pipelines.rules.spec import query_name
from pipelines.stages import stages


def parse_toy(q: Query) -> Query:
    """'<ISO time>,<client IP>,<queried name>' lines of a made-up DNS logger."""
    base = ["source", "file", "line_number", "raw"]
    q.stage(base, _pre=first_error(*line_checks("raw", "valid_utf8")), _f="split(raw, ',', -1)")
    q.stage("*", _ts="get(_f, 0)", event_time=to_time("get(_f, 0)"))
    return q.stage(
        [*base, "event_time"],
        sensor=lit("toy-1"),
        kind=lit("dns"),
        src_ip="get(_f, 1)",
        query="lower(get(_f, 2))",
        error=first_error(("_pre IS NOT NULL", "_pre"),
                          ("size(_f) != 3", "format_string('wrong field count: %d', size(_f))"),
                          bad_time("time", "_ts", "event_time")),
    )


TOY = Source(name="toy", description="lines of the toy DNS logger", parse=parse_toy, silver={"dns": "silver_dns"})

RULE = """/*
id: 0b6f7c52-3d7e-4d55-9a43-7d1f7e0c9a11
name: Toy logger saw the evil domain
version: 1
severity: medium
mitre: [T1071]
description: A client asked the toy logger for evil.example.
false_positives:
  - A researcher looking the domain up on purpose.
tables: [silver_dns]
event_time: event_time
watermark: 1 minute
window: 5 minutes
keys: [src_ip]
*/
SELECT src_ip, NULL AS mac, NULL AS device, NULL AS owner,
       window.start AS window_start, window.end AS window_end,
       min(event_time) AS first_seen, max(event_time) AS last_seen,
       concat(count(*), ' queries for evil.example') AS evidence
FROM silver_dns
WHERE source = 'toy' AND query = 'evil.example'
GROUP BY src_ip, window(event_time, '5 minutes')
"""

LINES = [
    "2026-11-20T10:00:05Z,10.9.0.7,EVIL.example",
    "2026-11-20T10:01:00Z,10.9.0.7,evil.example",
    "2026-11-20T10:02:00Z,10.9.0.8,benign.example",
    "not,a,time",
    "2026-11-20T12:00:00Z,10.9.0.8,later.example",  # moves the watermark past the 10:00 window
]


@pytest.fixture
def toy_source():
    register_source(TOY)
    yield TOY
    unregister_source(TOY.name)


def test_a_registered_source_and_a_rule_file_carry_rows_from_landing_to_alerts(spark, tmp_path, monkeypatch,
                                                                                  toy_source):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "toy_evil_domain.sql").write_text(RULE)
    monkeypatch.setenv("SECLAKE_RULES", str(rules))
    home = Home.resolve(tmp_path / "home")
    landing = home.landing / "toy"
    landing.mkdir(parents=True)
    (landing / "dns-1.log").write_text("\n".join(LINES) + "\n")
    lake = Lake(home)

    names = [s.name for s in stages()]
    assert names[0] == "etl" and "bronze_toy" in stages()[0].writes and query_name("toy_evil_domain") in names

    reports = {r.name: r for r in run_once(spark, lake, only=["etl", query_name("toy_evil_domain")])}
    assert all(r.error is None for r in reports.values()), [r.line() for r in reports.values()]

    assert lake.read(spark, "bronze_toy").count() == len(LINES)
    bad = lake.read(spark, "quarantine").where("source = 'toy'").collect()
    assert [(r.line_number, r.reason) for r in bad] == [(4, "bad time value")]
    dns = lake.read(spark, "silver_dns").where("source = 'toy'").orderBy("event_time").collect()
    assert [(r.src_ip, r.query, r.sensor) for r in dns] == [
        ("10.9.0.7", "evil.example", "toy-1"), ("10.9.0.7", "evil.example", "toy-1"),
        ("10.9.0.8", "benign.example", "toy-1"), ("10.9.0.8", "later.example", "toy-1")]
    alerts = lake.read(spark, "alerts").collect()
    assert [(a.rule_name, a.src_ip, a.evidence) for a in alerts] == [
        ("Toy logger saw the evil domain", "10.9.0.7", "2 queries for evil.example")]


def test_a_source_feeding_an_unknown_table_or_reusing_a_name_is_refused():
    with pytest.raises(ValueError, match="unknown silver table"):
        register_source(Source(name="odd", description="", parse=parse_toy, silver={"dns": "silver_nope"}))
    with pytest.raises(ValueError, match="already registered"):
        register_source(Source(name="zeek", description="", parse=parse_toy, silver={}))
