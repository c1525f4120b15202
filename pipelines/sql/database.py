"""The Python API: `connect()` and `Database`, Spark SQL over one home's registry tables."""
from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pipelines.home import Home
from pipelines.sql.statements import (
    Pin,
    SqlError,
    describe,
    inspect,
    parse_as_of,
    rewrite_time_travel,
    split_statements,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.lake.registry import Lake

# Temp views are session-wide: one statement at a time registers, analyses and drops its views.
_VIEWS_LOCK = threading.Lock()


def connect(home: str | os.PathLike | None = None, *, spark: SparkSession | None = None) -> Database:
    """The registry's tables in `home` (default `$SECLAKE_HOME`, else ./seclake-home), ready for SQL.

    For example `connect("/data/seclake").sql("SELECT count(*) AS n FROM silver_dns@v3").first().n`.
    A folder without `tables/` fails here, before Spark starts.
    """
    from pipelines.lake.registry import Lake

    return Database(Lake(Home.resolve(home).existing()), spark)


class Database:
    """Spark SQL over one home's tables; every statement reads one committed snapshot per table.

    A DataFrame returned by `sql` or `table` reads one snapshot per table each time it runs: the
    newest, unless pinned with `as_of` or `name@v12` (Delta's semantics). Spark starts on the
    first query, so `tables()` and `history()` are instant.
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
        """Run one statement; `as_of` pins every plain table reference. `args` is passed to Spark for
        `:name` markers, but with delta-spark's session extension Spark 4.2 leaves them unbound
        (SqlError: UNBOUND_SQL_PARAMETER; see the xfail in tests/test_sql.py): put values in the SQL."""
        statements = split_statements(statement)
        if len(statements) != 1:
            raise SqlError(f"sql() runs exactly one statement, got {len(statements)}")
        default = None if as_of is None else parse_as_of(as_of)
        text, pins, edits = rewrite_time_travel(statements[0])
        found = inspect(text)
        latest: list[str] = []
        for name in sorted(found.tables - pins.keys()):
            if name in self.lake.names() and (found.exact or self.lake.exists(name)):
                if default is None:
                    latest.append(name)
                else:
                    pins[name] = Pin(name, default)
            elif (found.exact and name not in found.ctes and "." not in name
                  and not self.spark.catalog.tableExists(name)):
                raise SqlError(self._unknown_table(name))
        with self.errors(text, edits):
            self.lake.register(self.spark, latest)
        with _VIEWS_LOCK:
            registered: list[str] = []
            try:
                for view, pin in pins.items():
                    self.table(pin.table, pin.as_of).createOrReplaceTempView(view)
                    registered.append(view)
                with self.errors(text, edits):
                    # Analysis happens here: each table's snapshot is fixed for the whole statement.
                    return self.spark.sql(text, args=args)
            finally:
                for view in registered:
                    self.spark.catalog.dropTempView(view)

    def table(self, name: str, as_of: str | int | datetime | None = None) -> DataFrame:
        """One committed snapshot of `name` (the latest, or the one `as_of` a version or time)."""
        if name not in self.lake.names() or not self.lake.exists(name):
            raise SqlError(self._unknown_table(name))
        when = None if as_of is None else parse_as_of(as_of)
        with self.errors():
            try:
                return (self.lake.read(self.spark, name, version=when) if isinstance(when, int)
                        else self.lake.read(self.spark, name, timestamp=when))
            except ValueError as exc:
                raise SqlError(str(exc)) from None

    def tables(self) -> pd.DataFrame:
        """Every registry table: version, rows, files, bytes, last commit, partitioning (from the Delta log)."""
        import pandas as pd

        from pipelines.lake.log import summary

        rows = []
        for name in self.lake.names():
            spec = self.lake.spec(name)
            row: dict[str, Any] = {"name": name, "layer": spec.layer, "exists": self.lake.exists(name),
                                   "partitioned_by": ", ".join(spec.partition_by)}
            if row["exists"]:
                with self.errors():
                    found = summary(self.lake.path(name))
                # Row counts come from the files' stats, so listing stays instant on big tables.
                row.update(version=found.version, rows=found.rows, files=found.files, size_bytes=found.size_bytes,
                           last_commit=found.last_commit, partitioned_by=", ".join(found.partition_columns))
            rows.append(row)
        columns = ["name", "layer", "exists", "version", "rows", "files", "size_bytes", "last_commit", "partitioned_by"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.astype({c: "Int64" for c in ("version", "rows", "files", "size_bytes")})

    def history(self, name: str, limit: int | None = None) -> pd.DataFrame:
        """The commits of `name`, newest first: version, time, operation, app_id/batch_id (txn), rows and files
        added."""
        import pandas as pd

        from pipelines.lake.log import commits

        if name not in self.lake.names() or not self.lake.exists(name):
            raise SqlError(self._unknown_table(name))
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        with self.errors():
            rows = commits(self.lake.path(name), limit)
        columns = ["version", "timestamp", "operation", "app_id", "batch_id", "rows_added", "files_added"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.astype({c: "Int64" for c in ("version", "batch_id", "rows_added", "files_added")})

    def created(self) -> list[str]:
        """Names of the registry tables that exist in this home."""
        return [name for name in self.lake.names() if self.lake.exists(name)]

    @contextmanager
    def errors(self, text: str = "", edits: list[tuple[int, int, int]] | None = None) -> Iterator[None]:
        """Turn Spark and delta-rs failures into one-line SqlErrors, positions mapped back to the user's text.

        Also for running a DataFrame from `sql`: its errors at collect time are the statement's too.
        """
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
                name = (exc.getMessageParameters() or {}).get("relationName", "").replace("`", "")
                raise SqlError(self._unknown_table(name.lower())) from exc
            raise SqlError(describe(str(exc), text, edits or [], syntax=isinstance(exc, ParseException))) from exc
        except Py4JJavaError as exc:
            raise SqlError(describe(str(exc.java_exception.getMessage()), text, edits or [])) from exc
        except (Py4JError, DeltaError) as exc:
            raise SqlError(describe(str(exc), text, edits or [])) from exc
        finally:
            for lg, was in zip(loggers, previous):
                lg.disabled = was

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
