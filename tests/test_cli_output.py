"""What `seclake run-once` and `seclake sql` print, run as a user runs them (a subprocess, output
piped): seclake's own lines only, no JVM, log4j, Spark or Python-worker chatter, in plain form
(no escape codes: the output is not a terminal)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.query import REPORT_COLUMNS, QueryReport
from pipelines.stages import stages
from sample_data.generator import generate

REPO = Path(__file__).resolve().parents[1]

# What the JVM, log4j, Spark and PySpark's Python workers print when nothing quiets them.
CHATTER = re.compile("|".join([
    r"WARNING: Using incubator modules",
    r"Setting default log level",
    r"To adjust logging level",
    r"setLogLevel",
    r"log4j",
    r"SLF4J",
    r"^\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} (INFO|WARN|ERROR)",  # log4j's console pattern
    r"\b(INFO|WARN|WARNING|ERROR)\b.*\b(org\.apache|spark|Spark|Executor|TaskSetManager)",
    r"NativeCodeLoader",
    r"Python worker",
    r"Received UDF",
    r"^\s+at [\w.$]+\(",  # a Java stack frame
    r"py4j",
    r"\x1b\[",  # escape codes: none when the output is not a terminal
    r'"logger": "\w*QueryContextLogger"',  # PySpark's JSON log of every SQL error, its plan and stack
]))


def seclake(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def chatter(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (run.stdout + run.stderr).splitlines() if CHATTER.search(line)]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A quarter of an hour of 5 hosts, run once by the CLI."""
    root = tmp_path_factory.mktemp("cli") / "home"
    generate(root, hours=0.25, hosts=5, seed=7)
    return root


@pytest.fixture(scope="module")
def run_once(home) -> subprocess.CompletedProcess:
    return seclake("run-once", "--home", str(home))


def test_patterns_catch_the_chatter_they_are_for():
    for line in ["WARNING: Using incubator modules: jdk.incubator.vector",
                 'Setting default log level to "WARN".',
                 "25/11/20 10:00:00 WARN NativeCodeLoader: Unable to load native-hadoop library",
                 "Streaming TransformWithStateInPandas Python worker Received UDF from JVM",
                 "\tat org.apache.spark.sql.Dataset.show(Dataset.scala:1)",
                 '{"ts": "2026-12-04 19:01:02", "level": "ERROR", "logger": "SQLQueryContextLogger", "msg": "x"}']:
        assert CHATTER.search(line), line
    assert not CHATTER.search("etl: 1 batch, 4 files, 5,300 data lines in -> silver_dns=1,797 in 25.8s")


def test_run_once_prints_a_line_per_stage_then_the_report_table(home, run_once):
    assert run_once.returncode == 0, run_once.stderr[-3000:]
    assert chatter(run_once) == []
    names = [s.name for s in stages()]
    err = run_once.stderr.splitlines()
    assert err[0] == f"seclake run-once: home {home}"
    assert len(err) == 1 + len(names)
    for k, (line, name) in enumerate(zip(err[1:], names), start=1):
        assert line.startswith(f"run-once [{k}/{len(names)}] {name}: "), line
    assert re.fullmatch(r"run-once \[1/\d+\] etl: 1 batch, 4 files, [\d,]+ data lines in -> .* in \d+\.\ds", err[1])
    out = run_once.stdout.splitlines()
    assert out[0].split() == list(REPORT_COLUMNS) and set(out[1]) == {"-"}
    assert [line.split()[0] for line in out[2:]] == names
    assert re.match(r"etl +1 +4 files, [\d,]+ data lines +quarantine=", out[2]), out[2]


