"""Unit tests of rules: `<rule>.tests.yml` beside each `<rule>.sql`.

A tests file holds named cases; each gives input rows per table and the alerts expected:

```yaml
defaults:                      # optional: column values every row of a table starts from
  enriched_dns: {src_ip: 10.0.1.15, mac: "f4:8e:38:6f:1e:4f", device: WS-FIN-101, owner: Ann Lee}
cases:
  - name: burst of NXDOMAIN answers raises one alert
    input:
      enriched_dns:
        - {event_time: "2026-11-20 09:10:00", repeat: 40, every: 1 second,
           query: "q{i}x.biz", rcode_name: NXDOMAIN}
    alerts:
      - {src_ip: 10.0.1.15, window_start: "2026-11-20 09:10:00", evidence_contains: "40 NXDOMAIN"}
  - name: a few typos do not
    input: ...
    alerts: []
```

Rows: columns not given are NULL; `event_date` defaults to the UTC date of `event_time` and
`event_id` to a unique value; `repeat: N` makes N rows, the i-th (from 0) `every` x i later,
with `{i}` (or `{i:x}`, any format spec) in strings replaced by i. Expected alerts: every
column given must equal the alert's (`<column>_contains` checks a substring); a case passes
when the alerts produced and the alerts expected pair up one to one.

Cases run as batch queries (the backtest path) in a child session: fast, and the same SQL
and alert construction as the stream.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import yaml
from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, DateType, StructType, TimestampType

from pipelines.rules.backtest import collect_alerts, run_batch
from pipelines.rules.engine import analysis_error
from pipelines.rules.spec import Rule, RuleError, yaml_problem
from pipelines.rules.tables import table_schema
from pipelines.schemas import ALERTS_SCHEMA
from pipelines.settings import interval_seconds, utc_instant

_INDEX = re.compile(r"\{i(?::([^}]*))?\}")


@dataclass(frozen=True)
class Case:
    """One named case: input rows per table, the alerts expected."""

    name: str
    inputs: dict[str, list[dict]]
    alerts: list[dict]


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case; `message` says what differed."""

    rule: str
    case: str
    passed: bool
    message: str = ""


def load_cases(rule: Rule) -> list[Case]:
    """The cases of `rule` (from `rule.tests_path`); RuleError when missing or malformed."""
    path = rule.tests_path
    if path is None or not path.is_file():
        raise RuleError(f"rule {rule.slug} has no tests file {path.name if path else '<rule>.tests.yml'} beside it")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: not readable as UTF-8 text ({exc})") from None
    return parse_cases(text, rule, str(path))


