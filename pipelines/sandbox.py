"""What SQL from a user may never do in seclake: call Java, run a program, read files by path, write.

One policy, checked on the sqlglot tree (Spark dialect) before Spark sees the statement, shared by
the rule validator (`pipelines/rules/spec.py`, which adds the rules' own restrictions) and
analysts' SQL (`seclake sql`, `pipelines/sql/statements.py`). `seclake serve` enforces the same
policy inside the JVM (`jvm/sandbox/`), because statements from JDBC clients never pass through
Python; `docs/bi.md` says why there are two implementations and what each refuses.
"""
from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import Token

_REFLECTION = "calls Java methods by reflection, outside SQL's sandbox"
ESCAPE_FUNCTIONS: dict[str, str] = {
    "reflect": _REFLECTION,
    "java_method": _REFLECTION,
    "try_reflect": _REFLECTION,
    "read_files": "reads arbitrary files",
    "identifier": "builds table or column names at run time, which the sandbox cannot check",
    "table_changes_by_path": "reads a Delta table by its path",
}
"""Functions refused anywhere in a statement (lambdas and subqueries included), with the reason."""

# `<format>.\`<path>\`` reads a file when spark.sql.runSQLOnFiles is on (seclake turns it off too).
FILE_FORMATS: frozenset[str] = frozenset({
    "parquet", "json", "csv", "orc", "text", "avro", "delta", "binaryfile", "xml", "jdbc", "hive", "file",
})

# Statements (or parts of one) that write data, change the catalog or the session, or run a
# command sqlglot only knows as opaque text (ADD JAR, EXECUTE IMMEDIATE, MSCK, ...).
_WRITES: tuple[type[exp.Expr], ...] = (
    exp.Create, exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Drop, exp.Alter, exp.TruncateTable,
    exp.LoadData, exp.Command, exp.Set, exp.Use, exp.Cache, exp.Uncache, exp.Refresh, exp.Analyze, exp.Declare,
)
# Token types that only occur in statements that write or run something, for statements sqlglot
# cannot parse (the check then falls back to the tokens).
_WRITING_TOKENS = frozenset({"INSERT", "CREATE", "DROP", "DELETE", "UPDATE", "MERGE", "ALTER", "CACHE",
                             "TRUNCATE", "LOAD", "COMMAND", "SET", "USE", "EXECUTE"})


class SandboxError(ValueError):
    """A statement the sandbox refuses; the message says what and why, in one line."""


def function_names(node: exp.Func) -> set[str]:
    """Every lower-case name Spark could know the function node by (`builtin.reflect` -> reflect).

    >>> import sqlglot
    >>> sorted(function_names(sqlglot.parse_one("`REFLECT`('a', 'b')", read="spark")))
    ['reflect']
    """
    if isinstance(node, exp.Anonymous):
        return {str(node.name).lower()}
    return {n.lower() for n in type(node).sql_names()} | {node.key.lower()}


def check_escapes(tree: exp.Expr) -> None:
    """Raise SandboxError for the first construct in `tree` that escapes SQL or writes.

    >>> import sqlglot
    >>> check_escapes(sqlglot.parse_one("SELECT transform(array(1), x -> java_method('a', 'b'))", read="spark"))
    Traceback (most recent call last):
    pipelines.sandbox.SandboxError: function java_method() is not allowed: it calls Java methods by reflection, \
outside SQL's sandbox
    """
    for node in tree.walk():
        if isinstance(node, exp.QueryTransform):
            raise SandboxError("TRANSFORM ... USING runs an external command: not allowed")
        if isinstance(node, _WRITES):
            raise SandboxError(f"{_statement_word(node)} is not allowed: only reading statements are")
        if isinstance(node, exp.Func):
            for name in sorted(function_names(node) & ESCAPE_FUNCTIONS.keys()):
                raise SandboxError(f"function {name}() is not allowed: it {ESCAPE_FUNCTIONS[name]}")
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            check_table_name(node)


def check_table_name(table: exp.Table) -> None:
    """Refuse a table reference that names a file (`parquet.\\`/etc\\``, `` `/tmp/x` ``) instead of a table.

    >>> import sqlglot
    >>> check_table_name(sqlglot.parse_one("SELECT * FROM json.`/etc/x`", read="spark").find(exp.Table))
    Traceback (most recent call last):
    pipelines.sandbox.SandboxError: file-path read json.`/etc/x` is not allowed; read seclake tables by name
    """
    qualifier = ".".join(p for p in (table.catalog, table.db) if p)
    name = table.name
    if table.db.lower() in FILE_FORMATS or "/" in name or ":" in name:
        shown = f"{qualifier}.`{name}`" if qualifier else f"`{name}`"
        raise SandboxError(f"file-path read {shown} is not allowed; read seclake tables by name")


def check_tokens(tokens: list[Token]) -> None:
    """The same policy for a statement sqlglot cannot parse, from its tokens: conservative, since a
    column named like an escape function is refused too; Spark rejects the syntax in most cases anyway."""
    describe = bool(tokens) and tokens[0].token_type.name == "DESCRIBE"
    for token, after in zip(tokens, [*tokens[1:], None], strict=True):
        kind, text = token.token_type.name, token.text
        if kind == "USING" and after is not None and after.token_type.name == "STRING":
            # Hive's MAP ... USING / REDUCE ... USING, which sqlglot cannot parse: TRANSFORM's synonyms.
            raise SandboxError("TRANSFORM (MAP, REDUCE) ... USING runs an external command: not allowed")
        if describe and kind == "STRING" and ("/" in text or ":" in text):  # Delta's DESCRIBE DETAIL '/path'
            raise SandboxError(f"file-path read '{text}' is not allowed; read seclake tables by name")
        if kind in ("VAR", "IDENTIFIER") and text.lower() in ESCAPE_FUNCTIONS:
            raise SandboxError(f"function {text.lower()}() is not allowed: it {ESCAPE_FUNCTIONS[text.lower()]}")
        if kind == "IDENTIFIER" and ("/" in text or ":" in text):
            raise SandboxError(f"file-path read `{text}` is not allowed; read seclake tables by name")
        if kind in _WRITING_TOKENS:
            raise SandboxError(f"{text.upper()} is not allowed: only reading statements are")


def _statement_word(node: exp.Expr) -> str:
    if isinstance(node, exp.Command):
        return str(node.this).upper()  # the command's first word: ADD, EXECUTE, MSCK, ...
    words: dict[type[exp.Expr], str] = {exp.TruncateTable: "TRUNCATE", exp.LoadData: "LOAD DATA"}
    return words.get(type(node), node.key.upper())
