"""`seclake rules list|validate|test|backtest|coverage|status|enable`: the rule pack from the command line."""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from pipelines.rules.pack import RulePack, default_rules_dir, duplicate_id, duplicate_name, scan_rules
from pipelines.rules.spec import LOGIC, Rule, RuleError, validate_rule


def add_commands(sub: argparse._SubParsersAction, home_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `rules` and its sub-commands to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"))
    >>> parser.parse_args(["rules", "validate"]).rules_command
    'validate'
    """
    rules = sub.add_parser("rules", help="detection rules: list, validate, test, backtest, coverage, status, "
                                         "enable (docs/rules.md)")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, metavar="COMMAND")

    listing = rules_sub.add_parser("list", help="one line per rule: file, version, severity, MITRE, name")
    rules_dir_arg(listing)
    listing.set_defaults(func=cmd_list)

    validate = rules_sub.add_parser("validate",
                                    help="validate rule files (metadata, SQL safety); exit 1 if any is invalid")
    validate.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                          help="rule files or folders (default: the rules folder)")
    rules_dir_arg(validate)
    validate.set_defaults(func=cmd_validate)

    test = rules_sub.add_parser("test", help="run every rule's test cases (<rule>.tests.yml) and the pack lint")
    test.add_argument("names", nargs="*", metavar="RULE", help="only these rules (file name, id or path)")
    rules_dir_arg(test)
    test.set_defaults(func=cmd_test)

    backtest = rules_sub.add_parser(
        "backtest", help="run a rule as a batch query over the tables' history: alerts per day, entities, "
                         "precision/recall against <home>/ground_truth.jsonl, diff against another version")
    backtest.add_argument("rule", metavar="RULE", help="rule file name (slug), id or path to its .sql")
    backtest.add_argument("--from", dest="start", default=None,
                          help="first event time: 2026-11-20 or ISO-8601 (inclusive)")
    backtest.add_argument("--to", dest="end", default=None,
                          help="last event time: a date means through that day; an ISO-8601 time is exclusive")
    backtest.add_argument("--against", default=None, metavar="REV|PATH",
                          help="the baseline RULE is compared with: a path to a .sql file (the deployed "
                               "rule, RULE being a draft), or a git revision (the rule's file at that "
                               "commit, e.g. HEAD~1 or main); new alerts are RULE's only")
    backtest.add_argument("--ground-truth", type=Path, default=None,
                          help="ground-truth file (default: <home>/ground_truth.jsonl when present)")
    backtest.add_argument("--write", action="store_true",
                          help="also add to the alerts table the alerts it finds that the table lacks (late events); "
                               "give whole windows or days with --from/--to")
    home_arg(backtest)
    rules_dir_arg(backtest)
    backtest.set_defaults(func=cmd_backtest)

    coverage = rules_sub.add_parser("coverage", help="MITRE ATT&CK coverage of the pack: an ATT&CK Navigator layer "
                                                     "(JSON) and a Markdown table")
    coverage.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                          help="folder for attack-navigator-layer.json and attack-coverage.md (default: .)")
    rules_dir_arg(coverage)
    coverage.set_defaults(func=cmd_coverage)

    status = rules_sub.add_parser("status", help="each rule's health in the home: ok, failing (backing off), "
                                                 "disabled or invalid, with the last failure")
    home_arg(status)
    rules_dir_arg(status)
    status.set_defaults(func=cmd_status)

    enable = rules_sub.add_parser("enable", help="re-enable a rule disabled after failing (the running stream "
                                                 "starts it within seconds)")
    enable.add_argument("rule", metavar="RULE", help="rule file name (slug) or id")
    home_arg(enable)
    rules_dir_arg(enable)
    enable.set_defaults(func=cmd_enable)


def rules_dir_arg(parser: argparse.ArgumentParser) -> None:
    """Add `--rules DIR` (the rule pack to use) to a command that names or loads rules."""
    parser.add_argument("--rules", type=_folder, default=None,
                        help="rules folder (default: $SECLAKE_RULES or the repository's rules/)")


def _folder(text: str) -> Path:
    """An argparse type: an existing folder (a mistyped one would read as a pack of no rules).

    >>> _folder("/no/such/rules")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: /no/such/rules: no such folder
    """
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return Path(text)


def rules_folder(args: argparse.Namespace) -> Path:
    """The rules folder a command given `rules_dir_arg` uses."""
    return args.rules or default_rules_dir()


def find_rule(name: str, rules_dir: str | os.PathLike) -> Rule:
    """A rule by path, file name (slug) or id; ValueError naming what was not found."""
    if name.endswith(".sql") and Path(name).is_file():
        return validate_rule(Path(name))
    pack = scan_rules(rules_dir)
    for rule in pack.rules:
        if name in (rule.slug, rule.id):
            return rule
    for path, reason in pack.errors.items():
        if path.stem == name:
            raise RuleError(reason)
    close = difflib.get_close_matches(name, [r.slug for r in pack.rules], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"no rule {name!r} in {rules_dir}; {hint}rules: {', '.join(r.slug for r in pack.rules)} "
                     "(a rule of another folder: --rules DIR)")


def cmd_list(args: argparse.Namespace) -> int:
    pack = scan_rules(rules_folder(args))
    width = max((len(rule.slug) for rule in pack.rules), default=0)
    for rule in pack.rules:
        print(f"{rule.slug:<{width}} v{rule.version:<3} {rule.severity:<8} {','.join(rule.mitre):<22} {rule.name}")
    for reason in pack.errors.values():
        print(f"INVALID {reason}")
    return 1 if pack.errors else 0


def cmd_validate(args: argparse.Namespace) -> int:
    folders = [p for p in args.paths if p.is_dir()] if args.paths else [rules_folder(args)]
    files = [p for p in args.paths if not p.is_dir()]
    bad = 0
    for folder in folders:
        pack = scan_rules(folder)
        for rule in pack.rules:
            print(f"ok      {rule.path} ({rule.slug} v{rule.version}, {rule.severity})")
        for reason in pack.errors.values():
            print(f"INVALID {reason}")
        bad += len(pack.errors)
    joins = scan_rules(rules_folder(args)) if files else None
    for path in files:
        try:
            rule = validate_rule(path)
            replaced = _check_against(rule, joins)
            instead = f", a new text of {replaced}" if replaced else ""
            print(f"ok      {path} ({rule.slug} v{rule.version}, {rule.severity}{instead})")
        except RuleError as exc:
            print(f"INVALID {exc}")
            bad += 1
    print(f"{bad} invalid" if bad else "all valid", file=sys.stderr)
    return 1 if bad else 0


def _check_against(rule: Rule, pack: RulePack | None) -> Path | None:
    """RuleError when `rule` (a file validated alone) would be refused by the pack it joins: its
    file is one of the pack's invalid ones, or another file of the pack has its id or name. A
    file with the id and the name of a pack's rule is a new text of it (a draft of its next
    version outside the pack): the path it would replace; refused when its version is older, or
    when its logic changed under the same version (the deploy would be refused: bump `version`)."""
    if pack is None or rule.path is None:
        return None
    here = rule.path.resolve()
    for path, reason in pack.errors.items():
        if path.resolve() == here:
            raise RuleError(reason)
    others = [o for o in pack.rules if o.path is not None and o.path.resolve() != here]
    replaced = next((o for o in others if (o.id, o.slug) == (rule.id, rule.slug)), None)
    if replaced is not None:
        if rule.version < replaced.version:
            raise RuleError(f"{rule.path}: v{rule.version} is older than v{replaced.version} of {replaced.path}: "
                            f"a new text of it takes a version past {replaced.version}")
        if rule.version == replaced.version and rule.logic_hash != replaced.logic_hash:
            raise RuleError(f"{rule.path}: its {LOGIC} differ from {replaced.path} under the same "
                            f"v{rule.version}: bump `version`")
        return replaced.path
    for other in others:
        if rule.id == other.id:
            raise RuleError(duplicate_id(rule.path, rule.id, other.path))
        if rule.slug == other.slug:
            raise RuleError(duplicate_name(rule.path, rule.slug, other.path))
    return None


def cmd_test(args: argparse.Namespace) -> int:
    from pipelines.rules.testing import lint_rule, run_rule_tests
    from pipelines.spark import get_spark
    from pipelines.terminal import Progress, print_table

    rules_dir = rules_folder(args)
    pack = scan_rules(rules_dir)
    rules = [find_rule(n, rules_dir) for n in args.names] if args.names else pack.rules
    invalid = [] if args.names else list(pack.errors.values())
    for reason in invalid:
        print(f"INVALID {reason}")
    # A tests file that does not load is one failed result of the run (`<tests file>`), said once.
    lint = [problem for rule in rules if _cases_load(rule) for problem in lint_rule(rule)]
    for problem in lint:
        print(f"LINT    {problem}")
    with Progress("rules test", total=1 + len(rules)) as progress:
        progress.working_on("starting Spark")
        spark = get_spark(app_name="seclake-rules-test", ui=False)
        progress.step("Spark started")

        def said(rule: Rule, done: list) -> None:
            failed = sum(not r.passed for r in done)
            progress.step(f"{rule.slug}: {len(done)} case(s){f', {failed} failed' if failed else ''}")

        results = run_rule_tests(spark, rules, on_rule=said)
    print_table(["rule", "case", "result", "why"],
                [(r.rule, r.case, "PASS" if r.passed else "FAIL", r.message) for r in results])
    failed = sum(not r.passed for r in results)
    counts = [f"{len(results)} case(s), {failed} failed"] + [
        f"{n} {what}" for n, what in ((len(lint), "lint problem(s)"), (len(invalid), "invalid file(s)")) if n]
    print(", ".join(counts), file=sys.stderr)
    return 1 if failed or lint or invalid else 0


def _cases_load(rule: Rule) -> bool:
    from pipelines.rules.testing import load_cases

    try:
        load_cases(rule)
    except RuleError:
        return False
    return True


def cmd_backtest(args: argparse.Namespace) -> int:
    from pyspark.errors import PySparkException

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.operations.running import refuse_while_rolling_back
    from pipelines.rules.backtest import (
        GROUND_TRUTH,
        backtest,
        check_range,
        check_tables,
        load_ground_truth,
        parse_when,
        rule_at_revision,
        write_missing,
    )
    from pipelines.rules.engine import analysis_error
    from pipelines.spark import get_spark
    from pipelines.terminal import Progress

    rules_dir = rules_folder(args)
    rule = find_rule(args.rule, rules_dir)
    against = None
    if args.against:
        other = Path(args.against)
        if other.is_file():
            against = validate_rule(other)
        elif rule.path is None:
            raise ValueError(f"--against {args.against}: rule {rule.slug} has no file to look up in git")
        else:
            against = rule_at_revision(rule.path, args.against)
    home = Home.resolve(args.home)
    truth = args.ground_truth or (home.root / GROUND_TRUTH)
    if args.ground_truth and not truth.is_file():
        raise FileNotFoundError(f"no ground-truth file {truth}")
    if truth.is_file():
        load_ground_truth(truth)  # a bad record named before Spark starts, not after the backtest
    if args.write:  # said before the backtest; `write_missing` refuses too
        refuse_while_rolling_back(home, f"add {rule.slug}'s missing alerts")
    start = parse_when(args.start) if args.start else None
    end = parse_when(args.end, end_of_day=True) if args.end else None
    check_range(start, end, typed=(args.start, args.end))  # said before Spark starts
    check_tables(Lake(home), rule)  # said before Spark starts
    with Progress("backtest", total=2 + bool(args.write)) as progress:
        progress.working_on("starting Spark")
        spark = get_spark(app_name="seclake-rules-backtest", ui=False)
        progress.step("Spark started")
        progress.working_on(f"running {rule.slug} over the tables")
        try:
            result = backtest(spark, Lake(home), rule, start=start, end=end,
                              ground_truth=truth if truth.is_file() else None, against=against)
        except PySparkException as exc:
            raise ValueError(f"rule {rule.slug} fails on the tables: {analysis_error(spark, rule, exc)}") from None
        progress.step(f"{rule.slug}: {len(result.alerts):,} alerts")
        if args.write:
            progress.working_on("adding the alerts the table lacks")
            found, added = write_missing(spark, Lake(home), rule, start, end)
            progress.step(f"{added:,} alerts added")
    print("\n".join(result.lines()))
    if args.write:
        print(f"alerts: {added} added, {found - added} of the {found} found were already in the table")
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    from pipelines.rules.coverage import tactics, techniques, write_coverage
    from pipelines.terminal import print_table

    pack = scan_rules(rules_folder(args))
    for reason in pack.errors.values():
        print(f"INVALID {reason}", file=sys.stderr)
    layer, table = write_coverage(pack.rules, args.out)
    print_table(["technique", "tactic", "rules"],
                [(t, ", ".join(tactics(t)) or "-", ", ".join(r.slug for r in named))
                 for t, named in techniques(pack.rules).items()])
    print(f"wrote {layer} (open it in the ATT&CK Navigator: Open Existing Layer) and {table}", file=sys.stderr)
    return 1 if pack.errors else 0


def _rule_status(args: argparse.Namespace):
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.rules.status import RuleStatus
    from pipelines.spark import get_spark

    home = Home.resolve(args.home).existing()
    return RuleStatus(get_spark(app_name="seclake-rules-status", ui=False), Lake(home))


def cmd_status(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.rules.engine import deployed_health, file_hash, invalid_names, own_name
    from pipelines.rules.health import DISABLED, INVALID, OK
    from pipelines.rules.status import health_of, recorded_health
    from pipelines.spark import get_spark

    root = rules_folder(args)
    pack = scan_rules(root)
    lake = Lake(Home.resolve(args.home).existing())
    # delta-rs, no JVM; Spark only for a table delta-rs cannot read alone.
    recorded = recorded_health(lake, lambda: get_spark(app_name="seclake-rules-status", ui=False))
    valid = pack.by_slug()
    now = {rule.slug: deployed_health(health_of(recorded, rule.slug, rule.content_hash), lake, rule)
           for rule in pack.rules}
    # An invalid file as the pack judges it now, whether or not a run has recorded it; one refused for
    # another's file name by its path, not over that rule's line.
    for name, (path, reason) in invalid_names(Path(root), pack).items():
        key = path.stem if own_name(name, path) else path.relative_to(root).with_suffix("").as_posix()
        now[key] = health_of(recorded, key, file_hash(path)).invalid(reason)
    healths = [now[slug] for slug in sorted(now)]
    width = max((len(slug) for slug in now), default=0)
    for health in healths:
        slug = health.rule
        retry = f", next try after {health.retry_at:%Y-%m-%d %H:%M:%S} UTC" if health.retry_at else ""
        failures = f", {health.failures} failure(s) in a row" if health.failures else ""
        reason = f": {health.reason}" if health.reason else ""
        unrun = (health.state == OK and slug in valid
                 and not lake.home.checkpoint(valid[slug].checkpoint_name).is_dir())
        # A rule's checkpoint is per version: a new version has not run even when the one before it has.
        never = f" (v{valid[slug].version} not run yet)" if unrun else ""
        print(f"{slug:<{width}}  {health.state}{never}{failures}{retry}{reason}")
    return 1 if any(h.state in (DISABLED, INVALID) for h in healths) else 0


def cmd_enable(args: argparse.Namespace) -> int:
    from pipelines.rules.health import OK, RuleHealth

    rule = find_rule(args.rule, rules_folder(args))
    was: list[RuleHealth] = []  # the health the enable changed, read under the table's lock

    def enable(health: RuleHealth) -> RuleHealth:
        was.append(health)
        return health if health.state == OK else health.enabled()

    _rule_status(args).update(rule.slug, rule.content_hash, enable)
    if was[0].state == OK:
        print(f"rule {rule.slug} is not disabled (state ok): nothing to do")
    else:
        print(f"rule {rule.slug} re-enabled (was {was[0].state} after {was[0].failures} failure(s): {was[0].reason})")
    return 0
