"""`seclake demo`: generate a sample day into the home, run the whole pipeline once as a Dagster run, summarise."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.home import Home, dagster_instance

if TYPE_CHECKING:
    from pipelines.lake.registry import Lake

REPO = Path(__file__).resolve().parent.parent  # workspace.yaml's folder
RUN_ONCE_JOB = "run_once_job"  # assets/jobs.py


def run_demo(home: Home, hours: float, hosts: int, seed: int) -> int:
    """Generate (once per home), run `run_once_job` in Dagster, print tables and alerts.

    `seclake demo --hours 2 --hosts 20` calls `run_demo(Home.resolve(...), hours=2, hosts=20, seed=7)`;
    it returns 0 unless the Dagster run failed (`.ci/demo` runs it; tests/test_cli_output.py runs a
    small one, tests/test_demo.py checks the summary).
    """
    from pipelines.lake.registry import Lake
    from pipelines.terminal import Progress
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
    # The run is a Dagster run (assets/launch.py, in a process of its own: pipelines never imports
    # Dagster), recorded in the home's instance, so the UI shows it with its steps and checks.
    dagster_home = home.dagster
    print(f"[2/3] running run_once_job in Dagster: every stage once (Trigger.AvailableNow), then the checks "
          f"(run history in {dagster_home})", file=sys.stderr)
    launched = launch_run_once(home)
    print("[3/3] summary", file=sys.stderr)
    print(summary(Lake(home)))
    # Absolute paths: the hints work from any folder, not only the repository's.
    dagster, seclake = (Path(sys.executable).with_name(name) for name in ("dagster", "seclake"))
    print(f"\nDone in {time.monotonic() - started:.0f}s. Next:\n"
          f"  SQL shell:  {seclake} sql --home {home.root}\n"
          f"  one query:  {seclake} sql --home {home.root} "
          f"\"SELECT rule_name, count(*) FROM alerts GROUP BY 1\"\n"
          f"  Dagster UI: DAGSTER_HOME={dagster_home} SECLAKE_HOME={home.root} {dagster} dev "
          f"-w {REPO / 'workspace.yaml'}  (then open http://localhost:3000: the run is under Runs)")
    return launched


def launch_run_once(home: Home) -> int:
    """`run_once_job` as a Dagster run on the instance in `home/dagster` (`python -m assets.launch`);
    its exit code. The instance is made with telemetry off: a demo sends nothing anywhere."""
    dagster_home = dagster_instance(home.dagster)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "SECLAKE_HOME": str(home.root)}
    return subprocess.run([sys.executable, "-m", "assets.launch", RUN_ONCE_JOB, "--tag", "seclake/launched_by=demo"],
                          env=env).returncode


def summary(lake: Lake) -> str:
    """Two aligned tables: version and rows of every table, then alerts by rule and severity."""
    from pipelines.lake.log import count_by, summary
    from pipelines.terminal import format_table

    tables: list[tuple[str, int | None, int | None]] = []
    for name in lake.names():
        if not lake.exists(name):
            tables.append((name, None, None))
            continue
        found = summary(lake.path(name))
        tables.append((name, found.version, found.rows))
    alerts = count_by(lake.path("alerts"), ["rule_name", "severity"]) if lake.exists("alerts") else []
    by_rule = (format_table(["rule", "severity", "alerts"], alerts, title="alerts by rule and severity")
               if alerts else "alerts by rule and severity: none")
    return format_table(["table", "version", "rows"], tables, title="tables ('-': not created yet)") + "\n\n" + by_rule
