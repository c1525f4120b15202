"""One asset per Delta table, built from the pipeline's stages and the table registry.

Naming (one thing, one name): table `silver_dns` in layer `silver` is asset key `silver/dns`,
group `silver`; its stage's op is named after the stage (`etl`) and checkpoints under
`checkpoints/<stage>`. A stage that writes several tables in one query (`etl`) is one
multi-asset with `can_subset=False`: materialising any of its tables runs its query once. Stages
that run at once (a wave: the enriched tables) share one subsettable op named after their layer.
"""
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Backoff,
    Failure,
    Jitter,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    TableColumn,
    TableSchema,
    multi_asset,
)

from assets.resources import LakeResource, SparkResource
from pipelines.lake.log import commits, summary
from pipelines.lake.read import value_counts
from pipelines.lake.registry import Lake
from pipelines.operations.running import WriterLock
from pipelines.query import QueryReport, Stage
from pipelines.stages import StageError, own_tables, parts, run_unless_idle, shared_tables, waves

# Every op that writes a table runs in this pool; give it limit 1 so that two runs never write
# at once (docs/dagster.md: `dagster instance concurrency set seclake_lake 1`).
LAKE_POOL = "seclake_lake"

# Transient failures (a Delta commit conflict, a Python worker that timed out under load)
# are retried after about 5 s, 15 s, 35 s ((2^n - 1) x 5 s, give or take 5 s); a schema error
# raises Failure(allow_retries=False).
RETRY_POLICY = RetryPolicy(max_retries=3, delay=5, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)

KINDS = {"spark", "delta"}


def table_key(table: str) -> AssetKey:
    """The asset key of a registry table: layer, then the name without the layer prefix.

    >>> table_key("silver_dns").to_user_string()
    'silver/dns'
    >>> table_key("quarantine").to_user_string()
    'bronze/quarantine'
    """
    spec = Lake.spec(table)
    short = table[len(spec.layer) + 1:] if table.startswith(f"{spec.layer}_") else table
    return AssetKey([spec.layer, short])


def table_definition_metadata(table: str) -> dict:
    """Static metadata of a table asset: its column schema (shown in the UI), name, partitioning."""
    spec = Lake.spec(table)
    columns = [
        TableColumn(name=f.name, type=f.dataType.simpleString(), description=(f.metadata or {}).get("comment"))
        for f in spec.schema.fields
    ]
    return {
        # The standard table keys (what dagster's TableMetadataSet writes; not exported in 1.13).
        "dagster/column_schema": TableSchema(columns=columns),
        "dagster/table_name": table,
        "partition_by": ", ".join(spec.partition_by) or "(none)",
    }


def table_spec(table: str, deps: list[AssetKey] | tuple = ()) -> AssetSpec:
    """The asset spec of registry table `table`: key, description, layer as its group, its columns."""
    spec = Lake.spec(table)
    return AssetSpec(
        key=table_key(table),
        description=spec.description,
        group_name=spec.layer,
        kinds=KINDS,
        metadata=table_definition_metadata(table),
        deps=list(deps),
        tags={"seclake/layer": spec.layer},
    )


def table_state(lake: Lake, table: str) -> dict:
    """The table as its Delta log shows it now (delta-rs, no JVM), as materialisation metadata:
    `table_version`, `dagster/row_count`, `dagster/last_updated_timestamp` (last commit),
    `last_writer` (the commit's txn app id, else its operation). Empty if the table does not exist.

    Every table materialisation carries it, from a Dagster run or from `table_state_sensor`, so the
    catalog shows the same facts whoever wrote the table.

    >>> table_state(LakeResource(home="/nonexistent").lake, "silver_dns")
    {}
    """
    if not lake.exists(table):
        return {}
    found = summary(lake.path(table))
    last = commits(lake.path(table), limit=1)[0]
    state: dict = {
        "table_version": found.version,
        "dagster/last_updated_timestamp": MetadataValue.timestamp(found.last_commit),
        "last_writer": last["app_id"] or last["operation"] or "-",
    }
    if found.rows is not None:  # None when a data file has no statistics: no count rather than a wrong one
        state["dagster/row_count"] = found.rows
    return state


