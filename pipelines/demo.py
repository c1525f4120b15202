"""`seclake demo`: generate a sample day into the home, run the whole pipeline once, summarise."""
from __future__ import annotations

import sys
import time

from pipelines.home import Home


def run_demo(home: Home, hours: float = 24, hosts: int = 50, seed: int = 7) -> int:
    """Generate (once per home), run every stage with AvailableNow, print tables and alerts.

    `seclake demo --hours 2 --hosts 20` calls `run_demo(Home.resolve(...), hours=2, hosts=20)`;
    it returns 0 unless a stage reported an error (`.ci/demo` runs it; tests/test_demo.py checks the summary).
    """
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.spark import get_spark
    from sample_data.generator import generate

    home.create()
    started = time.monotonic()
    if (home.root / "manifest.json").exists():
        print(f"[1/3] sample data already in {home.landing} (delete {home.root} to regenerate)", file=sys.stderr)
    else:
        print(f"[1/3] generating {hours:g} h of logs for {hosts} hosts (seed {seed}) into {home.landing}",
              file=sys.stderr)
        generate(home.root, hours=hours, hosts=hosts, seed=seed,
                 progress=lambda m: print(f"      {m}", file=sys.stderr))
    print("[2/3] running every stage once (Trigger.AvailableNow)", file=sys.stderr)
    spark = get_spark(app_name="seclake-demo")
    lake = Lake(home)
    reports = run_once(spark, lake, on_report=lambda r: print(f"      {r.line()}", file=sys.stderr))
    print("[3/3] summary", file=sys.stderr)
    print(summary(spark, lake))
    print(f"\nDone in {time.monotonic() - started:.0f}s. Next:\n"
          f"  SQL shell:  .venv/bin/seclake sql --home {home.root}\n"
          f"  one query:  .venv/bin/seclake sql --home {home.root} "
          f"\"SELECT rule_name, count(*) FROM alerts GROUP BY 1\"\n"
          f"  Dagster UI: SECLAKE_HOME={home.root} .venv/bin/dagster dev -w workspace.yaml  "
          f"(then open http://localhost:3000)")
    return 1 if any(r.error for r in reports) else 0


def summary(spark, lake) -> str:
    """Rows and version of every table, then alerts by rule and severity."""
    from pipelines.lake.log import summary

    lines = [f"{'table':<22} {'version':>7} {'rows':>10}"]
    for name in lake.names():
        if not lake.exists(name):
            lines.append(f"{name:<22} {'-':>7} {'not created':>10}")
            continue
        found = summary(lake.path(name))
        lines.append(f"{name:<22} {found.version:>7} {found.rows:>10}")
    if lake.exists("alerts"):
        alerts = lake.read(spark, "alerts").groupBy("rule_name", "severity").count().orderBy("rule_name").collect()
        lines.append("\nalerts by rule and severity:")
        lines += [f"  {r.rule_name:<40} {r.severity:<9} {r['count']:>6}" for r in alerts] or ["  (none)"]
    return "\n".join(lines)
