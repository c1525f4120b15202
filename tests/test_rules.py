"""The repo-wide rule test (as elastic's test_all_rules): every rule under rules/ validates,
passes the lint (tests file with positive and negative cases) and every one of its cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.rules.pack import scan_rules
from pipelines.rules.spec import RuleError
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
