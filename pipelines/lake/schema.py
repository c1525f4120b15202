"""Schema conversions between Spark, Arrow and Delta, and the evolution rule."""
from __future__ import annotations

import pyarrow as pa
from deltalake import Schema as DeltaSchema
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType


class SchemaMismatchError(ValueError):
    """A write whose schema is not an additive evolution of the table's schema."""


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """Spark schema -> Arrow schema with UTC microsecond timestamps (what Delta calls `timestamp`).

    >>> from pyspark.sql.types import StructField, TimestampType
    >>> spark_to_arrow(StructType([StructField("ts", TimestampType())])).field("ts").type
    TimestampType(timestamp[us, tz=UTC])
    """
    return to_arrow_schema(schema, timezone="UTC")


def spark_to_delta(schema: StructType) -> DeltaSchema:
    """Spark schema -> Delta schema, via Arrow, so both engines agree on every type."""
    return DeltaSchema.from_arrow(spark_to_arrow(schema))


def delta_to_spark(schema: DeltaSchema) -> StructType:
    """Delta schema (from a table's log) -> Spark schema for Spark's native Parquet reader."""
    arrow = pa.schema(schema.to_arrow())
    # delta-rs reports strings as string_view/large types; Spark wants the plain ones.
    return from_arrow_schema(_plain_types(arrow))


def _plain_types(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in schema])


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), pa.field("value", _plain(t.item_type), t.item_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC") if t.tz else pa.timestamp("us")
    return t


def as_nullable(schema: StructType) -> StructType:
    """Every column nullable, as Spark's own file sinks write them (a batch's NOT NULL is incidental).

    >>> from pyspark.sql.types import LongType, StructField
    >>> as_nullable(StructType([StructField("n", LongType(), False)])).fields[0].nullable
    True
    """
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


def merge_schemas(table: StructType, incoming: StructType, table_name: str = "table") -> StructType | None:
    """Return the evolved schema if `incoming` adds columns (added as nullable), None if nothing changes.

    Raises SchemaMismatchError naming the column when a column's type changes.

    >>> from pyspark.sql.types import IntegerType, StringType, StructField
    >>> t = StructType([StructField("a", IntegerType())])
    >>> merge_schemas(t, StructType(t.fields + [StructField("b", StringType())])).fieldNames()
    ['a', 'b']
    """
    existing = {f.name: f for f in table.fields}
    added = []
    for field in incoming.fields:
        old = existing.get(field.name)
        if old is None:
            added.append(StructField(field.name, field.dataType, True, field.metadata))
        elif _comparable(old.dataType) != _comparable(field.dataType):
            raise SchemaMismatchError(
                f"{table_name}: column {field.name!r} has type {old.dataType.simpleString()} in the table "
                f"but {field.dataType.simpleString()} in the write; changing a column's type is not supported")
    if not added:
        return None
    return StructType(table.fields + added)


def _comparable(dt) -> str:
    # Nullability inside nested types is not a type change.
    return dt.simpleString()
