"""One asset per detection rule file, and the `alerts` table asset that gathers them.

Model: every rule is a streaming query of its own (its own checkpoint, `rule_<slug>/v<version>-plan<n>`)
appending to the one `alerts` table, so each rule asset (`rules/<slug>`) is the *producer* of
its slice of `alerts`: materialising it runs that rule's query with AvailableNow and records
how many alerts it added. The table asset (`<layer>/alerts`) depends on every rule asset and
writes nothing itself; it records the table as a whole (rows per rule and severity). Adding a
`.sql` file under `rules/` adds an asset on the next reload of the code location, no Python.

A rule file that does not validate still gets its asset, described as invalid, whose
materialisation fails with the validation error (not retried): one bad file neither breaks the
code location nor disappears silently.
"""
import re
from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
    multi_asset_check,
)

from assets.resources import LakeResource, SparkResource
from assets.tables import LAKE_POOL, RETRY_POLICY, run_metadata, shared_table_asset, start_op, table_key
from pipelines.lake.log import read_columns, tally
from pipelines.lake.registry import Lake
from pipelines.rules.pack import RulePack, default_rules_dir
from pipelines.rules.spec import RULE_QUERY_PREFIX, query_name
from pipelines.rules.tables import ALERTS_TABLE

RULES_GROUP = "rules"
def rule_key(slug: str) -> AssetKey:
    """`rules/<slug>`: the asset of one rule file (slug = file name without `.sql`)."""
    return AssetKey([RULES_GROUP, slug])


def _tag_value(value) -> str:
    # Tag values: at most 63 characters of letters, digits, '-', '_', '.'.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:63]


def scan(rules_dir: Path) -> RulePack:
    """The rule pack of `rules_dir` (`pipelines.rules.pack.scan_rules`): valid rules and errors."""
    from pipelines.rules.pack import scan_rules

    return scan_rules(rules_dir)


def _rule_metadata(rule) -> dict:
    meta = {
        "rule_id": rule.id,
        "rule_name": rule.name,
        "rule_version": rule.version,
        "severity": rule.severity,
        "mitre_attack": ", ".join(rule.mitre) or "-",
        "tables": ", ".join(rule.tables),
        "window": rule.window,
        "watermark": rule.watermark,
        "query": rule.query_name,
        "checkpoint": f"checkpoints/{rule.checkpoint_name}",
    }
    if rule.false_positives:
        meta["false_positives"] = MetadataValue.md("\n".join(f"- {fp}" for fp in rule.false_positives))
    if rule.path is not None:
        meta["rule_file"] = MetadataValue.path(str(rule.path))
    return meta


RULES_OP = "rules"


def alerts_by_rule(lake: Lake) -> dict[str, int] | None:
    """Rows of `alerts` per `rule_id`, counted by delta-rs from that column alone (a rule asset's
    "Row count": the alerts it has raised); None when delta-rs cannot read the table alone.

    >>> from assets.resources import LakeResource
    >>> alerts_by_rule(LakeResource(home="/nonexistent").lake)
    {}
    """
    if not lake.exists(ALERTS_TABLE):
        return {}
    try:
        return {rule_id: n for rule_id, n in tally(read_columns(lake.path(ALERTS_TABLE), ["rule_id"]), ["rule_id"])}
    except LookupError:
        return None


def rules_asset(rules: list) -> AssetsDefinition:
    """The assets `rules/<slug>` of the valid rules, one op (`rules`) for them all: materialising
    any of them runs those rules' queries as run-once does, several at once
    (`pipelines.jobs.run_wave`), each appending to `alerts`."""
    from pipelines.jobs import run_wave
    from pipelines.rules.engine import rule_stage

    known = set(Lake.names())
    stages = {rule_key(rule.slug): rule_stage(rule) for rule in rules}
    by_key = {rule_key(rule.slug): rule for rule in rules}
    specs = [AssetSpec(
        key=key,
        description=f"{rule.name} (severity {rule.severity}; MITRE ATT&CK {', '.join(rule.mitre) or '-'})\n\n"
                    f"{rule.description.strip()}",
        group_name=RULES_GROUP,
        kinds={"spark", "sql"},
        # Its reads include end_of_input: a rule on a silver table must run after run-once's mark.
        deps=[table_key(t) for t in stages[key].reads if t in known],
        metadata=_rule_metadata(rule),
        tags={"seclake/severity": _tag_value(rule.severity), **{f"mitre/{_tag_value(m)}": "" for m in rule.mitre}},
    ) for key, rule in by_key.items()]

    @multi_asset(name=RULES_OP, specs=specs, can_subset=True, pool=LAKE_POOL, retry_policy=RETRY_POLICY,
                 op_tags={"seclake/rule": "selected"})
    def _rules(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource):
        the_lake = lake.lake
        with start_op(context, the_lake):
            selected = [key for key in by_key if key in context.selected_asset_keys]

            def on_report(report) -> None:
                context.log.info(report.line())

            reports = {r.name: r for r in run_wave(lambda: spark.session, the_lake, lake.stream_settings,
                                                   [stages[key] for key in selected], on_report)}
            failed = []
            raised = alerts_by_rule(the_lake)
            for key in selected:
                rule, report = by_key[key], reports[stages[key].name]
                if report.error:
                    failed.append(f"{rule.slug}: {report.error}")
                    continue
                # The rule's own figures: the state of `alerts` as a whole is its table asset's.
                meta = run_metadata(report, None, the_lake)
                meta["alerts_added"] = report.rows_out.get(ALERTS_TABLE, 0)
                meta["alerts_version"] = report.versions.get(ALERTS_TABLE, "-")
                if raised is not None:
                    meta["dagster/row_count"] = raised.get(rule.id, 0)
                yield MaterializeResult(asset_key=key, metadata={**_rule_metadata(rule), **meta})
            if failed:
                # The others are materialised above; a retry runs the failed ones again (the others find nothing new).
                raise Failure(description=f"{len(failed)} rule(s) failed: " + "; ".join(failed), allow_retries=True)

    return _rules


