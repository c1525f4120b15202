"""Every environment variable seclake reads, in one place, each with its default and why.

Settings that vary per machine or deployment come from the environment; settings of the
streams themselves are `pipelines.settings.Settings` (`--set name=value`).

>>> sorted(VARIABLES)[:2]
['AWS_ACCESS_KEY_ID', 'AWS_REGION']
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

VARIABLES: dict[str, str] = {
    "SECLAKE_HOME": "the lake's home folder when --home is not given (default ./seclake-home)",
    "SECLAKE_LAKE": "where tables/ and checkpoints/ live: the home folder (default) or s3a://bucket/prefix "
                    "(docs/deploy.md); landing/ and reference/ stay in the home",
    "SECLAKE_S3_ENDPOINT": "an S3-compatible server's URL, e.g. http://127.0.0.1:9000 (default: AWS S3 itself)",
    "AWS_ACCESS_KEY_ID": "the object store's access key (S3A, delta-rs and pyarrow all use it)",
    "AWS_SECRET_ACCESS_KEY": "the object store's secret key",
    "AWS_REGION": "the bucket's region (default us-east-1)",
    "SECLAKE_KAFKA": "Kafka bootstrap servers to ingest sensor topics from, e.g. 127.0.0.1:9092 (default: none, "
                     "landing files only; docs/kafka.md)",
    "SECLAKE_RULES": "the rules folder (default: the repository's rules/)",
    "SECLAKE_SPARK_MASTER": "Spark master URL (default local[*]); e.g. spark://host:7077",
    "SECLAKE_DRIVER_MEMORY": "the Spark driver's heap, e.g. 2g (default 4g: local mode runs every task in the "
                             "driver); a smaller heap makes a rule that blows it up stop the application sooner",
    "SECLAKE_SPARK_LOG_LEVEL": "Spark's log level (default FATAL: seclake says failures; ERROR or INFO shows Spark's)",
    "SECLAKE_ENV": "Dagster resources profile: local (default) or another configured in assets/resources.py",
    "SECLAKE_RUN_ONCE_CRON": "cron of the Dagster run-once schedule (default every 15 minutes)",
    "SECLAKE_MAX_QUARANTINE_RATIO": "share of quarantined lines that fails the blocking quality check (default 0.05)",
    "DAGSTER_HOME": "the Dagster instance (run history) `python -m assets.launch` records its runs in (default: "
                    "the home's dagster/ folder, where seclake demo records its run; `dagster dev` needs it set: "
                    "docs/dagster.md)",
    "JAVA_HOME": "the Java 17+ to run Spark with (default: java on PATH)",
}


def _get(name: str) -> str | None:
    # Only documented variables: a typo here would silently read nothing.
    assert name in VARIABLES, name
    return os.environ.get(name) or None


def home() -> str | None:
    """`$SECLAKE_HOME`, if set."""
    return _get("SECLAKE_HOME")


def lake() -> str | None:
    """`$SECLAKE_LAKE`, if set."""
    return _get("SECLAKE_LAKE")


def s3_endpoint() -> str | None:
    """`$SECLAKE_S3_ENDPOINT`, if set."""
    return _get("SECLAKE_S3_ENDPOINT")


def aws_access_key_id() -> str | None:
    """`$AWS_ACCESS_KEY_ID`, if set."""
    return _get("AWS_ACCESS_KEY_ID")


def aws_secret_access_key() -> str | None:
    """`$AWS_SECRET_ACCESS_KEY`, if set."""
    return _get("AWS_SECRET_ACCESS_KEY")


def aws_region() -> str:
    """`$AWS_REGION`, else us-east-1 (S3-compatible servers accept any)."""
    return _get("AWS_REGION") or "us-east-1"


def kafka() -> str | None:
    """`$SECLAKE_KAFKA`, if set: the ETL then also reads the sensors' Kafka topics (stage `etl_kafka`)."""
    return _get("SECLAKE_KAFKA")


