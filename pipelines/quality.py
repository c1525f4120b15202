"""Great Expectations suites of the silver and enriched tables, in one place, and how they run.

`assets/checks.py` wraps these as Dagster asset checks. Suites are derived from each table's
registry schema by column name, so a new table gets its expectations without code:

- not null: `event_id`, `event_time`, `event_date` (and the key columns of `dhcp_leases` and
  `dhcp_clock`);
- valid IP: `*_ip`, `*_addr`, `ip`; valid MAC (lower-case, colon-separated): `mac`, `*_mac`;
  ports in 0..65535;
- value sets: `proto`, `severity` (1-4), `source`, `qtype_name`, `conn_state`.

A table is validated with GE's Spark datasource, or with its pandas datasource when it is small
(`engine="auto"`: at most `PANDAS_MAX_ROWS` rows), which is ~20x faster on small tables. Spark
runs GE's cheapest result format first and re-validates only the failing expectations for
examples of bad values.

The quarantine ratio (quarantined / (good + quarantined) lines per source, over recently
ingested lines) is validated by a GE suite too, on a small frame of per-source counts.
"""
from __future__ import annotations

import functools
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no usage statistics sent from pipelines

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
import pandas as pd  # noqa: E402
from great_expectations.core import ExpectationSuiteValidationResult  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from pipelines.lake.log import read_columns, summary, tally  # noqa: E402
from pipelines.lake.registry import Lake  # noqa: E402
from pipelines.parsers.sources import get_source, source_names  # noqa: E402
from pipelines.settings import MAX_QUARANTINE_RATIO, QUARANTINE_WINDOW_HOURS  # noqa: E402

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
# Hex groups and 2-7 colons, optionally ending in an IPv4 (::ffff:10.0.0.1) and a zone (%eth0).
IPV6 = rf"(?:[0-9A-Fa-f]{{0,4}}:){{2,7}}(?:[0-9A-Fa-f]{{0,4}}|{IPV4})(?:%[0-9A-Za-z_.]+)?"
IP_REGEX = rf"^(?:{IPV4}|{IPV6})$"
# silver normalises MACs to lower case with colons.
MAC_REGEX = r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$"

PROTOCOLS = ["tcp", "udp", "icmp", "icmp6", "ipv6-icmp", "sctp", "gre", "esp", "ah", "igmp", "unknown_transport"]
SEVERITIES = [1, 2, 3, 4]  # Suricata: 1 high .. 3 low; 4 is used by some rule sets
QTYPES = ["A", "AAAA", "CNAME", "MX", "NS", "PTR", "SOA", "SRV", "TXT", "NAPTR", "DS", "DNSKEY", "RRSIG",
          "NSEC", "NSEC3", "HTTPS", "SVCB", "CAA", "ANY", "*", "AXFR", "IXFR", "NBSTAT", "NULL", "HINFO",
          "SPF", "OPT", "TLSA", "SSHFP", "WKS", "DNAME", "URI"]
# Rare or new record types should not fail a table: 99% of qtype names must be known.
QTYPES_MOSTLY = 0.99
CONN_STATES = ["S0", "S1", "SF", "REJ", "S2", "S3", "RSTO", "RSTR", "RSTOS0", "RSTRH", "SH", "SHR", "OTH",
               # Suricata flow states, when conn comes from EVE flow records
               "new", "established", "closed", "bypassed", "local_bypassed", "capture_bypassed"]

NOT_NULL = ("event_id", "event_time", "event_date", "alert_id")
# Key columns of tables without event ids (the clock's would otherwise have no expectation at all).
NOT_NULL_BY_TABLE = {"dhcp_leases": ("ip", "mac", "valid_from"), "dhcp_clock": ("clock", "written_at")}

PANDAS_MAX_ROWS = 200_000


def expectations_for(table: str, schema: StructType | None = None) -> list[gxe.Expectation]:
    """The expectations of `table`, derived from its schema (default: the registry's).

    >>> [e.expectation_type for e in expectations_for("silver_ids_alerts")][:2]
    ['expect_column_values_to_not_be_null', 'expect_column_values_to_not_be_null']
    """
    schema = schema or Lake.spec(table).schema
    columns = schema.fieldNames()
    out: list[gxe.Expectation] = []
    for column in (*NOT_NULL, *NOT_NULL_BY_TABLE.get(table, ())):
        if column in columns:
            out.append(gxe.ExpectColumnValuesToNotBeNull(column=column))
    for column in columns:
        if column == "ip" or column.endswith(("_ip", "_addr")):
            out.append(gxe.ExpectColumnValuesToMatchRegex(column=column, regex=IP_REGEX))
        elif column == "mac" or column.endswith("_mac"):
            out.append(gxe.ExpectColumnValuesToMatchRegex(column=column, regex=MAC_REGEX))
        elif column.endswith("_port"):
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=0, max_value=65535))
        elif column == "proto":
            out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=PROTOCOLS))
        elif column == "severity":
            out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=SEVERITIES))
        elif column == "source":
            out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=list(source_names())))
        elif column == "qtype_name":
            out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=QTYPES, mostly=QTYPES_MOSTLY))
        elif column == "conn_state":
            out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=CONN_STATES))
    return out


