"""SQL expression builders shared by the Zeek and Suricata parsers.

The parsers are written as Spark SQL expression strings applied with `selectExpr`: one
Python->JVM call per stage instead of one per Column operation (building the same plan with
the Column API took thousands of py4j calls, seconds per micro-batch). No higher-order
functions (lambdas) either: their generated code names lambda variables after fresh
expression ids, so every new plan would miss Spark's compiled-code cache. Nothing here throws
on bad input under ANSI mode: conversions use try_cast, so a bad value becomes NULL and the
caller turns "raw value present but converted value NULL" into a quarantine reason.
"""
from __future__ import annotations

import uuid

from pyspark.sql import DataFrame

# Longer lines are quarantined: real Zeek/EVE lines are a few KB; a megabyte line is a
# corrupt file (missing newlines) or an abuse, and would bloat bronze rows.
MAX_LINE_BYTES = 1 << 20

# Event times outside this window are corrupt (e.g. epoch milliseconds read as seconds) and
# would create absurd event_date partitions.
MIN_EVENT_TIME = "1990-01-01 00:00:00"
MAX_EVENT_TIME = "2100-01-01 00:00:00"


def lit(value: str) -> str:
    """A Spark SQL string literal for `value` (backslashes and quotes escaped).

    >>> lit("a'b\\\\c")
    "'a\\\\'b\\\\\\\\c'"
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Query:
    """A chain of SELECT steps over one input DataFrame, turned into a DataFrame with one `spark.sql` call.

    Each step materialises values that later steps reuse (a reused expression would otherwise
    be copied into every expression that refers to it); building them as one WITH query gets
    the whole chain analysed once instead of once per step.

    >>> q = Query(["file", "text"]).stage(["file"], n="length(text)").where("n > 0")
    >>> q.build(spark.createDataFrame([("a.log", "xyz"), ("b.log", "")], "file string, text string")).collect()
    [Row(file='a.log', n=3)]
    """

    def __init__(self, columns: list[str]) -> None:
        self.columns = list(columns)
        self._steps: list[str] = []

    def _from(self) -> str:
        return f"_s{len(self._steps) - 1}" if self._steps else "{input}"

    def stage(self, keep: list[str] | str, **columns: str) -> "Query":
        """Keep `keep` (names, or "*" for all; a kept name also in `columns` is replaced) and add `columns`."""
        kept = [c for c in (self.columns if keep == "*" else keep) if c not in columns]
        self._steps.append("SELECT " + ", ".join([*[f"`{c}`" for c in kept], *[f"{sql} AS `{name}`" for name, sql
                                                                                 in columns.items()]])
                           + f" FROM {self._from()}")
        self.columns = [*kept, *columns]
        return self

    def explode(self, keep: list[str], array: str, pos: str, value: str) -> "Query":
        """One row per element of `array` (posexplode_outer: an empty array still gives one NULL row)."""
        self._steps.append(f"SELECT {', '.join(f'`{c}`' for c in keep)}, posexplode_outer({array}) AS ({pos}, {value})"
                           f" FROM {self._from()}")
        self.columns = [*keep, pos, value]
        return self

    def where(self, condition: str) -> "Query":
        self._steps.append(f"SELECT * FROM {self._from()} WHERE {condition}")
        return self

    def build(self, df: DataFrame) -> DataFrame:
        """Run the chain on `df` (whose columns must be the ones this Query started from)."""
        view = "_seclake_" + uuid.uuid4().hex
        ctes = ",\n".join(f"_s{i} AS ({step.replace('{input}', view)})" for i, step in enumerate(self._steps))
        df.createOrReplaceTempView(view)
        try:
            return df.sparkSession.sql(f"WITH {ctes}\nSELECT * FROM _s{len(self._steps) - 1}")
        finally:
            df.sparkSession.catalog.dropTempView(view)


def first_error(*checks: tuple[str, str]) -> str:
    """SQL for the reason of the first (condition, reason SQL) pair whose condition holds, else NULL."""
    return "coalesce(" + ", ".join(f"CASE WHEN {cond} THEN {reason} END" for cond, reason in checks) + ")"


def line_checks(raw: str, valid_utf8: str) -> list[tuple[str, str]]:
    """Checks every data line must pass before its format is even looked at."""
    return [
        (f"instr({raw}, chr(0)) > 0", lit("NUL byte")),
        (f"NOT {valid_utf8}", lit("invalid UTF-8")),
        (f"octet_length({raw}) > {MAX_LINE_BYTES}",
         f"format_string('line too long: %d bytes (limit {MAX_LINE_BYTES})', octet_length({raw}))"),
        (f"trim({raw}) = ''", lit("empty line")),
    ]


def joined_json(raw: str) -> tuple[str, str]:
    """Check: text after the line's JSON value, as when a lost newline joined two records
    (`from_json` reads the first value and ignores the rest: the second record vanished). Only a
    line with a `}` followed by something JSON never puts after one is parsed a second time."""
    after_brace = r"'\\}\\s*[^\\s,}\\]]'"
    return (f"({raw} RLIKE {after_brace} AND "
            f"coalesce(size(from_json(concat('[', {raw}, ']'), 'array<string>')), 0) != 1)",
            lit("text after the JSON value (two records on one line?)"))


def bad(name: str, raw: str, typed: str) -> tuple[str, str]:
    """Check: the raw value is present but did not convert."""
    return f"({raw} IS NOT NULL AND {typed} IS NULL)", lit(f"bad {name} value")


def bad_time(name: str, raw: str, typed: str) -> tuple[str, str]:
    """Check: the raw time is present but did not parse, or lies outside the plausible window."""
    return (f"({raw} IS NOT NULL AND ({typed} IS NULL OR {typed} < TIMESTAMP'{MIN_EVENT_TIME}'"
            f" OR {typed} >= TIMESTAMP'{MAX_EVENT_TIME}'))"), lit(f"bad {name} value")


def to_time(value: str) -> str:
    """SQL: epoch seconds ('1521911720.865716') or ISO-8601 ('2021-06-06T15:59:46.457984+0200') -> TIMESTAMP.

    Epoch strings go through DECIMAL so microseconds survive exactly (a DOUBLE would not);
    ISO strings keep their offset (stored as UTC); strings without a zone are read in the
    session zone (UTC in seclake); anything else is NULL, a date without a time or a time without
    a date included (Spark would read '15:59:46' as today).
    """
    return (f"CASE WHEN {value} RLIKE '^-?[0-9]+(\\\\.[0-9]*)?([eE][-+]?[0-9]+)?$' "
            f"THEN timestamp_micros(try_cast(try_cast({value} AS DECIMAL(20,6)) * 1000000 AS BIGINT)) "
            f"WHEN {value} RLIKE '^\\\\s*[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T ][0-9]{{2}}:[0-9]{{2}}' "
            f"THEN try_to_timestamp({value}) END")


def to_date(ts: str) -> str:
    """SQL: the UTC calendar date of a TIMESTAMP, whatever the session time zone."""
    return f"date_from_unix_date(CAST(floor(unix_micros({ts}) / 86400000000) AS INT))"


def to_port(value: str) -> str:
    """SQL: '53' -> 53; NULL unless an integer in 0..65535."""
    return f"CASE WHEN try_cast({value} AS INT) BETWEEN 0 AND 65535 THEN try_cast({value} AS INT) END"


def to_mac(value: str) -> str:
    """SQL: any common MAC spelling ('08-00-27-5E-9A-A6', '0800.275e.9aa6') -> '08:00:27:5e:9a:a6'.

    NULL if not 48 bits."""
    digits = f"regexp_replace(lower({value}), '[:.\\\\-\\\\s]', '')"
    return f"CASE WHEN {digits} RLIKE '^[0-9a-f]{{12}}$' THEN regexp_replace({digits}, '(..)(?!$)', '$1:') END"


def to_proto(value: str) -> str:
    """SQL: transport protocol name in lower case; ICMPv6 spellings ('IPv6-ICMP') become 'icmp' as in Zeek."""
    return (f"CASE WHEN lower(trim({value})) IN ('ipv6-icmp', 'icmpv6', 'icmp6') THEN 'icmp' "
            f"ELSE lower(trim({value})) END")


def file_stem(file: str) -> str:
    """SQL: 'file:///x/dns.2026-11-20-13-00-00.log.gz' -> 'dns' (the Zeek log path a file name starts
    with); a Kafka message's 'kafka://zeek.dns/0@12' -> 'dns' (its topic's kind)."""
    return (f"CASE WHEN startswith({file}, 'kafka://') "
            f"THEN substring_index(substring_index(substr({file}, 9), '/', 1), '.', -1) "
            f"ELSE substring_index(regexp_extract({file}, '([^/]*)$', 1), '.', 1) END")
