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

Modules: `database` (`connect`, `Database`), `statements` (the statement text: splitting, the
tables it reads, `@` rewriting, `parse_as_of`, `SqlError`; no Spark), `output` (table, CSV and
JSON printing), `shell` (the interactive loop) and `commands` (the three sub-commands).
"""
from pipelines.sql.database import Database, connect
from pipelines.sql.statements import AsOf, SqlError, parse_as_of

__all__ = ["AsOf", "Database", "SqlError", "connect", "parse_as_of"]
