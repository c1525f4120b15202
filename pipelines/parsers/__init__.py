"""Parsers for landing files: whole files -> data lines -> typed rows for bronze, quarantine and silver.

Native Spark expressions only (no Python UDFs), no actions: every function works on
streaming and batch DataFrames, e.g. inside the ETL's foreachBatch. One file holding a DNS
record and a line that is not JSON gives two bronze rows, one quarantined, one silver_dns row:

>>> dns = ('{"ts":1521911720.86,"uid":"C1","id.orig_h":"10.0.0.1","id.orig_p":5353,"id.resp_h":"10.0.0.2",'
...        '"id.resp_p":53,"proto":"udp","query":"example.org","_path":"dns"}')
>>> files = spark.createDataFrame([("dns.log", dns + "\\nnot json\\n")], "file string, text string")
>>> parsed = parse(split_lines(files, "zeek"), "zeek")  # files: (file, text), one row per landing file
>>> to_bronze(parsed).count(), to_quarantine(parsed).count(), to_silver(parsed, "silver_dns").count()
(2, 1, 1)
"""
from pipelines.parsers.lines import split_lines
from pipelines.parsers.tables import PARSED_COLUMNS, parse, to_bronze, to_quarantine, to_silver

__all__ = ["PARSED_COLUMNS", "parse", "split_lines", "to_bronze", "to_quarantine", "to_silver"]
