"""The table registry: every seclake table's name, layer, schema and partitioning, in one place."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipelines.home import Home
from pipelines.lake.read import read_table
from pipelines.lake.sink import DeltaSink


@dataclass(frozen=True)
class TableSpec:
    """One table: `name` is also its folder, asset key suffix and checkpoint name."""

    name: str
    layer: str
    description: str
    schema: StructType
    partition_by: tuple[str, ...] = ()


TABLES: dict[str, TableSpec] = {}


def register(spec: TableSpec) -> TableSpec:
    """Add a table to the registry (each module that owns a table registers it at import)."""
    if spec.name in TABLES and TABLES[spec.name] != spec:
        raise ValueError(f"table {spec.name!r} is registered twice with different specs")
    TABLES[spec.name] = spec
    return spec


class Lake:
    """The registry bound to one home folder: where each table lives and how to read/write it.

    >>> lake = Lake(Home.resolve("/tmp/x"))
    >>> lake.path("silver_dns").as_posix()  # doctest: +SKIP
    '/tmp/x/tables/silver_dns'
    """

    def __init__(self, home: Home) -> None:
        self.home = home

    @staticmethod
    def spec(name: str) -> TableSpec:
        _load_all()
        try:
            return TABLES[name]
        except KeyError:
            raise ValueError(f"unknown table {name!r}; known tables: {', '.join(sorted(TABLES))}") from None

    @staticmethod
    def names() -> list[str]:
        _load_all()
        return list(TABLES)

    def path(self, name: str) -> Path:
        return self.home.table(self.spec(name).name)

    def exists(self, name: str) -> bool:
        return (self.path(name) / "_delta_log").is_dir()

    def sink(self, name: str, *, app_id: str | None = None) -> DeltaSink:
        """The exactly-once sink for `name`; the app_id defaults to the table name (one writer per table)."""
        spec = self.spec(name)
        return DeltaSink(self.path(name), app_id=app_id or name, partition_by=spec.partition_by)

    def read(self, spark: SparkSession, name: str, *, version: int | None = None,
             timestamp: str | datetime | None = None) -> DataFrame:
        return read_table(spark, self.path(name), version=version, timestamp=timestamp)


def _load_all() -> None:
    # Table-owning modules register their specs on import; importing them here keeps the
    # registry complete for callers that only import the registry.
    import pipelines.schemas  # noqa: F401
