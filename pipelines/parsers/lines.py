"""Whole landing files -> one row per data line, with the header block that governs it.

The ETL reads each landing file as one row (`wholetext`), so a line's position and the header
it depends on (Zeek's `#fields`) are both known from the file itself: no ordering across rows
is needed and the same code runs on streaming and batch DataFrames.

A source with headers cuts its file into blocks (`Source.header_blocks`), then each block is
cut into lines. A block's first line number is the line count of the text before it.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.parsers.common import Query, lit
from pipelines.parsers.sources import get_source


def split_lines(files: DataFrame, source: str) -> DataFrame:
    """Whole files (`file`, `text`) -> one row per data line.

    Columns: `source`, `file`, `line_number` (1-based, counting every physical line including
    headers), `raw` (the line without its `\\n` or `\\r\\n`; invalid UTF-8 bytes appear as
    U+FFFD), `valid_utf8`, and the source's `block_columns` (for Zeek `zeek_format` and
    `zeek_header`). Header lines (`comment_prefix`) and the empty string after a file's final
    newline are not data lines; a blank line anywhere else is (parse quarantines it).
    ValueError names an unknown source.

    >>> files = spark.createDataFrame([("dns.log", '{"ts":1}\\n\\n')], "file string, text string")
    >>> [(r.line_number, r.raw) for r in split_lines(files, "zeek").collect()]
    [(1, '{"ts":1}'), (2, '')]
    """
    spec = get_source(source)
    # Splitting decodes the text, which turns invalid bytes into U+FFFD; so a U+FFFD in a line
    # of a file that is not valid UTF-8 marks a bad line (a valid file may hold a genuine one).
    # A byte-order mark (an editor's, Windows' tools') is not part of the first line: with it, a
    # Zeek file's header block was not found and every line was quarantined.
    q = (Query(["file", "text"])
         .stage(["file"], text="CASE WHEN startswith(text, '\\uFEFF') THEN substr(text, 2) ELSE text END")
         .stage(["file", "text"], _file_utf8="is_valid_utf8(text)"))
    if spec.header_blocks is not None:
        spec.header_blocks(q)
    else:
        q.stage(["file", "_file_utf8"], _bi="0", _nblocks="1", _before="0", _block="text")
    extra = list(spec.block_columns)
    keep = ["file", "_file_utf8", "_bi", "_nblocks", "_before", *extra]
    q.stage(keep, _lines="split(_block, '\\n', -1)")
    q.stage("*", _nlines="size(_lines)")
    q.explode([*keep, "_nlines"], "_lines", "_li", "_line")
    trailing = "(_bi = _nblocks - 1 AND _li = _nlines - 1 AND _line = '')"
    header_line = f" OR startswith(_line, {lit(spec.comment_prefix)})" if spec.comment_prefix else ""
    q.where(f"_li IS NOT NULL AND NOT ({trailing}{header_line})")
    q.stage(extra,
            source=lit(source),
            file="file",
            line_number="CAST(_before + _li + 1 AS BIGINT)",
            raw="CASE WHEN endswith(_line, '\\r') THEN substr(_line, 1, char_length(_line) - 1) ELSE _line END",
            valid_utf8="(_file_utf8 OR instr(_line, '\\uFFFD') = 0)")
    return q.stage(["source", "file", "line_number", "raw", "valid_utf8", *extra]).build(files)
