"""Record the driver JVM's class-data archive: `python -m pipelines.class_archive` (run by `.ci/setup`).

A Spark driver loads and verifies some 11,000 classes from the jars before its session exists
and 17,000 by its first query, at every start. Java's dynamic class-data sharing (CDS) writes the classes
a JVM loaded to an archive when it exits; a later JVM with the same class path maps it instead.
This module runs a small run-once over generated logs (the ETL, the leases, one enriched table
and one rule: the other stages load the same Spark and Delta code) in a JVM that records the
archive, then moves it to `pipelines.spark.CLASS_ARCHIVE`, which `get_spark` maps from then on.
Only Spark's own jars (the JVM's class path) are archived; Delta's, which Spark adds at run time,
load as before.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from pyspark import SparkContext

from pipelines.query import Stage
from pipelines.spark import CLASS_ARCHIVE, driver_java_options, get_spark
from pipelines.stages import is_rule, stages


def training_stages(found: list[Stage]) -> list[str]:
    """The stages the training runs: every table stage but the enriched ones after the first, and
    one rule reading that one; each query more adds seconds and few classes.

    >>> training_stages(stages())
    ['etl', 'end_of_input', 'dhcp_leases', 'enriched_conn', 'rule_c2_beaconing']
    """
    tables = [s for s in found if not is_rule(s)]
    enriched = next(s for s in tables if s.name.startswith("enriched_"))
    rule = next(s for s in found if is_rule(s) and set(enriched.writes) & set(s.reads))
    return [s.name for s in tables if not s.name.startswith("enriched_")] + [enriched.name, rule.name]


def record(workdir: Path) -> float:
    """Run the training run-once in `workdir` in a JVM that writes the archive at exit, and put the
    archive in place (a JVM starting meanwhile never maps half a file): the archive's size in MB.

    Needs its own process: the JVM must start here and exit at the end (py4j keeps one per process).
    """
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from sample_data.generator import generate

    partial = Path(f"{CLASS_ARCHIVE}.tmp")
    partial.unlink(missing_ok=True)
    generate(workdir, hours=0.25, hosts=5, seed=11)
    only = training_stages(stages())
    spark = get_spark(app_name="seclake-class-archive", ui=False,
                      conf={"spark.driver.extraJavaOptions": driver_java_options("FATAL", record_archive=True)})
    failed = ["(raised)"]
    try:
        failed = [r.name for r in run_once(spark, Lake(Home.resolve(workdir)), only=only) if r.error]
    finally:
        # The JVM writes the archive as it exits: when its stdin, py4j's gateway pipe, closes.
        spark.stop()
        proc = SparkContext._gateway.proc if SparkContext._gateway is not None else None
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=300)
        if failed:  # the classes of a run that broke off: not kept
            partial.unlink(missing_ok=True)
    if failed:
        raise RuntimeError(f"the training run-once failed in {failed}")
    if not partial.exists():
        raise RuntimeError(f"the JVM exited without writing {partial}")
    os.replace(partial, CLASS_ARCHIVE)
    return CLASS_ARCHIVE.stat().st_size / 2**20


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="seclake-class-archive-") as tmp:
        try:
            size = record(Path(tmp))
        except Exception as exc:  # an optimisation: the JVM starts without it, as before
            print(f"seclake: no class-data archive ({exc}); Spark starts without it", file=sys.stderr)
            return 1
    print(f"seclake: class-data archive {CLASS_ARCHIVE} ({size:.0f} MB) recorded in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
