"""The driver JVM's class-data archive (pipelines/class_archive.py): used when it matches, silent when not."""
from __future__ import annotations

import subprocess
from pathlib import Path

from pipelines.spark import CLASS_ARCHIVE, driver_java_options


def test_the_session_jvm_maps_the_archive_setup_recorded(spark):
    assert CLASS_ARCHIVE.exists(), f"{CLASS_ARCHIVE} is missing: `bash .ci/setup` records it"
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    # The JVM maps a matching archive; one that does not match (another JVM or class path) it skips.
    mapped = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".jsa" in line}
    assert str(CLASS_ARCHIVE) in mapped, mapped


def test_an_archive_that_does_not_match_the_class_path_is_skipped_without_a_word():
    # `java -version` has none of Spark's class path: the archive cannot be used, and says nothing.
    options = [o for o in driver_java_options("FATAL").split() if "cds" in o or "SharedArchive" in o]
    assert any(o.startswith("-XX:SharedArchiveFile=") for o in options), options
    done = subprocess.run(["java", *options, "-version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    # Without the switches that silence it, the same JVM warns: the test above sees the real case.
    loud = subprocess.run(["java", options[0], "-version"], capture_output=True, text=True, timeout=60)
    assert "Unable to use shared archive" in loud.stdout + loud.stderr