def suite_for(table: str, schema: StructType | None = None) -> gx.ExpectationSuite:
    """The GE suite named after `table`."""
    return gx.ExpectationSuite(name=table, expectations=expectations_for(table, schema))


def quarantine_suite(max_ratio: float = MAX_QUARANTINE_RATIO) -> gx.ExpectationSuite:
    """Over a frame of per-source counts (`source`, `good`, `quarantined`, `ratio`)."""
    return gx.ExpectationSuite(name="quarantine_ratio", expectations=[
        gxe.ExpectColumnValuesToBeBetween(column="ratio", min_value=0.0, max_value=max_ratio),
    ])


# --- running a suite ---------------------------------------------------------------------------

@dataclass
class Failed:
    """One failed expectation: its type (GE name), column, and how much of the data broke it."""

    expectation: str
    column: str | None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    examples: list = field(default_factory=list)
    error: str | None = None

    def describe(self) -> str:
        where = f"({self.column})" if self.column else ""
        if self.error:
            return f"{self.expectation}{where}: raised {self.error}"
        detail = []
        if self.unexpected_count is not None:
            detail.append(f"{self.unexpected_count} unexpected")
        if self.unexpected_percent is not None:
            detail.append(f"{self.unexpected_percent:.2f}%")
        if self.examples:
            detail.append(f"e.g. {self.examples[:3]}")
        return f"{self.expectation}{where}" + (f": {', '.join(detail)}" if detail else "")


@dataclass
class Outcome:
    """The result of validating one suite."""

    suite: str
    success: bool
    evaluated: int
    rows: int
    engine: str
    failed: list[Failed] = field(default_factory=list)

    def describe(self) -> str:
        if self.success:
            return f"{self.suite}: {self.evaluated} expectations passed on {self.rows} rows ({self.engine})"
        return (f"{self.suite}: {len(self.failed)} of {self.evaluated} expectations failed on {self.rows} rows: "
                + "; ".join(f.describe() for f in self.failed))


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        _CONTEXT = gx.get_context(mode="ephemeral")
        _CONTEXT.variables.progress_bars = ProgressBarsConfig(globally=False)
    return _CONTEXT


def run_suite(data: DataFrame | pd.DataFrame, suite: gx.ExpectationSuite, *,
              result_format: str = "SUMMARY") -> ExpectationSuiteValidationResult:
    """Run `suite` over a Spark or pandas DataFrame with a GE ValidationDefinition; GE's result."""
    ctx = _context()
    token = uuid.uuid4().hex[:8]
    if isinstance(data, pd.DataFrame):
        source = ctx.data_sources.add_pandas(f"pandas_{suite.name}_{token}")
    else:
        source = ctx.data_sources.add_spark(f"spark_{suite.name}_{token}")
    batch = source.add_dataframe_asset(suite.name).add_batch_definition_whole_dataframe("whole")
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"{suite.name}_{token}", expectations=[
        e.copy() for e in suite.expectations]))
    validation = ctx.validation_definitions.add(
        gx.ValidationDefinition(name=f"{suite.name}", data=batch, suite=suite))
    try:
        return validation.run(batch_parameters={"dataframe": data}, result_format=result_format)
    finally:
        ctx.validation_definitions.delete(validation.name)
        ctx.suites.delete(suite.name)
        ctx.data_sources.delete(source.name)


def _failures(result: ExpectationSuiteValidationResult) -> list[Failed]:
    failed = []
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        assert config is not None  # a suite's run gives each result its expectation's configuration
        info = r.exception_info or {}
        raised = info.get("raised_exception") if isinstance(info, dict) else None
        res = r.result or {}
        failed.append(Failed(
            expectation=config.type,
            column=config.kwargs.get("column"),
            unexpected_count=res.get("unexpected_count"),
            unexpected_percent=res.get("unexpected_percent"),
            examples=[_plain(v) for v in (res.get("partial_unexpected_list") or [])[:5]],
            error=(info.get("exception_message") if raised else None),
        ))
    return failed


