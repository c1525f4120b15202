"""The `seclake sql`, `serve`, `tables` and `history` sub-commands: their arguments, and what they run."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.servers import port_number
from pipelines.settings import rows_arg
from pipelines.sql.database import Database, SqlError, connect
from pipelines.sql.output import FORMATS, write_frame, write_pandas, write_tables
from pipelines.sql.serve import DEFAULT_HOST, DEFAULT_PORT
from pipelines.sql.shell import Shell, readline_input
from pipelines.sql.statements import parse_as_of, split_statements

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_LIMIT = 100


def cmd_sql(args: argparse.Namespace) -> int:
    as_of = None if args.as_of is None else parse_as_of(args.as_of)
    db = _database(args)
    script = args.query if args.query is not None else (None if sys.stdin.isatty() else sys.stdin.read())
    if script is None:
        shell = Shell(db, args.format, args.limit, as_of, sys.stdout, sys.stderr)
        read_line, save = readline_input(db)
        count = len(db.created())
        print(f"seclake sql: {count} table{'' if count == 1 else 's'} in {db.lake.home.root}; "
              ".help for help, \\q to quit", file=sys.stderr)
        try:
            return shell.run(read_line)
        finally:
            save()
    statements = split_statements(script)
    if not statements:
        raise ValueError("no SQL statement given")
    for i, statement in enumerate(statements):
        if i:
            print()
        try:
            write_frame(db, db.sql(statement, as_of=as_of), args.format, args.limit, sys.stdout, sys.stderr)
        except SqlError as exc:
            if len(statements) == 1:
                raise
            rest = len(statements) - i - 1
            not_run = f"; the {rest} after it not run" if rest else ""
            raise SqlError(f"statement {i + 1} of {len(statements)} failed{not_run}: {exc}") from exc
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from pipelines.sql.serve import serve

    serve(args.home, host=args.host, port=args.port)
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    write_tables(connect(args.home).tables(), args.format, sys.stdout)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    frame = connect(args.home).history(args.table, limit=args.limit or None)
    write_pandas(with_rule_names(frame, args.rules), args.format, sys.stdout)
    return 0


def with_rule_names(history: pd.DataFrame, rules_dir: Path | None = None) -> pd.DataFrame:
    """`history` with a `rule` column after `app_id` naming the rule file (in `rules_dir`, default
    the pack's folder) of each commit a rule wrote (app id `rule:<rule id>:v<version>:<checkpoint
    tag>`), when one did.

    >>> import pandas as pd
    >>> with_rule_names(pd.DataFrame({"app_id": ["silver_dns"]})).columns.tolist()
    ['app_id']
    """
    from pipelines.rules.pack import rule_names

    ids = history["app_id"].str.extract(r"^rule:([0-9a-f-]{36}):", expand=False)
    if ids.isna().all():
        return history
    names = rule_names(rules_dir)
    out = history.copy()
    out.insert(int(out.columns.get_loc("app_id")) + 1, "rule",
               ids.map(lambda i: names.get(i, i) if isinstance(i, str) else ""))
    return out


def add_commands(sub: argparse._SubParsersAction, home_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `sql`, `serve`, `tables` and `history` to the `seclake` command line."""
    def output_args(parser: argparse.ArgumentParser, limit_help: str) -> None:
        parser.add_argument("--format", choices=FORMATS, default="table",
                            help="aligned table (default), CSV with a header, or JSON Lines")
        parser.add_argument("--limit", type=rows_arg(0), default=DEFAULT_LIMIT, help=limit_help)

    sql = sub.add_parser(
        "sql", help="query the tables with Spark SQL (one statement, or an interactive shell)",
        description="Run Spark SQL over every created table, each read at one committed snapshot. "
                    "Without QUERY: an interactive shell on a terminal, else the statements on stdin, "
                    "run in order up to the first that fails.")
    home_arg(sql)
    sql.add_argument("query", nargs="?", metavar="QUERY",
                     help='e.g. "SELECT query, count(*) c FROM silver_dns GROUP BY query ORDER BY c DESC LIMIT 10"')
    output_args(sql, f"rows printed per statement, 0 = all (default {DEFAULT_LIMIT})")
    sql.add_argument("--as-of", metavar="VERSION|TIMESTAMP",
                     help="read every table as of a version (12) or time (2026-11-20T10:00:00Z); "
                          "per table in the SQL: silver_dns@v12")
    sql.set_defaults(func=cmd_sql)

    serve = sub.add_parser(
        "serve", help="serve the tables to BI tools over JDBC/ODBC (Spark's Thrift server), read-only",
        description="Start Spark's Thrift JDBC/ODBC server over every created table, read-only (the SQL sandbox "
                    "refuses writes, reflection and file reads), until Ctrl-C or SIGTERM. Connect with "
                    "jdbc:hive2://HOST:PORT/default (DBeaver, beeline) or hive://HOST:PORT/default (Superset); "
                    "see docs/bi.md.")
    home_arg(serve)
    serve.add_argument("--host", default=DEFAULT_HOST,
                       help=f"interface to listen on (default {DEFAULT_HOST}: this machine only; the endpoint has "
                            "no authentication, so bind elsewhere only behind a firewall or proxy you trust)")
    serve.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    serve.set_defaults(func=cmd_serve)

    tables = sub.add_parser("tables", help="list the tables: version, rows, files, size, last commit, partitioning")
    home_arg(tables)
    tables.add_argument("--format", choices=FORMATS, default="table",
                        help="aligned table (default), CSV with a header, or JSON Lines")
    tables.set_defaults(func=cmd_tables)

    history = sub.add_parser("history", help="list a table's commits: version, time, operation, batch, rows added")
    home_arg(history)
    history.add_argument("table", metavar="TABLE")
    from pipelines.rules.cli import rules_dir_arg

    rules_dir_arg(history)
    output_args(history, f"newest commits shown, 0 = all (default {DEFAULT_LIMIT})")
    history.set_defaults(func=cmd_history)


def _database(args: argparse.Namespace) -> Database:
    """The home's Database on a Spark session without UI; a bad home fails before Spark starts."""
    from pipelines.spark import get_spark

    lake = connect(args.home).lake
    return Database(lake, get_spark(app_name="seclake-sql", ui=False))