def run_metadata(report: QueryReport, table: str | None, lake: Lake, quarantine_table: str | None = None) -> dict:
    """Materialisation metadata of one table written by a stage's run (or the stage as a whole):
    the run's figures (`version` is the last version this run committed, `-` if none) and the
    table's state after it (`table_state`). What went in is counted as the report counts it: the
    ETL's `files_in` and `data_lines_in` (`QueryReport.read`), the other stages' `rows_in`.

    >>> report = QueryReport("etl", batches=1, rows_in=8, read={"files": 4, "data lines": 5936})
    >>> meta = run_metadata(report, None, LakeResource(home="/nonexistent").lake)
    >>> {k: v for k, v in meta.items() if k.endswith("_in")}
    {'files_in': 4, 'data_lines_in': 5936}
    """
    read = {f"{unit.replace(' ', '_')}_in": n for unit, n in report.read.items()}
    meta: dict = {
        "stage": report.name,
        **(read or {"rows_in": report.rows_in}),
        "batches": report.batches,
        "duration_s": round(report.duration_s, 3),
        "watermark": report.watermark or "-",
        "state_rows": report.state_rows,
        "late_rows": report.late_rows,
        "stage_rows_out": MetadataValue.json(dict(report.rows_out)),
        "summary": report.line(),
    }
    if table is not None:
        meta["rows_out"] = report.rows_out.get(table, 0)
        version = report.versions.get(table)
        meta["version"] = version if version is not None else "-"
        meta["path"] = MetadataValue.path(str(lake.path(table)))
        meta.update(table_state(lake, table))
    if quarantine_table is not None:
        meta["quarantine_rows"] = report.rows_out.get(quarantine_table, 0)
    return meta


def as_failure(err: StageError, lake: Lake) -> Failure:
    """A Dagster Failure for a failed stage: schema errors (and other deterministic errors such
    as an invalid rule) are not retried; anything else, e.g. a commit conflict, is."""
    report = err.report or QueryReport(err.stage, error=str(err))
    meta = {"python_error": err.python_error or "-", **run_metadata(report, None, lake)}
    if not err.retriable:
        return Failure(description=f"{err} ({err.error_class}: not retried, a retry would fail the same way)",
                       metadata=meta, allow_retries=False)
    return Failure(description=str(err), metadata=meta, allow_retries=True)


def start_op(context: AssetExecutionContext, lake: Lake, *, landing: bool = False) -> WriterLock:
    """`pipelines.jobs.start_run_once` for an op that writes tables (`landing`: it reads landing),
    and the home's writer lock, which the op holds while it writes (`with start_op(...):`).
    Refused while `seclake stream` runs on the home or a rollback waits to be finished (a Failure
    not retried) or while another command writes it (a `seclake run-once` from cron, say: retried,
    it may be done by then).
    A home this makes is said in the run's log: a mistyped `SECLAKE_HOME` otherwise looks like a
    home with nothing new."""
    from pipelines.jobs import start_run_once
    from pipelines.operations.running import HomeBusy, RollbackPending

    existed = lake.home.root.exists()
    try:
        lock = start_run_once(lake, f"Dagster run {context.run_id} (op {context.op_def.name})", landing=landing)
    except HomeBusy as err:
        # An interrupted rollback waits for an operator, not for a retry's back-off.
        raise Failure(description=str(err), allow_retries=not isinstance(err, RollbackPending)) from None
    except RuntimeError as err:
        raise Failure(description=str(err), allow_retries=False) from None
    if not existed:
        context.log.warning(f"home {lake.home.root} did not exist: this run made it, empty (is SECLAKE_HOME, or "
                            f"the lake resource's `home`, right?); sensors' logs go in {lake.home.landing}")
    return lock


