"""The code location: the one `Definitions` of seclake (`workspace.yaml` loads `defs`).

Everything is built from the pipeline itself, so new tables, stages and rule files appear on the
next reload without editing this package:

- table assets from `pipelines.stages.stages()` + the table registry (`assets/tables.py`);
- one asset per `rules/**/*.sql` file plus the `alerts` table asset (`assets/rules.py`);
- Great Expectations checks on silver and enriched tables (`assets/checks.py`), and
  `rule_enabled` on every rule asset (`assets/rules.py`);
- `run_once_job`, `stream_job` (`assets/jobs.py`), `run_once_schedule`, `landing_sensor`,
  `kafka_lag_sensor` (`assets/automation.py`); `table_state_sensor`, which records tables written outside Dagster
  (`assets/table_state.py`); `maintenance_job`, `retention_job` and their schedules
  (`assets/operations.py`); `intel_load_job` and `intel_sensor` (`assets/intel.py`); the `incidents`
  asset (`assets/triage.py`); resources chosen by `$SECLAKE_ENV` (`assets/resources.py`).
"""
from collections.abc import Iterable, Mapping
from pathlib import Path

from dagster import Definitions, in_process_executor

from assets import automation, checks, intel, jobs, operations, rules, table_state, tables, triage
from assets.resources import resources_for_environment
from pipelines.query import Stage
from pipelines.stages import stages, table_stages


def build_definitions(rules_dir: Path | str | None = None, stage_list: Iterable[Stage] | None = None,
                      env: str | None = None, resources: Mapping[str, object] | None = None) -> Definitions:
    """Assemble the definitions. `defs` uses the defaults; tests pass their own rules folder,
    stages or resources (default: `resources_for_environment(env)`).

    >>> build_definitions().resolve_job_def("run_once_job").name
    'run_once_job'
    """
    pipeline_stages = table_stages(list(stage_list) if stage_list is not None else stages())
    folder = Path(rules_dir) if rules_dir else None
    assets = [*tables.stage_assets(pipeline_stages, {"incidents": triage.incidents}),
              *rules.rule_assets(folder)]
    return Definitions(
        assets=assets,
        asset_checks=[*checks.quality_checks(pipeline_stages), *rules.rule_checks(folder)],
        jobs=[jobs.run_once_job_def(), jobs.stream_job, operations.maintenance_job, operations.retention_job,
              intel.intel_load_job],
        schedules=[automation.run_once_schedule_def(), operations.maintenance_schedule, operations.retention_schedule],
        sensors=[automation.landing_sensor, automation.kafka_lag_sensor, table_state.table_state_sensor,
                 intel.intel_sensor],
        resources=dict(resources) if resources is not None else resources_for_environment(env),
        executor=in_process_executor,
    )


defs = build_definitions()
