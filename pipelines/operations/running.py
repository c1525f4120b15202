"""Who writes a home: the home's writer lock, and whether its holder is `seclake stream`.

Every command that writes a home's tables and checkpoints (run-once, stream, maintain, retention,
and each op of a Dagster run that runs a stage's queries or rewrites tables) holds the home's
writer lock while it does (`writer_lock`): two at once would run queries on the same checkpoints,
so the second is refused in one line naming the first. An hourly `run-once` from cron that
outlasts its hour is the usual way to get there.

The lock file names its holder, so it also says when a stream runs (`running_stream`): rollback,
maintenance, retention and Dagster's launches refuse then with the stream's own advice (stop it),
a dry run still plans, and the stream's rules application knows the stream that started it.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import time
from pathlib import Path

from pipelines.home import Home

LOCK = "writer.lock"
# The command `seclake stream` takes the lock as, which `running_stream` looks for.
STREAM = "seclake stream"
ROLLBACK = "seclake rollback"
# The plan of a rollback being applied, in the home, removed once every step is done: until then only
# the rollback takes the writer lock (a run between would write into half-rolled-back tables).
PENDING = "rollback-pending.json"


def running_stream(home: Home) -> int | None:
    """The pid of a live `seclake stream` on `home`, or None: no lock, another holder, or a stream
    killed without clean-up (`kill -9` releases the lock and leaves its holder's line).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     home = Home.resolve(tmp)
    ...     with writer_lock(home, STREAM):
    ...         during = running_stream(home)
    ...     during == os.getpid(), running_stream(home)
    (True, None)
    """
    try:
        holder = (home.root / LOCK).read_text(errors="replace")
    except FileNotFoundError:
        return None
    found = re.match(rf"{re.escape(STREAM)} \(pid (\d+),", holder)  # the line `writer_lock` writes
    if found is None:
        return None
    pid = int(found.group(1))
    held = _holds_lock(pid, home.root / LOCK)
    if held is not None:
        return pid if held else None
    try:  # no lock table to read (not Linux): the pid alone, which the kernel may have reused
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # exists, owned by another user
    return pid


def _holds_lock(pid: int, path: Path) -> bool | None:
    """Whether process `pid` holds the flock on `path`, from the kernel's lock table; None where
    there is none to read. A live pid is not enough: after a `kill -9` the kernel may give the dead
    stream's pid to another process, which would then read as the stream."""
    try:
        table = Path("/proc/locks").read_text()
        stat = path.stat()
    except OSError:
        return None
    lock = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    # A line: "1: FLOCK  ADVISORY  WRITE 4541 fe:00:9980402 0 EOF" (waiters' lines hold "->").
    return any(fields[1:2] == ["FLOCK"] and fields[4:6] == [str(pid), lock]
               for fields in map(str.split, table.splitlines()))


def refuse_while_streaming(home: Home, command: str) -> None:
    """RuntimeError, in one line, when a stream runs on `home`."""
    pid = running_stream(home)
    if pid is not None:
        raise RuntimeError(f"a seclake stream (pid {pid}) is running on {home.root}: stop it before {command}")


class HomeBusy(RuntimeError):
    """Another process holds the home's writer lock; it ends when that process finishes (or dies)."""


class RollbackPending(HomeBusy):
    """A rollback was interrupted (`PENDING`): it ends only when someone runs that rollback again."""


class WriterLock:
    """The home's writer lock, held from `writer_lock` until `release` (or the block's end, or the
    process's: the kernel releases a dead holder's lock, so a `kill -9` leaves none behind)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        """Let the next writer in (the lock file stays, empty)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def writer_lock(home: Home, command: str) -> WriterLock:
    """Take `home`'s writer lock for `command` ("seclake run-once"), or raise HomeBusy naming the
    command that holds it. Not blocking: the caller says what to do instead.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     home = Home.resolve(tmp)
    ...     with writer_lock(home, "seclake run-once"):
    ...         writer_lock(home, "seclake maintain")
    Traceback (most recent call last):
    ...
    pipelines.operations.running.HomeBusy: seclake run-once (pid ...) is writing ...: wait ... before seclake maintain
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     home = Home.resolve(tmp)
    ...     with writer_lock(home, STREAM):
    ...         writer_lock(home, STREAM)
    Traceback (most recent call last):
    ...
    pipelines.operations.running.HomeBusy: seclake stream (pid ...) is writing ...: stop it before seclake stream
    """
    path = home.root / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        busy = _busy(fd, home, command)
        os.close(fd)
        raise busy from None
    # Looked for once the lock is ours: while a rollback runs, its plan is there too, and it is named
    # above as the holder, not taken for an interrupted one.
    if command != ROLLBACK and (home.root / PENDING).exists():
        os.close(fd)
        raise _interrupted(home, command)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{command} (pid {os.getpid()}, since {time.strftime('%H:%M:%S', time.gmtime())} UTC)".encode(), 0)
    return WriterLock(fd)


def refuse_while_rolling_back(home: Home, command: str) -> None:
    """For the writers that take no writer lock (a backtest's or an intel sweep's alerts), which a
    rollback's RESTORE of `alerts` would undo: HomeBusy naming the rollback while one runs on `home`,
    RollbackPending when one was interrupted there (`PENDING`), each in one line."""
    if not (home.root / PENDING).exists():
        return
    busy = _running(home, command)
    if busy is not None:  # its plan is there while it runs
        raise busy
    raise _interrupted(home, command)


def _interrupted(home: Home, command: str) -> RollbackPending:
    return RollbackPending(f"a rollback was interrupted on {home.root}: `{pending_command(home)}` "
                           f"finishes it; then {command}")


def _busy(fd: int, home: Home, command: str) -> HomeBusy:
    """HomeBusy naming the holder of the writer lock open as `fd` (its line in the lock file)."""
    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    # A stream does not finish: it is stopped (Ctrl-C, SIGTERM).
    wait = "stop it" if holder.startswith(STREAM) else "wait for it to finish"
    return HomeBusy(f"{holder} is writing {home.root}: {wait} before {command}")


def _running(home: Home, command: str) -> HomeBusy | None:
    """HomeBusy naming the process holding `home`'s writer lock, None when no process holds it."""
    try:
        fd = os.open(home.root / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _busy(fd, home, command)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def pending_record(home: Home) -> dict | None:
    """The plan of the rollback pending in `home` (`PENDING`) as `rollback.save_pending` wrote it, or None."""
    try:
        return json.loads((home.root / PENDING).read_text())
    except FileNotFoundError:
        return None


def pending_command(home: Home) -> str:
    """The command line of the rollback whose plan is pending in `home` (`PENDING`)."""
    try:
        return str((pending_record(home) or {})["command"])
    except (OSError, ValueError, KeyError):
        return "the same seclake rollback"
