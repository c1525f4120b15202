"""Parsers for landing files: whole files -> data lines -> typed rows for bronze, quarantine and silver.

Native Spark expressions only (no Python UDFs), no actions: every function works on
streaming and batch DataFrames, e.g. inside the ETL's foreachBatch:

>>> lines = split_lines(files, "zeek")          # files: (file, text), one row per landing file
>>> parsed = parse(lines, "zeek")
>>> to_bronze(parsed), to_quarantine(parsed), to_silver(parsed, "silver_dns")  # doctest: +ELLIPSIS
(DataFrame[...], DataFrame[...], DataFrame[...])
"""
from pipelines.parsers.lines import split_lines
from pipelines.parsers.tables import PARSED_COLUMNS, parse, to_bronze, to_quarantine, to_silver

__all__ = ["PARSED_COLUMNS", "parse", "split_lines", "to_bronze", "to_quarantine", "to_silver"]
