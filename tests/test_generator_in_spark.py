"""The generator's parallel path inside a process that already runs Spark (issue: the suite hung).

Forking a process with a JVM and Py4J threads could leave a worker waiting for ever on a lock
copied mid-use; the generator now spawns its workers. This runs the parallel path several times
after a SparkSession started, and compares every tree to the serial run byte for byte.
"""
from __future__ import annotations

from pathlib import Path

from sample_data import generator as gen
from test_generator import tree_hashes

# 4 hourly files x 100 devices: above the generator's threshold (400) for using worker processes
ARGS = dict(hours=4, hosts=100, seed=11, start="2026-11-20T00:00:00Z")


def test_parallel_generate_after_spark_started_finishes_and_equals_serial(spark, tmp_path: Path, monkeypatch):
    assert spark.range(3).count() == 3          # the JVM and its Py4J threads are up
    contexts: list[str] = []
    get_context = gen.multiprocessing.get_context
    monkeypatch.setattr(gen.multiprocessing, "get_context", lambda m: contexts.append(m) or get_context(m))
    serial = tmp_path / "serial"
    gen.generate(serial, workers=1, **ARGS)
    want = tree_hashes(serial)
    assert want, "the serial run wrote nothing"
    for i in range(3):
        out = tmp_path / f"parallel-{i}"
        gen.generate(out, workers=2, **ARGS)
        assert tree_hashes(out) == want, f"parallel run {i} differs from the serial run"
    assert contexts == ["spawn"] * 3, f"the parallel path did not run as expected: {contexts}"
