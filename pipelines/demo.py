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
    from pipelines.query import REPORT_COLUMNS
    from pipelines.spark import get_spark
    from pipelines.stages import stages
    from pipelines.terminal import Progress, print_table
    from sample_data.generator import DEFAULT_START, done_line, generate, hour_files, parse_start

    home.create()
    started = time.monotonic()
    if (home.root / "manifest.json").exists():
        print(f"[1/3] sample data already in {home.landing} (delete {home.root} to regenerate)", file=sys.stderr)
    else:
        print(f"[1/3] generating {hours:g} h of logs for {hosts} hosts (seed {seed}) into {home.landing}",
              file=sys.stderr)
        with Progress("generate", total=hour_files(parse_start(DEFAULT_START), hours)) as progress:
            manifest = generate(home.root, hours=hours, hosts=hosts, seed=seed, progress=progress.step)
        print(done_line(manifest, home.root, time.monotonic() - started), file=sys.stderr)
    print("[2/3] running every stage once (Trigger.AvailableNow)", file=sys.stderr)
    with Progress("run-once", steps=[s.name for s in stages()]) as progress:
        progress.working_on("starting Spark")
        spark = get_spark(app_name="seclake-demo")
        lake = Lake(home)
        progress.working_on()
        reports = run_once(spark, lake, on_report=lambda r: progress.step(r.line()))
    print("[3/3] summary", file=sys.stderr)
    print_table(REPORT_COLUMNS, [r.cells() for r in reports], title="stages")
    print()
    print(summary(spark, lake))
    print(f"\nDone in {time.monotonic() - started:.0f}s. Next:\n"
          f"  SQL shell:  .venv/bin/seclake sql --home {home.root}\n"
          f"  one query:  .venv/bin/seclake sql --home {home.root} "
          f"\"SELECT rule_name, count(*) FROM alerts GROUP BY 1\"\n"
          f"  Dagster UI: SECLAKE_HOME={home.root} .venv/bin/dagster dev -w workspace.yaml  "
          f"(then open http://localhost:3000)")
    return 1 if any(r.error for r in reports) else 0


def summary(spark, lake) -> str:
    """Two aligned tables: version and rows of every table, then alerts by rule and severity."""
    from pipelines.lake.log import summary
    from pipelines.terminal import format_table

    tables: list[tuple[str, int | None, int | None]] = []
    for name in lake.names():
        if not lake.exists(name):
            tables.append((name, None, None))
            continue
        found = summary(lake.path(name))
        tables.append((name, found.version, found.rows))
    alerts = []
    if lake.exists("alerts"):
        counted = lake.read(spark, "alerts").groupBy("rule_name", "severity").count().orderBy("rule_name").collect()
        alerts = [(r.rule_name, r.severity, r["count"]) for r in counted]
    by_rule = (format_table(["rule", "severity", "alerts"], alerts, title="alerts by rule and severity")
               if alerts else "alerts by rule and severity: none")
    return format_table(["table", "version", "rows"], tables, title="tables ('-': not created yet)") + "\n\n" + by_rule
