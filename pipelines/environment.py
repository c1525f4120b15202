"""Every environment variable seclake reads, in one place, each with its default and why.

Settings that vary per machine or deployment come from the environment; settings of the
streams themselves are `pipelines.settings.Settings` (`--set name=value`).

>>> sorted(VARIABLES)[:2]
['JAVA_HOME', 'SECLAKE_ENV']
"""
from __future__ import annotations

import os
from pathlib import Path

VARIABLES: dict[str, str] = {
    "SECLAKE_HOME": "the lake's home folder when --home is not given (default ./seclake-home)",
    "SECLAKE_RULES": "the rules folder (default: the repository's rules/)",
    "SECLAKE_SPARK_MASTER": "Spark master URL (default local[*]); e.g. spark://host:7077",
    "SECLAKE_SPARK_LOG_LEVEL": "Spark's log level (default ERROR: quiet unless asked)",
    "SECLAKE_ENV": "Dagster resources profile: local (default) or another configured in assets/resources.py",
    "SECLAKE_RUN_ONCE_CRON": "cron of the Dagster run-once schedule (default every 15 minutes)",
    "SECLAKE_MAX_QUARANTINE_RATIO": "share of quarantined lines that fails the blocking quality check (default 0.05)",
    "JAVA_HOME": "the Java 17+ to run Spark with (default: java on PATH)",
}


def _get(name: str) -> str | None:
    # Only documented variables: a typo here would silently read nothing.
    assert name in VARIABLES, name
    return os.environ.get(name) or None


def home() -> str | None:
    """`$SECLAKE_HOME`, if set."""
    return _get("SECLAKE_HOME")


def rules_dir() -> Path | None:
    """`$SECLAKE_RULES`, if set."""
    value = _get("SECLAKE_RULES")
    return Path(value) if value else None


def spark_master() -> str | None:
    """`$SECLAKE_SPARK_MASTER`, if set."""
    return _get("SECLAKE_SPARK_MASTER")


def spark_log_level() -> str | None:
    """`$SECLAKE_SPARK_LOG_LEVEL`, if set (e.g. WARN or INFO to see Spark's own logging)."""
    return _get("SECLAKE_SPARK_LOG_LEVEL")


def dagster_env() -> str | None:
    """`$SECLAKE_ENV`, if set."""
    return _get("SECLAKE_ENV")


def run_once_cron() -> str | None:
    """`$SECLAKE_RUN_ONCE_CRON`, if set."""
    return _get("SECLAKE_RUN_ONCE_CRON")


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
