"""Analysts' SQL over the live tables: each statement reads one committed snapshot of every table it names.

`seclake sql`, `seclake tables`, `seclake history` and the notebook entry point `connect()` share
one path. The tables a statement names are found with sqlglot and registered by path in the
session's in-memory catalog (`Lake.register`); Spark with delta-spark runs the statement, fixing
each table's snapshot when it analyses it. Commits made meanwhile by the streams are not seen, a
half-written batch never is. Delta's own SQL works on those names: `DESCRIBE HISTORY silver_dns`,
`SELECT ... FROM silver_dns VERSION AS OF 3`.

Time travel: `as_of=` / `--as-of 12` pins every table of a statement; `silver_dns@v12` or
`silver_dns@2026-11-20T10:00:00Z` in the SQL text pins one reference. The `@` form is rewritten
to a temp view name (`silver_dns__v12`) over that version before anything parses the statement.
`seclake tables` and `seclake history` read the Delta logs without starting Spark.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from pipelines.home import Home

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.lake.registry import Lake

AsOf = int | datetime
FORMATS = ("table", "csv", "json")
DEFAULT_LIMIT = 100
HISTORY_FILE = ".sql_history"

# Comments, string literals and quoted names: nothing inside them is a table, an `@` or a `;`.
# Unterminated ones run to the end, so a half-typed comment keeps the shell reading lines.
_OPAQUE = r"""--[^\n]*|/\*.*?(?:\*/|\Z)|'(?:\\.|[^'\\])*(?:'|\Z)|"(?:\\.|[^"\\])*(?:"|\Z)|`(?:[^`]|``)*(?:`|\Z)"""
_OPAQUE_RE = re.compile(_OPAQUE, re.S)
_TIME_TRAVEL_RE = re.compile(rf"(?P<opaque>{_OPAQUE})|\b(?P<name>[A-Za-z_]\w*)@(?P<when>[^\s,;()]*)", re.S)
_POSITION_RE = re.compile(r"line (\d+),? pos (\d+)")

# First words of statements that only read. Anything else (SET, CREATE ... USING parquet, INSERT,
# ADD JAR) could write, or read files outside the registry despite spark.sql.runSQLOnFiles=false.
# SHOW is left out too: outside a statement no view exists, so SHOW TABLES would list nothing.
_READING_WORDS = {"SELECT", "WITH", "FROM", "VALUES", "EXPLAIN", "DESCRIBE", "DESC"}
_EXPLAIN_RE = re.compile(r"\s*EXPLAIN(\s+(EXTENDED|CODEGEN|COST|FORMATTED))?\s+", re.I)
_WRITING_TOKENS = {"INSERT", "CREATE", "DROP", "DELETE", "UPDATE", "MERGE", "ALTER", "CACHE", "TRUNCATE", "LOAD"}

# Temp views are session-wide: one statement at a time registers, analyses and drops its views.
_VIEWS_LOCK = threading.Lock()

# sqlglot warns when it parses a statement as an opaque Command; _inspect handles that case itself.
logging.getLogger("sqlglot").setLevel(logging.ERROR)


class SqlError(ValueError):
    """A statement that cannot run, said in one line (the Spark or delta-rs error stays chained)."""


def parse_as_of(value: str | int | datetime) -> AsOf:
    """A table version (`12`, `v12`) or a point in time (ISO 8601, UTC unless it names an offset).

    >>> parse_as_of("v12"), parse_as_of("2026-11-20T10:00:00Z")
    (12, datetime.datetime(2026, 11, 20, 10, 0, tzinfo=datetime.timezone.utc))
    """
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip()
    if re.fullmatch(r"[vV]?\d+", text):
        return int(text.lstrip("vV"))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"bad as-of {value!r}: expected a version (12 or v12) "
                         "or an ISO timestamp (2026-11-20T10:00:00Z)") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def connect(home: str | os.PathLike | None = None, *, spark: SparkSession | None = None) -> Database:
    """The registry's tables in `home` (default `$SECLAKE_HOME`, else ./seclake-home), ready for SQL.

    >>> db = connect(home="/tmp/x")  # doctest: +SKIP
    >>> db.sql("SELECT count(*) AS n FROM silver_dns@v3").first().n  # doctest: +SKIP
    1200
    """
    from pipelines.lake.registry import Lake

    resolved = Home.resolve(home)
    if not resolved.tables.is_dir():
        raise ValueError(f"{resolved.root} is not a seclake home (no tables/ folder); "
                         "pass --home/home= or set SECLAKE_HOME")
    return Database(Lake(resolved), spark)