def stage_asset(stage: Stage, writes: tuple[str, ...], parts: list[Stage] | None = None) -> AssetsDefinition:
    """The multi-asset of one stage: one spec per table in `writes` (the tables only it writes),
    one query run per materialisation, then one per stage that is part of it (`parts`: the ETL from
    Kafka beside the ETL from files), whose rows count in the same materialisation."""
    from pipelines.jobs import late_attribution_warning

    parts = parts or []
    deps = [table_key(t) for t in stage.reads]
    quarantine = "quarantine" if "quarantine" in writes else None

    @multi_asset(
        name=stage.name,
        specs=[table_spec(t, deps) for t in writes],
        can_subset=False,
        pool=LAKE_POOL,
        retry_policy=RETRY_POLICY,
        description=f"Streaming query `{stage.name}` run with Trigger.AvailableNow; writes "
                    + ", ".join(f"`{t}`" for t in writes),
        op_tags={"seclake/stage": stage.name},
    )
    def _stage(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource):
        the_lake = lake.lake
        with start_op(context, the_lake, landing=not stage.reads):
            reports = []
            for run in (stage, *parts):
                try:
                    reports.append(run_unless_idle(lambda: spark.session, the_lake, lake.stream_settings, run))
                except StageError as err:
                    raise as_failure(err, the_lake) from err
                context.log.info(reports[-1].line())
            if warning := late_attribution_warning(reports):
                context.log.warning(warning)
            for table in writes:
                meta = run_metadata(reports[0], table, the_lake, quarantine)
                for part in reports[1:]:
                    meta["rows_out"] += part.rows_out.get(table, 0)
                    if quarantine is not None:
                        meta["quarantine_rows"] += part.rows_out.get(quarantine, 0)
                    if part.versions.get(table) is not None:
                        meta["version"] = part.versions[table]
                    meta[f"{part.name}_summary"] = part.line()
                yield MaterializeResult(asset_key=table_key(table), metadata=meta)

    return _stage


def wave_asset(wave: list[Stage], writes: dict[str, tuple[str, ...]]) -> AssetsDefinition:
    """The multi-asset of a wave of table stages (`pipelines.stages.waves`: the enriched tables), one
    op for them all, named after their tables' layer: materialising any of its tables runs the
    selected stages side by side, as run-once does (`pipelines.jobs.run_wave`), where one op per
    stage would run one after the other (Dagster's in-process executor). `writes`: each stage's own
    tables. A failed stage fails the op after the others' tables are materialised."""
    from pipelines.jobs import late_attribution_warning, run_wave

    by_key = {table_key(t): (stage, t) for stage in wave for t in writes[stage.name]}
    layers = {Lake.spec(t).layer for stage in wave for t in writes[stage.name]}
    if len(layers) != 1:
        raise ValueError(f"the stages {[s.name for s in wave]} run at once but write tables of the layers "
                         f"{sorted(layers)}: their op needs one name")

    @multi_asset(
        name=layers.pop(),
        specs=[table_spec(t, [table_key(r) for r in stage.reads]) for stage in wave for t in writes[stage.name]],
        can_subset=True,
        pool=LAKE_POOL,
        retry_policy=RETRY_POLICY,
        description="Streaming queries " + ", ".join(f"`{s.name}`" for s in wave)
                    + " run side by side with Trigger.AvailableNow, one per table",
        op_tags={"seclake/stage": ",".join(s.name for s in wave)},
    )
    def _wave(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource):
        the_lake = lake.lake
        with start_op(context, the_lake):
            chosen = [s for s in wave if any(by_key[k][0] is s for k in context.selected_asset_keys)]
            reports = {r.name: r for r in run_wave(lambda: spark.session, the_lake, lake.stream_settings, chosen,
                                                   lambda r: context.log.info(r.line()))}
            if warning := late_attribution_warning(reports.values()):
                context.log.warning(warning)
            for key, (stage, table) in by_key.items():
                if key in context.selected_asset_keys and not reports[stage.name].error:
                    yield MaterializeResult(asset_key=key, metadata=run_metadata(reports[stage.name], table, the_lake))
            errors = [StageError(r.name, f"stage {r.name} failed: {r.error}", r.python_error, r)
                      for r in (reports[s.name] for s in chosen) if r.error]
            if errors:
                # Retried unless no failure can pass on a retry; the message names every failed stage.
                err = next((e for e in errors if e.retriable), errors[0])
                raise as_failure(StageError(err.stage, "; ".join(map(str, errors)), err.python_error, err.report),
                                 the_lake)

    return _wave