def rules_dir() -> Path | None:
    """`$SECLAKE_RULES`, if set."""
    value = _get("SECLAKE_RULES")
    return Path(value) if value else None


# What Spark takes: checked here, since Spark's own refusal of a bad value is a JVM that exits
# before it says anything ("Java gateway process exited"), or an error after its start.
_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(\s*,\s*\d+)?\])?|local-cluster\[.+\]|spark://.+|yarn|k8s://.+")
_MEMORY = re.compile(r"[1-9]\d*[kmgt]", re.IGNORECASE)  # the JVM's -Xmx: a unit, no "gb"
LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def _checked(name: str, valid: Callable[[str], object], expected: str) -> str | None:
    value = _get(name)
    if value is not None and not valid(value):
        raise ValueError(f"{name} must be {expected}, not {value!r}")
    return value


def spark_master() -> str | None:
    """`$SECLAKE_SPARK_MASTER`, if set: a Spark master URL; ValueError names a value Spark would refuse.

    >>> os.environ["SECLAKE_SPARK_MASTER"] = "bogus://x"
    >>> spark_master()
    Traceback (most recent call last):
    ...
    ValueError: SECLAKE_SPARK_MASTER must be a Spark master such as local[*], ..., not 'bogus://x'
    >>> del os.environ["SECLAKE_SPARK_MASTER"]
    """
    return _checked("SECLAKE_SPARK_MASTER", _MASTER.fullmatch,
                    "a Spark master such as local[*], local[4], spark://host:7077, yarn or k8s://https://host:443")


def driver_memory() -> str | None:
    """`$SECLAKE_DRIVER_MEMORY`, if set: a JVM size such as 4g or 512m."""
    return _checked("SECLAKE_DRIVER_MEMORY", _MEMORY.fullmatch, "a size such as 4g or 512m")


def spark_log_level() -> str | None:
    """`$SECLAKE_SPARK_LOG_LEVEL`, if set (e.g. WARN or INFO to see Spark's own logging): one of `LOG_LEVELS`."""
    value = _checked("SECLAKE_SPARK_LOG_LEVEL", lambda v: v.upper() in LOG_LEVELS, f"one of {', '.join(LOG_LEVELS)}")
    return value.upper() if value else None


def check_spark_variables() -> None:
    """ValueError naming the first bad `SECLAKE_SPARK_MASTER`, `SECLAKE_DRIVER_MEMORY` or
    `SECLAKE_SPARK_LOG_LEVEL`: for a command that starts Spark later, after other set-up."""
    spark_master()
    driver_memory()
    spark_log_level()


def dagster_env() -> str | None:
    """`$SECLAKE_ENV`, if set."""
    return _get("SECLAKE_ENV")


def run_once_cron() -> str | None:
    """`$SECLAKE_RUN_ONCE_CRON`, if set."""
    return _get("SECLAKE_RUN_ONCE_CRON")


def dagster_home() -> str | None:
    """`$DAGSTER_HOME`, if set."""
    return _get("DAGSTER_HOME")


def max_quarantine_ratio(default: float) -> float:
    """`$SECLAKE_MAX_QUARANTINE_RATIO` as a number in [0, 1], else `default`; ValueError names a bad value.

    >>> max_quarantine_ratio(0.05)  # with the variable unset
    0.05
    """
    value = _get("SECLAKE_MAX_QUARANTINE_RATIO")
    if value is None:
        return default
    try:
        ratio = float(value)
    except ValueError:
        raise ValueError(f"SECLAKE_MAX_QUARANTINE_RATIO must be a number, not {value!r}") from None
    if not 0 <= ratio <= 1:
        raise ValueError(f"SECLAKE_MAX_QUARANTINE_RATIO must be between 0 and 1, not {ratio}")
    return ratio


def java_home() -> str | None:
    """`$JAVA_HOME`, if set."""
    return _get("JAVA_HOME")
