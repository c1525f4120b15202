"""The tables a rule may read, with their schemas, and where the alerts table lives."""
from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pipelines.lake.registry import Lake

ALERTS_TABLE = "alerts"
RULE_STATUS_TABLE = "rule_status"
# One finding across the versions of its rule: a new version's backfill raises what the earlier one
# found again, under another alert_id (which holds the version).
FINDING_COLUMNS = ("rule_id", "window_start", "window_end", "src_ip", "mac", "device")
# rule_id prefix of platform alerts (a rule disabled, rows a rule dropped): in `alerts` where analysts
# look, but about seclake itself, so incidents and precision leave them out.
PLATFORM_RULE_PREFIX = "seclake."
RULE_DISABLED_ID = f"{PLATFORM_RULE_PREFIX}rule_disabled"
RULE_LATE_ROWS_ID = f"{PLATFORM_RULE_PREFIX}rule_late_rows"
PLATFORM_RULE_IDS = (RULE_DISABLED_ID, RULE_LATE_ROWS_ID)


def readable_tables() -> dict[str, StructType]:
    """Every table a rule may read, name -> schema: the registry's tables except `alerts` and the
    state tables (`kept_by`: rule_status, alert_triage): rules read events, not alerts or state.

    >>> "enriched_dns" in readable_tables() and "alerts" not in readable_tables()
    True
    """
    return {name: Lake.spec(name).schema for name in Lake.names()
            if name != ALERTS_TABLE and not Lake.spec(name).kept_by}


# Lookup tables: state a rule may join as its current snapshot (`lookups:` in the rule's metadata),
# never streamed. Each maps to the rows that count now: an expired indicator matches nothing.
LOOKUP_TABLES: dict[str, str] = {
    "indicators": "valid_from <= current_timestamp() AND valid_until > current_timestamp()",
}


def lookup_view(rows: DataFrame, name: str) -> DataFrame:
    """The rows of lookup table `name` that count now. In a streaming rule, Delta re-reads the
    table's latest version in every micro-batch, so an indicator loaded while the stream runs is
    matched from the next batch on."""
    return rows.where(LOOKUP_TABLES[name])


def table_schema(name: str) -> StructType:
    """The schema of one table a rule may read or look up; ValueError names an unknown table.

    >>> table_schema("silver_dhcp").fieldNames()[:2]
    ['event_id', 'event_time']
    >>> table_schema("indicators").fieldNames()[2:4]
    ['type', 'value']
    """
    tables = {**readable_tables(), **{name: Lake.spec(name).schema for name in LOOKUP_TABLES}}
    try:
        return tables[name]
    except KeyError:
        raise ValueError(f"unknown table {name!r}; rules may read: {', '.join(sorted(tables))}") from None


def table_path(lake: Lake, name: str) -> Path:
    """Where `name` lives in `lake` (the registry's layout: `<home>/tables/<name>`)."""
    return lake.home.table(name)