def parse_cases(text: str, rule: Rule, label: str = "tests") -> list[Case]:
    """Parse tests YAML for `rule`: check names, tables and columns; expand repeats."""
    try:
        doc = _str_keys(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise RuleError(f"{label}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list) or not doc["cases"]:
        raise RuleError(f"{label}: expected a mapping with a non-empty `cases:` list")
    unknown = sorted(set(doc) - {"cases", "defaults"})
    if unknown:
        raise RuleError(f"{label}: unknown top-level key(s) {unknown}")
    reads = [*rule.tables, *rule.lookups]
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict) or any(t not in reads or not isinstance(v, (dict, type(None)))
                                             for t, v in defaults.items()):
        raise RuleError(f"{label}: `defaults` must map tables the rule reads ({reads}) to column values")
    cases: list[Case] = []
    names: set[str] = set()
    for n, raw in enumerate(doc["cases"], 1):
        where = f"{label} case {n}"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
            raise RuleError(f"{where}: every case needs a `name`")
        name = raw["name"]
        where = f"{label} case {name!r}"
        if name in names:
            raise RuleError(f"{where}: duplicate case name")
        names.add(name)
        extra = sorted(set(raw) - {"name", "input", "alerts"})
        if extra:
            raise RuleError(f"{where}: unknown key(s) {extra}; a case has name, input, alerts")
        inputs = raw.get("input") or {}
        if not isinstance(inputs, dict):
            raise RuleError(f"{where}: `input` must map table names to lists of rows")
        rows: dict[str, list[dict]] = {}
        for table, items in inputs.items():
            if table not in reads:
                raise RuleError(f"{where}: input table {table!r} is not read by the rule (it reads {reads})")
            if not isinstance(items, list):
                raise RuleError(f"{where}: input {table} must be a list of rows")
            rows[table] = expand_rows(table, items, defaults.get(table) or {}, f"{where}, {table}")
        expected = raw.get("alerts")
        if not isinstance(expected, list) or not all(isinstance(a, dict) for a in expected):
            raise RuleError(f"{where}: `alerts` must be a list of expected alerts (`alerts: []` for none)")
        for alert in expected:
            bad = [k for k in alert if k.removesuffix("_contains") not in ALERTS_SCHEMA.fieldNames()]
            if bad:
                hints = _hints([k.removesuffix("_contains") for k in bad], ALERTS_SCHEMA.fieldNames())
                raise RuleError(f"{where}: expected alert column(s) {bad} are not alert columns{hints} (a rule's "
                                "own columns are in `details`: check them with `details_contains`)")
        cases.append(Case(name, rows, expected))
    return cases


def _str_keys(value: object) -> object:
    """`value` with every mapping key a string: YAML reads `1:` as an int, which no check names
    (and which sorting beside string keys cannot order).

    >>> _str_keys({1: [{"a": 2, 3: None}]})
    {'1': [{'a': 2, '3': None}]}
    """
    if isinstance(value, dict):
        return {str(k): _str_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_str_keys(v) for v in value]
    return value


def expand_rows(table: str, items: list, defaults: dict | None = None, where: str = "rows") -> list[dict]:
    """Rows of `table` from the tests-file row syntax (defaults, `repeat`/`every`, `{i}`), typed
    for `spark.createDataFrame(rows, table_schema(table))`.

    >>> [r["query"] for r in expand_rows("enriched_dns", [{"event_time": "2026-11-20 09:00:00", "repeat": 2,
    ...                                                     "every": "1 second", "query": "q{i}.biz"}])]
    ['q0.biz', 'q1.biz']
    """
    schema = table_schema(table)
    defaults = defaults or {}
    rows: list[dict] = []
    for item in items:
        if not isinstance(item, dict):
            raise RuleError(f"{where}: each row must be a mapping of column: value")
        spec = {**defaults, **item}
        repeat = spec.pop("repeat", 1)
        every = spec.pop("every", None)
        if not isinstance(repeat, int) or repeat < 1:
            raise RuleError(f"{where}: repeat must be a positive integer, got {repeat!r}")
        try:
            step = timedelta(seconds=interval_seconds(every)) if every is not None else timedelta(0)
        except ValueError as exc:
            raise RuleError(f"{where}: every: {exc}") from None
        unknown = sorted(set(spec) - set(schema.fieldNames()))
        if unknown:
            raise RuleError(f"{where}: column(s) {unknown} are not in {table}{_hints(unknown, schema.fieldNames())}")
        for i in range(repeat):
            try:
                row = {k: _indexed(v, i) for k, v in spec.items()}
            except ValueError as exc:  # a format spec that does not fit an integer: '{i:zz}'
                raise RuleError(f"{where}: '{{i:...}}' in a value: {exc}") from None
            row = _typed(row, schema, where)
            if "event_time" in schema.fieldNames() and row.get("event_time") is not None:
                row["event_time"] = row["event_time"] + step * i
                row.setdefault("event_date", row["event_time"].date())
            if "event_id" in schema.fieldNames():
                row.setdefault("event_id", f"{table}-{len(rows)}")
            rows.append(row)
    return rows


def _indexed(value, i: int):
    if isinstance(value, str):
        return _INDEX.sub(lambda m: format(i, m.group(1) or ""), value)
    if isinstance(value, list):
        return [_indexed(v, i) for v in value]
    return value


def _typed(row: dict, schema: StructType, where: str) -> dict:
    out: dict[str, object] = {}
    for name, value in row.items():
        dtype = schema[name].dataType
        try:
            if value is None:
                out[name] = None
            elif isinstance(dtype, TimestampType):
                out[name] = utc_instant(value if isinstance(value, datetime) else str(value))
            elif isinstance(dtype, DateType):
                out[name] = value if isinstance(value, date) else date.fromisoformat(str(value))
            elif isinstance(dtype, ArrayType):
                if not isinstance(value, list):
                    raise ValueError("expected a list")
                out[name] = value
            elif dtype.typeName() in ("integer", "long", "short"):
                out[name] = int(value)
            elif dtype.typeName() in ("double", "float"):
                out[name] = float(value)
            elif dtype.typeName() == "boolean":
                out[name] = bool(value)
            else:
                out[name] = str(value)
        except (TypeError, ValueError) as exc:
            raise RuleError(f"{where}: column {name}: {value!r} is not of type {dtype.simpleString()} "
                            f"({exc})") from None
    return out


def run_case(spark: SparkSession, rule: Rule, case: Case) -> CaseResult:
    """Run one case as a batch query and compare the alerts with the expected ones."""

    def load(session: SparkSession, table: str):
        return session.createDataFrame(case.inputs.get(table, []), table_schema(table))

    try:
        produced = collect_alerts(run_batch(spark, rule, load))
    except Exception as exc:  # a case that cannot run is a failed case, with Spark's reason
        return CaseResult(rule.slug, case.name, False, f"query failed: {analysis_error(spark, rule, exc)}")
    unmatched = list(produced)
    missing = []
    for expected in case.alerts:
        hit = next((a for a in unmatched if _matches(a, expected)), None)
        if hit is None:
            missing.append(expected)
        else:
            unmatched.remove(hit)
    if not missing and not unmatched:
        return CaseResult(rule.slug, case.name, True)
    problems = [f"expected alert not raised: {e}" for e in missing]
    named = [k.removesuffix("_contains") for e in case.alerts for k in e]
    problems += [f"unexpected alert: {_brief(a, named)}" for a in unmatched]
    return CaseResult(rule.slug, case.name, False, "; ".join(problems))


def _matches(alert: dict, expected: dict) -> bool:
    for key, want in expected.items():
        if key.endswith("_contains"):
            got = alert.get(key.removesuffix("_contains"))
            if got is None or str(want) not in str(got):
                return False
            continue
        got = alert.get(key)
        if isinstance(got, datetime):
            if want is None or got != utc_instant(want if isinstance(want, datetime) else str(want)):
                return False
        elif isinstance(got, list):
            if list(want or []) != got:
                return False
        elif (None if got is None else str(got)) != (None if want is None else str(want)):
            return False
    return True


def _brief(alert: dict, named: list[str]) -> str:
    """The alert's usual columns and those the case's expected alerts name (the ones it was compared on).

    >>> _brief({"src_ip": "10.0.0.1", "mac": None, "device": None, "window_start": 1, "window_end": 2,
    ...         "evidence": "e", "first_seen": 1}, ["first_seen", "src_ip"])
    '{src_ip: 10.0.0.1, mac: None, device: None, window_start: 1, window_end: 2, evidence: e, first_seen: 1}'
    """
    keys: tuple[str, ...] = ("src_ip", "mac", "device", "window_start", "window_end", "evidence")
    keys += tuple(dict.fromkeys(k for k in named if k not in keys and k in alert))
    return "{" + ", ".join(f"{k}: {alert[k]}" for k in keys) + "}"


def run_rule_tests(spark: SparkSession, rules: list[Rule],
                   on_rule: Callable[[Rule, list[CaseResult]], None] | None = None) -> list[CaseResult]:
    """Every case of every rule; a rule whose tests file is missing or malformed is one failed
    result. `on_rule` sees each rule's results as they come (a pack's cases take a minute)."""
    results: list[CaseResult] = []
    for rule in rules:
        try:
            done = [run_case(spark, rule, case) for case in load_cases(rule)]
        except RuleError as exc:
            done = [CaseResult(rule.slug, "<tests file>", False, str(exc))]
        results.extend(done)
        if on_rule is not None:
            on_rule(rule, done)
    return results



def lint_rule(rule: Rule) -> list[str]:
    """What the pack-wide lint finds wrong with `rule` beyond validation (empty list = fine):
    its tests file must exist and hold at least one case expecting alerts and one expecting none.

    >>> from pipelines.rules.pack import RULES_DIR
    >>> from pipelines.rules.spec import validate_rule
    >>> lint_rule(validate_rule(RULES_DIR / "dns" / "dga_nxdomain_burst.sql"))
    []
    """
    try:
        cases = load_cases(rule)
    except RuleError as exc:
        return [str(exc)]
    problems = []
    if not any(c.alerts for c in cases):
        problems.append(f"rule {rule.slug}: no positive test case (one that expects an alert)")
    if not any(not c.alerts for c in cases):
        problems.append(f"rule {rule.slug}: no negative test case (one that expects `alerts: []`)")
    return problems


def _hints(unknown: list[str], names: list[str]) -> str:
    """' (did you mean ...?)' for the names in `unknown` close to one of `names`, else ''.

    >>> _hints(["qurey", "zzz", "srcip"], ["query", "src_ip"])
    " (did you mean 'query' for 'qurey', 'src_ip' for 'srcip'?)"
    """
    hints = [f"{close[0]!r} for {u!r}" for u in unknown if (close := difflib.get_close_matches(u, names, n=1))]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""
