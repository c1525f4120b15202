"""Whole landing files -> one row per data line, with the Zeek header block that governs it.

The ETL reads each landing file as one row (`wholetext`), so a line's position and the
`#fields` header it depends on are both known from the file itself: no ordering across
rows is needed and the same code runs on streaming and batch DataFrames.

A Zeek file is first cut into header blocks (one per `#separator` line: Zeek starts every
header with it, and concatenated logs repeat it), the block's header values are read with
regular expressions, then the block is cut into lines. A block's first line number is the
line count of the text before it.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.parsers.common import Query, lit
from pipelines.schemas import SOURCES

# Header lines whose value is used, with their defaults when absent. `#separator` is followed
# by a space (the separator is not known yet), the others by the separator.
_HEADER_DEFAULTS = {"set_separator": ",", "empty_field": "(empty)", "unset_field": "-", "path": None}


def check_source(source: str) -> None:
    """Raise ValueError naming `source` unless it is one of SOURCES.

    >>> check_source("zeek")
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {list(SOURCES)}")


def split_lines(files: DataFrame, source: str) -> DataFrame:
    """Whole files (`file`, `text`) -> one row per data line.

    Columns: `source`, `file`, `line_number` (1-based, counting every physical line including
    headers), `raw` (the line without its `\\n` or `\\r\\n`; invalid UTF-8 bytes appear as
    U+FFFD), `valid_utf8`; for Zeek also `zeek_format` ('tsv' | 'json' | NULL, from the
    file's first characters) and `zeek_header` (struct: separator, set_separator,
    empty_field, unset_field, path, fields, types of the header block above the line; NULL
    when that block has no `#fields`). Zeek `#` lines and the empty string after a file's
    final newline are not data lines; a blank line anywhere else is (parse quarantines it).

    >>> files = spark.createDataFrame([("dns.log", '{"ts":1}\\n\\n')], "file string, text string")
    >>> [(r.line_number, r.raw) for r in split_lines(files, "zeek").collect()]
    [(1, '{"ts":1}'), (2, '')]
    """
    check_source(source)
    # Splitting decodes the text, which turns invalid bytes into U+FFFD; so a U+FFFD in a line
    # of a file that is not valid UTF-8 marks a bad line (a valid file may hold a genuine one).
    q = Query(["file", "text"]).stage(["file", "text"], _file_utf8="is_valid_utf8(text)")
    if source == "zeek":
        _zeek_blocks(q)
    else:
        q.stage(["file", "_file_utf8"], _bi="0", _nblocks="1", _before="0", _block="text")
    zeek = ["zeek_format", "zeek_header"] if source == "zeek" else []
    keep = ["file", "_file_utf8", "_bi", "_nblocks", "_before", *zeek]
    q.stage(keep, _lines="split(_block, '\\n', -1)")
    q.stage("*", _nlines="size(_lines)")
    q.explode([*keep, "_nlines"], "_lines", "_li", "_line")
    trailing = "(_bi = _nblocks - 1 AND _li = _nlines - 1 AND _line = '')"
    header_line = " OR _line LIKE '#%'" if source == "zeek" else ""
    q.where(f"_li IS NOT NULL AND NOT ({trailing}{header_line})")
    q.stage(zeek,
            source=lit(source),
            file="file",
            line_number="CAST(_before + _li + 1 AS BIGINT)",
            raw="CASE WHEN endswith(_line, '\\r') THEN substr(_line, 1, char_length(_line) - 1) ELSE _line END",
            valid_utf8="(_file_utf8 OR instr(_line, '\\uFFFD') = 0)")
    return q.stage(["source", "file", "line_number", "raw", "valid_utf8", *zeek]).build(files)


def _zeek_blocks(q: Query) -> None:
    """Turn one row per file into one row per header block: _bi, _nblocks, _before (lines before it), _block
    text, zeek_format, zeek_header."""
    start = "ltrim(substr(text, 1, 64))"
    q.stage(["file", "text", "_file_utf8"],
            zeek_format=f"CASE WHEN {start} LIKE '#%' THEN 'tsv' WHEN {start} LIKE '{{%' THEN 'json' END",
            _blocks="split(text, '\\n(?=#separator )', -1)")
    q.stage("*", _nblocks="size(_blocks)")
    q.explode(["file", "text", "_file_utf8", "zeek_format", "_nblocks"], "_blocks", "_bi", "_block")
    # The text before block k ends just before the k-th '\n#separator '.
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_block"],
            _prefix="CASE WHEN _bi > 0 THEN substring_index(text, '\\n#separator ', _bi) END")

    def header_line(name: str) -> str:
        # Only blocks that start with a header are searched: a JSON file has no headers and
        # a regex miss scans the whole block.
        return f"CASE WHEN _block LIKE '#%' THEN nullif(regexp_extract(_block, '(?m)^(#{name}[^\\r\\n]*)', 1), '') END"

    lines = {f"_h_{name}": header_line(name) for name in [*_HEADER_DEFAULTS, "fields", "types"]}
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_block"],
            _before="coalesce(octet_length(_prefix) - octet_length(replace(_prefix, '\\n', '')) + 1, 0)",
            _sep_raw="CASE WHEN _block LIKE '#%' THEN regexp_extract(_block, '^#separator ([^\\r\\n]*)', 1) END",
            **lines)
    # '#separator \x09' spells the separator as hex escapes; absent means tab.
    q.stage("*", _sep="CASE WHEN coalesce(_sep_raw, '') = '' THEN '\\t' "
                      "WHEN _sep_raw RLIKE '^(\\\\\\\\x[0-9a-fA-F]{2})+$' "
                      "THEN decode(unhex(replace(_sep_raw, '\\\\x', '')), 'UTF-8') ELSE _sep_raw END")

    def value(name: str) -> str:
        return f"substr(_h_{name}, {len(name) + 2} + char_length(_sep))"

    def values_of(name: str) -> str:
        return f"split({value(name)}, {separator_regex('_sep')}, -1)"

    defaults = {name: value(name) if default is None else f"coalesce({value(name)}, {lit(default)})"
                for name, default in _HEADER_DEFAULTS.items()}
    header = ", ".join(["'separator', _sep", *[f"'{n}', {sql}" for n, sql in defaults.items()],
                        f"'fields', {values_of('fields')}", f"'types', {values_of('types')}"])
    q.stage(["file", "_file_utf8", "zeek_format", "_nblocks", "_bi", "_before", "_block"],
            zeek_header=f"CASE WHEN _h_fields IS NOT NULL THEN named_struct({header}) END")


def separator_regex(sep: str) -> str:
    """SQL: a regex matching the separator in column/expression `sep` literally.

    A tab stays a bare tab, which Java's String.split handles without a regex engine.
    """
    return f"CASE WHEN {sep} = '\\t' THEN {sep} ELSE concat('\\\\Q', {sep}, '\\\\E') END"