def invalid_rule_asset(path: Path, reason: str, slug: str | None = None) -> AssetsDefinition:
    """The asset of a rule file that does not validate: its materialisation fails with `reason`."""
    slug = slug or Path(path).stem

    @multi_asset(
        name=query_name(slug),
        specs=[AssetSpec(key=rule_key(slug), description=f"INVALID rule file, not deployed: {reason}",
                         group_name=RULES_GROUP, kinds={"sql"},
                         metadata={"rule_file": MetadataValue.path(str(path)), "error": reason},
                         tags={"seclake/severity": "invalid"})],
        can_subset=False,
    )
    def _invalid(context: AssetExecutionContext):
        raise Failure(description=f"rule file {path} is not valid: {reason}", allow_retries=False)

    return _invalid


RULE_ENABLED = "rule_enabled"


def rule_enabled_checks(rules: list) -> AssetChecksDefinition:
    """The `rule_enabled` check of each rule asset in `rules`: fails while `rule_status` has the rule
    failing (a warning: it is retried after its back-off) or disabled (an error). The rules op
    materialises a rule held back, so that the alerts and incidents after it still run: this check
    is where the run shows it. One op (`rule_enabled`) reads `rule_status` once for them all: a step
    per rule cost `seclake demo` about 0.3 s each (docs/performance.md, "Shared tables")."""
    specs = [AssetCheckSpec(RULE_ENABLED, asset=rule_key(rule.slug), blocking=False,
                            description="the rule is not failing or disabled after failing at run time "
                                        "(rule_status; `seclake rules enable` re-enables a disabled one)")
             for rule in rules]

    @multi_asset_check(name=RULE_ENABLED, specs=specs, can_subset=True,
                       description="every selected rule is neither failing nor disabled after failing at run time")
    def _check(context: AssetCheckExecutionContext, spark: SparkResource,
               lake: LakeResource) -> Iterator[AssetCheckResult]:
        from pipelines.rules.health import DISABLED, FAILING
        from pipelines.rules.status import health_of, recorded_health

        chosen = {key.asset_key for key in context.selected_asset_check_keys}
        # Read by delta-rs: a run with nothing new starts no Spark for this check.
        recorded = recorded_health(lake.lake, lambda: spark.session)
        for rule in rules:
            if rule_key(rule.slug) not in chosen:
                continue
            health = health_of(recorded, rule.slug, rule.content_hash)
            yield AssetCheckResult(
                asset_key=rule_key(rule.slug), check_name=RULE_ENABLED,
                passed=health.state not in (FAILING, DISABLED),
                severity=AssetCheckSeverity.ERROR if health.state == DISABLED else AssetCheckSeverity.WARN,
                description=f"{rule.slug}: {health.state}" + (f" ({health.reason})" if health.reason else ""),
                metadata={"state": health.state, "failures_in_a_row": health.failures, "reason": health.reason or "-",
                          "retry_at": health.retry_at.isoformat() if health.retry_at else "-"})

    return _check


def rule_checks(rules_dir: Path | str | None = None) -> list[AssetChecksDefinition]:
    """`rule_enabled` on the asset of every valid rule file under `rules_dir`."""
    folder = Path(rules_dir) if rules_dir else default_rules_dir()
    rules = scan(folder).rules if folder.is_dir() else []
    return [rule_enabled_checks(rules)] if rules else []


def rule_assets(rules_dir: Path | str | None = None) -> list[AssetsDefinition]:
    """One asset per `.sql` file under `rules_dir` plus the `alerts` table asset depending on them."""
    folder = Path(rules_dir) if rules_dir else default_rules_dir()
    if not folder.is_dir():
        return []
    from pipelines.rules.engine import invalid_names

    pack = scan(folder)
    assets = [rules_asset(pack.rules)] if pack.rules else []
    # Named as run-once's stage and the stream's query name the file (a duplicate name by its folder).
    for name, (path, reason) in sorted(invalid_names(folder, pack).items()):
        assets.append(invalid_rule_asset(path, reason, name.removeprefix(RULE_QUERY_PREFIX)))
    if ALERTS_TABLE in Lake.names():
        keys = [rule_key(r.slug) for r in pack.rules]
        assets.append(shared_table_asset(ALERTS_TABLE, keys, "one streaming query per rule file"))
    return assets