def test_run_once_json_prints_each_stage_s_report_as_a_line_of_json(home, run_once, tmp_path):
    assert run_once.returncode == 0
    again = tmp_path / "home"
    shutil.copytree(home, again)  # the module's home stays as the other tests expect it
    run = seclake("run-once", "--json", "--home", str(again))
    assert run.returncode == 0, run.stderr[-3000:]
    assert chatter(run) == []
    reports = [QueryReport(**json.loads(line)) for line in run.stdout.splitlines()]  # JSON lines, nothing else
    assert [r.name for r in reports] == [s.name for s in stages()]
    # Each line says what the stage's progress line says; a second run has nothing new.
    progress = [line.split("] ", 1)[1] for line in run.stderr.splitlines() if line.startswith("run-once [")]
    assert progress == [r.line() for r in reports], run.stderr
    assert all(r.skipped or not r.batches for r in reports), run.stdout


def test_run_once_on_a_home_without_logs_waits_for_input_and_exits_0(tmp_path):
    empty = seclake("run-once", "--home", str(tmp_path / "home"))
    assert empty.returncode == 0, empty.stderr[-3000:]
    assert "FAILED" not in empty.stdout + empty.stderr and chatter(empty) == []
    assert f"(new: it did not exist; sensor logs go in {tmp_path / 'home' / 'landing'})" in empty.stderr
    rows = {line.split()[0]: line for line in empty.stdout.splitlines()[2:]}
    assert list(rows) == [s.name for s in stages()]
    assert re.match(r"etl +0 +0 rows +nothing written", rows.pop("etl")), empty.stdout
    assert all("waiting for input: no " in line for line in rows.values()), empty.stdout


def test_run_once_refuses_an_unknown_stage_before_touching_the_home(tmp_path):
    typo = seclake("run-once", "--home", str(tmp_path / "home"), "--only", "dns_tunneling")
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.startswith("seclake run-once: --only dns_tunneling: no such stage; the stages are etl, ")
    assert "rule_dns_tunneling" in typo.stderr and not (tmp_path / "home").exists()


def test_sql_prints_the_result_and_nothing_else(home, run_once):
    assert run_once.returncode == 0
    run = seclake("sql", "--home", str(home), "SELECT count(*) AS n FROM silver_dns WHERE source = 'zeek'")
    assert run.returncode == 0, run.stderr
    assert chatter(run) == []
    assert run.stderr == ""
    lines = run.stdout.splitlines()
    assert [lines[0], lines[1], lines[3]] == ["n", "---", "(1 row)"] and len(lines) == 4
    assert int(lines[2].replace(",", "")) > 0


def test_history_of_alerts_names_the_rule_of_each_commit(home, run_once):
    import csv
    import io

    run = seclake("history", "alerts", "--home", str(home), "--format", "csv", "--rules", str(REPO / "rules"))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    slugs = {p.stem for p in (REPO / "rules").rglob("*.sql")}
    by_rules = [r for r in rows if r["app_id"].startswith("rule:")]
    assert by_rules and all(r["rule"] in slugs for r in by_rules), rows


def test_intel_load_of_a_domain_seen_in_dns_raises_an_alert_naming_it(home, run_once, tmp_path):
    from deltalake import DeltaTable

    from pipelines.intel.store import intel_rules

    assert run_once.returncode == 0
    seen = seclake("sql", "--home", str(home), "SELECT query FROM enriched_dns WHERE device IS NOT NULL "
                   "AND query LIKE '%.%' ORDER BY query LIMIT 1")
    domain = seen.stdout.splitlines()[2].strip()
    feed = tmp_path / "feed.txt"
    feed.write_text(f"# a feed of one domain, and a range too wide to match\n{domain}\n10.0.0.0/7\n")
    loaded = seclake("intel", "load", str(feed), "--home", str(home))
    assert loaded.returncode == 0, loaded.stderr
    assert chatter(loaded) == []
    assert (f"{feed}: 1 entry not loaded: '10.0.0.0/7': a range wider than /8"
            in loaded.stderr.splitlines()), loaded.stderr
    assert re.fullmatch(r"sweep of the last 90 days: [1-9]\d* new alert\(s\) "
                        r"\(rules threat_intel_domain, threat_intel_ip\)\n", loaded.stdout), loaded.stdout
    domain_rule = next(r.id for r in intel_rules() if r.slug == "threat_intel_domain")
    rows = DeltaTable(str(home / "tables" / "alerts")).to_pyarrow_table(columns=["rule_id", "evidence"]).to_pylist()
    alerts = [a for a in rows if a["rule_id"] == domain_rule]
    assert alerts and all(domain in a["evidence"] for a in alerts), alerts
    again = seclake("intel", "load", str(feed), "--home", str(home))
    assert "0 new alert(s)" in again.stdout  # the same matches are never written twice