def _plain(value):
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def validate(df: DataFrame, suite: gx.ExpectationSuite, *, engine: str = "auto",
             pandas_max_rows: int = PANDAS_MAX_ROWS, most_rows: int | None = None) -> Outcome:
    """Validate a Spark DataFrame against `suite` with GE.

    `engine`: `spark` (GE's Spark datasource), `pandas` (collect, then GE's pandas datasource)
    or `auto` (pandas up to `pandas_max_rows` rows). `most_rows`, when known (a table's row count
    in its log), bounds the frame's rows: `auto` then needs no Spark job to count them.

    >>> validate(spark.createDataFrame([("x",)], "proto string"), suite_for("silver_conn"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: suite silver_conn: column(s) ['conn_state', ...] not in the data (columns: ['proto'])
    """
    if engine not in ("auto", "spark", "pandas"):
        raise ValueError(f"engine must be 'auto', 'spark' or 'pandas', got {engine!r}")
    named = {e.column for e in suite.expectations if getattr(e, "column", None)}  # type: ignore[attr-defined]
    columns = sorted(named & set(df.columns))
    missing = sorted(named - set(df.columns))
    if missing:
        raise ValueError(f"suite {suite.name}: column(s) {missing} not in the data (columns: {df.columns})")
    data = df.select(*columns) if columns else df
    if engine == "auto" and most_rows is None:
        most_rows = data.count()
    if engine == "pandas" or (engine == "auto" and most_rows is not None and most_rows <= pandas_max_rows):
        return _validate_pandas(data.toPandas(), suite)
    data = data.cache()
    try:
        rows = data.count()  # fills the cache the suite then reads
        quick = run_suite(data, suite, result_format="BOOLEAN_ONLY")
        if quick.success:
            return Outcome(suite.name, True, len(quick.results), rows, "spark")
        failing = {(f.expectation, f.column) for f in _failures(quick)}
        again = gx.ExpectationSuite(name=suite.name, expectations=[
            e for e in suite.expectations if (e.expectation_type, getattr(e, "column", None)) in failing])
        detail = run_suite(data, again, result_format="SUMMARY")
        return Outcome(suite.name, False, len(quick.results), rows, "spark", _failures(detail))
    finally:
        data.unpersist()


def _validate_pandas(frame: pd.DataFrame, suite: gx.ExpectationSuite) -> Outcome:
    result = run_suite(frame, suite)
    return Outcome(suite.name, bool(result.success), len(result.results), len(frame), "pandas", _failures(result))


def validate_table(spark: SparkSession, lake: Lake, table: str, *, engine: str = "auto",
                   window_days: int | None = None) -> Outcome:
    """Validate the current snapshot of `table` (optionally only its last `window_days` event dates).

    A table small enough for pandas is read by delta-rs, the suite's columns only: Spark's read of
    it first rebuilds the table's state (1-2 s a table; docs/performance.md, "The checks' frames
    from delta-rs"). A table delta-rs cannot read alone (`read_columns`), or a larger one, is
    validated through Spark.
    """
    suite = suite_for(table)
    path = lake.path(table)
    # The log's count is the newest snapshot's, which a running stream may have moved past the one read:
    # close enough to choose the engine by.
    most_rows = summary(path).rows
    if engine == "pandas" or (engine == "auto" and most_rows is not None and most_rows <= PANDAS_MAX_ROWS):
        named = {e.column for e in suite.expectations if getattr(e, "column", None)}  # type: ignore[attr-defined]
        since = (datetime.now(timezone.utc).date() - timedelta(days=window_days)
                 if window_days is not None and "event_date" in Lake.spec(table).schema.fieldNames() else None)
        try:
            rows = read_columns(path, sorted(named | ({"event_date"} if since is not None else set())))
        except LookupError:
            rows = None
        if rows is not None:
            frame = rows.to_pandas()
            if since is not None:
                frame = frame[frame["event_date"] >= since].reset_index(drop=True)
            return _validate_pandas(frame[sorted(named)], suite)
    df = lake.read(spark, table)
    if window_days is not None and "event_date" in df.columns:
        df = df.where(F.col("event_date") >= F.date_sub(F.current_date(), window_days))
    return validate(df, suite, engine=engine, most_rows=most_rows)


# --- quarantine ratio --------------------------------------------------------------------------

