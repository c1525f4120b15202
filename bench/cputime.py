"""Run a command and report the CPU seconds of it and of every process it spawned.

`resource.getrusage(RUSAGE_CHILDREN)` only counts descendants that were waited for. A
`seclake` process does not wait for its JVM (the JVM notices the closed gateway and exits
after Python did), so the JVM would be missed. This wrapper makes itself a *child
subreaper* (Linux `prctl(PR_SET_CHILD_SUBREAPER)`): orphaned descendants are re-parented
to it, and it reaps every one of them before reporting, so their CPU is counted too.

    python bench/cputime.py --out cpu.json -- seclake run-once --home H

writes `{"user": s, "sys": s, "cpu": s, "wall": s, "rc": n}` to cpu.json. SIGTERM and
SIGINT sent to the wrapper are forwarded to the command.
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write the CPU and wall times to")
    parser.add_argument("--reap-timeout", type=float, default=120.0,
                        help="seconds to wait for orphaned descendants (the JVM) to exit")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    started = time.monotonic()
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = child.wait()
    ended = time.monotonic()
    # Reap everything re-parented to us (JVM, Python workers) so getrusage counts it.
    deadline = time.monotonic() + args.reap_timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        except OSError as exc:
            if exc.errno == errno.ECHILD:
                break
            raise
        if pid == 0:
            if time.monotonic() > deadline:
                print("cputime: descendants still running after the reap timeout; their CPU is not counted",
                      file=sys.stderr)
                break
            time.sleep(0.05)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {"user": usage.ru_utime, "sys": usage.ru_stime, "cpu": usage.ru_utime + usage.ru_stime,
              "wall": ended - started, "rc": rc}
    with open(args.out, "w") as handle:
        json.dump(result, handle)
    return rc


if __name__ == "__main__":
    sys.exit(main())