def test_a_rule_that_calls_a_missing_function_fails_its_backtest_in_one_line(home, run_once, tmp_path):
    # A misspelt column is refused by the validator (tests/test_rules_validation.py); a misspelt
    # function only Spark's analysis finds.
    text = (REPO / "rules" / "dns" / "dns_tunneling.sql").read_text()
    head, body = text.split("*/", 1)
    (tmp_path / "rules" / "dns").mkdir(parents=True)
    (tmp_path / "rules" / "dns" / "bad_function.sql").write_text(head + "*/" + body.replace("length(", "lenght("))
    run = seclake("rules", "backtest", "bad_function", "--rules", str(tmp_path / "rules"), "--home", str(home))
    assert run.returncode == 2 and chatter(run) == [] and "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.splitlines()[-1]
    assert last.startswith("seclake rules: rule bad_function fails on the tables: [UNRESOLVED_ROUTINE"), last
    assert "`LENGHT`" in last  # as sqlglot regenerated the SQL
    # Spark's position is in sqlglot's one-line text: said as the file's line instead.
    bad = next(n for n, line in enumerate((head + "*/" + body.replace("length(", "lenght(")).splitlines(), 1)
               if "lenght(" in line)
    assert last.endswith(f"; bad_function.sql line {bad}; did you mean length()?"), last
    # Run once, the failure is said in the rule's progress line and in the table, nowhere else.
    once = seclake("run-once", "--home", str(home), "--only", "rule_bad_function", "--rules", str(tmp_path / "rules"))
    assert once.returncode == 1 and chatter(once) == [], once.stderr[-3000:]
    assert "rule_bad_function: FAILED in " in once.stderr, once.stderr
    assert f"bad_function.sql line {bad}" in once.stderr
    assert (once.stdout + once.stderr).count("UNRESOLVED_ROUTINE") == 2, once.stdout + once.stderr


def test_rules_status_refuses_a_folder_that_is_not_a_home(tmp_path):
    typo = seclake("rules", "status", "--home", str(tmp_path / "nope"))
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert typo.stderr == f"seclake rules: {tmp_path / 'nope'} is not a seclake home (no tables/ folder); " \
                          "is the path given (--home) or SECLAKE_HOME right?\n"


@pytest.mark.parametrize("command", [["maintain", "--dry-run"], ["retention", "--dry-run"],
                                     ["rollback", "silver_dns", "--to-version", "0", "--dry-run"]])
def test_operator_commands_refuse_a_folder_that_is_not_a_home(tmp_path, command):
    typo = seclake(*command, "--home", str(tmp_path / "nope"))
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert typo.stderr.startswith(f"seclake {command[0]}: {tmp_path / 'nope'} is not a seclake home"), typo.stderr
    assert not (tmp_path / "nope").exists()


def test_run_once_refuses_a_home_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    run = seclake("run-once", "--home", str(tmp_path / "afile"))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"seclake run-once: home {tmp_path / 'afile'} is a file, not a folder\n", run.stderr


@pytest.mark.parametrize("command, said", [(["run-once"], "seclake run-once: "),
                                           (["generate", "--hours", "1", "--hosts", "5"], "seclake generate: error: ")])
def test_a_uri_for_the_home_is_refused(command, said):
    # They made a local folder ./s3a:/lake/newhome and wrote to it, run-once saying only that the home was new.
    run = seclake(*command, "--home", "s3a://lake/newhome")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"{said}home s3a://lake/newhome: a home is a local folder; keep its tables on "
                          "object storage with SECLAKE_LAKE=s3a://lake/newhome (docs/deploy.md)\n"), run.stderr
    assert not (REPO / "s3a:").exists()


