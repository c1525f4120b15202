"""`seclake demo`'s closing summary. The whole demo (generate a day, run every stage) is what
`.ci/demo` runs; this checks the summary it prints, on a lake where only some tables exist."""
from __future__ import annotations

from pipelines.demo import summary
from pipelines.home import Home
from pipelines.lake.registry import Lake


def test_summary_gives_version_and_rows_per_table_and_alerts_by_rule(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    for table in ("silver_dns", "alerts"):
        lake.ensure(spark, table)
    text = summary(lake)
    rows = [line.split() for line in text.splitlines()]
    assert rows[:2] == [["tables", "('-':", "not", "created", "yet)"], ["table", "version", "rows"]]
    assert set(text.splitlines()[2]) == {"-"}  # the header rule
    assert ["silver_dns", "0", "0"] in rows
    assert ["bronze_zeek", "-", "-"] in rows
    assert [r[0] for r in rows[3:len(lake.names()) + 3]] == lake.names()
    assert rows[-1] == ["alerts", "by", "rule", "and", "severity:", "none"]


def test_summary_counts_alerts_by_rule_and_severity_from_the_log_reader(spark, tmp_path):
    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = Lake.spec("alerts").schema
    rows = [{**dict.fromkeys(schema.names), "alert_id": f"a{i}", "rule_name": name, "severity": severity}
            for i, (name, severity) in enumerate([("Port scan", "medium"), ("C2", "high"), ("Port scan", "medium"),
                                                  ("C2", "critical")])]
    lake.sink("alerts", app_id="test").write_batch(spark.createDataFrame(rows, schema), 0)
    by_rule = summary(lake).split("\n\n")[1].splitlines()
    assert by_rule[0] == "alerts by rule and severity"
    assert [line.split() for line in by_rule[3:]] == [["C2", "critical", "1"], ["C2", "high", "1"],
                                                      ["Port", "scan", "medium", "2"]]
