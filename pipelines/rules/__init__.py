"""Detection rules kept as SQL files (`rules/<source>/<rule>.sql`), run as streaming queries.

- `spec`: the rule format and its validation (`validate_rule`, `Rule`, `RuleError`);
- `pack`: every rule of a folder (`scan_rules`, `load_rules`);
- `engine`: one streaming query per rule appending to the `alerts` table (`start_rule`,
  `rule_stages` for `pipelines.stages.stages()`, `RuleManager` for hot deploy in `seclake stream`);
- `backtest`: the same SQL as a batch query over history, scored against ground truth;
- `testing`: the cases in `<rule>.tests.yml` and the pack-wide lint;
- `cli`: `seclake rules list|validate|test|backtest`.

See docs/rules.md.
"""
from pipelines.rules.engine import MissingInputError, RuleManager, rule_stages, start_rule
from pipelines.rules.pack import RulePack, default_rules_dir, load_rules, scan_rules
from pipelines.rules.spec import Rule, RuleError, validate_rule

__all__ = [
    "MissingInputError", "Rule", "RuleError", "RuleManager", "RulePack", "default_rules_dir", "load_rules",
    "rule_stages", "scan_rules", "start_rule", "validate_rule",
]
