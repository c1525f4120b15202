"""Schema rules of the table layer."""
from __future__ import annotations

from pyspark.sql.types import StructField, StructType


class SchemaMismatchError(ValueError):
    """A write whose schema is not an additive evolution of the table's schema (Delta refused it)."""


def as_nullable(schema: StructType) -> StructType:
    """Every column nullable, as Spark's own file sinks write them (a batch's NOT NULL is incidental).

    >>> from pyspark.sql.types import LongType, StructField
    >>> as_nullable(StructType([StructField("n", LongType(), False)])).fields[0].nullable
    True
    """
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])
