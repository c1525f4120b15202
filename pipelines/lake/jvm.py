"""delta-spark's JVM side from Python (py4j): classes, Scala objects, Scala sequences, a table's log.

The table layer reaches a few Delta internals that PySpark does not wrap (a transaction's commit,
a snapshot's checksum); these are the three ways in. Each names its class in full, in one step:
py4j's `jvm.org.apache.x.Y` asks the JVM about every dotted prefix first, a round trip and a
failed class look-up over the whole class path each (performance.md, "Python's round trips").
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from py4j.java_gateway import JavaClass, JavaObject
from pyspark.sql import SparkSession


def jvm_class(spark: SparkSession, name: str) -> JavaClass:
    """The JVM class `name` (a nested class as `Outer$Inner`): its static methods, fields and constructors.

    >>> jvm_class(spark, "java.lang.String").join("-", ["a", "b"])
    'a-b'
    """
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # a live session always has its gateway
    return JavaClass(name, gateway._gateway_client)


def scala_object(spark: SparkSession, name: str) -> JavaObject:
    """The Scala `object` compiled as class `name` (ending in `$`): py4j reaches neither objects
    nested in objects nor the methods an object's class has no static forwarder for.

    >>> scala_object(spark, "org.apache.spark.sql.delta.DeltaOperations$ManualUpdate$").name()
    'Manual Update'
    """
    return getattr(jvm_class(spark, name), "MODULE$")


def scala_seq(spark: SparkSession, items: Iterable[object]) -> JavaObject:
    """A Scala immutable `Seq` of `items` (Python values or JVM objects).

    >>> scala_seq(spark, ["event_date"]).mkString(",")
    'event_date'
    """
    values = jvm_class(spark, "java.util.ArrayList")()
    for item in items:
        values.add(item)
    return jvm_class(spark, "scala.jdk.javaapi.CollectionConverters").asScala(values).toSeq()


def delta_log(spark: SparkSession, uri: str) -> JavaObject:
    """delta-spark's DeltaLog of the table at `uri` (its transactions, snapshots, log checkpoints).

    >>> delta_log(spark, "/tmp/no-table-here").tableExists()
    False
    """
    return jvm_class(spark, "org.apache.spark.sql.delta.DeltaLog").forTable(spark._jsparkSession, uri)


def scala_now(spark: SparkSession) -> JavaObject:
    """`Some(now in epoch milliseconds)`: the optional time Delta's actions take (a table's creation,
    a set transaction's update)."""
    return jvm_class(spark, "scala.Some")(jvm_class(spark, "java.lang.Long").valueOf(int(time.time() * 1000)))
