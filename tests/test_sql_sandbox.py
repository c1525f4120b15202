"""`seclake sql`'s sandbox: hostile statements are refused with their reason; analysts' queries still run."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import cli
from pipelines.home import Home
from pipelines.lake.registry import Lake
from pipelines.schemas import SILVER_SCHEMAS
from pipelines.sql import Database, SqlError, connect

# (case id, statement, what the one-line error must say). Shared with tests/test_serve.py, which
# sends some of them through the JDBC endpoint.
HOSTILE: list[tuple[str, str, str]] = [
    ("java_method", "SELECT java_method('java.lang.System', 'getProperty', 'user.home')",
     "function java_method() is not allowed: it calls Java methods by reflection"),
    ("reflect", "SELECT reflect('java.lang.Runtime', 'getRuntime')", "function reflect() is not allowed"),
    ("try_reflect", "SELECT try_reflect('java.lang.System', 'exit', 0)", "function try_reflect() is not allowed"),
    ("reflect_quoted_upper", "SELECT `REFLECT`('java.lang.System', 'getenv')", "function reflect() is not allowed"),
    ("reflect_qualified", "SELECT builtin.reflect('java.lang.System', 'getenv')", "function reflect() is not allowed"),
    ("reflect_in_lambda", "SELECT transform(array('a'), x -> java_method('java.lang.System', 'getenv', x))",
     "function java_method() is not allowed"),
    ("reflect_in_aggregate_lambda",
     "SELECT aggregate(array(1), 0, (acc, x) -> acc + length(reflect('java.lang.System', 'getenv')))",
     "function reflect() is not allowed"),
    ("reflect_in_subquery", "SELECT * FROM silver_dns WHERE query IN (SELECT reflect('java.util.UUID', 'randomUUID'))",
     "function reflect() is not allowed"),
    ("reflect_in_cte", "WITH x AS (SELECT java_method('java.lang.System', 'getenv') AS e) SELECT * FROM x",
     "function java_method() is not allowed"),
    ("reflect_in_lateral_view",
     "SELECT x FROM silver_dns LATERAL VIEW explode(array(reflect('java.lang.System', 'getenv'))) t AS x",
     "function reflect() is not allowed"),
    ("parquet_path", "SELECT * FROM parquet.`/etc`", "file-path read parquet.`/etc` is not allowed"),
    ("json_path", "SELECT * FROM json.`file:///etc/passwd`", "file-path read json.`file:///etc/passwd`"),
    ("text_path_in_join", "SELECT * FROM silver_dns d JOIN text.`/etc/passwd` p ON true", "file-path read text."),
    ("delta_path", "SELECT count(*) FROM delta.`/tmp/home/tables/alerts`", "file-path read delta."),
    ("backquoted_path", "SELECT * FROM `/etc/passwd`", "file-path read `/etc/passwd`"),
    ("describe_detail_path", "DESCRIBE DETAIL '/tmp/home/tables/alerts'", "file-path read '/tmp/home/tables/alerts'"),
    ("describe_history_path", "DESCRIBE HISTORY delta.`/tmp/home/tables/alerts`", "file-path read delta.`/tmp/home"),
    ("read_files", "SELECT * FROM read_files('/etc/passwd', format => 'text')", "function read_files() is not allowed"),
    ("identifier_clause", "SELECT * FROM IDENTIFIER('parquet.`/etc`')", "function identifier() is not allowed"),
    ("transform_using", "SELECT TRANSFORM(query) USING '/bin/sh -c id' AS (x) FROM silver_dns",
     "TRANSFORM ... USING runs an external command"),
    ("map_using", "FROM (SELECT 1 AS a) MAP a USING 'touch /tmp/pwned' AS (x)", "REDUCE) ... USING runs an external"),
    ("reduce_using", "FROM silver_dns REDUCE query USING 'id' AS (x)", "REDUCE) ... USING runs an external"),
    ("map_in_subquery", "SELECT * FROM (MAP a USING 'id' AS (x) FROM (SELECT 1 AS a))", "USING runs an external"),
    ("map_in_cte", "WITH t AS (FROM (SELECT 1 AS a) MAP a USING 'id' AS (x)) SELECT * FROM t",
     "USING runs an external"),
    ("table_changes_by_path", "SELECT * FROM table_changes_by_path('/other/home/tables/alerts', 0)",
     "function table_changes_by_path() is not allowed"),
    ("load_data", "LOAD DATA LOCAL INPATH '/etc/passwd' INTO TABLE alerts", "'LOAD' statements are not allowed"),
    ("add_jar", "ADD JAR /tmp/evil.jar", "'ADD' statements are not allowed"),
    ("add_file", "ADD FILE /etc/passwd", "'ADD' statements are not allowed"),
    ("set_conf", "SET spark.sql.runSQLOnFiles=true", "'SET' statements are not allowed"),
    ("insert", "INSERT INTO alerts SELECT * FROM alerts", "'INSERT' statements are not allowed"),
    ("cte_insert", "WITH x AS (SELECT * FROM alerts) INSERT INTO alerts SELECT * FROM x",
     "sandbox: INSERT is not allowed"),
    ("insert_in_subquery", "SELECT * FROM (DELETE FROM silver_dns)", "sandbox: DELETE is not allowed"),
    ("create_table", "CREATE TABLE t USING parquet LOCATION '/etc' AS SELECT 1", "'CREATE' statements are not allowed"),
    ("create_udf", "CREATE TEMPORARY FUNCTION pwn AS 'com.evil.Udf' USING JAR '/tmp/evil.jar'",
     "'CREATE' statements are not allowed"),
    ("drop", "DROP TABLE alerts", "'DROP' statements are not allowed"),
    ("alter", "ALTER TABLE alerts SET TBLPROPERTIES ('delta.appendOnly' = 'false')",
     "'ALTER' statements are not allowed"),
    ("delete", "DELETE FROM alerts", "'DELETE' statements are not allowed"),
    ("update", "UPDATE alerts SET severity = 'low'", "'UPDATE' statements are not allowed"),
    ("merge", "MERGE INTO alerts a USING alerts b ON a.alert_id = b.alert_id WHEN MATCHED THEN DELETE",
     "'MERGE' statements are not allowed"),
    ("cache", "CACHE TABLE silver_dns", "'CACHE' statements are not allowed"),
    ("execute_immediate", "EXECUTE IMMEDIATE 'DROP TABLE alerts'", "'EXECUTE' statements are not allowed"),
    ("explain_reflect", "EXPLAIN SELECT reflect('java.lang.System', 'exit', 0)", "function reflect() is not allowed"),
    ("unparseable_reflect", "SELECT java_method('java.lang.System', 'getenv') FROM silver_dns WHERE (",
     "function java_method() is not allowed"),
]

# Ordinary analyst statements, with the value of their first column that they must return.
ALLOWED: list[tuple[str, str, object]] = [
    ("join_and_cte", "WITH q AS (SELECT query, count(*) AS n FROM silver_dns GROUP BY query) "
                     "SELECT count(*) FROM q JOIN silver_dns d ON d.query = q.query", 30),
    ("window_function", "SELECT max(rn) FROM (SELECT row_number() OVER (PARTITION BY query ORDER BY event_time) AS rn "
                        "FROM silver_dns)", 10),
    ("version_as_of", "SELECT count(*) FROM silver_dns VERSION AS OF 0", 10),
    ("at_version", "SELECT (SELECT count(*) FROM silver_dns) - (SELECT count(*) FROM silver_dns@v0)", 20),
    ("lambda", "SELECT size(filter(collect_list(query), q -> q LIKE 'q1%')) FROM silver_dns", 10),
    ("values_and_range", "SELECT count(*) FROM (VALUES (1), (2)) t(x) CROSS JOIN range(3)", 6),
    ("describe_history", "DESCRIBE HISTORY silver_dns", 2),
    ("explain", "EXPLAIN SELECT count(*) FROM silver_dns", None),
    ("describe", "DESCRIBE silver_dns", "event_id"),
]


def _silver_dns_home(spark: SparkSession, root: Path) -> Home:
    """silver_dns with two commits: 10 rows (version 0), then 20 more (version 1); 3 distinct queries."""
    home = Home.resolve(root).create()
    schema = SILVER_SCHEMAS["silver_dns"]
    base = int(datetime(2026, 11, 20, tzinfo=timezone.utc).timestamp())
    sink = Lake(home).sink("silver_dns")
    for batch_id, (start, end) in enumerate([(0, 10), (10, 30)]):
        df = spark.range(start, end, numPartitions=1).select(
            F.format_string("e%d", "id").alias("event_id"),
            (F.lit(base) + F.col("id")).cast("timestamp").alias("event_time"),
            F.format_string("q%d.example.com", F.col("id") % 3).alias("query"),
        )
        sink.write_batch(df.select([F.col(f.name).cast(f.dataType) if f.name in df.columns
                                    else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields]), batch_id)
    return home


@pytest.fixture(scope="module")
def home(spark, tmp_path_factory) -> Home:
    return _silver_dns_home(spark, tmp_path_factory.mktemp("sandbox") / "home")


def test_the_hostile_corpus_is_large_enough():
    assert len(HOSTILE) >= 20 and len({case for case, _, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize(("case", "statement", "reason"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_statements_are_refused_before_spark_with_the_reason(tmp_path, case, statement, reason):
    db = Database(connect(Home.resolve(tmp_path).create().root).lake)  # no Spark: refused before it starts
    with pytest.raises(SqlError) as err:
        db.sql(statement)
    assert reason in str(err.value), str(err.value)
    assert db._spark is None


def test_the_cli_refuses_reflection_in_one_line_with_exit_code_2(capsys, home):
    statement = "SELECT java_method('java.lang.System','getProperty','user.home')"
    code = cli.main(["sql", "--home", str(home.root), statement])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == ("seclake sql: refused by the sandbox: function java_method() is not allowed: "
                                    "it calls Java methods by reflection, outside SQL's sandbox")


@pytest.mark.parametrize(("case", "statement", "first"), ALLOWED, ids=[a[0] for a in ALLOWED])
def test_analyst_queries_still_run(spark, home, case, statement, first):
    rows = connect(home.root, spark=spark).sql(statement).collect()
    assert rows
    if case == "describe_history":
        assert len(rows) == first
    elif first is not None:
        assert rows[0][0] == first, rows[0]
