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
    rows = [line.split() for line in summary(spark, lake).splitlines()]
    assert rows[0] == ["table", "version", "rows"]
    assert ["silver_dns", "0", "0"] in rows
    assert ["bronze_zeek", "-", "not", "created"] in rows
    assert [r[0] for r in rows[1:len(lake.names()) + 1]] == lake.names()
    assert rows[-2:] == [["alerts", "by", "rule", "and", "severity:"], ["(none)"]]
