"""The `seclake stream` marker: a pid file in the home while the streams run.

Rollback, maintenance and retention rewrite tables and checkpoints the streams are using, so they
refuse while the marker names a live process.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipelines.home import Home

MARKER = "stream.pid"


def marker_path(home: Home) -> Path:
    """Where `seclake stream` records its pid: `<home>/stream.pid`."""
    return home.root / MARKER


@contextmanager
def stream_marker(home: Home) -> Iterator[None]:
    """Hold the marker while the block runs (the streams), removed on exit, even on an error."""
    path = marker_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        try:
            if path.read_text().strip() == str(os.getpid()):  # not a later stream's marker
                path.unlink()
        except FileNotFoundError:
            pass


def running_stream(home: Home) -> int | None:
    """The pid of a live `seclake stream` on `home`, or None (no marker, or its process is gone).

    >>> running_stream(Home.resolve("/nonexistent-home")) is None
    True
    """
    try:
        pid = int(marker_path(home).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return None  # killed without cleanup (kill -9): a stale marker
    except PermissionError:
        return pid  # exists, owned by another user
    return pid


def refuse_while_streaming(home: Home, command: str) -> None:
    """RuntimeError, in one line, when a stream runs on `home`."""
    pid = running_stream(home)
    if pid is not None:
        raise RuntimeError(f"a seclake stream (pid {pid}) is running on {home.root}: stop it before {command}")