def quarantine_counts(spark: SparkSession, lake: Lake, sources: list[str] | tuple[str, ...] | None = None,
                      window_hours: float | None = QUARANTINE_WINDOW_HOURS,
                      now: datetime | None = None) -> pd.DataFrame:
    """Per source: good lines (bronze, parse_ok), quarantined lines, and their ratio.

    Counts lines ingested in the `window_hours` up to `now` (default: the current time; all lines
    if None), so that a bad file stands out instead of being diluted by the table's history.
    The window's `source` and `parse_ok` are read by delta-rs: on the demo's home 0.1 s, through Spark
    1.2 s warm and 5 s in a fresh JVM (docs/performance.md, "The quarantine check from delta-rs").
    When delta-rs cannot read a table alone (`read_columns`), Spark counts them all.
    """
    sources = tuple(sources) if sources is not None else source_names()
    until = now or datetime.now(timezone.utc)
    since = until - timedelta(hours=window_hours) if window_hours is not None else None
    tables = [t for t in sorted({get_source(source).bronze_table for source in sources}) if lake.exists(t)]
    quarantine = lake.exists("quarantine")
    try:
        good, bad = _counts_from_files(lake, tables, quarantine, sources, since, until)
    except LookupError:
        good, bad = _counts_from_spark(spark, lake, tables, quarantine, sources, since, until)
    frame = pd.DataFrame({"source": list(sources), "good": [good.get(s, 0) for s in sources],
                          "quarantined": [bad.get(s, 0) for s in sources]})
    total = frame["good"] + frame["quarantined"]
    frame["ratio"] = (frame["quarantined"] / total.where(total > 0)).fillna(0.0)
    return frame


def _counts_from_files(lake: Lake, tables: list[str], quarantine: bool, sources: tuple[str, ...],
                       since: datetime | None, until: datetime) -> tuple[dict[str, int], dict[str, int]]:
    """(good lines, quarantined lines) per source in the window, read by delta-rs; LookupError as `read_columns`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    window = ("ingest_time", since, until) if since is not None else None

    def per_source(table: str, flag: str | None) -> dict[str, int]:
        rows = read_columns(lake.path(table), ["source", *([flag] if flag else [])], window)
        rows = rows.filter(pc.is_in(rows.column("source"), pa.array(sources)))
        if flag:
            counted = rows.group_by(["source"]).aggregate([(flag, "sum")])
            return {r["source"]: int(r[f"{flag}_sum"] or 0) for r in counted.to_pylist()}
        return dict(tally(rows, ["source"]))

    good: dict[str, int] = {}
    for table in tables:
        # Every bronze table has had parse_ok since the first; a table without it is a ValueError naming it.
        for source, n in per_source(table, "parse_ok").items():
            good[source] = good.get(source, 0) + n
    return good, per_source("quarantine", None) if quarantine else {}


def _counts_from_spark(spark: SparkSession, lake: Lake, tables: list[str], quarantine: bool,
                       sources: tuple[str, ...], since: datetime | None, until: datetime
                       ) -> tuple[dict[str, int], dict[str, int]]:
    """(good lines, quarantined lines) per source in the window, in one Spark query."""
    def recent(table: str) -> DataFrame:
        # The window's lines from the files whose ingest_time statistics allow them: Delta's own scan
        # first rebuilds each table's state with Spark jobs (docs/performance.md, "The quarantine
        # check's window from the log").
        if since is None:
            return lake.read(spark, table)
        return lake.read_in_range(spark, table, "ingest_time", since, until)

    parts = []
    for table in tables:
        df = recent(table).where(F.col("source").isin(list(sources)))
        ok = F.col("parse_ok") if "parse_ok" in df.columns else F.lit(True)
        parts.append(df.select("source", ok.cast("int").alias("good"), F.lit(0).alias("bad")))
    if quarantine:
        parts.append(recent("quarantine").where(F.col("source").isin(list(sources)))
                     .select("source", F.lit(0).alias("good"), F.lit(1).alias("bad")))
    good: dict[str, int] = {}
    bad: dict[str, int] = {}
    if parts:
        union = functools.reduce(DataFrame.unionByName, parts)
        for row in union.groupBy("source").agg(F.sum("good").alias("good"), F.sum("bad").alias("bad")).collect():
            good[row["source"]], bad[row["source"]] = int(row["good"]), int(row["bad"])
    return good, bad


def validate_quarantine_ratio(counts: pd.DataFrame, max_ratio: float = MAX_QUARANTINE_RATIO) -> Outcome:
    """GE suite `quarantine_ratio` over the per-source counts of `quarantine_counts`."""
    if not 0.0 <= max_ratio <= 1.0:
        raise ValueError(f"max_ratio must be within 0..1, got {max_ratio}")
    result = run_suite(counts, quarantine_suite(max_ratio))
    failed = _failures(result)
    for f in failed:  # name the offending sources rather than bare ratios
        bad = counts[counts["ratio"] > max_ratio]
        # A percentage with the limit beside it: 2 of 4,282 lines is 0.047%, which `.3f` printed as "0.000".
        f.examples = [f"{r.source}: {r.quarantined:,}/{r.good + r.quarantined:,} = {r.ratio:.3%} > {max_ratio:.3%}"
                      for r in bad.itertuples()]
    return Outcome("quarantine_ratio", bool(result.success), len(result.results), int(counts["good"].sum()
                   + counts["quarantined"].sum()), "pandas", failed)
