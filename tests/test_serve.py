"""`seclake serve`: a real JDBC client (beeline, which pyspark ships with the Hive JDBC driver) gets the same
count as `seclake sql`, and the sandbox in the JVM refuses hostile statements that arrive over JDBC."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from pipelines import cli
from pipelines.home import Home
from pipelines.schemas import SILVER_SCHEMAS
from pipelines.sql.serve import jdbc_url
from test_sql_sandbox import _silver_dns_home

SECLAKE = [sys.executable, "-m", "pipelines.cli"]
PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"
START_SECONDS = 180  # a Spark JVM and the Thrift server on a loaded 2-core machine

# (statement, what the JDBC error must say): the JVM sandbox's own refusals.
HOSTILE_OVER_JDBC: list[tuple[str, str]] = [
    ("SELECT java_method('java.lang.System', 'getProperty', 'user.home')", "function java_method() is not allowed"),
    ("SELECT transform(array('a'), x -> `REFLECT`('java.lang.System', 'getenv', x))",
     "function reflect() is not allowed"),
    ("SELECT * FROM silver_dns WHERE query IN (SELECT try_reflect('java.util.UUID', 'randomUUID'))",
     "function try_reflect() is not allowed"),
    ("SELECT * FROM parquet.`/etc`", "table parquet./etc is not allowed"),
    ("SELECT count(*) FROM delta.`/tmp`", "table delta./tmp is not allowed"),
    ("SET spark.sql.runSQLOnFiles=true", "SetCommand is not allowed"),
    ("ADD JAR /tmp/evil.jar", "is not allowed: this endpoint only reads"),
    ("INSERT INTO silver_dns SELECT * FROM silver_dns", "InsertIntoStatement is not allowed"),
    ("DROP TABLE silver_dns", "is not allowed: this endpoint only reads"),
    ("CREATE TEMPORARY VIEW v AS SELECT 1", "is not allowed: this endpoint only reads"),
    ("SELECT TRANSFORM(query) USING 'id' AS (x) FROM silver_dns", "TRANSFORM ... USING runs an external command"),
    ("EXPLAIN SELECT reflect('java.lang.System', 'exit', 0)", "function reflect() is not allowed"),
    ("SELECT * FROM `/etc/passwd`", "table /etc/passwd is not allowed"),
    ("SELECT * FROM IDENTIFIER('parquet.`/etc`')", "table parquet./etc is not allowed"),
    ("RESTORE TABLE silver_dns TO VERSION AS OF 0", "is not allowed: this endpoint only reads"),
    ("CACHE TABLE silver_dns", "is not allowed: this endpoint only reads"),
    ("DELETE FROM silver_dns", "is not allowed: this endpoint only reads"),
    ("DESCRIBE HISTORY '/tmp'", "table '/tmp' is not allowed: read seclake tables by name"),
    ("DESCRIBE DETAIL delta.`/tmp`", "table delta./tmp is not allowed"),
    ("DESCRIBE DETAIL '/tmp'", "table '/tmp' is not allowed: read seclake tables by name"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def beeline(url: str, *statements: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run statements (or beeline's own `!commands`) with beeline (the Hive JDBC client pyspark ships), going on
    after an error; result rows as CSV on stdout (beeline's prompts and blank lines removed), errors on stderr."""
    script = tmp / "statements.sql"
    script.write_text("".join(f"{s}\n" if s.startswith("!") else f"{s};\n" for s in statements))  # !commands take none
    done = subprocess.run(
        ["java", "-cp", f"{PYSPARK_JARS}/*", "org.apache.hive.beeline.BeeLine", "-u", url, "-n", "analyst",
         "--outputformat=csv2", "--showHeader=false", "--silent=true", "--force=true", "-f", str(script)],
        capture_output=True, text=True, timeout=300)
    rows = re.sub(r"\d+: jdbc:hive2://\S+> ?", "", done.stdout).splitlines()
    done.stdout = "\n".join(row for row in rows if row.strip())
    return done


@pytest.fixture(scope="module")
def home(spark, tmp_path_factory) -> Home:
    return _silver_dns_home(spark, tmp_path_factory.mktemp("serve") / "home")


@pytest.fixture(scope="module")
def server(home, tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen]]:
    port = _free_port()
    log = tmp_path_factory.mktemp("serve-log") / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen([*SECLAKE, "serve", "--home", str(home.root), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + START_SECONDS
        while "seclake serve:" not in log.read_text():
            assert proc.poll() is None, f"seclake serve exited with {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"seclake serve did not start in {START_SECONDS} s: {log.read_text()}"
            time.sleep(1)
        yield jdbc_url("127.0.0.1", port), proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_serve_help_names_the_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "--host HOST" in out and "127.0.0.1" in out and "default 10000" in out


def test_a_jdbc_client_gets_the_same_count_as_seclake_sql(capsys, home, server, tmp_path):
    url, _ = server
    query = "SELECT count(*) FROM silver_dns WHERE query = 'q1.example.com'"
    assert cli.main(["sql", "--home", str(home.root), "--format", "csv", query]) == 0
    expected = int(capsys.readouterr().out.splitlines()[1])
    # What BI tools send besides queries (USE, SHOW, DESCRIBE), Delta's time travel and history, a window function.
    done = beeline(url, query, "SELECT count(*) FROM silver_dns VERSION AS OF 0", "USE default", "SHOW TABLES",
                   "DESCRIBE HISTORY silver_dns",
                   "SELECT max(rn) FROM (SELECT row_number() OVER (PARTITION BY query ORDER BY event_time) AS rn "
                   "FROM silver_dns)", tmp=tmp_path)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [str(expected), "10"] and expected == 10, done.stdout
    assert "default,silver_dns,false" in lines and lines[-1] == "10", done.stdout


def test_a_jdbc_client_lists_each_tables_columns(server, tmp_path):
    # What DBeaver's schema browser and ODBC tools ask (DatabaseMetaData.getColumns, beeline's !columns):
    # Delta's catalog entry has no columns of its own.
    url, _ = server
    done = beeline(url, "!columns silver_dns", tmp=tmp_path)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    listed = [row.split(",")[3] for row in done.stdout.splitlines() if ",silver_dns," in row]
    assert listed == list(SILVER_SCHEMAS["silver_dns"].fieldNames()), done.stdout


def test_the_endpoint_refuses_hostile_statements(server, tmp_path):
    url, _ = server
    done = beeline(url, *(statement for statement, _ in HOSTILE_OVER_JDBC), tmp=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == len(HOSTILE_OVER_JDBC) and all("seclake sandbox: " in e for e in errors), done.stderr
    for (statement, reason), error in zip(HOSTILE_OVER_JDBC, errors):
        assert reason in error, (statement, error)
    assert done.stdout == ""  # not one row came back


def test_the_tables_are_unchanged_and_the_server_stops_cleanly_on_sigterm(home, server, tmp_path):
    url, proc = server
    done = beeline(url, "SELECT count(*) FROM silver_dns", tmp=tmp_path)
    assert done.returncode == 0 and done.stdout == "30", done.stderr  # nothing was written
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_a_port_in_use_is_named_in_one_line(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*SECLAKE, "serve", "--home", str(home.root), "--port", str(port)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"seclake serve: cannot listen on 127.0.0.1:{port}: "), done.stderr[-3000:]
    assert "Address already in use" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