# The columns a shared table's asset counts its rows by, the first of each that the table has.
SHARED_LABELS = (("rows_by_rule", ("rule_name", "rule_id")), ("rows_by_severity", ("severity",)),
                 ("rows_by_source", ("source", "stage", "query")))


def shared_table_asset(table: str, writers: list[AssetKey], writer_label: str) -> AssetsDefinition:
    """The asset of a table that several queries append to (`alerts`, `late_events`).

    Dagster gives an asset one producer, so the writers stay assets of their own (`writers`) and
    this asset depends on all of them; it writes nothing, it records the table as a whole:
    its state (`table_state`), rows, and rows per rule / severity / stage when the table has such
    a column.
    """

    @multi_asset(
        name=f"{table}_table",
        specs=[table_spec(table, writers)],
        can_subset=False,
        description=f"`{table}` as a whole; written by {writer_label}, each an asset upstream of this one",
    )
    def _shared(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource):
        the_lake = lake.lake
        meta: dict = {"path": MetadataValue.path(str(the_lake.path(table)))}
        if not the_lake.exists(table):
            meta.update({"dagster/row_count": 0, "note": f"{table} has not been written yet"})
            return MaterializeResult(asset_key=table_key(table), metadata=meta)
        # The table's state too, as every table materialisation carries it: table_state_sensor
        # then finds its version recorded and reports nothing after the run.
        meta.update(table_state(the_lake, table))
        names = Lake.spec(table).schema.fieldNames()
        labels = {label: column for label, candidates in SHARED_LABELS
                  if (column := next((c for c in candidates if c in names), None))}
        meta["dagster/row_count"], counts = value_counts(lambda: spark.session, the_lake.path(table),
                                                         list(labels.values()))
        meta.update({label: MetadataValue.json(counts[column]) for label, column in labels.items()})
        return MaterializeResult(asset_key=table_key(table), metadata=meta)

    return _shared


def stage_assets(stages: list[Stage], own: dict[str, AssetsDefinition] | None = None
                 ) -> list[AssetsDefinition | AssetSpec]:
    """One multi-asset per table-writing stage (`pipelines.stages.table_stages`), or per wave of
    stages that run at once (`wave_asset`: the enriched tables), one asset per
    table several of them write (`late_events`), and an external asset per state table that a
    command keeps (`rule_status`, `alert_triage`: `TableSpec.kept_by`; no Dagster op writes them,
    `table_state_sensor` records their versions) unless `own` gives its asset (`incidents`).
    """
    shared = shared_tables(stages)
    assets: list[AssetsDefinition | AssetSpec] = [
        stage_asset(w[0], own_tables(w[0], stages), parts(w[0], stages)) if len(w) == 1
        else wave_asset(w, {s.name: own_tables(s, stages) for s in w})
        for w in waves([s for s in stages if not s.part_of])]
    for table, writers in shared.items():
        keys = [table_key(t) for w in writers for t in own_tables(w, stages)]
        assets.append(shared_table_asset(table, keys, "stages " + ", ".join(f"`{w.name}`" for w in writers)))
    for table in (t for t in Lake.names() if Lake.spec(t).kept_by):
        if own and table in own:
            assets.append(own[table])
            continue
        spec = table_spec(table)
        assets.append(spec.replace_attributes(description=f"{spec.description} (kept by {Lake.spec(table).kept_by})"))
    return assets
