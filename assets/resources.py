"""Resources of the code location, and the one place they are chosen by environment.

- `spark` (`SparkResource`): owns the run's SparkSession, built by `pipelines.spark.get_spark` on
  first use and stopped when the run ends. Runs use the in-process executor, so every asset of a
  run shares the one session.
- `lake` (`LakeResource`): the home folder (`$SECLAKE_HOME`, else `./seclake-home`) and stream
  settings overrides. It never starts Spark, so sensors can use it.

`resources_for_environment()` picks their configuration from `$SECLAKE_ENV` (`local`, the default,
or `ci`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, Failure, InitResourceContext
from pydantic import Field, PrivateAttr, field_validator

from pipelines import environment
from pipelines.home import Home
from pipelines.lake.registry import Lake
from pipelines.settings import Settings

if TYPE_CHECKING:  # pyspark is imported when a run first asks for its session
    from pyspark.sql import SparkSession


class SparkResource(ConfigurableResource):
    """The run's SparkSession (`pipelines.spark.get_spark`), created lazily on first `.session`.

    If a SparkContext already runs in the process (tests, notebooks), the resource uses that
    session and leaves it running at teardown; a session it started itself it stops, after
    stopping any streaming query still active.
    Ops reach the session as `spark.session` (a `pyspark.sql.SparkSession`).
    """

    master: str | None = Field(default=None, description="Spark master; default $SECLAKE_SPARK_MASTER, else local[*]")
    app_name: str = Field(default="seclake-dagster", description="Spark application name")
    ui: bool = Field(default=True, description="start the Spark UI (port 4040+)")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings, override seclake's")

    _session: Any = PrivateAttr(default=None)
    _owned: bool = PrivateAttr(default=False)

    @property
    def session(self) -> SparkSession:
        """The SparkSession of this run; a Failure, not retried, once its Spark application stopped
        (a retry in this run would only meet the same stopped application)."""
        from pipelines.spark import context_stopped

        if self._session is not None and context_stopped():
            raise Failure(description="the run's Spark application stopped (the run's log above says why, e.g. "
                                      "java.lang.OutOfMemoryError); what committed is kept: re-execute the run "
                                      "to go on in a new one", allow_retries=False)
        if self._session is None:
            from pyspark import SparkContext

            from pipelines.spark import BUILDING, get_spark

            with BUILDING:  # a session being built in another thread (assets/launch.py) is not this one's
                already_running = SparkContext._active_spark_context is not None
                self._session = get_spark(self.master, app_name=self.app_name, ui=self.ui, conf=dict(self.conf))
            self._owned = not already_running
        return self._session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session, self._session = self._session, None
        if session is None or not self._owned:
            return
        for query in session.streams.active:
            try:
                query.stop()
            except Exception:  # a query that failed while stopping must not keep the JVM alive
                pass
        session.stop()


class LakeResource(ConfigurableResource):
    """The seclake home folder and the stream settings every query of a run uses.

    >>> LakeResource(home="/tmp/x").lake.path("silver_dns").as_posix()
    '/tmp/x/tables/silver_dns'
    """

    home: str | None = Field(default=None, description="home folder; default $SECLAKE_HOME, else ./seclake-home")
    settings: dict[str, str] = Field(
        default_factory=dict,
        description="overrides of pipelines/settings.py, e.g. {max_bytes_per_trigger: '67108864'}")

    @field_validator("settings")
    @classmethod
    def _settings_apply(cls, settings: dict[str, str]) -> dict[str, str]:
        # Refused as the resource is configured, before any op: raised inside an op, the assets' retry
        # policy would try it three more times, and a bad name or number fails the same way each time.
        Settings().with_overrides(settings)
        return settings

    @property
    def lake(self) -> Lake:
        return Lake(Home.resolve(self.home))

    def existing_lake(self, *, or_landing: bool = False) -> Lake:
        """`lake`, when its home was written before (`Home.existing`, as the CLI's commands on a
        home); else a Failure naming the folder, not retried: a mistyped `home` or an unset
        `$SECLAKE_HOME` would otherwise be maintained, swept or read as a new, empty home.

        >>> LakeResource(home="/nonexistent").existing_lake()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dagster._core.definitions.events.Failure: /nonexistent is not a seclake home (no tables/ folder); ...
        """
        try:
            return Lake(Home.resolve(self.home).existing(or_landing=or_landing))
        except ValueError as exc:  # also a home that recorded another lake (Home.resolve)
            raise Failure(description=str(exc), allow_retries=False) from None

    @property
    def stream_settings(self) -> Settings:
        """`Settings` with the overrides applied; values are converted to each setting's type."""
        return Settings().with_overrides(self.settings)  # checked when configured: `_settings_apply`


ENVIRONMENTS = ("local", "ci")


def resources_for_environment(env: str | None = None) -> dict[str, ConfigurableResource]:
    """The resources of `env` (default `$SECLAKE_ENV`, else `local`).

    - `local`: Spark with its UI, the home folder from `$SECLAKE_HOME` or `./seclake-home`.
    - `ci`: no Spark UI and a smaller driver, for headless runs on small machines.

    >>> sorted(resources_for_environment("local"))
    ['lake', 'spark']
    """
    env = env or environment.dagster_env() or "local"
    if env == "local":
        return {"spark": SparkResource(), "lake": LakeResource()}
    if env == "ci":
        return {"spark": SparkResource(ui=False, conf={"spark.driver.memory": "2g"}), "lake": LakeResource()}
    raise ValueError(f"unknown SECLAKE_ENV {env!r}; expected one of {', '.join(ENVIRONMENTS)}")
