"""The `incidents` asset (gold/incidents): the alerts of each entity grouped in time with a risk
score, rebuilt whole from `alerts` and `alert_triage` (`pipelines.triage.incidents.refresh`, which
writes nothing when neither changed since the last build) so that BI tools and notebooks read
incidents as a table; `seclake alerts incidents` computes the same rows on demand."""
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from assets.resources import LakeResource, SparkResource
from assets.tables import LAKE_POOL, RETRY_POLICY, table_definition_metadata, table_key, table_state
from pipelines.lake.registry import Lake
from pipelines.rules.tables import ALERTS_TABLE
from pipelines.triage.incidents import INCIDENTS_TABLE, refresh, riskiest
from pipelines.triage.store import TRIAGE_TABLE


@asset(key=table_key(INCIDENTS_TABLE), deps=[table_key(ALERTS_TABLE), table_key(TRIAGE_TABLE)],
       description=Lake.spec(INCIDENTS_TABLE).description, group_name=Lake.spec(INCIDENTS_TABLE).layer,
       kinds={"spark", "delta"}, metadata=table_definition_metadata(INCIDENTS_TABLE), pool=LAKE_POOL,
       retry_policy=RETRY_POLICY, tags={"seclake/layer": Lake.spec(INCIDENTS_TABLE).layer})
def incidents(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource) -> MaterializeResult:
    # As `seclake alerts incidents`: a mistyped home would get an empty incidents table, reported a success.
    the_lake = lake.existing_lake(or_landing=True)
    done = refresh(lambda: spark.session, the_lake)
    context.log.info(f"{done.incidents} incident(s) written as incidents v{done.version}" if done.written else
                     f"alerts and alert_triage unchanged since incidents v{done.version} "
                     f"({done.incidents} incident(s)): nothing written")
    top = riskiest(lambda: spark.session, the_lake)
    return MaterializeResult(metadata={
        "version": done.version, "incidents": done.incidents, "written": done.written,
        "riskiest": MetadataValue.md("\n".join(f"- {r['entity']}: risk {r['risk']}, {r['alerts']} alert(s), "
                                               f"{len(r['rules'])} rule(s)" for r in top) or "(none)"),
        **table_state(the_lake, INCIDENTS_TABLE),
    })
