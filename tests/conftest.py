"""One SparkSession for the whole test session; every test writes under its own tmp_path."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.spark import get_spark

REAL_LOGS = Path(__file__).resolve().parents[1].parent / "shared" / "real-logs"


@pytest.fixture(scope="session")
def spark():
    session = get_spark(app_name="seclake-tests", ui=False, conf={"spark.driver.memory": "3g"})
    yield session
    session.stop()


@pytest.fixture
def real_logs() -> Path:
    if not REAL_LOGS.is_dir():
        pytest.skip(f"real logs not present at {REAL_LOGS} "
                    "(they live beside the repo in ../shared, not in a user's checkout)")
    return REAL_LOGS