@dataclass(frozen=True)
class _Pin:
    """One view a statement needs: `table` at `as_of` (None = the latest commit)."""

    table: str
    as_of: AsOf | None


class Database:
    """Spark SQL over one home's tables; every statement reads one committed snapshot per table.

    A DataFrame returned by `sql` or `table` reads one snapshot per table each time it runs: the
    newest, unless pinned with `as_of` or `name@v12` (Delta's semantics). Spark starts on the
    first query, so `tables()` and `history()` are instant.

    >>> db = connect(home="/tmp/x")  # doctest: +SKIP
    >>> db.sql("SELECT query, count(*) c FROM silver_dns "  # doctest: +SKIP
    ...        "GROUP BY query ORDER BY c DESC LIMIT 10").toPandas()
    """

    def __init__(self, lake: Lake, spark: SparkSession | None = None) -> None:
        self.lake = lake
        self._spark = spark

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from pipelines.spark import get_spark

            self._spark = get_spark(app_name="seclake-sql")
        return self._spark

    def sql(self, statement: str, as_of: str | int | datetime | None = None,
            args: dict[str, Any] | None = None) -> DataFrame:
        """Run one statement; `as_of` pins every plain table reference, `args` fills `:name` markers.

        >>> db.sql("SELECT * FROM alerts WHERE mac = :mac", args={"mac": "a4:34:d9:00:00:01"})  # doctest: +SKIP
        """
        statements = _split_statements(statement)
        if len(statements) != 1:
            raise SqlError(f"sql() runs exactly one statement, got {len(statements)}")
        default = None if as_of is None else parse_as_of(as_of)
        text, pins, edits = _rewrite_time_travel(statements[0])
        found = _inspect(text)
        latest: list[str] = []
        for name in sorted(found.tables - pins.keys()):
            if name in self.lake.names() and (found.exact or self.lake.exists(name)):
                if default is None:
                    latest.append(name)
                else:
                    pins[name] = _Pin(name, default)
            elif (found.exact and name not in found.ctes and "." not in name
                  and not self.spark.catalog.tableExists(name)):
                raise SqlError(self._unknown_table(name))
        with self._errors(text, edits):
            self.lake.register(self.spark, latest)
        with _VIEWS_LOCK:
            registered: list[str] = []
            try:
                for view, pin in pins.items():
                    self.table(pin.table, pin.as_of).createOrReplaceTempView(view)
                    registered.append(view)
                with self._errors(text, edits):
                    # Analysis happens here: each table's snapshot is fixed for the whole statement.
                    return self.spark.sql(text, args=args)
            finally:
                for view in registered:
                    self.spark.catalog.dropTempView(view)

    def table(self, name: str, as_of: str | int | datetime | None = None) -> DataFrame:
        """One committed snapshot of `name` (the latest, or the one `as_of` a version or time).

        >>> db.table("silver_dns", as_of=3).count()  # doctest: +SKIP
        1200
        """
        if name not in self.lake.names() or not self.lake.exists(name):
            raise SqlError(self._unknown_table(name))
        when = None if as_of is None else parse_as_of(as_of)
        with self._errors():
            try:
                return (self.lake.read(self.spark, name, version=when) if isinstance(when, int)
                        else self.lake.read(self.spark, name, timestamp=when))
            except ValueError as exc:
                raise SqlError(str(exc)) from None

    def tables(self) -> pd.DataFrame:
        """Every registry table: version, rows, files, bytes, last commit, partitioning (from the Delta log).

        >>> db.tables()[["name", "version", "rows"]]  # doctest: +SKIP
        """
        import pandas as pd

        from pipelines.lake.log import summary

        rows = []
        for name in self.lake.names():
            spec = self.lake.spec(name)
            row: dict[str, Any] = {"name": name, "layer": spec.layer, "exists": self.lake.exists(name),
                                   "partitioned_by": ", ".join(spec.partition_by)}
            if row["exists"]:
                with self._errors():
                    found = summary(self.lake.path(name))
                # Row counts come from the files' stats, so listing stays instant on big tables.
                row.update(version=found.version, rows=found.rows, files=found.files, size_bytes=found.size_bytes,
                           last_commit=found.last_commit, partitioned_by=", ".join(found.partition_columns))
            rows.append(row)
        columns = ["name", "layer", "exists", "version", "rows", "files", "size_bytes", "last_commit", "partitioned_by"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.astype({c: "Int64" for c in ("version", "rows", "files", "size_bytes")})

    def history(self, name: str, limit: int | None = None) -> pd.DataFrame:
        """The commits of `name`, newest first: version, time, operation, app_id/batch_id (txn), rows and files added.

        >>> db.history("silver_dns", limit=5)  # doctest: +SKIP
        """
        import pandas as pd

        from pipelines.lake.log import commits

        if name not in self.lake.names() or not self.lake.exists(name):
            raise SqlError(self._unknown_table(name))
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        with self._errors():
            rows = commits(self.lake.path(name), limit)
        columns = ["version", "timestamp", "operation", "app_id", "batch_id", "rows_added", "files_added"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.astype({c: "Int64" for c in ("version", "batch_id", "rows_added", "files_added")})

    def created(self) -> list[str]:
        """Names of the registry tables that exist in this home."""
        return [name for name in self.lake.names() if self.lake.exists(name)]

    def _unknown_table(self, name: str) -> str:
        if name in self.created():  # Spark read it as a table where sqlglot saw none, e.g. IDENTIFIER('t')
            return f"could not tell that {name!r} is read as a table here; name it plainly in FROM or JOIN"
        if name in self.lake.names():
            return (f"table {name!r} is not created yet in {self.lake.home.tables} "
                    "(the pipeline has not written it; `seclake tables` shows what exists)")
        created = self.created()
        close = difflib.get_close_matches(name, self.lake.names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown table {name!r}{hint} (known: {', '.join(created) or 'none yet, run the pipeline first'})"

    @contextmanager
    def _errors(self, text: str = "", edits: list[tuple[int, int, int]] | None = None) -> Iterator[None]:
        """Turn Spark and delta-rs failures into one-line SqlErrors, positions mapped back to the user's text."""
        from deltalake.exceptions import DeltaError
        from py4j.protocol import Py4JError, Py4JJavaError
        from pyspark.errors import ParseException, PySparkException
        from pyspark.logger import PySparkLogger

        # pyspark logs every SQL error with its JVM stack trace before raising it; we report it instead.
        loggers = [PySparkLogger.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
        previous = [lg.disabled for lg in loggers]
        for lg in loggers:
            lg.disabled = True
        try:
            yield
        except PySparkException as exc:
            condition = exc.getCondition() or ""
            if condition.startswith("TABLE_OR_VIEW_NOT_FOUND"):
                name = exc.getMessageParameters().get("relationName", "").replace("`", "")
                raise SqlError(self._unknown_table(name.lower())) from exc
            raise SqlError(_describe(str(exc), text, edits or [], syntax=isinstance(exc, ParseException))) from exc
        except Py4JJavaError as exc:
            raise SqlError(_describe(str(exc.java_exception.getMessage()), text, edits or [])) from exc
        except (Py4JError, DeltaError) as exc:
            raise SqlError(_describe(str(exc), text, edits or [])) from exc
        finally:
            for lg, was in zip(loggers, previous):
                lg.disabled = was


@dataclass(frozen=True)
class _Found:
    """What a statement names: tables (lower case, `db.t` when qualified), CTE names, and whether
    sqlglot parsed it (`exact`) or the names are a token-level guess."""

    tables: set[str]
    ctes: set[str]
    exact: bool


def _inspect(text: str) -> _Found:
    """Find the tables a statement reads, and refuse statements that could write or read outside the registry."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    code = _code_only(text)
    first = re.match(r"[\s(]*([A-Za-z]+)", code)
    word = first.group(1).upper() if first else ""
    if word not in _READING_WORDS:
        raise SqlError(f"seclake sql only reads: {word or text.strip()[:20]!r} statements are not allowed "
                       f"(start with one of {', '.join(sorted(_READING_WORDS))})")
    explain = _EXPLAIN_RE.match(code)
    if explain:  # sqlglot keeps EXPLAIN's statement as one opaque string: look inside it
        return _inspect(text[explain.end():])
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except SqlglotError:
        tree = None
    if tree is not None and not isinstance(tree, exp.Command):
        writes = tree.find(exp.Insert, exp.Create, exp.Drop, exp.Delete, exp.Update, exp.Merge, exp.Alter,
                           exp.Cache, exp.LoadData, exp.TruncateTable)
        if writes is not None:
            raise SqlError(f"seclake sql only reads: this statement contains {writes.key.upper()}")
        tables = set()
        for table in tree.find_all(exp.Table):
            if not isinstance(table.this, exp.Identifier):
                continue  # a table-valued function such as range(10)
            tables.add(".".join(p.name for p in table.parts).lower())
        # DESCRIBE FUNCTION f also parses as a table: leave DESCRIBE's other names to Spark.
        return _Found(tables, {cte.alias.lower() for cte in tree.find_all(exp.CTE)},
                      exact=not isinstance(tree, exp.Describe))
    # sqlglot cannot read it (or read it as an opaque Command, like EXPLAIN): guess from the tokens
    # and leave the verdict on names and syntax to Spark.
    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except SqlglotError:
        return _Found(set(), set(), exact=False)
    writes = sorted({t.token_type.name for t in tokens} & _WRITING_TOKENS)
    if writes:
        raise SqlError(f"seclake sql only reads: this statement contains {writes[0]}")
    names = {t.text.lower() for t in tokens if t.token_type.name in ("VAR", "IDENTIFIER")}
    return _Found(names, set(), exact=False)


def _code_only(text: str) -> str:
    """`text` with comments, strings and quoted names blanked out (same length, same lines)."""
    return _OPAQUE_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _split_statements(text: str) -> list[str]:
    """The statements in `text`, split at `;` outside comments and quotes; comment-only pieces dropped."""
    code = _code_only(text)
    bounds = [-1] + [m.start() for m in re.finditer(";", code)] + [len(text)]
    return [text[a + 1:b] for a, b in zip(bounds, bounds[1:]) if code[a + 1:b].strip()]


def _rewrite_time_travel(text: str) -> tuple[str, dict[str, _Pin], list[tuple[int, int, int]]]:
    """Replace `t@v12` / `t@<ISO time>` with generated view names.

    Returns the new text, the view each name stands for, and the edits (start, end, new length)
    that map positions in Spark's error messages back to the user's text.
    """
    pins: dict[str, _Pin] = {}
    edits: list[tuple[int, int, int]] = []

    def replace(match: re.Match) -> str:
        if match.group("opaque") is not None:
            return match.group()
        name, when = match.group("name").lower(), match.group("when")
        try:
            as_of = parse_as_of(when)
        except ValueError:
            raise SqlError(f"bad time-travel reference {match.group()!r}: "
                           f"write {name}@v12 or {name}@2026-11-20T10:00:00Z") from None
        view = f"{name}__v{as_of}" if isinstance(as_of, int) else f"{name}__at_" + re.sub(r"\W", "_", when).lower()
        pins[view] = _Pin(name, as_of)
        edits.append((match.start(), match.end(), len(view)))
        return view

    return _TIME_TRAVEL_RE.sub(replace, text), pins, edits


def _describe(message: str, text: str, edits: list[tuple[int, int, int]], *, syntax: bool = False) -> str:
    """One line from a Spark/delta-rs message: no [CONDITION] tag, SQLSTATE, plan or stack trace."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", lines[0] if lines else "failed")
    first = re.split(r"\s*SQLSTATE:", first)[0].rstrip(" ;")
    position = _POSITION_RE.search(message)
    where = ""
    if position:
        line, pos = _original_position(text, edits, int(position.group(1)), int(position.group(2)))
        where = f"line {line}, pos {pos}"
    if syntax:
        first = re.sub(r"^Syntax error at or near", "near", first)
        return f"syntax error at {where}: {first}" if where else f"syntax error: {first}"
    return f"{first} ({where})" if where else first


def _original_position(rewritten: str, edits: list[tuple[int, int, int]], line: int, pos: int) -> tuple[int, int]:
    """Map (line, pos) in the rewritten statement back to the text the user wrote (rewrites never span lines)."""

    def original(offset: int) -> int:
        shift = 0
        for start, end, new_len in edits:
            if offset < start + shift:
                break
            if offset < start + shift + new_len:
                return start  # inside a generated view name: point at the user's reference
            shift += new_len - (end - start)
        return offset - shift

    line_start = sum(len(part) + 1 for part in rewritten.split("\n")[:line - 1])
    return line, original(line_start + pos) - original(line_start)


# ---- output -------------------------------------------------------------------------------------

_MAX_CELL = 80


def _write_frame(db: Database, df: DataFrame, fmt: str, limit: int, out: TextIO, err: TextIO) -> None:
    """Print a query result; at most `limit` rows (0 = all), saying so when more exist."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType

    names = df.columns
    positional = df.toDF(*[f"_c{i}" for i in range(len(names))])  # result columns may share a name
    if fmt == "json":
        # Spark renders the values (session time zone, arrays, structs) as its own JSON writer would.
        cells = positional.select(F.to_json(F.struct(*[F.col(f"_c{i}").alias(n) for i, n in enumerate(names)]),
                                            {"ignoreNullFields": "false"}))
    else:
        cells = positional.select(*[F.col(c).cast("string") for c in positional.columns])
    with db._errors():
        rows = [list(r) for r in (cells.limit(limit + 1) if limit else cells).collect()]
    truncated = bool(limit) and len(rows) > limit
    rows = rows[:limit] if truncated else rows
    if fmt == "json":
        out.writelines(f"{r[0]}\n" for r in rows)
    else:
        right = [isinstance(f.dataType, NumericType) for f in df.schema.fields]
        _write_rows(out, fmt, names, rows, right, truncated)
    if truncated and fmt != "table":
        err.write(_rows_note(limit, truncated))


def _write_pandas(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    import pandas as pd

    if fmt == "json":
        text = frame.to_json(orient="records", lines=True, date_format="iso", date_unit="ms")
        out.write(text if text.endswith("\n") or not text else text + "\n")
        return

    def cell(value: Any) -> str:
        if value is None or pd.isna(value):
            return ""  # listings, not query results: an empty cell reads better than NULL
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return str(value)

    rows = [[cell(v) for v in record] for record in frame.itertuples(index=False)]
    right = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in frame.dtypes]
    _write_rows(out, fmt, list(frame.columns), rows, right, truncated=False)


def _write_rows(out: TextIO, fmt: str, header: list[str], rows: list[list[str | None]], right: list[bool],
                truncated: bool) -> None:
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in row] for row in rows])
        return
    out.write(_table_text(header, rows, right))
    out.write(_rows_note(len(rows), truncated))


def _rows_note(count: int, truncated: bool) -> str:
    rows = f"{count} row{'' if count == 1 else 's'}"
    return f"(showing first {rows})\n" if truncated else f"({rows})\n"


def _table_text(header: list[str], rows: list[list[str | None]], right: list[bool]) -> str:
    """psql-style aligned text; NULL for nulls, multi-line cells (EXPLAIN) kept, and long cells
    cut when other columns stand beside them (CSV and JSON always print whole values)."""
    width_cap = _MAX_CELL if len(header) > 1 else None

    def lines_of(value: str | None) -> list[str]:
        if value is None:
            return ["NULL"]
        lines = value.rstrip("\n").split("\n")
        return [v[:width_cap - 1] + "…" if width_cap and len(v) > width_cap else v for v in lines]

    body = [[lines_of(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(line) for row in body for line in row[i]]) for i, h in enumerate(header)]
    buf = io.StringIO()
    buf.write(" | ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip() + "\n")
    buf.write("-+-".join("-" * w for w in widths) + "\n")
    for row in body:
        for k in range(max(len(c) for c in row) if row else 0):
            parts = []
            for cell, width, numeric in zip(row, widths, right):
                text = cell[k] if k < len(cell) else ""
                parts.append(text.rjust(width) if numeric else text.ljust(width))
            buf.write(" | ".join(parts).rstrip() + "\n")
    return buf.getvalue()


def _human_size(n: int) -> str:
    units = ("B", "KB", "MB", "GB", "TB")
    size, step = float(n), 0
    while size >= 1024 and step < len(units) - 1:
        size, step = size / 1024, step + 1
    return f"{n} B" if step == 0 else f"{size:.1f} {units[step]}"


def _write_tables(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    """`tables()`; for people (table format) with sizes in KB/MB and "not created yet" as the last commit."""
    if fmt == "table":
        frame = frame.assign(
            size=[_human_size(n) if e else None for n, e in zip(frame["size_bytes"], frame["exists"])],
            last_commit=[t if e else "not created yet" for t, e in zip(frame["last_commit"], frame["exists"])],
        )[["name", "layer", "version", "rows", "files", "size", "last_commit", "partitioned_by"]]
    _write_pandas(frame, fmt, out)


# ---- command line --------------------------------------------------------------------------------

_HELP = """\
Statements end with ';' and may span lines; -- and /* */ comments are fine (rule files paste as is).
Every created table is there by name; pin one reference with NAME@v12 or NAME@2026-11-20T10:00:00Z.
  .tables                    tables with version, rows, files, last commit
  .schema NAME               columns and types of NAME
  .history NAME              commits of NAME, newest first
  .format table|csv|json     output format (now {fmt})
  .limit N                   rows shown, 0 = all (now {limit})
  .as-of VERSION|TIME|off    pin every table of the following statements (now {as_of})
  .help                      this text
  .quit or \\q                leave (Ctrl-D too)
"""


class _Shell:
    """The interactive loop: statements end with `;`, dot-commands act at once, errors never end it."""

    def __init__(self, db: Database, fmt: str, limit: int, as_of: AsOf | None, out: TextIO, err: TextIO) -> None:
        self.db, self.fmt, self.limit, self.as_of, self.out, self.err = db, fmt, limit, as_of, out, err

    def run(self, read_line: Callable[[str], str]) -> int:
        buffer: list[str] = []
        while True:
            try:
                line = read_line("      -> " if buffer else "seclake> ")
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:  # Ctrl-C drops the statement being typed
                self.out.write("\n")
                buffer = []
                continue
            if not buffer and line.strip().startswith((".", "\\")):
                if not self._command(line.strip()):
                    return 0
                continue
            if not buffer and not line.strip():
                continue
            buffer.append(line)
            text = "\n".join(buffer)
            if _code_only(text).rstrip().endswith(";"):
                buffer = []
                for statement in _split_statements(text):
                    self._guarded(lambda s=statement: _write_frame(
                        self.db, self.db.sql(s, as_of=self.as_of), self.fmt, self.limit, self.out, self.err))

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except KeyboardInterrupt:
            self.db.spark.sparkContext.cancelAllJobs()
            self.err.write("(cancelled)\n")
        except Exception as exc:  # noqa: BLE001 - one bad statement must not end the session
            text = str(exc).strip()
            self.err.write(f"error: {text.splitlines()[0] if text else type(exc).__name__}\n")

    def _command(self, line: str) -> bool:
        """Run one dot-command; False means leave."""
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word in (".quit", "\\q"):
            return False
        if word == ".help":
            as_of = "off" if self.as_of is None else self.as_of
            self.out.write(_HELP.format(fmt=self.fmt, limit=self.limit, as_of=as_of))
        elif word == ".tables":
            self._guarded(lambda: _write_tables(self.db.tables(), self.fmt, self.out))
        elif word == ".history" and rest:
            self._guarded(lambda: _write_pandas(self.db.history(rest, limit=self.limit or None), self.fmt, self.out))
        elif word == ".schema" and rest:
            self._guarded(lambda: self._schema(rest))
        elif word == ".format" and rest in FORMATS:
            self.fmt = rest
        elif word == ".limit" and rest.isdigit():
            self.limit = int(rest)
        elif word == ".as-of" and rest:
            try:
                self.as_of = None if rest == "off" else parse_as_of(rest)
            except ValueError as exc:
                self.err.write(f"error: {exc}\n")
        else:
            self.err.write(f"error: unknown or incomplete command {line!r}; .help lists them\n")
        return True

    def _schema(self, name: str) -> None:
        fields = self.db.table(name).schema.fields
        self.out.write(_table_text(["column", "type"], [[f.name, f.dataType.simpleString()] for f in fields],
                                   [False, False]))


def _readline_input(db: Database) -> tuple[Callable[[str], str], Callable[[], None]]:
    """`input` with line editing, tab completion of table names and history kept in the home folder."""
    import readline

    history = db.lake.home.root / HISTORY_FILE
    try:
        readline.read_history_file(history)
    except OSError:
        pass  # first session in this home
    readline.set_history_length(2000)
    words = sorted(set(db.created()) | {".tables", ".schema", ".history", ".format", ".limit", ".as-of", ".help",
                                        ".quit", "SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "LIMIT"})

    def complete(prefix: str, state: int) -> str | None:
        matches = [w for w in words if w.lower().startswith(prefix.lower())]
        return matches[state] if state < len(matches) else None

    readline.set_completer_delims(" \t\n(),;")
    readline.set_completer(complete)
    readline.parse_and_bind("tab: complete")

    def save() -> None:
        try:
            readline.write_history_file(history)
        except OSError:
            pass  # a read-only home still gets a working shell

    return input, save


def _database(args: argparse.Namespace) -> Database:
    """The home's Database on a Spark session without UI; a bad home fails before Spark starts."""
    from pyspark.sql import SparkSession

    from pipelines.spark import get_spark

    lake = connect(args.home).lake
    fresh = SparkSession.getActiveSession() is None
    spark = get_spark(app_name="seclake-sql", ui=False)
    if fresh and "SECLAKE_SPARK_LOG_LEVEL" not in os.environ:
        spark.sparkContext.setLogLevel("FATAL")  # a failing task is reported in one line, not a JVM trace
    return Database(lake, spark)


def _check_output_args(args: argparse.Namespace) -> None:
    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0 (0 = no limit), got {args.limit}")


def cmd_sql(args: argparse.Namespace) -> int:
    _check_output_args(args)
    as_of = None if args.as_of is None else parse_as_of(args.as_of)
    db = _database(args)
    script = args.query if args.query is not None else (None if sys.stdin.isatty() else sys.stdin.read())
    if script is None:
        shell = _Shell(db, args.format, args.limit, as_of, sys.stdout, sys.stderr)
        read_line, save = _readline_input(db)
        count = len(db.created())
        print(f"seclake sql: {count} table{'' if count == 1 else 's'} in {db.lake.home.root}; "
              ".help for help, \\q to quit", file=sys.stderr)
        try:
            return shell.run(read_line)
        finally:
            save()
    statements = _split_statements(script)
    if not statements:
        raise ValueError("no SQL statement given")
    for i, statement in enumerate(statements):
        if i:
            print()
        _write_frame(db, db.sql(statement, as_of=as_of), args.format, args.limit, sys.stdout, sys.stderr)
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    _write_tables(connect(args.home).tables(), args.format, sys.stdout)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    _check_output_args(args)
    frame = connect(args.home).history(args.table, limit=args.limit or None)
    _write_pandas(frame, args.format, sys.stdout)
    return 0


def add_commands(sub: argparse._SubParsersAction, home_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `sql`, `tables` and `history` to the `seclake` command line."""
    def output_args(parser: argparse.ArgumentParser, limit_help: str) -> None:
        parser.add_argument("--format", choices=FORMATS, default="table",
                            help="aligned table (default), CSV with a header, or JSON Lines")
        parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=limit_help)

    sql = sub.add_parser(
        "sql", help="query the tables with Spark SQL (one statement, or an interactive shell)",
        description="Run Spark SQL over every created table, each read at one committed snapshot. "
                    "Without QUERY: an interactive shell on a terminal, else the statements on stdin.")
    home_arg(sql)
    sql.add_argument("query", nargs="?", metavar="QUERY",
                     help='e.g. "SELECT query, count(*) c FROM silver_dns GROUP BY query ORDER BY c DESC LIMIT 10"')
    output_args(sql, f"rows printed per statement, 0 = all (default {DEFAULT_LIMIT})")
    sql.add_argument("--as-of", metavar="VERSION|TIMESTAMP",
                     help="read every table as of a version (12) or time (2026-11-20T10:00:00Z); "
                          "per table in the SQL: silver_dns@v12")
    sql.set_defaults(func=cmd_sql)

    tables = sub.add_parser("tables", help="list the tables: version, rows, files, size, last commit, partitioning")
    home_arg(tables)
    tables.add_argument("--format", choices=FORMATS, default="table",
                        help="aligned table (default), CSV with a header, or JSON Lines")
    tables.set_defaults(func=cmd_tables)

    history = sub.add_parser("history", help="list a table's commits: version, time, operation, batch, rows added")
    home_arg(history)
    history.add_argument("table", metavar="TABLE")
    output_args(history, f"newest commits shown, 0 = all (default {DEFAULT_LIMIT})")
    history.set_defaults(func=cmd_history)
