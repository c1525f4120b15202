"""The table registry: every seclake table's name, layer, schema and partitioning, in one place."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipelines.home import Home
from pipelines.lake.jvm import jvm_class
from pipelines.lake.log import newer_version, open_log
from pipelines.lake.read import read_in_range, read_table
from pipelines.lake.sink import DEFAULT_CHECKPOINT_INTERVAL, DeltaSink, create_empty, delta_errors


@dataclass(frozen=True)
class TableSpec:
    """One table: `name` is also its folder (`tables/<name>`) and its Dagster asset key (its layer,
    then the name without the layer's prefix: silver_dns -> silver/dns). `kept_by` names what keeps a table
    that no stage writes (a state table: no rule reads it)."""

    name: str
    layer: str
    description: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    kept_by: str = ""


def _specs() -> dict[str, TableSpec]:
    from pipelines import schemas
    from pipelines.parsers.sources import sources

    specs = [
        TableSpec(source.bronze_table, "bronze", source.description,
                  schemas.BRONZE_SCHEMA, ("event_date",))
        for source in sources()
    ]
    # Not partitioned: quarantined lines have no trustworthy event time to partition by.
    specs.append(TableSpec("quarantine", "bronze", "lines that could not be parsed, with the reason",
                           schemas.QUARANTINE_SCHEMA))
    specs += [
        TableSpec(name, "silver", schemas.SILVER_DESCRIPTIONS[name], schema, ("event_date",))
        for name, schema in schemas.SILVER_SCHEMAS.items()
    ]
    specs.append(TableSpec("end_of_input", "silver", "run-once's marks: every event before flush_at has arrived",
                           schemas.END_OF_INPUT_SCHEMA))
    specs.append(TableSpec("dhcp_clock", "silver", "how far DHCP has surely arrived, from the sensors' other logs: "
                           "moves dhcp_leases in a stream when DHCP is quiet", schemas.DHCP_CLOCK_SCHEMA))
    specs.append(TableSpec("dhcp_leases", "silver", "non-overlapping DHCP lease segments: which MAC held an IP when",
                           schemas.LEASE_SCHEMA, ("event_date",)))
    specs += [
        TableSpec(name, "enriched", f"{name.removeprefix('enriched_')} events attributed to the device holding the IP "
                  "at event time (lease + inventory)", schema, ("event_date",))
        for name, schema in schemas.ENRICHED_SCHEMAS.items()
    ]
    specs.append(TableSpec("late_events", "enriched", "per batch: events that arrived after the join watermark",
                           schemas.LATE_EVENTS_SCHEMA))
    specs.append(TableSpec("alerts", "gold", "one row per detection: rule, entity, window, evidence; stable alert_id",
                           schemas.ALERTS_SCHEMA, ("event_date",)))
    specs.append(TableSpec("rule_status", "gold", "one row per change of a rule's health: failing, disabled, "
                           "re-enabled, invalid; a rule's newest row is its state", schemas.RULE_STATUS_SCHEMA,
                           kept_by="the rules' runners"))
    specs.append(TableSpec("alert_triage", "gold", "one row per triaged alert: status, assignee, notes; "
                           "updated with MERGE", schemas.ALERT_TRIAGE_SCHEMA, kept_by="seclake alerts"))
    specs.append(TableSpec("suppressions", "gold", "known-benign findings: rule, entity, reason, expiry; an alert "
                           "they match is written with suppressed_by", schemas.SUPPRESSIONS_SCHEMA,
                           kept_by="seclake suppress"))
    specs.append(TableSpec("notifications", "gold", "one row per alert and destination: delivered, or dead-lettered "
                           "with the last error", schemas.NOTIFICATIONS_SCHEMA, kept_by="seclake notify"))
    specs.append(TableSpec("incidents", "gold", "alerts of one entity grouped in time, with a risk score; rebuilt "
                           "whole from alerts and alert_triage", schemas.INCIDENTS_SCHEMA,
                           kept_by="the Dagster asset incidents"))
    specs.append(TableSpec("indicators", "gold", "threat-intel indicators (IPs, domains) by feed, with validity; "
                           "loaded with MERGE", schemas.INDICATORS_SCHEMA, kept_by="seclake intel load"))
    return {spec.name: spec for spec in specs}


TABLES: dict[str, TableSpec] = {}
# The sources TABLES was built for: registering a source adds its bronze table.
_BUILT_FOR: list[tuple[str, ...]] = []
# name -> table location registered in this process's (one JVM's) catalog
_REGISTERED: dict[str, str] = {}
# name -> the columns (schema JSON) written into its catalog entry by `_catalog_columns`
_COLUMNS: dict[str, str] = {}


class Lake:
    """The registry bound to one home folder: where each table lives and how to read/write it.

    >>> lake = Lake(Home.resolve("/tmp/x"))
    >>> lake.path("silver_dns").as_posix()
    '/tmp/x/tables/silver_dns'
    """

    def __init__(self, home: Home) -> None:
        self.home = home

    @staticmethod
    def spec(name: str) -> TableSpec:
        """The registry's entry for `name`; ValueError naming the nearest table for an unknown one.

        >>> Lake.spec("silver_dns").partition_by
        ('event_date',)
        """
        _load_all()
        try:
            return TABLES[name]
        except KeyError:
            close = difflib.get_close_matches(name, TABLES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown table {name!r}; {hint}known tables: {', '.join(sorted(TABLES))}") from None

    @staticmethod
    def names() -> list[str]:
        """Every table of the registry, in layer order (bronze first)."""
        _load_all()
        return list(TABLES)

    def path(self, name: str) -> Path:
        """Where table `name` lives: `<lake root>/tables/<name>` (a local Path or an ObjectPath)."""
        return self.home.table(self.spec(name).name)

    def exists(self, name: str) -> bool:
        """True once the table's first commit is in its log (the log folder appears before it)."""
        return next((self.path(name) / "_delta_log").glob("*.json"), None) is not None

    def ensure(self, spark: SparkSession, name: str, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> bool:
        """Create `name` empty, with its registry schema and partitioning, unless it exists.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     lake = Lake(Home.resolve(tmp))
        ...     lake.ensure(spark, "silver_dns"), lake.ensure(spark, "silver_dns"), lake.exists("silver_dns")
        (True, False, True)
        """
        spec = self.spec(name)
        return create_empty(spark, self.path(name), spec.schema, list(spec.partition_by), checkpoint_interval)

    def register(self, spark: SparkSession, names: list[str] | None = None, *, columns: bool = False) -> list[str]:
        """Name the home's existing tables in `spark`'s catalog (`SELECT ... FROM silver_dns`); return them.

        The catalog is in memory, one per JVM: every process registers by path, so no metastore
        lock keeps a second reader out while the streams write. A name registered for another
        home in this JVM is pointed at this one (only the catalog entry changes, never the data).
        `columns`: also keep each entry's columns equal to the table's (`_catalog_columns`).

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     lake = Lake(Home.resolve(tmp))
        ...     _ = lake.ensure(spark, "silver_dns")
        ...     lake.register(spark), spark.sql("SELECT count(*) AS n FROM silver_dns").first()
        (['silver_dns'], Row(n=0))
        """
        done = []
        for name in names if names is not None else self.names():
            if not self.exists(name):
                continue
            location = str(self.path(name))
            if _REGISTERED.get(name) != location or not spark.catalog.tableExists(name):
                self.unregister(spark, name)
                spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{location}'")
                _REGISTERED[name] = location
            if columns:
                _catalog_columns(spark, name)
            done.append(name)
        return done

    def unregister(self, spark: SparkSession, name: str) -> None:
        """Forget `name` in `spark`'s catalog; the files, if any, stay (an external table's DROP)."""
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        _REGISTERED.pop(name, None)
        _COLUMNS.pop(name, None)

    def sink(self, name: str, *, app_id: str | None = None) -> DeltaSink:
        """The exactly-once sink for `name`; the app_id defaults to the table name (one writer per table).
        Its commits hold the home's `commit_lock` on `name`: other processes of the home may append too."""
        spec = self.spec(name)
        return DeltaSink(self.path(name), app_id=app_id or name, partition_by=spec.partition_by,
                         commit_lock=partial(self.home.commit_lock, spec.name))

    def append(self, name: str, frame: DataFrame) -> None:
        """Append `frame` to `name` as a plain Delta append: no batch id, for rows whose repeat says
        the same again (a rule's health, a platform alert whose id says whether it is new). The caller
        holds `home.commit_lock(name)`, around its read too when the rows depend on one. Columns the
        table lacks are added (a table from an older seclake); Delta's refusals name the table."""
        with delta_errors(name):
            (frame.write.format("delta").mode("append").option("mergeSchema", "true")
             .partitionBy(*self.spec(name).partition_by).save(str(self.path(name))))

    def read(self, spark: SparkSession, name: str, *, version: int | None = None,
             timestamp: str | datetime | None = None) -> DataFrame:
        """Table `name`'s latest snapshot, or the one at `version` or `timestamp` (`read.read_table`)."""
        return read_table(spark, self.path(name), version=version, timestamp=timestamp)

    def read_in_range(self, spark: SparkSession, name: str, column: str, lo: datetime, hi: datetime) -> DataFrame:
        """`name`'s rows with `column` in [lo, hi], reading only the files that can hold them (`read.read_in_range`)."""
        return read_in_range(spark, self.path(name), column, lo, hi)


class CatalogWatch:
    """Keeps a long-lived session's catalog entries, columns included, equal to the home's tables as
    they appear, change and go (`seclake serve`). A look asks each known table only whether its
    next commit file exists and its last seen one still does: re-registering all 21 tables every
    10 s cost an idle server 2.6 CPU seconds a minute, against 0.2 with these looks."""

    def __init__(self, lake: Lake, spark: SparkSession) -> None:
        self._lake = lake
        self._spark = spark
        self._versions: dict[str, int] = {}

    def refresh(self) -> list[str]:
        """Register the tables that appeared or committed since the last look; return their names.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     lake = Lake(Home.resolve(tmp))
        ...     watch = CatalogWatch(lake, spark)
        ...     _ = lake.ensure(spark, "dhcp_clock")
        ...     first, again = watch.refresh(), watch.refresh()
        ...     spark.createDataFrame([], "extra string").write.format("delta").mode("append") \\
        ...         .option("mergeSchema", "true").save(str(lake.path("dhcp_clock")))
        ...     added = watch.refresh(), spark.catalog.listColumns("dhcp_clock")[-1].name
        >>> first, again, added, watch.names()
        (['dhcp_clock'], [], (['dhcp_clock'], 'extra'), ['dhcp_clock'])
        """
        changed = [name for name in self._lake.names() if self._moved(name)]
        return self._lake.register(self._spark, changed, columns=True)

    def names(self) -> list[str]:
        """The tables registered so far."""
        return list(self._versions)

    def _moved(self, name: str) -> bool:
        seen = self._versions.get(name)
        if seen is None:
            if not self._lake.exists(name):
                return False
            # Before registering: a commit after this read is found by the next look.
            self._versions[name] = open_log(self._lake.path(name)).version()
            return True
        newer = newer_version(self._lake.path(name), seen)
        if newer is None:  # deleted, perhaps made again with fewer commits: look at it afresh
            del self._versions[name]
            if not self._lake.exists(name):
                self._lake.unregister(self._spark, name)  # a client's listing would name a table that fails
                return False
            return self._moved(name)
        self._versions[name] = newer
        return newer != seen


def _catalog_columns(spark: SparkSession, name: str) -> None:
    """Write the table's current columns into its catalog entry when they changed.

    Delta registers a table with no columns (its log holds them; queries read them there), but
    the Thrift server answers JDBC/ODBC clients' column listings (`DatabaseMetaData.getColumns`:
    DBeaver's browser, Tableau, Power BI) from the entry alone: without this, none.
    """
    schema = spark.table(name).schema.json()
    if _COLUMNS.get(name) != schema:
        columns = jvm_class(spark, "org.apache.spark.sql.types.DataType").fromJson(schema)
        spark._jsparkSession.sharedState().externalCatalog().alterTableDataSchema("default", name, columns)
        _COLUMNS[name] = schema


def _load_all() -> None:
    # Deferred so that importing the registry stays cheap and free of import cycles.
    from pipelines.parsers.sources import source_names

    if _BUILT_FOR != [source_names()]:
        TABLES.clear()
        TABLES.update(_specs())
        _BUILT_FOR[:] = [source_names()]
