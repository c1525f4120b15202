"""delta-spark's JVM side from Python (py4j): the gateway, Scala objects and Scala sequences.

The table layer reaches a few Delta internals that PySpark does not wrap (a transaction's commit,
a snapshot's checksum); these are the three ways in.
"""
from __future__ import annotations

from collections.abc import Iterable

from py4j.java_gateway import JavaObject, JVMView
from pyspark.sql import SparkSession


def gateway(spark: SparkSession) -> JVMView:
    """The JVM view of `spark`'s gateway (`gateway(spark).java.lang.System`)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a live session always has its gateway
    return jvm


def scala_object(spark: SparkSession, name: str) -> JavaObject:
    """The Scala `object` compiled as class `name` (ending in `$`), found by reflection through the
    loader that holds the Delta jars: py4j reaches neither objects nested in objects nor the
    methods an object's class has no static forwarder for.

    >>> scala_object(spark, "org.apache.spark.sql.delta.DeltaOperations$ManualUpdate$").name()
    'Manual Update'
    """
    jvm = gateway(spark)
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    return jvm.java.lang.Class.forName(name, True, loader).getField("MODULE$").get(None)


def scala_seq(spark: SparkSession, items: Iterable[object]) -> JavaObject:
    """A Scala immutable `Seq` of `items` (Python values or JVM objects).

    >>> scala_seq(spark, ["event_date"]).mkString(",")
    'event_date'
    """
    jvm = gateway(spark)
    values = jvm.java.util.ArrayList()
    for item in items:
        values.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(values).toSeq()