def test_generate_refuses_a_home_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    run = seclake("generate", "--hours", "1", "--hosts", "2", "--home", str(tmp_path / "afile"))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"seclake generate: error: home {tmp_path / 'afile'} is a file, not a folder\n", run.stderr


@pytest.mark.parametrize("variable, value, expected", [
    ("SECLAKE_DRIVER_MEMORY", "lots", "a size such as 4g or 512m"),
    ("SECLAKE_SPARK_MASTER", "bogus://x", "a Spark master such as local[*]"),
    ("SECLAKE_SPARK_LOG_LEVEL", "LOUD", "one of ALL, TRACE, DEBUG, INFO, WARN, ERROR, FATAL, OFF"),
])
def test_a_bad_spark_variable_is_named_before_the_jvm_starts(tmp_path, variable, value, expected):
    # Each was "[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number",
    # or Spark's own refusal after its start, naming no variable.
    (tmp_path / "home" / "tables").mkdir(parents=True)
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "sql", "--home", str(tmp_path / "home"), "SELECT 1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, variable: value})
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert run.stderr.startswith(f"seclake sql: {variable} must be {expected}") and run.stderr.endswith(
        f", not {value!r}\n"), run.stderr


def test_rules_status_read_by_delta_rs_exits_with_its_own_code_every_time(spark, tmp_path):
    # delta-rs's threads aborted 5 of 30 such runs at the interpreter's teardown (exit 134,
    # "terminate called without an active exception"); `pipelines.cli.run` leaves without it.
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.rules.pack import scan_rules
    from pipelines.rules.status import RuleStatus, utc_now

    home = Home.resolve(tmp_path / "home").create()
    rule = scan_rules(REPO / "rules").rules[0]
    RuleStatus(spark, Lake(home)).update(rule.slug, rule.content_hash, lambda h: h.failed(
        "boom", utc_now(), max_failures=3, retry_s=60))
    for _ in range(20):
        run = seclake("rules", "status", "--home", str(home.root), timeout=120)
        assert run.returncode == 0 and run.stderr == "", (run.returncode, run.stderr[-500:])
        assert f"{rule.slug} " in run.stdout and "failing, 1 failure(s) in a row" in run.stdout, run.stdout


@pytest.mark.parametrize("command", [["run-once"], ["rules", "status"]])
def test_an_abbreviated_or_unknown_option_is_named_with_its_commands_usage(tmp_path, command):
    # `--hom` once meant `--home` (argparse's prefix matching): a later `--homes` would change it.
    typo = seclake(*command, "--hom", str(tmp_path / "h"))
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    usage, error = typo.stderr.strip().splitlines()[0], typo.stderr.strip().splitlines()[-1]
    assert usage.startswith(f"usage: seclake {' '.join(command)} "), typo.stderr
    assert error == f"seclake {' '.join(command)}: error: unrecognized arguments: --hom {tmp_path / 'h'}", error
    assert not (tmp_path / "h").exists()


def _state_command(command: str, tmp_path: Path) -> list[str]:
    feed = tmp_path / "feed.txt"
    feed.write_text("evil.test\n")
    return {"suppress": ["suppress", "add", "--all-rules", "--ip", "10.0.0.5", "--reason", "lab"],
            "intel": ["intel", "load", str(feed)],
            "notify": ["notify", "--set", "notify_webhook_url=http://127.0.0.1:9/hook"]}[command]


