"""The text of a statement: as-of values, splitting at `;`, the tables it reads, `t@v12` rewriting, error messages.

Pure functions over strings (sqlglot, no Spark), so the shell, the commands and `Database` agree on them.
"""
from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from datetime import datetime

from pipelines.sandbox import SandboxError, check_escapes, check_tokens
from pipelines.settings import utc_instant

AsOf = int | datetime

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

# sqlglot warns when it parses a statement as an opaque Command; inspect handles that case itself.
logging.getLogger("sqlglot").setLevel(logging.ERROR)


class SqlError(ValueError):
    """A statement that cannot run, said in one line (the Spark or delta-rs error stays chained)."""


def parse_as_of(value: str | int | datetime) -> AsOf:
    """A table version (`12`, `v12`) or a point in time (ISO 8601, UTC unless it names an offset).

    >>> parse_as_of("v12"), parse_as_of("2026-11-20T10:00:00Z")
    (12, datetime.datetime(2026, 11, 20, 10, 0, tzinfo=datetime.timezone.utc))
    """
    if isinstance(value, datetime):
        return utc_instant(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip()
    if re.fullmatch(r"[vV]?\d+", text):
        return int(text.lstrip("vV"))
    try:
        return utc_instant(text)
    except ValueError:
        raise ValueError(f"bad as-of {value!r}: expected a version (12 or v12) "
                         "or an ISO timestamp (2026-11-20T10:00:00Z)") from None


@dataclass(frozen=True)
class Pin:
    """One view a statement needs: `table` at `as_of` (None = the latest commit)."""

    table: str
    as_of: AsOf | None


@dataclass(frozen=True)
class Found:
    """What a statement names: tables (lower case, `db.t` when qualified), CTE names, and whether
    sqlglot parsed it (`exact`) or the names are a token-level guess."""

    tables: set[str]
    ctes: set[str]
    exact: bool


def inspect(text: str) -> Found:
    """Find the tables a statement reads; refuse statements that could write, call Java or read files
    (`pipelines.sandbox`: the same policy as the rule validator's).

    >>> found = inspect("WITH x AS (SELECT * FROM Silver_DNS) SELECT * FROM x JOIN range(3)")
    >>> sorted(found.tables), found.ctes, found.exact
    (['silver_dns', 'x'], {'x'}, True)
    >>> inspect("WITH x AS (SELECT 1) INSERT INTO silver_dns SELECT * FROM x")
    Traceback (most recent call last):
    pipelines.sql.statements.SqlError: refused by the sandbox: INSERT is not allowed: only reading statements are
    >>> inspect("SELEC count(*) FROM silver_dns")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    pipelines.sql.statements.SqlError: 'SELEC' is not a statement; did you mean SELECT? (start with one of ...)
    """
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    code = code_only(text)
    first = re.match(r"[\s(]*([A-Za-z]+)", code)
    word = first.group(1).upper() if first else ""
    if word not in _READING_WORDS:
        starts = f"(start with one of {', '.join(sorted(_READING_WORDS))})"
        typo = difflib.get_close_matches(word, _READING_WORDS, n=1, cutoff=0.75)
        if typo:
            raise SqlError(f"{word!r} is not a statement; did you mean {typo[0]}? {starts}")
        if code.lstrip().startswith("."):
            raise SqlError(f"{code.split()[0]!r} is a command of the interactive shell (`seclake sql` with no "
                           "query, on a terminal), not SQL")
        if word == "SHOW":
            raise SqlError("SHOW is not run here: `seclake tables` (or .tables in the shell) lists the tables, "
                           "DESCRIBE <table> gives its columns")
        raise SqlError(f"read-only: {word or text.strip()[:20]!r} statements are not allowed {starts}")
    explain = _EXPLAIN_RE.match(code)
    if explain:  # sqlglot keeps EXPLAIN's statement as one opaque string: look inside it
        return inspect(text[explain.end():])
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except SqlglotError:
        tree = None
    if tree is not None and not isinstance(tree, exp.Command):
        try:
            check_escapes(tree)
        except SandboxError as exc:
            raise SqlError(f"refused by the sandbox: {exc}") from None
        tables = set()
        for table in tree.find_all(exp.Table):
            if not isinstance(table.this, exp.Identifier):
                continue  # a table-valued function such as range(10)
            tables.add(".".join(p.name for p in table.parts).lower())
        # DESCRIBE FUNCTION f also parses as a table: leave DESCRIBE's other names to Spark.
        return Found(tables, {cte.alias.lower() for cte in tree.find_all(exp.CTE)},
                     exact=not isinstance(tree, exp.Describe))
    # sqlglot cannot read it (or read it as an opaque Command, like EXPLAIN): guess from the tokens
    # and leave the verdict on names and syntax to Spark.
    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except SqlglotError:
        # Not even tokens: Spark's parser fails on it too, with a better message.
        return Found(set(), set(), exact=False)
    try:
        check_tokens(tokens)
    except SandboxError as exc:
        raise SqlError(f"refused by the sandbox: {exc}") from None
    names = {t.text.lower() for t in tokens if t.token_type.name in ("VAR", "IDENTIFIER")}
    return Found(names, set(), exact=False)


def code_only(text: str) -> str:
    """`text` with comments, strings and quoted names blanked out (same length, same lines).

    >>> code_only("SELECT ';' AS s -- x;")
    'SELECT     AS s      '
    """
    return _OPAQUE_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def split_statements(text: str) -> list[str]:
    """The statements in `text`, split at `;` outside comments and quotes; comment-only pieces dropped.

    >>> split_statements("SELECT 'a;b' AS s; /* c; */ SELECT 2; -- done")
    ["SELECT 'a;b' AS s", ' /* c; */ SELECT 2']
    """
    code = code_only(text)
    bounds = [-1] + [m.start() for m in re.finditer(";", code)] + [len(text)]
    return [text[a + 1:b] for a, b in zip(bounds, bounds[1:]) if code[a + 1:b].strip()]


def rewrite_time_travel(text: str) -> tuple[str, dict[str, Pin], list[tuple[int, int, int]]]:
    """Replace `t@v12` / `t@<ISO time>` with generated view names.

    Returns the new text, the view each name stands for, and the edits (start, end, new length)
    that map positions in Spark's error messages back to the user's text.

    >>> text, pins, edits = rewrite_time_travel("SELECT * FROM Silver_DNS@v12 -- not t@v1")
    >>> text
    'SELECT * FROM silver_dns__v12 -- not t@v1'
    >>> pins, edits
    ({'silver_dns__v12': Pin(table='silver_dns', as_of=12)}, [(14, 28, 15)])
    """
    pins: dict[str, Pin] = {}
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
        pins[view] = Pin(name, as_of)
        edits.append((match.start(), match.end(), len(view)))
        return view

    return _TIME_TRAVEL_RE.sub(replace, text), pins, edits


def describe(message: str, text: str, edits: list[tuple[int, int, int]], *, syntax: bool = False) -> str:
    """One line from a Spark/delta-rs message: no [CONDITION] tag, SQLSTATE, plan or stack trace.

    `text` and `edits` come from `rewrite_time_travel`: a position Spark reports is the user's.

    >>> text, _, edits = rewrite_time_travel("SELECT count(*)\\nFROM silver_dns@v1 WHER x")
    >>> describe("[PARSE_SYNTAX_ERROR] Syntax error at or near 'x'. SQLSTATE: 42601 (line 2, pos 25)\\n== SQL ==",
    ...          text, edits, syntax=True)
    "syntax error at line 2, pos 24: near 'x'."
    """
    if "COLUMN_IS_NOT_VARIANT_TYPE" in message:
        # Spark 4.2 lacks the text of its own error here ("Cannot find main error class ...").
        return ("`column:field` reads a field of a VARIANT column, and the column is not one; for JSON "
                "text such as alerts.details write parse_json(details):field or get_json_object(details, '$.field')")
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", _first_sentence(message))
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


def _first_sentence(message: str) -> str:
    """The message's first line, with the lines that continue its sentence (Delta wraps some of its
    messages: "... available to\\nthis table (...)"); not the plan or stack trace after it.

    >>> _first_sentence("The timestamp is before the version available to\\nthis table (x). Use a later one.\\n'Plan")
    'The timestamp is before the version available to this table (x). Use a later one.'
    >>> _first_sentence("Table not found. Verify the spelling.\\nSearch path: [a, b].")
    'Table not found. Verify the spelling.'
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "failed"
    sentence = lines[0]
    for line in lines[1:]:
        if re.search(r"[.;:!?]$", sentence) or not re.match(r"[a-z(]", line) or line.startswith("at "):
            break
        sentence += " " + line
    return sentence


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
