"""Doctest support (`pytest --doctest-modules pipelines`): examples that use `spark` get one shared
SparkSession in their namespace. The session starts on the first such example, so modules whose
examples never mention `spark` run without a JVM. Tests have their own `spark` fixture
(tests/conftest.py); get_spark is getOrCreate, so both share one session in one process.
"""
from __future__ import annotations

import re

import pytest
from _pytest.doctest import DoctestItem

_USES_SPARK = re.compile(r"\bspark\b")


@pytest.fixture(scope="session")
def _doctest_spark():
    from pipelines.spark import get_spark

    session = get_spark(app_name="seclake-doctests", ui=False)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _spark_for_doctests(request: pytest.FixtureRequest, doctest_namespace: dict) -> None:
    node = request.node
    if not isinstance(node, DoctestItem) or node.dtest is None:
        return
    if any(_USES_SPARK.search(example.source) for example in node.dtest.examples):
        doctest_namespace["spark"] = request.getfixturevalue("_doctest_spark")
