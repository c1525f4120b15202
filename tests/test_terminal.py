"""Terminal output (`pipelines/terminal.py`): aligned tables, plain progress lines off a terminal,
a live bar on one. No Spark here: `seclake generate` is the long command these run."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

from pipelines.query import REPORT_COLUMNS, QueryReport
from pipelines.terminal import Progress, format_table

REPO = Path(__file__).resolve().parents[1]
ESCAPE = re.compile(r"\x1b\[")


def test_table_keeps_columns_aligned_whatever_the_length_of_a_name():
    names = ["dga", "a rule whose name is much longer than the forty characters the old summary allowed"]
    lines = format_table(["rule", "severity", "alerts"], [(n, "high", 1234) for n in names]).splitlines()
    assert lines[0].split() == ["rule", "severity", "alerts"]
    assert set(lines[1]) == {"-"}
    # Numbers are right-aligned: every row (and the header) ends in the same column.
    assert len({len(line) for line in lines}) == 1 and all(line.endswith("1,234") for line in lines[2:])
    assert lines[2].index("high") == lines[3].index("high")


def test_stage_reports_make_one_row_each_under_the_report_columns():
    reports = [QueryReport("etl", batches=2, read={"files": 96, "data lines": 112467},
                           rows_out={"silver_dns": 5000}, duration_s=30),
               QueryReport("enriched_dns", skipped=True)]
    lines = format_table(REPORT_COLUMNS, [r.cells() for r in reports]).splitlines()
    assert lines[0].split() == list(REPORT_COLUMNS)
    assert lines[2].split() == ["etl", "2", "96", "files,", "112,467", "data", "lines", "silver_dns=5,000", "30.0s"]
    assert lines[3].split()[:4] == ["enriched_dns", "0", "-", "-"]


def test_progress_is_plain_lines_when_not_a_terminal():
    out = StringIO()
    with Progress("run-once", total=3, stream=out) as progress:
        progress.working_on("starting Spark")  # only ever shown on a live bar
        progress.step("etl: done")
        progress.note("a line that stays")
        progress.step("dhcp_leases: done")
    assert out.getvalue().splitlines() == ["run-once [1/3] etl: done", "a line that stays",
                                           "run-once [2/3] dhcp_leases: done"]


def test_generate_piped_prints_one_plain_line_per_hour(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "generate", "--out", str(tmp_path / "g"),
                          "--hours", "2", "--hosts", "5"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert not ESCAPE.search(run.stderr + run.stdout)
    assert [line.split(" ", 2)[:2] for line in lines[:2]] == [["generate", "[1/2]"], ["generate", "[2/2]"]]
    assert re.fullmatch(r"generate \[1/2\] 2026-11-20T00:00Z  [\d,]+ events  \(\d+\.\d s\)", lines[0])
    assert lines[2].startswith("generated ") and len(lines) == 3


def test_generate_on_a_terminal_draws_a_live_bar(tmp_path):
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "generate", "--out", str(tmp_path / "g"),
                             "--hours", "2", "--hosts", "5"], cwd=REPO, stdout=follower, stderr=follower,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = seen.decode("utf-8", "replace")
    assert ESCAPE.search(text), "no cursor or colour codes: the live bar was not drawn"
    assert "generate [1/2]" not in text  # the plain fallback was not used
    assert "generated " in text


def _read_all(fd: int) -> str:
    seen = b""
    while select.select([fd], [], [], 0.5)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    return seen.decode("utf-8", "replace")


def test_live_bar_names_the_step_that_runs():
    leader, follower = pty.openpty()
    with open(follower, "w", encoding="utf-8") as terminal:
        with Progress("run-once", steps=["etl", "dhcp_leases"], stream=terminal) as progress:
            progress.working_on("starting Spark")
            time.sleep(0.3)  # rich redraws ten times a second
            progress.working_on()
            time.sleep(0.3)
            progress.step("etl: done")
            time.sleep(0.3)
        text = _read_all(leader)
    os.close(leader)
    assert "starting Spark" in text and "running etl" in text and "running dhcp_leases" in text
    assert "run-once [1/2]" not in text
