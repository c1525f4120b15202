"""Printing results: query results and the `tables`/`history` listings as aligned text, CSV or JSON Lines."""
from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

    from pipelines.sql.database import Database

FORMATS = ("table", "csv", "json")
_MAX_CELL = 80


def json_keys(names: list[str]) -> list[str]:
    """A result's column names as JSON keys: a repeated name (`SELECT a.src_ip, b.src_ip`) numbered
    from its second, since JSON readers keep one value per key.

    >>> json_keys(["src_ip", "count", "src_ip", "src_ip_2"])
    ['src_ip', 'count', 'src_ip_3', 'src_ip_2']
    """
    taken = set(names)
    keys = []
    for name in names:
        if name in keys:
            number = 2
            while f"{name}_{number}" in taken:
                number += 1
            name = f"{name}_{number}"
            taken.add(name)
        keys.append(name)
    return keys


def write_frame(db: Database, df: DataFrame, fmt: str, limit: int, out: TextIO, err: TextIO) -> None:
    """Print a query result; at most `limit` rows (0 = all), saying so when more exist."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType

    names = df.columns
    positional = df.toDF(*[f"_c{i}" for i in range(len(names))])  # result columns may share a name
    if fmt == "json":
        # Spark renders the values (session time zone, arrays, structs) as its own JSON writer would.
        keys = json_keys(names)
        cells = positional.select(F.to_json(F.struct(*[F.col(f"_c{i}").alias(n) for i, n in enumerate(keys)]),
                                            {"ignoreNullFields": "false"}))
    else:
        cells = positional.select(*[F.col(c).cast("string") for c in positional.columns])
    with db.errors():
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


def write_pandas(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    """Print a listing (`tables()`, `history()`): empty cells for missing values, times to the millisecond.

    >>> import sys, pandas as pd
    >>> write_pandas(pd.DataFrame({"version": pd.array([2, None], dtype="Int64"), "op": ["WRITE", None]}),
    ...              "table", sys.stdout)
    version | op
    --------+------
          2 | WRITE
            |
    (2 rows)
    """
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

    rows: list[list[str | None]] = [[cell(v) for v in record] for record in frame.itertuples(index=False)]
    right = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in frame.dtypes]
    _write_rows(out, fmt, list(frame.columns), rows, right, truncated=False)


def write_tables(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    """`tables()`; for people (table format) with sizes in KB/MB and "not created yet" as the last commit."""
    if fmt == "table":
        frame = frame.assign(
            size=[_human_size(n) if e else None for n, e in zip(frame["size_bytes"], frame["exists"])],
            last_commit=[t if e else "not created yet" for t, e in zip(frame["last_commit"], frame["exists"])],
        )[["name", "layer", "version", "rows", "files", "size", "last_commit", "partitioned_by"]]
    write_pandas(frame, fmt, out)


def table_text(header: list[str], rows: list[list[str | None]], right: list[bool]) -> str:
    """psql-style aligned text; NULL for nulls, multi-line cells (EXPLAIN) kept, and long cells
    cut when other columns stand beside them (CSV and JSON always print whole values).

    >>> print(table_text(["n", "s"], [["1", "a\\nb"], ["10", None]], [True, False]), end="")
    n  | s
    ---+-----
     1 | a
       | b
    10 | NULL
    """
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


def _write_rows(out: TextIO, fmt: str, header: list[str], rows: list[list[str | None]], right: list[bool],
                truncated: bool) -> None:
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in row] for row in rows])
        return
    out.write(table_text(header, rows, right))
    out.write(_rows_note(len(rows), truncated))


def _rows_note(count: int, truncated: bool) -> str:
    rows = f"{count} row{'' if count == 1 else 's'}"
    return f"(showing first {rows})\n" if truncated else f"({rows})\n"


def _human_size(n: int) -> str:
    """A byte count in B, KB, MB, ... (powers of 1024).

    >>> _human_size(512), _human_size(1536), _human_size(3 * 1024**3)
    ('512 B', '1.5 KB', '3.0 GB')
    """
    units = ("B", "KB", "MB", "GB", "TB")
    size, step = float(n), 0
    while size >= 1024 and step < len(units) - 1:
        size, step = size / 1024, step + 1
    return f"{n} B" if step == 0 else f"{size:.1f} {units[step]}"
