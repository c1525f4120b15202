"""The repo-wide rule test (as elastic's test_all_rules): every rule under rules/ validates,
passes the lint (tests file with positive and negative cases) and every one of its cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.rules.pack import scan_rules
from pipelines.rules.spec import RuleError, validate_rule
from pipelines.rules.testing import lint_rule, load_cases, run_case

RULES_DIR = Path(__file__).resolve().parents[1] / "rules"
PACK = scan_rules(RULES_DIR)


def _cases():
    for rule in PACK.rules:
        try:
            cases = load_cases(rule)
        except RuleError:
            continue  # test_rule_lint reports it
        for case in cases:
            yield pytest.param(rule, case, id=f"{rule.slug}::{case.name}")


def test_every_rule_file_validates():
    assert PACK.errors == {}


@pytest.mark.parametrize("rule", PACK.rules, ids=[r.slug for r in PACK.rules])
def test_rule_lint(rule):
    assert lint_rule(rule) == []
    assert rule.path.parent.parent == RULES_DIR, "rules live in rules/<source>/<rule>.sql"


@pytest.mark.parametrize("rule, case", list(_cases()))
def test_rule_case(spark, rule, case):
    result = run_case(spark, rule, case)
    assert result.passed, result.message


@pytest.mark.parametrize("mitre", ["mitre: []", ""], ids=["empty", "absent"])
def test_pack_rejects_a_rule_without_a_technique_id(tmp_path, mitre):
    """The pack lint (test_every_rule_file_validates) fails for a rule that names no ATT&CK technique."""
    text = (RULES_DIR / "dns" / "dns_tunneling.sql").read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("mitre:"))
    folder = tmp_path / "dns"
    folder.mkdir()
    (folder / "no_technique.sql").write_text(text.replace(line, mitre), encoding="utf-8")
    errors = scan_rules(tmp_path).errors
    assert [p.name for p in errors] == ["no_technique.sql"]
    assert "mitre" in next(iter(errors.values()))
    with pytest.raises(RuleError, match="mitre"):
        validate_rule(folder / "no_technique.sql")


def test_rules_test_says_a_missing_tests_file_once(spark, tmp_path, capsys):
    import shutil

    from pipelines.cli import main

    (tmp_path / "dns").mkdir()
    shutil.copy(RULES_DIR / "dns" / "dga_nxdomain_burst.sql", tmp_path / "dns")  # its tests file left behind
    assert main(["rules", "test", "--rules", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert (out.out + out.err).count("dga_nxdomain_burst.tests.yml") == 1, out.out + out.err
    assert "<tests file>" in out.out and "LINT" not in out.out
    # Progress on stderr, a line per rule as it is tested (a pack's cases take a minute), then the count.
    assert out.err.strip().splitlines() == ["rules test [1/2] Spark started",
                                            "rules test [2/2] dga_nxdomain_burst: 1 case(s), 1 failed",
                                            "1 case(s), 1 failed"]


def test_a_tests_file_that_is_not_utf8_is_a_rule_error_naming_it(tmp_path):
    # It was a UnicodeDecodeError naming no file, which ended the whole `seclake rules test` run.
    source = RULES_DIR / "dns" / "dga_nxdomain_burst.sql"
    (tmp_path / source.name).write_text(source.read_text())
    tests = tmp_path / "dga_nxdomain_burst.tests.yml"
    tests.write_bytes((RULES_DIR / "dns" / tests.name).read_text().replace("cases:", "# café\ncases:", 1)
                      .encode("latin-1"))
    with pytest.raises(RuleError, match=f"{tests}: not readable as UTF-8 text"):
        load_cases(validate_rule(tmp_path / source.name))


def test_a_case_of_a_rule_calling_a_misspelt_function_fails_naming_the_line_and_the_function(spark, tmp_path):
    source = RULES_DIR / "dns" / "dns_tunneling.sql"
    text = source.read_text().replace("length(", "lenght(", 1)
    (tmp_path / source.name).write_text(text)
    rule = validate_rule(tmp_path / source.name)  # validation cannot know Spark's functions
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "lenght(" in row)
    case = load_cases(validate_rule(source))[0]
    result = run_case(spark, rule, case)
    assert not result.passed and "UNRESOLVED_ROUTINE" in result.message
    assert result.message.endswith(f"dns_tunneling.sql line {line}; did you mean length()?"), result.message


def test_a_case_expecting_another_value_shows_the_alert_it_got_in_that_column(spark):
    rule = validate_rule(RULES_DIR / "dns" / "dga_nxdomain_burst.sql")
    case = next(c for c in load_cases(rule) if c.alerts)
    wrong = type(case)(case.name, case.inputs, [{**case.alerts[0], "first_seen": "2020-01-01 00:00:00"}])
    result = run_case(spark, rule, wrong)
    assert not result.passed and "expected alert not raised" in result.message
    got = result.message.split("unexpected alert: ", 1)[1]
    assert "first_seen: 2026-" in got, result.message  # the column compared, with the value produced
