"""Rule validation without Spark: a hostile corpus, metadata checks, the pack's uniqueness rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.rules.pack import load_rules, scan_rules
from pipelines.rules.spec import RuleError, interval_seconds, split_metadata, validate_rule

META = {
    "id": "11111111-2222-4333-8444-555555555555",
    "name": "test rule",
    "version": "1",
    "severity": "low",
    "mitre": "[T1046]",
    "description": "a rule for tests",
    "false_positives": "[none known]",
    "tables": "[enriched_dns]",
    "event_time": "event_time",
    "watermark": "2 hours",
    "window": "10 minutes",
}
COLUMNS = ("src_ip, mac, device, owner, window.start AS window_start, window.end AS window_end, "
           "min(event_time) AS first_seen, max(event_time) AS last_seen, 'x' AS evidence")
GROUP = "GROUP BY src_ip, mac, device, owner, window(event_time, '10 minutes')"
VALID_SQL = f"SELECT {COLUMNS} FROM enriched_dns {GROUP}"


def rule_text(sql: str = VALID_SQL, drop: tuple[str, ...] = (), **meta: str) -> str:
    fields = {**META, **meta}
    header = "\n".join(f"{k}: {v}" for k, v in fields.items() if k not in drop)
    return f"/*\n{header}\n*/\n{sql}\n"


def with_column(expression: str) -> str:
    return f"SELECT {COLUMNS}, {expression} AS extra FROM enriched_dns {GROUP}"


# (case id, SQL after the metadata, what the error must say)
HOSTILE: list[tuple[str, str, str]] = [
    ("reflect", with_column("reflect('java.lang.Runtime', 'getRuntime')"), "reflect() is not allowed"),
    ("java_method", with_column("java_method('java.lang.System', 'exit', 0)"), "java_method() is not allowed"),
    ("try_reflect", with_column("try_reflect('java.lang.Runtime', 'getRuntime')"), "try_reflect() is not allowed"),
    ("reflect_quoted_upper", with_column("`REFLECT`('java.lang.Runtime', 'getRuntime')"), "reflect() is not allowed"),
    ("reflect_qualified", with_column("builtin.reflect('java.lang.Runtime', 'getRuntime')"), "reflect() is not allowed"),
    ("reflect_in_where", f"SELECT {COLUMNS} FROM enriched_dns WHERE java_method('a', 'b') IS NOT NULL {GROUP}",
     "java_method() is not allowed"),
    ("transform_using", "SELECT TRANSFORM(src_ip) USING '/bin/sh -c id' AS (x) FROM enriched_dns",
     "TRANSFORM ... USING runs an external command"),
    ("parquet_path", f"SELECT {COLUMNS} FROM parquet.`/etc/passwd` {GROUP}", "file-path read parquet.`/etc/passwd`"),
    ("json_path_in_subquery", f"SELECT {COLUMNS} FROM enriched_dns {GROUP} "
                              "HAVING count(*) > (SELECT count(*) FROM json.`file:///tmp/x.json`)", "file-path read json."),
    ("backquoted_path", f"SELECT {COLUMNS} FROM `/tmp/lake/tables/silver_dns` {GROUP}", "file-path read `/tmp/lake"),
    ("read_files", f"SELECT {COLUMNS} FROM read_files('/etc', format => 'text') {GROUP}", "read_files() is not allowed"),
    ("range_tvf", f"SELECT {COLUMNS} FROM range(10) {GROUP}", "table-valued function"),
    ("identifier_clause", f"SELECT {COLUMNS} FROM IDENTIFIER('silver_dns') {GROUP}", "identifier() is not allowed"),
    ("add_jar", "ADD JAR /tmp/evil.jar", "only a read-only SELECT"),
    ("set_conf", "SET spark.sql.runSQLOnFiles=true", "only a read-only SELECT"),
    ("create_udf", "CREATE TEMPORARY FUNCTION pwn AS 'com.evil.Udf' USING JAR '/tmp/evil.jar'", "only a read-only SELECT"),
    ("create_view", f"CREATE TEMPORARY VIEW enriched_dns AS {VALID_SQL}", "only a read-only SELECT"),
    ("drop_table", "DROP TABLE alerts", "only a read-only SELECT"),
    ("insert", f"INSERT INTO alerts {VALID_SQL}", "only a read-only SELECT"),
    ("cte_insert", f"WITH x AS ({VALID_SQL}) INSERT INTO alerts SELECT * FROM x", "only a read-only SELECT"),
    ("insert_directory", f"INSERT OVERWRITE DIRECTORY '/tmp/out' {VALID_SQL}", "only a read-only SELECT"),
    ("execute_immediate", "EXECUTE IMMEDIATE 'DROP TABLE alerts'", "only a read-only SELECT"),
    ("load_data", "LOAD DATA INPATH '/tmp/x' INTO TABLE silver_dns", "only a read-only SELECT"),
    ("cache_table", "CACHE TABLE silver_dns", "only a read-only SELECT"),
    ("second_statement", f"{VALID_SQL}; DROP TABLE alerts", "exactly one SQL statement expected"),
    ("unparseable", "SELECT src_ip FROM enriched_dns WHERE (", "does not parse"),
    ("unknown_table", f"SELECT {COLUMNS} FROM secrets {GROUP}", "unknown table 'secrets'"),
    ("catalog_table", f"SELECT {COLUMNS} FROM spark_catalog.default.enriched_dns {GROUP}",
     "qualified table name spark_catalog.default.enriched_dns"),
    ("global_temp", f"SELECT {COLUMNS} FROM global_temp.enriched_dns {GROUP}", "qualified table name global_temp.enriched_dns"),
    ("reads_alerts", f"SELECT {COLUMNS} FROM alerts {GROUP}", "may not read the alerts table"),
    ("time_travel", f"SELECT {COLUMNS} FROM enriched_dns VERSION AS OF 1 {GROUP}", "time travel"),
    ("raise_error", with_column("raise_error('boom')"), "raise_error() is not allowed"),
    ("nondeterministic_rand", with_column("rand()"), "rand() is non-deterministic"),
    ("nondeterministic_now", with_column("current_timestamp()"), "current_timestamp() is non-deterministic"),
    ("window_function", f"SELECT {COLUMNS}, lag(max(event_time)) OVER (PARTITION BY src_ip ORDER BY src_ip) AS prev "
                        f"FROM enriched_dns {GROUP}", "window functions"),
    ("distinct_aggregate", with_column("count(DISTINCT query)"), "DISTINCT aggregates are not supported"),
    ("order_limit", f"{VALID_SQL} ORDER BY src_ip LIMIT 10", "ORDER BY / LIMIT"),
]


@pytest.mark.parametrize("case_id, sql, reason", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_rules_are_rejected_with_the_reason(case_id, sql, reason):
    with pytest.raises(RuleError) as err:
        validate_rule(rule_text(sql))
    assert reason in str(err.value), str(err.value)


def test_the_hostile_corpus_is_large_enough():
    assert len(HOSTILE) >= 20


def test_a_comment_that_parsers_might_read_differently_never_reaches_spark():
    # sqlglot reads nested comments like Spark does; in any case Spark only ever runs the SQL
    # regenerated from the validated tree, without comments.
    rule = validate_rule(rule_text(f"/* /* */ DROP TABLE alerts; -- */ {VALID_SQL}"))
    assert "DROP" not in rule.sql.upper() and "--" not in rule.sql and "/*" not in rule.sql


def test_a_valid_rule_is_accepted_with_canonical_sql_and_defaults():
    rule = validate_rule(rule_text(), slug="test_rule")
    assert (rule.slug, rule.version, rule.severity, rule.mitre) == ("test_rule", 1, "low", ("T1046",))
    assert rule.tables == ("enriched_dns",) and rule.keys == ("src_ip", "mac")
    assert rule.sql.startswith("SELECT src_ip, mac") and rule.checkpoint_name == "rules/test_rule_v1"
    assert rule.query_name == "rule:test_rule"


def test_a_description_edit_changes_the_content_hash_but_not_the_logic_hash():
    a, b = validate_rule(rule_text()), validate_rule(rule_text(description="reworded"))
    assert a.content_hash != b.content_hash and a.logic_hash == b.logic_hash
    c = validate_rule(rule_text(VALID_SQL.replace("'x' AS evidence", "'y' AS evidence")))
    assert c.logic_hash != a.logic_hash


# (case id, rule text, what the error must say)
BAD_METADATA: list[tuple[str, str, str]] = [
    ("no_block", VALID_SQL, "must open with the metadata block"),
    ("unclosed", "/* id: x\n" + VALID_SQL, "not closed"),
    ("bad_yaml", "/* id: [unclosed\n*/\n" + VALID_SQL, "not valid YAML"),
    ("not_mapping", "/* just words\n*/\n" + VALID_SQL, "must be a YAML mapping"),
    ("missing_field", rule_text(drop=("severity",)), "['severity'] missing"),
    ("unknown_field", rule_text(author="me"), "unknown metadata field(s) ['author']"),
    ("bad_uuid", rule_text(id="rule-1"), "id 'rule-1' is not a UUID"),
    ("upper_uuid", rule_text(id="11111111-2222-4333-8444-55555555555A"), "is not a UUID in canonical lower-case"),
    ("bad_severity", rule_text(severity="urgent"), "severity 'urgent' is not one of low, medium, high, critical"),
    ("bad_mitre", rule_text(mitre="[T46, TA0001]"), "mitre id(s) ['T46', 'TA0001']"),
    ("mitre_not_list", rule_text(mitre="T1046"), "mitre must be a list"),
    ("bad_version", rule_text(version="0"), "version must be an integer >= 1"),
    ("string_version", rule_text(version="'2'"), "version must be an integer >= 1"),
    ("bad_watermark", rule_text(watermark="soon"), "watermark: 'soon' is not an interval"),
    ("event_time_not_a_column", rule_text(event_time="ts"), "event_time column 'ts' is not a column of table enriched_dns"),
    ("tables_differ", rule_text(tables="[enriched_conn]"), "differ from the tables the SQL reads ['enriched_dns']"),
    ("window_mismatch", rule_text(window="5 minutes"), "differs from the metadata window '5 minutes'"),
    ("no_window", rule_text(f"SELECT {COLUMNS.replace('window.start', 'min(event_time)').replace('window.end', 'max(event_time)')} "
                            "FROM enriched_dns GROUP BY src_ip, mac, device, owner"), "must aggregate per window"),
    ("window_over_other_column", rule_text(VALID_SQL.replace("window(event_time", "window(lease_valid_from")),
     "must be over the event_time column"),
    ("missing_output", rule_text(VALID_SQL.replace(", 'x' AS evidence", "")), "must return column(s) ['evidence']"),
    ("select_star", rule_text(f"WITH t AS ({VALID_SQL}) SELECT * FROM t"), "no SELECT *"),
    ("keys_not_columns", rule_text(keys="[dst_ip]"), "keys ['dst_ip'] must be output columns"),
    ("leading_window_group", rule_text(f"SELECT {COLUMNS} FROM enriched_dns GROUP BY window(event_time, '10 minutes'), "
                                       "src_ip, mac, device, owner"), "put it last or in parentheses"),
]


@pytest.mark.parametrize("case_id, text, reason", BAD_METADATA, ids=[b[0] for b in BAD_METADATA])
def test_invalid_metadata_and_shape_are_rejected_with_the_reason(case_id, text, reason):
    with pytest.raises(RuleError) as err:
        validate_rule(text)
    assert reason in str(err.value), str(err.value)


def test_a_bad_file_name_is_rejected(tmp_path):
    path = tmp_path / "Bad-Name.sql"
    path.write_text(rule_text())
    with pytest.raises(RuleError, match="must be snake_case"):
        validate_rule(path)


def test_the_pack_rejects_duplicate_ids_and_file_names_but_keeps_the_first(tmp_path):
    (tmp_path / "dns").mkdir()
    (tmp_path / "conn").mkdir()
    other_id = "99999999-2222-4333-8444-555555555555"
    (tmp_path / "conn" / "first.sql").write_text(rule_text(id=other_id))
    (tmp_path / "dns" / "first.sql").write_text(rule_text())      # a second file named `first`
    (tmp_path / "dns" / "second.sql").write_text(rule_text())
    (tmp_path / "dns" / "third.sql").write_text(rule_text())      # the id of `second`
    (tmp_path / "dns" / "broken.sql").write_text("SELECT 1")
    errors: list[str] = []
    rules = load_rules(tmp_path, on_error=lambda path, reason: errors.append(reason))
    assert [r.path for r in rules] == [tmp_path / "conn" / "first.sql", tmp_path / "dns" / "second.sql"]
    assert len(errors) == 3
    assert any("dns/first.sql: duplicate rule file name 'first'" in e for e in errors)
    assert any("third.sql: duplicate id 11111111-2222-4333-8444-555555555555" in e for e in errors)
    assert any("broken.sql: the file must open with the metadata block" in e for e in errors)


def test_the_repository_pack_is_valid_and_unique():
    pack = scan_rules(Path(__file__).resolve().parents[1] / "rules")
    assert pack.errors == {}
    assert len(pack.rules) >= 8
    assert len({r.name for r in pack.rules}) == len(pack.rules)


def test_helpers():
    assert interval_seconds("1 hour") == 3600 and interval_seconds("10 minutes") == 600
    with pytest.raises(ValueError, match="is not an interval"):
        interval_seconds("0 seconds")
    assert split_metadata("  /* a: 1 */SELECT 1") == ({"a": 1}, "SELECT 1")