@pytest.mark.parametrize("command", ["suppress", "intel", "notify"])
def test_commands_that_keep_state_refuse_a_folder_that_is_not_a_home(tmp_path, command):
    # Each once wrote its table under a mistyped --home (or, for notify, delivered nothing from it) and said it had.
    typo = seclake(*_state_command(command, tmp_path), "--home", str(tmp_path / "nope"), timeout=120)
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert typo.stderr.startswith(f"seclake {command}: {tmp_path / 'nope'} is not a seclake home"), typo.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize(("args", "commands"), [
    ([], "demo, generate, run-once"), (["alerts"], "list, incidents, show, ack"), (["rules"], "list, validate, test"),
])
def test_a_missing_command_is_refused_naming_the_commands_there_are(args, commands):
    run = seclake(*args)
    assert run.returncode == 2
    assert f"error: the following arguments are required: COMMAND (one of: {commands}" in run.stderr, run.stderr


@pytest.mark.parametrize(("args", "named"), [
    (["generate", "--hours", "inf"], "hours must be a number from 0.1 to 87840, got inf"),
    (["retention", "--dry-run", "--set", "retention_silver_days=1000000"],
     "setting retention_silver_days=1000000: must be at most 36500"),
    (["intel", "load", "FEED", "--sweep-days", "1000000"], "--sweep-days 1000000: each must be 1 to 36500"),
    (["rules", "backtest", "dga_nxdomain_burst", "--to", "9999-12-31"], "'9999-12-31' is not a date"),
    (["rules", "backtest", "dga_nxdomain_burst", "--ground-truth", "TRUTH"], "TRUTH:2: not a ground-truth record"),
    (["alerts", "incidents", "--span", "inf"], "--span inf: give a positive number of hours"),
    (["notify", "--set", "notify_webhook_url=https://hooks.example/T0 B1"], "is not a valid URL"),
    (["cluster", "start", "--port", "70000"], "argument --port: 70000 is not a TCP port (1 to 65535)"),
    (["stream", "--report-every", "nan"], "argument --report-every: nan is not a number of seconds above zero"),
    (["notify", "--every", "30"], "--every 30 paces --follow's passes"),  # without --follow: it was ignored
    # A typo saved a suppression that matched nothing, silently.
    (["suppress", "add", "--rule", "seclake.rule_disabld", "--ip", "10.0.0.5", "--reason", "lab"],
     "no platform rule 'seclake.rule_disabld'; did you mean 'seclake.rule_disabled'?"),
    # Read as a pack of no rules: the commits' rule column was left out, silently.
    (["history", "alerts", "--rules", "/no/such/rules"], "argument --rules: /no/such/rules: no such folder"),
    # Spark's limit takes an int: a Py4J traceback after Spark had started.
    (["alerts", "list", "--limit", "3000000000"],
     "argument --limit: 3000000000 is not a row count from 1 to 2147483646"),
    (["sql", "SELECT 1", "--limit", "-1"], "argument --limit: -1 is not a row count from 0 to 2147483646"),
    # Said after Spark had started, without "all".
    (["alerts", "list", "--status", "bogus"], "--status bogus: expected open, acknowledged, closed or all"),
    # Accepted, and changed nothing: retention's setting given to maintain.
    (["maintain", "--dry-run", "--set", "retention_bronze_days=90"],
     "setting retention_bronze_days: seclake maintain does not read it (seclake retention does)"),
])
def test_out_of_range_input_is_refused_in_one_line_naming_it(tmp_path, args, named):
    # Each of these once ended in a Python traceback (an OverflowError, an InvalidURL, an AttributeError),
    # some after part of the work was done.
    home = tmp_path / "home"
    (home / "tables").mkdir(parents=True)
    feed, truth = tmp_path / "feed.txt", tmp_path / "truth.jsonl"
    feed.write_text("evil.test\n")
    truth.write_text('{"scenario": "s", "start": "2026-11-20T00:00:00Z", "end": "2026-11-20T01:00:00Z"}\n[]\n')
    args = [{"FEED": str(feed), "TRUTH": str(truth)}.get(a, a) for a in args]
    where = ["--out", str(tmp_path / "gen")] if args[0] == "generate" else ["--home", str(home)]
    run = seclake(*args, *where, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert named.replace("TRUTH", str(truth)) in run.stderr.strip().splitlines()[-1], run.stderr
