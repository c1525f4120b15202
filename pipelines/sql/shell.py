"""The interactive `seclake sql` shell: statements end with `;`, dot-commands act at once."""
from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timezone
from typing import TYPE_CHECKING, TextIO

from pipelines.settings import MAX_ROWS
from pipelines.sql.output import FORMATS, table_text, write_frame, write_pandas, write_tables
from pipelines.sql.statements import AsOf, code_only, parse_as_of, split_statements

if TYPE_CHECKING:
    from pipelines.sql.database import Database

HISTORY_FILE = ".sql_history"

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


class Shell:
    """The interactive loop: statements end with `;`, dot-commands act at once, errors never end it."""

    def __init__(self, db: Database, fmt: str, limit: int, as_of: AsOf | None, out: TextIO, err: TextIO) -> None:
        self.db, self.fmt, self.limit, self.as_of, self.out, self.err = db, fmt, limit, as_of, out, err

    def run(self, read_line: Callable[[str], str]) -> int:
        """Read lines with `read_line(prompt)` until `.quit`, `\\q` or end of input; the exit code."""
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
            if code_only(text).rstrip().endswith(";"):
                buffer = []
                for statement in split_statements(text):
                    self._guarded(functools.partial(self._run, statement))

    def _run(self, statement: str) -> None:
        write_frame(self.db, self.db.sql(statement, as_of=self.as_of), self.fmt, self.limit, self.out, self.err)

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
            self._guarded(lambda: write_tables(self.db.tables(), self.fmt, self.out))
        elif word == ".history" and rest:
            self._guarded(lambda: write_pandas(self.db.history(rest, limit=self.limit or None), self.fmt, self.out))
        elif word == ".schema" and rest:
            self._guarded(lambda: self._schema(rest))
        elif word == ".format" and rest in FORMATS:
            self.fmt = rest
        elif word == ".limit" and rest:
            if rest.isdigit() and int(rest) <= MAX_ROWS:  # Spark's limit takes an int
                self.limit = int(rest)
            else:
                self.err.write(f"error: .limit {rest}: a row count from 0 (all) to {MAX_ROWS}\n")
        elif word == ".as-of" and rest:
            try:
                self.as_of = None if rest == "off" else parse_as_of(rest)
            except ValueError as exc:
                self.err.write(f"error: {exc}\n")
            else:  # said: it changes what every following statement reads
                pinned = (f"version {self.as_of}" if isinstance(self.as_of, int)
                          else f"{self.as_of.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC" if self.as_of is not None
                          else None)
                self.err.write(f"every table read as of {pinned} (.as-of off: as of now)\n" if pinned
                               else "every table read as of now\n")
        else:
            self.err.write(f"error: unknown or incomplete command {line!r}; .help lists them\n")
        return True

    def _schema(self, name: str) -> None:
        fields = self.db.table(name).schema.fields
        self.out.write(table_text(["column", "type"], [[f.name, f.dataType.simpleString()] for f in fields],
                                  [False, False]))


def readline_input(db: Database) -> tuple[Callable[[str], str], Callable[[], None]]:
    """`input` with line editing, tab completion of table names and history kept in the home folder;
    also the function that saves that history."""
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
