"""The tables a rule may read, with their schemas, and where the alerts table lives."""
from __future__ import annotations

from pathlib import Path

from pyspark.sql.types import StructType

from pipelines.lake.registry import Lake

ALERTS_TABLE = "alerts"
RULE_STATUS_TABLE = "rule_status"


def readable_tables() -> dict[str, StructType]:
    """Every table a rule may read, name -> schema: the registry's tables except `alerts` and the
    state tables (`kept_by`: rule_status, alert_triage): rules read events, not alerts or state.

    >>> "enriched_dns" in readable_tables() and "alerts" not in readable_tables()
    True
    """
    return {name: Lake.spec(name).schema for name in Lake.names()
            if name != ALERTS_TABLE and not Lake.spec(name).kept_by}


def table_schema(name: str) -> StructType:
    """The schema of one readable table; ValueError names an unknown table.

    >>> table_schema("silver_dhcp").fieldNames()[:2]
    ['event_id', 'event_time']
    """
    tables = readable_tables()
    try:
        return tables[name]
    except KeyError:
        raise ValueError(f"unknown table {name!r}; rules may read: {', '.join(sorted(tables))}") from None


def table_path(lake: Lake, name: str) -> Path:
    """Where `name` lives in `lake` (the registry's layout: `<home>/tables/<name>`)."""
    return lake.home.table(name)
