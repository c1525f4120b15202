"""Rule validation without Spark: a hostile corpus, metadata checks, the pack's uniqueness rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.rules.limits import MAX_ALLOCATION, MAX_ALLOCATION_PRODUCT, MAX_SEQUENCE, regex_problem
from pipelines.rules.pack import load_rules, scan_rules
from pipelines.rules.spec import RuleError, split_metadata, validate_rule
from pipelines.settings import interval_seconds

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
LOOKUP_SQL = (f"SELECT {COLUMNS} FROM enriched_dns JOIN indicators i ON i.value = enriched_dns.query {GROUP}"
              .replace("GROUP BY src_ip", "GROUP BY enriched_dns.src_ip"))


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
    ("reflect_qualified", with_column("builtin.reflect('java.lang.Runtime', 'getRuntime')"),
     "reflect() is not allowed"),
    ("reflect_in_where", f"SELECT {COLUMNS} FROM enriched_dns WHERE java_method('a', 'b') IS NOT NULL {GROUP}",
     "java_method() is not allowed"),
    ("transform_using", "SELECT TRANSFORM(src_ip) USING '/bin/sh -c id' AS (x) FROM enriched_dns",
     "TRANSFORM ... USING runs an external command"),
    ("parquet_path", f"SELECT {COLUMNS} FROM parquet.`/etc/passwd` {GROUP}", "file-path read parquet.`/etc/passwd`"),
    ("json_path_in_subquery", f"SELECT {COLUMNS} FROM enriched_dns {GROUP} "
                              "HAVING count(*) > (SELECT count(*) FROM json.`file:///tmp/x.json`)",
     "file-path read json."),
    ("backquoted_path", f"SELECT {COLUMNS} FROM `/tmp/lake/tables/silver_dns` {GROUP}", "file-path read `/tmp/lake"),
    ("read_files", f"SELECT {COLUMNS} FROM read_files('/etc', format => 'text') {GROUP}",
     "read_files() is not allowed"),
    ("range_tvf", f"SELECT {COLUMNS} FROM range(10) {GROUP}", "table-valued function"),
    ("identifier_clause", f"SELECT {COLUMNS} FROM IDENTIFIER('silver_dns') {GROUP}", "identifier() is not allowed"),
    ("add_jar", "ADD JAR /tmp/evil.jar", "only a read-only SELECT"),
    ("set_conf", "SET spark.sql.runSQLOnFiles=true", "only a read-only SELECT"),
    ("create_udf", "CREATE TEMPORARY FUNCTION pwn AS 'com.evil.Udf' USING JAR '/tmp/evil.jar'",
     "only a read-only SELECT"),
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
    # sqlglot read these as valid (an empty item dropped, an empty list kept), Spark refuses them.
    ("empty_group_item", f"SELECT {COLUMNS} FROM enriched_dns {GROUP.replace(', ', ',, ', 1)}",
     "a list item left empty"),
    ("trailing_select_comma", f"SELECT {COLUMNS}, FROM enriched_dns {GROUP}", "a list item left empty"),
    ("empty_select", f"SELECT DISTINCT FROM enriched_dns {GROUP}", "column 6: SELECT has nothing after it"),
    ("empty_group_by", f"SELECT {COLUMNS} FROM enriched_dns GROUP BY HAVING count(*) > 1",
     "GROUP BY has nothing after it"),
    ("where_where", f"SELECT {COLUMNS} FROM enriched_dns WHERE WHERE rcode_name = 'NXDOMAIN' {GROUP}",
     "WHERE has nothing after it"),
    ("unknown_table", f"SELECT {COLUMNS} FROM secrets {GROUP}", "unknown table 'secrets'"),
    ("catalog_table", f"SELECT {COLUMNS} FROM spark_catalog.default.enriched_dns {GROUP}",
     "qualified table name spark_catalog.default.enriched_dns"),
    ("global_temp", f"SELECT {COLUMNS} FROM global_temp.enriched_dns {GROUP}",
     "qualified table name global_temp.enriched_dns"),
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
    assert rule.sql.startswith("SELECT src_ip, mac") and rule.checkpoint_name == "rule_test_rule/v1-plan2"
    assert rule.query_name == "rule_test_rule"


def test_a_description_edit_changes_the_content_hash_but_not_the_logic_hash():
    a, b = validate_rule(rule_text()), validate_rule(rule_text(description="reworded"))
    assert a.content_hash != b.content_hash and a.logic_hash == b.logic_hash
    c = validate_rule(rule_text(VALID_SQL.replace("'x' AS evidence", "'y' AS evidence")))
    assert c.logic_hash != a.logic_hash


def where(condition: str) -> str:
    return f"SELECT {COLUMNS} FROM enriched_dns WHERE {condition} {GROUP}"


JOINED_COLUMNS = ("d.src_ip, d.mac, d.device, d.owner, window.start AS window_start, window.end AS window_end, "
                  "min(d.event_time) AS first_seen, max(d.event_time) AS last_seen, 'x' AS evidence")
JOINED_GROUP = "GROUP BY d.src_ip, d.mac, d.device, d.owner, window(d.event_time, '10 minutes')"


def joined(join: str) -> str:
    """A rule over enriched_dns `d` joined (`join`) with enriched_conn `c`."""
    return rule_text(f"SELECT {JOINED_COLUMNS} FROM enriched_dns d {join} {JOINED_GROUP}",
                     tables="[enriched_dns, enriched_conn]")


_NESTED = "catastrophic backtracking"
_TOO_BIG = f"exceeds the limit of {MAX_ALLOCATION:,}"
_NO_EQUALITY = "a join needs an equality between a column of each side"
_CROSS = "a cross join (CROSS JOIN, or tables separated by commas in FROM)"

# (case id, rule text, what the error must say): valid SQL that would exhaust memory or CPU.
RESOURCE_EXHAUSTION: list[tuple[str, str, str]] = [
    # the examples
    ("sequence_two_billion", rule_text(where("sequence(1, 2000000000) IS NOT NULL")),
     f"sequence() would build 2,000,000,000 elements, more than the limit of {MAX_SEQUENCE:,}"),
    # a bound computed by a nested function (sqlglot 30's function nodes once read as absent arguments)
    ("sequence_nested_function_bound", rule_text(where("sequence(1, abs(2000000000)) IS NOT NULL")),
     "sequence() bounds must be integer literals"),
    ("schema_of_csv_repeat", rule_text(where("query = schema_of_csv(repeat('a,', 100000000))")),
     f"repeat() size 200,000,000 (100,000,000 copies of 2 characters) {_TOO_BIG}"),
    ("url_decode_rpad", rule_text(where("url_decode(rpad('%', 100000000, 'a')) IS NOT NULL")),
     f"rpad() length 100,000,000 {_TOO_BIG}"),
    ("rlike_nested_plus", rule_text(where("query RLIKE '(a+)+$'")), f"nests quantifiers in '(a+)+': {_NESTED}"),
    ("cross_join", joined("CROSS JOIN enriched_conn c"), _CROSS),
    ("join_without_equality", joined("JOIN enriched_conn c ON d.event_time < c.event_time"), _NO_EQUALITY),
    # sizes: upper case, other functions, lambdas, CTEs, constant expressions, computed sizes
    ("sequence_upper_case", rule_text(where("SEQUENCE(1, 200001) IS NOT NULL")), "would build 200,001 elements"),
    ("sequence_with_step", rule_text(with_column("sequence(0, 2000000000, 10)")), "would build 200,000,001 elements"),
    ("sequence_in_lambda", rule_text(with_column("transform(array(1), k -> sequence(k, 1000000000))")),
     "sequence() bounds must be integer literals"),
    ("sequence_of_dates",
     rule_text(with_column("sequence(to_date('2000-01-01'), to_date('2100-01-01'), interval 1 day)")),
     "sequence() bounds must be integer literals"),
    ("sequence_scaled_size", rule_text(with_column("sequence(1, size(collect_set(query)) * 1000000)")),
     "sequence() bounds must be integer literals"),
    ("sequence_size_plus_huge", rule_text(with_column("sequence(1, size(collect_set(query)) + 2000000000)")),
     "bounds differ by 1,999,999,999 besides size(...)"),
    ("sequence_zero_step", rule_text(with_column("sequence(1, 10, 0)")), "step must be a non-zero numeric literal"),
    ("exploded_sequence",
     rule_text(f"SELECT {COLUMNS} FROM enriched_dns LATERAL VIEW explode(sequence(1, 1000000)) s AS n {GROUP}"),
     "would build 1,000,000 elements"),
    ("repeat_upper_case", rule_text(with_column("REPEAT('a', 10001)")), f"repeat() count 10,001 {_TOO_BIG}"),
    ("repeat_column", rule_text(with_column("repeat(max(query), 100000000)")),
     f"repeat() count 100,000,000 {_TOO_BIG}"),
    ("repeat_in_cte", rule_text(f"WITH padded AS (SELECT *, repeat(query, 50000) AS q FROM enriched_dns) "
                                f"SELECT {COLUMNS} FROM padded {GROUP}"), f"repeat() count 50,000 {_TOO_BIG}"),
    ("repeat_constant_expression", rule_text(with_column("repeat('a', 2147483647 + 1)")), "count 2,147,483,648"),
    ("repeat_cast_string", rule_text(with_column("repeat('a', CAST('100000000' AS INT))")), "count 100,000,000"),
    ("repeat_in_lambda", rule_text(with_column("transform(collect_list(query), q -> repeat(q, length(q)))")),
     "repeat() count must be a numeric literal"),
    ("repeat_lambda_variable", rule_text(with_column("transform(array(100000000), n -> repeat('a', n))")),
     "repeat() count must be a numeric literal"),
    ("lpad_computed_length", rule_text(with_column("lpad(max(query), max(length(query)) * 1000, '0')")),
     "lpad() length must be a numeric literal"),
    ("lpad_upper_case", rule_text(with_column("LPAD(max(query), 20000000, '0')")),
     f"lpad() length 20,000,000 {_TOO_BIG}"),
    ("space", rule_text(with_column("space(100000000)")), f"space() length 100,000,000 {_TOO_BIG}"),
    ("space_computed", rule_text(with_column("space(count(*))")), "space() length must be a numeric literal"),
    ("array_repeat", rule_text(with_column("size(array_repeat(src_ip, 100000000))")),
     "array_repeat() count 100,000,000"),
    ("array_repeat_computed", rule_text(with_column("array_repeat(1, count(*))")),
     "array_repeat() count must be a numeric literal"),
    ("array_insert_far", rule_text(with_column("array_insert(array(1), 100000000, 2)")),
     "array_insert() position 100,000,000"),
    ("format_string_width", rule_text(with_column("format_string('%0100000000d', 1)")),
     "format_string() width 100,000,000"),
    ("printf_computed_format", rule_text(with_column("printf(max(query), 1)")),
     "format_string() format must be a string literal"),
    ("approx_count_distinct_rsd", rule_text(with_column("approx_count_distinct(query, 0.0000001)")),
     "relative standard deviation 1E-7 is below 0.01"),
    ("count_min_sketch_eps", rule_text(with_column("count_min_sketch(query, 0.0000001, 0.9, 1)")),
     "count_min_sketch() needs eps >= 0.001"),
    ("nested_allocations", rule_text(with_column("repeat(rpad(max(query), 10000), 10000)")),
     f"multiply to 100,000,000 (limit {MAX_ALLOCATION_PRODUCT:,})"),
    ("allocations_through_a_cte", rule_text(f"WITH p AS (SELECT *, rpad(query, 5000) AS q FROM enriched_dns) "
                                            f"SELECT {COLUMNS}, max(repeat(q, 5000)) AS extra FROM p {GROUP}"),
     "multiply to 25,000,000"),
    # regular expressions: every function that takes one, upper case, lambdas, CTEs, computed patterns
    ("regexp_star_star", rule_text(where("query REGEXP '(a*)*b'")), "nests quantifiers in '(a*)*'"),
    ("regexp_like_alternation", rule_text(where("regexp_like(query, '(a|a?)+')")), "nests quantifiers in '(a|a?)+'"),
    ("rlike_words", rule_text(where(r"query RLIKE '^(\\w+\\s?)*$'")), _NESTED),
    ("rlike_upper_case", rule_text(where("query RLIKE '(?i)(X+)+Y'")), "nests quantifiers in '(X+)+'"),
    ("rlike_function_upper_case", rule_text(where("RLIKE(query, '([a-z]+\\.)+$')")), _NESTED),
    ("rlike_any", rule_text(where("query RLIKE ANY ('^a', '(b+)+$')")), "nests quantifiers in '(b+)+'"),
    ("rlike_escaped_parens_unescaped_by_spark", rule_text(where(r"query RLIKE '\(a+\)+$'")),
     "nests quantifiers in '(a+)+'"),
    ("bounded_repetition_of_unbounded", rule_text(where("query RLIKE '(a+){2,20}$'")),
     "nests quantifiers in '(a+){2,20}'"),
    ("regexp_extract", rule_text(with_column("regexp_extract(max(query), '((a+)b?)+', 1)")), _NESTED),
    ("regexp_extract_all", rule_text(with_column("regexp_extract_all(max(query), '(x*y?)*', 0)")), _NESTED),
    ("regexp_replace", rule_text(with_column("regexp_replace(max(query), '(.*a)+', '')")), _NESTED),
    ("regexp_count", rule_text(with_column("regexp_count(max(query), '(a|b+)*c')")), _NESTED),
    ("regexp_substr", rule_text(with_column("regexp_substr(max(query), '(a+)*')")), _NESTED),
    ("regexp_instr", rule_text(with_column("regexp_instr(max(query), '(a+)*')")), _NESTED),
    ("split_regex", rule_text(with_column("split(max(query), '(-+)+')")), _NESTED),
    ("str_to_map_regex", rule_text(with_column("str_to_map(max(query), '(;+)+', '=')")), _NESTED),
    ("regex_in_lambda", rule_text(with_column("filter(collect_list(query), q -> q RLIKE '(a+)+$')")), _NESTED),
    ("regex_in_cte", rule_text(f"WITH slow AS (SELECT * FROM enriched_dns WHERE query RLIKE '(a+)+$') "
                               f"SELECT {COLUMNS} FROM slow {GROUP}"), _NESTED),
    ("regex_computed", rule_text(where("query RLIKE concat('(a', '+)+')")),
     "rlike() pattern must be a string literal"),
    ("regex_from_column", rule_text(where("query RLIKE hostname")), "rlike() pattern must be a string literal"),
    ("regex_from_lambda", rule_text(with_column("filter(collect_list(query), q -> max(hostname) RLIKE q)")),
     "rlike() pattern must be a string literal"),
    ("regex_that_does_not_compile", rule_text(where("query RLIKE '(a'")), "is not a valid Java regular expression"),
    # joins
    ("comma_join", joined(", enriched_conn c"), _CROSS),
    ("cross_join_upper_in_cte", rule_text(f"WITH pairs AS (SELECT d.* FROM enriched_dns d CROSS JOIN enriched_conn c) "
                                          f"SELECT {COLUMNS} FROM pairs {GROUP}",
                                          tables="[enriched_dns, enriched_conn]"),
     _CROSS),
    ("join_on_true", joined("JOIN enriched_conn c ON TRUE"), _NO_EQUALITY),
    ("join_without_on", joined("JOIN enriched_conn c"), _NO_EQUALITY),
    ("join_equality_or_true", joined("JOIN enriched_conn c ON d.src_ip = c.src_ip OR TRUE"), _NO_EQUALITY),
    ("join_equality_within_one_side", joined("JOIN enriched_conn c ON d.src_ip = d.attributed_ip"), _NO_EQUALITY),
    ("join_equality_with_constant", joined("JOIN enriched_conn c ON c.proto = 'tcp'"), _NO_EQUALITY),
    ("join_ambiguous_columns", joined("JOIN enriched_conn c ON src_ip = dst_ip"), _NO_EQUALITY),
    ("semi_join_inequality", joined("LEFT SEMI JOIN enriched_conn c ON d.event_time > c.event_time"), _NO_EQUALITY),
    ("natural_join", joined("NATURAL JOIN enriched_conn c"), "NATURAL JOIN joins on whatever columns"),
]


@pytest.mark.parametrize("case_id, text, reason", RESOURCE_EXHAUSTION, ids=[r[0] for r in RESOURCE_EXHAUSTION])
def test_resource_exhausting_rules_are_rejected_with_the_reason(case_id, text, reason):
    with pytest.raises(RuleError) as err:
        validate_rule(text)
    assert reason in str(err.value), str(err.value)


def test_the_resource_exhaustion_corpus_is_large_enough():
    assert len(RESOURCE_EXHAUSTION) >= 40


# (case id, rule text): within the limits, accepted.
WITHIN_LIMITS: list[tuple[str, str]] = [
    ("small_literals", rule_text(with_column("concat(repeat('-', 20), lpad(max(query), 64, ' '), space(2), "
                                             "rpad('x', 5, '.'), size(array_repeat(0, 3)), size(sequence(1, 24)))"))),
    ("largest_repeat", rule_text(with_column(f"repeat(max(query), {MAX_ALLOCATION})"))),
    ("largest_sequence", rule_text(with_column(f"size(sequence(1, {MAX_SEQUENCE}))"))),
    ("sequence_bounded_by_size", rule_text(with_column("transform(sequence(1, size(collect_list(query)) - 1), "
                                                       "k -> k)"))),
    ("sequence_descending", rule_text(with_column("sequence(10, -10, -2)"))),
    ("array_insert_append",
     rule_text(with_column("array_insert(collect_list(query), size(collect_list(query)) + 1, 'x')"))),
    ("format_widths", rule_text(with_column("format_string('%-20s %5d %.2f', max(query), 1, 0.5)"))),
    ("sketch_defaults", rule_text(with_column("approx_count_distinct(query, 0.05)"))),
    ("safe_regexes", rule_text(where(r"query RLIKE '^[a-z0-9-]{20,}\\.' "
                                     r"AND query NOT RLIKE '^172[.](1[6-9]|2[0-9]|3[01])[.]' "
                                     r"AND regexp_extract(query, '^([0-9]+[.][0-9]+[.][0-9]+)[.]', 1) = '' "
                                     r"AND query RLIKE '(\\d{1,3}\\.){3}\\d{1,3}' AND size(split(query, '[.]')) > 2 "
                                     r"AND query RLIKE '(?:com|net)+$'"))),
    ("possessive_and_atomic", rule_text(where("query RLIKE '(a++)+$' AND query RLIKE '(?>a+)+$' "
                                              "AND query RLIKE '(a+)++$'"))),
    ("escaped_and_class_parentheses", rule_text(where(r"query RLIKE '\\(a+\\)+' AND query RLIKE '[(a+)+]'"))),
    ("equi_join", joined("JOIN enriched_conn c ON d.src_ip = c.src_ip AND c.event_time BETWEEN d.event_time "
                         "AND d.event_time + INTERVAL 1 MINUTE")),
    ("left_anti_join", joined("LEFT ANTI JOIN enriched_conn c ON c.src_ip = d.src_ip")),
    ("left_semi_join_expression", joined("LEFT SEMI JOIN enriched_conn c ON (lower(d.mac) = lower(c.mac))")),
    ("null_safe_equality", joined("JOIN enriched_conn c ON d.mac <=> c.mac")),
    ("join_using", joined("JOIN enriched_conn c USING (src_ip)")),
    ("join_unqualified_ctes", rule_text(
        "WITH a AS (SELECT src_ip AS dns_ip, event_time FROM enriched_dns), "
        "b AS (SELECT src_ip AS conn_ip, mac, device, owner FROM enriched_conn) "
        "SELECT dns_ip AS src_ip, mac, device, owner, window.start AS window_start, window.end AS window_end, "
        "min(event_time) AS first_seen, max(event_time) AS last_seen, 'x' AS evidence "
        "FROM a JOIN b ON dns_ip = conn_ip GROUP BY dns_ip, mac, device, owner, window(event_time, '10 minutes')",
        tables="[enriched_dns, enriched_conn]")),
]


@pytest.mark.parametrize("case_id, text", WITHIN_LIMITS, ids=[w[0] for w in WITHIN_LIMITS])
def test_rules_within_the_resource_limits_are_accepted(case_id, text):
    validate_rule(text)


def test_a_limit_refusal_names_the_rule_file_and_the_line(tmp_path):
    path = tmp_path / "bomb.sql"
    sql = f"SELECT {COLUMNS}\nFROM enriched_dns\nWHERE query RLIKE '(a+)+$'\n{GROUP}"
    path.write_text(rule_text(sql))
    line = path.read_text().splitlines().index("WHERE query RLIKE '(a+)+$'") + 1
    with pytest.raises(RuleError) as err:
        validate_rule(path)
    assert str(err.value).startswith(f"{path}: line {line}: query RLIKE '(a+)+$': regular expression"), str(err.value)


@pytest.mark.parametrize("pattern, refused", [
    ("(a+)+$", True), ("(a*)*", True), ("(a|a?)+", True), (r"(\w+\s?)*$", True), ("((a)+)+", True),
    ("(a{1,3})+", True), ("(a+){3}", True), ("(?<name>a+)+", True), ("(a+)*?", True), (r"(\.[a-z]+)+", True),
    (r"^[a-z0-9-]{20,}\.", False), (r"(\d{1,3}\.){3}\d{1,3}", False), ("(ab){2,}", False), ("(?:a|b)+", False),
    ("(a+)?", False), ("(a++)+", False), ("(?>a+)+", False), ("(a+)++", False), ("[(a+)+]", False),
    (r"\(a+\)+", False), (r"\Q(a+)+\E", False), ("[]a]+", False), (r"\p{L}+", False),
])
def test_the_nested_quantifier_heuristic(pattern, refused):
    assert (regex_problem(pattern) is not None) is refused, regex_problem(pattern)


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
    ("event_time_not_a_column", rule_text(event_time="ts"),
     "event_time column 'ts' is not a column of table enriched_dns"),
    ("tables_differ", rule_text(tables="[enriched_conn]"),
     "differ from the tables the SQL reads ['enriched_dns']: add enriched_dns to `tables:` (or `lookups:`); "
     "remove enriched_conn"),
    ("window_mismatch", rule_text(window="5 minutes"),
     "window(...) at line 14 duration '10 minutes' differs from the metadata window '5 minutes'"),
    ("no_window",
     rule_text(f"SELECT {COLUMNS.replace('window.start', 'min(event_time)').replace('window.end', 'max(event_time)')} "
               "FROM enriched_dns GROUP BY src_ip, mac, device, owner"),
     "must aggregate per window"),
    ("window_over_other_column", rule_text(VALID_SQL.replace("window(event_time", "window(lease_valid_from")),
     "must be over the event_time column"),
    ("missing_output", rule_text(VALID_SQL.replace(", 'x' AS evidence", "")), "must return column(s) ['evidence']"),
    ("select_star", rule_text(f"WITH t AS ({VALID_SQL}) SELECT * FROM t"), "no SELECT *"),
    ("keys_not_columns", rule_text(keys="[dst_ip]"), "keys ['dst_ip'] must be output columns"),
    ("leading_window_group", rule_text(f"SELECT {COLUMNS} FROM enriched_dns GROUP BY window(event_time, '10 minutes'), "
                                       "src_ip, mac, device, owner"), "put it last or in parentheses"),
    ("lookup_not_declared", rule_text(LOOKUP_SQL), "indicators is a lookup table: list it under `lookups:`"),
    ("lookup_as_stream", rule_text(LOOKUP_SQL, tables="[enriched_dns, indicators]"),
     "indicators is a lookup table: list it under `lookups:`"),
    ("lookup_not_a_lookup", rule_text(VALID_SQL, lookups="[alert_triage]"),
     "lookups ['alert_triage'] are not lookup tables; rules may look up: indicators"),
    ("lookup_not_read", rule_text(VALID_SQL, lookups="[indicators]"),
     "lookups ['indicators'] differ from the tables the SQL reads ['enriched_dns']"),
]


@pytest.mark.parametrize("case_id, text, reason", BAD_METADATA, ids=[b[0] for b in BAD_METADATA])
def test_invalid_metadata_and_shape_are_rejected_with_the_reason(case_id, text, reason):
    with pytest.raises(RuleError) as err:
        validate_rule(text)
    assert reason in str(err.value), str(err.value)


def test_a_lookup_table_is_joined_not_streamed():
    rule = validate_rule(rule_text(LOOKUP_SQL, lookups="[indicators]"))
    assert (rule.tables, rule.lookups) == (("enriched_dns",), ("indicators",))


def test_a_bad_file_name_is_rejected(tmp_path):
    path = tmp_path / "Bad-Name.sql"
    path.write_text(rule_text())
    with pytest.raises(RuleError, match="must be snake_case"):
        validate_rule(path)


def test_the_pack_rejects_duplicate_ids_and_file_names_but_keeps_the_oldest(tmp_path):
    import os

    (tmp_path / "dns").mkdir()
    (tmp_path / "conn").mkdir()
    other_id = "99999999-2222-4333-8444-555555555555"
    files = [("conn/first.sql", rule_text(id=other_id)),
             ("dns/first.sql", rule_text()),       # a second file named `first`
             ("dns/second.sql", rule_text()),
             ("dns/third.sql", rule_text()),       # the id of `second`
             ("dns/broken.sql", "SELECT 1"),
             ("dns/a_copy.sql", rule_text())]      # a copy of `second`, first in path order, made last
    for age, (name, text) in enumerate(files):
        (tmp_path / name).write_text(text)
        os.utime(tmp_path / name, (1.7e9 + age, 1.7e9 + age))
    errors: list[str] = []
    rules = load_rules(tmp_path, on_error=lambda path, reason: errors.append(reason))
    assert [r.path for r in rules] == [tmp_path / "conn" / "first.sql", tmp_path / "dns" / "second.sql"]
    assert len(errors) == 4
    assert any("dns/first.sql: duplicate rule file name 'first' (the older " in e for e in errors)
    duplicate = f"duplicate id 11111111-2222-4333-8444-555555555555, the id of the older {tmp_path / 'dns/second.sql'}"
    assert any(f"third.sql: {duplicate}: give this rule an id of its own" in e for e in errors), errors
    assert any(f"a_copy.sql: {duplicate}" in e for e in errors), errors
    assert any("broken.sql: the file must open with the metadata block" in e for e in errors)


def test_a_pack_under_a_hidden_folder_is_read_and_hidden_files_in_it_are_not(tmp_path):
    # Every part of the whole path was looked at: ~/.seclake/rules, or ../rules, loaded no rule, silently.
    root = tmp_path / ".seclake" / "rules"
    (root / "dns").mkdir(parents=True)
    (root / ".drafts").mkdir()
    (root / "dns" / "first.sql").write_text(rule_text())
    (root / ".drafts" / "second.sql").write_text(rule_text())
    assert [r.path for r in scan_rules(root).rules] == [root / "dns" / "first.sql"]
    assert [r.path.name for r in scan_rules(root / "dns" / ".." / "dns").rules] == ["first.sql"]


@pytest.mark.parametrize("text", [
    rule_text(VALID_SQL.replace("'x' AS evidence", "(" * 80 + "'x'" + ")" * 80 + " AS evidence")),
    rule_text(mitre="[" * 1000 + "]" * 1000),
], ids=["parentheses", "metadata"])
def test_a_rule_nested_too_deeply_is_refused_not_a_recursion_error(text):
    # The SQL parser and YAML raised RecursionError, which stopped `rules validate`, run-once and the stream.
    with pytest.raises(RuleError, match="rule deep: nested too deeply to check"):
        validate_rule(text, slug="deep")


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


IDS_CTE = ("WITH hits AS (SELECT attributed_ip AS src_ip, mac, device, owner, event_time FROM enriched_ids_alerts "
           "WHERE severity = 1) ")
IDS_SQL = IDS_CTE + f"SELECT {COLUMNS} FROM hits {GROUP}"


def test_a_realtime_rule_runs_its_cte_alone():
    rule = validate_rule(rule_text(IDS_SQL, tables="[enriched_ids_alerts]", realtime="hits"))
    assert rule.realtime_sql is not None and rule.realtime_sql.endswith("SELECT * FROM hits")
    assert "WHERE severity = 1" in rule.realtime_sql
    # Declaring it changes what the file says, not the alerts the micro-batch path writes.
    plain = validate_rule(rule_text(IDS_SQL, tables="[enriched_ids_alerts]"))
    assert plain.realtime_sql is None and plain.logic_hash == rule.logic_hash


@pytest.mark.parametrize("text, reason", [
    (rule_text(IDS_SQL, tables="[enriched_ids_alerts]", realtime="nope"), "has no CTE 'nope'"),
    (rule_text(VALID_SQL, realtime="hits"), "reads only enriched_ids_alerts"),
    (rule_text(IDS_SQL + " HAVING count(*) >= 5", tables="[enriched_ids_alerts]", realtime="hits"),
     "one event alone may not raise the alert"),
    (rule_text(IDS_CTE.replace("mac, device", "device") + f"SELECT {COLUMNS.replace('mac,', '', 1)}, 'm' AS mac "
               f"FROM hits {GROUP.replace('mac, ', '', 1)}", tables="[enriched_ids_alerts]", realtime="hits"),
     "it lacks ['mac']"),
], ids=["unknown CTE", "not the IDS table", "a threshold", "a key the CTE lacks"])
def test_a_realtime_rule_that_one_event_cannot_raise_is_refused(text, reason):
    with pytest.raises(RuleError, match=reason.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        validate_rule(text)


def test_a_parse_error_names_the_line_of_the_rule_file():
    text = rule_text("SELECT src_ip,\n  count(* AS n FROM enriched_dns GROUP BY src_ip")
    bad = text.splitlines().index("  count(* AS n FROM enriched_dns GROUP BY src_ip") + 1
    with pytest.raises(RuleError, match=f"does not parse at line {bad}, column "):
        validate_rule(text)


@pytest.mark.parametrize("expression, reason", [
    ("max(qurey)", "column 'qurey' at line {line}, column {col} is not a column of enriched_dns nor named in the "
                   "query; did you mean 'query'?"),
    ("max(MAC_ADDRESS)", "column 'MAC_ADDRESS' at line {line}, column {col} is not a column of enriched_dns"),
], ids=["misspelt", "no close name"])
def test_a_column_no_table_has_is_refused_at_its_line(expression, reason):
    text = rule_text(with_column(expression))
    line = len(text.splitlines())
    col = text.splitlines()[-1].index(expression[4:-1]) + 1
    with pytest.raises(RuleError, match=reason.format(line=line, col=col).replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        validate_rule(text)


@pytest.mark.parametrize("expression", [
    "max(QUERY)",  # Spark's names are case-insensitive
    "aggregate(collect_list(query), 0, (acc, q) -> acc + length(q))",  # a lambda's arguments
    "first(window.start)",  # the struct of GROUP BY window(...)
    "max(enriched_dns.nonexistent)",  # qualified: a struct's field or a table's column, left to Spark
], ids=["case", "lambda", "window", "qualified"])
def test_names_the_query_makes_or_spark_resolves_are_not_refused(expression):
    validate_rule(rule_text(with_column(expression)))


def test_a_yaml_error_in_the_metadata_names_the_line_of_the_rule_file():
    text = rule_text(mitre="[T1046, T1071")  # the list is not closed
    bad = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("description:"))
    with pytest.raises(RuleError, match=rf"not valid YAML: expected ',' or '\]', but got ':' at line {bad}, column 12 "
                                        r"\(while parsing a flow sequence from line \d+, column 8\)"):
        validate_rule(text)


def test_an_unknown_table_is_named_at_its_line_with_the_closest_table():
    text = rule_text(VALID_SQL.replace("FROM enriched_dns", "FROM enriched_dnss"))
    col = text.splitlines()[-1].index("enriched_dnss") + 1
    with pytest.raises(RuleError, match=rf"unknown table 'enriched_dnss' at line {len(text.splitlines())}, "
                                        rf"column {col}; did you mean 'enriched_dns'\?"):
        validate_rule(text)



def test_a_tests_file_column_typo_is_named_with_the_closest_column():
    from pipelines.rules.testing import parse_cases

    tests = ("cases:\n  - name: one\n    input:\n      enriched_dns:\n"
             "        - {event_time: '2026-11-20 10:00:00', qtype_nam: TXT}\n    alerts: []\n")
    with pytest.raises(RuleError, match=r"column\(s\) \['qtype_nam'\] are not in enriched_dns "
                                        r"\(did you mean 'qtype_name' for 'qtype_nam'\?\)"):
        parse_cases(tests, validate_rule(rule_text()))
    expected = "cases:\n  - name: one\n    input: {enriched_dns: []}\n    alerts: [{srcip: 10.0.0.1}]\n"
    with pytest.raises(RuleError, match=r"expected alert column\(s\) \['srcip'\] are not alert columns "
                                        r"\(did you mean 'src_ip' for 'srcip'\?\)"):
        parse_cases(expected, validate_rule(rule_text()))


@pytest.mark.parametrize("row, error", [
    ("{event_time: '2026-11-20 10:00:00', repeat: 2, every: 1 sec}", r"every: '1 sec' is not an interval"),
    ("{event_time: '2026-11-20 10:00:00', repeat: 2, query: 'q{i:zz}'}",
     r"'\{i:...\}' in a value: Unknown format code"),
])
def test_a_tests_file_repeat_error_is_a_rule_error_naming_the_case(row, error):
    # A RuleError is one failed result of that tests file; anything else stopped the whole `rules test`.
    from pipelines.rules.testing import parse_cases

    tests = f"cases:\n  - name: one\n    input:\n      enriched_dns:\n        - {row}\n    alerts: []\n"
    with pytest.raises(RuleError, match=rf"case 'one'.*{error}"):
        parse_cases(tests, validate_rule(rule_text()))


@pytest.mark.parametrize("tests, error", [
    ("defaults: {enriched_dns: [{query: x}]}\ncases: [{name: one, alerts: []}]\n", r"`defaults` must map tables"),
    ("cases: [{name: one, input: {enriched_dns: []}, alerts: [{1: x}]}]\n",
     r"expected alert column\(s\) \['1'\] are not alert columns"),
    ("cases: [{name: one, 7: x, alerts: []}]\n", r"case 'one': unknown key\(s\) \['7'\]"),
    ("cases: [{name: one, input: {enriched_dns: [{event_time: '2026-11-20 10:00:00', 2: x}]}, alerts: []}]\n",
     r"column\(s\) \['2'\] are not in enriched_dns"),
], ids=["defaults-list", "alert-int-key", "case-int-key", "row-int-key"])
def test_a_malformed_tests_file_is_a_rule_error_not_a_crash(tests, error):
    # TypeError / AttributeError stopped the whole `rules test` run before any rule's tests ran.
    from pipelines.rules.testing import parse_cases

    with pytest.raises(RuleError, match=error):
        parse_cases(tests, validate_rule(rule_text()))


def test_a_column_error_names_its_first_place_and_the_querys_own_names():
    cte = ("WITH hits AS (SELECT src_ip, mac, device, owner, event_time, query AS sessions FROM enriched_dns)\n"
           f"SELECT {COLUMNS} FROM hits {GROUP} HAVING max(sesions) > 1")
    with pytest.raises(RuleError, match="column 'sesions' .* did you mean 'sessions'"):
        validate_rule(rule_text(cte))
    wrong_table = cte.replace("FROM enriched_dns", "FROM silver_conn").replace("query AS", "uid AS")
    text = rule_text(wrong_table, tables="[silver_conn]")
    first = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith("WITH hits"))
    with pytest.raises(RuleError, match=f"column 'mac' at line {first}, column 30 "):  # the CTE's, not the SELECT's
        validate_rule(text)


def test_a_duplicate_with_the_same_modification_time_is_said_to_be_a_tie(tmp_path):
    import os

    (tmp_path / "dns").mkdir()
    for name in ("b_rule.sql", "a_copy.sql"):  # cp -p: the copy keeps the time
        (tmp_path / "dns" / name).write_text(rule_text())
        os.utime(tmp_path / "dns" / name, (1.7e9, 1.7e9))
    [reason] = scan_rules(tmp_path).errors.values()
    assert reason.startswith(f"{tmp_path / 'dns' / 'b_rule.sql'}: duplicate id ")
    assert "the id of " + str(tmp_path / "dns" / "a_copy.sql") + " (same modification time; the first by path" in reason


def test_a_missing_struct_field_is_placed_on_the_line_that_uses_it(tmp_path):
    # Spark points at `w.finish`; the word `w` alone first appears where the window is defined.
    source = Path(__file__).resolve().parents[1] / "rules" / "dns" / "dga_nxdomain_burst.sql"
    path = tmp_path / source.name
    text = source.read_text().replace("w.end AS window_end", "w.finish AS window_end")
    path.write_text(text)
    rule = validate_rule(path)
    row, line = next((n, line) for n, line in enumerate(rule.sql.splitlines(), 1) if "w.finish" in line)
    spark_says = (f"[FIELD_NOT_FOUND] No such struct field `finish` in `start`, `end`. "
                  f"line {row} pos {line.index('w.finish')}")
    used = next(n for n, line in enumerate(text.splitlines(), 1) if "w.finish" in line)
    assert rule.locate(spark_says).endswith(f"{path.name} line {used}")
