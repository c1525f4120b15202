"""What the `seclake` commands print: progress while long work runs, aligned tables for summaries.

One module for every command. On a terminal, progress is a live bar (rich) on stderr that
disappears when the work is done; anywhere else (a pipe, a file, CI, tests) each step is one
plain line on stderr, so logs keep every step. Tables are aligned text; on a terminal the
header is bold, elsewhere the output holds no escape codes.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from io import StringIO
from types import TracebackType
from typing import TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Column, Table

# A header rule of '-' and nothing else: readable in any log viewer, no box-drawing characters.
_HEAD_RULE = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
# Width given to rich when the output is not a terminal: rich would otherwise wrap at 80
# columns, and a log line or table row should stay one line however long.
PLAIN_WIDTH = 10_000


def stamped(line: str, at: datetime | None = None) -> str:
    """A line of `seclake stream`'s running output with its time (UTC) in front: the stream prints
    every query's progress each minute for days, and an operator must tell when a line was said.

    >>> stamped("etl: 1 batch", datetime(2026, 12, 6, 4, 20, 10, tzinfo=timezone.utc))
    '2026-12-06 04:20:10Z etl: 1 batch'
    """
    return f"{(at or datetime.now(timezone.utc)).astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}Z {line}"


def interactive(stream: TextIO) -> bool:
    """True when `stream` is a terminal (progress is drawn live there).

    >>> interactive(StringIO())
    False
    """
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _console(stream: TextIO) -> Console:
    if interactive(stream):
        return Console(file=stream, highlight=False)
    return Console(file=stream, highlight=False, color_system=None, force_terminal=False,
                   force_interactive=False, width=PLAIN_WIDTH, soft_wrap=True)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]], title: str | None) -> Table:
    table = Table(title=title, title_justify="left", box=_HEAD_RULE, header_style="bold",
                  title_style="bold", show_edge=False, pad_edge=False)
    for i, name in enumerate(columns):
        values = [row[i] for row in rows if row[i] is not None]
        numeric = bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table row {list(row)!r} has {len(row)} cells, not {len(columns)} ({', '.join(columns)})")
        table.add_row(*(_cell(v) for v in row))
    return table


def format_table(columns: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None) -> str:
    """`rows` as aligned plain text under `columns`: numbers right-aligned with thousands separators,
    None as '-'; one line per row however long.

    >>> print(format_table(["table", "rows"], [("silver_dns", 1797), ("alerts", None)]))
    table         rows
    ------------------
    silver_dns   1,797
    alerts           -
    """
    out = StringIO()
    _console(out).print(_table(columns, list(rows), title))
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())


def print_table(columns: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None,
                stream: TextIO | None = None) -> None:
    """Print `format_table(columns, rows, title)` to `stream` (stdout), in bold headers on a terminal."""
    stream = stream or sys.stdout
    if interactive(stream):
        _console(stream).print(_table(columns, list(rows), title))
    else:
        print(format_table(columns, rows, title), file=stream, flush=True)


class Progress:
    """Progress of long work, on stderr: a live bar on a terminal, else one plain line per step.

    `label` names the work ('run-once'); `total` is the number of steps, None when unknown; or
    `steps` names them in order, and the bar says which one runs (`working_on()`).

    >>> out = StringIO()
    >>> with Progress("maintain", total=2, stream=out) as progress:
    ...     progress.step("silver_dns compacted")
    >>> out.getvalue()
    'maintain [1/2] silver_dns compacted\\n'
    """

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None,
                 steps: Sequence[str] = ()) -> None:
        self.label = label
        self.steps = list(steps)
        self.total = len(self.steps) if self.steps else total
        self.done = 0
        self.stream = stream or sys.stderr
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress:
        if interactive(self.stream):
            # The label and counts keep their width; a long step message is cut, not wrapped.
            self._bar = RichProgress(SpinnerColumn(), TextColumn("[bold]{task.fields[label]}",
                                                                 table_column=Column(no_wrap=True)),
                                     BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("{task.description}", markup=False,
                                                table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                                     console=_console(self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total, label=self.label)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def working_on(self, what: str | None = None) -> None:
        """Say what runs now (shown on the bar; no plain line, the step's own line follows);
        None: the next of `steps`."""
        if what is None and self.done < len(self.steps):
            what = f"running {self.steps[self.done]}"
        if self._bar is not None and self._task is not None and what is not None:
            self._bar.update(self._task, description=what)

    def step(self, message: str) -> None:
        """One step done: advance the bar, or print `label [k/total] message`."""
        self.done += 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=1, description=message)
            if self.done < len(self.steps):
                self.working_on()
            return
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        print(f"{self.label} [{count}] {message}", file=self.stream, flush=True)

    def note(self, message: str) -> None:
        """A line that stays: printed above a live bar, or as a plain line."""
        if self._bar is not None:
            self._bar.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.stream, flush=True)
