"""Local servers the project starts for development and tests (the Kafka broker, S3Proxy, a Spark
standalone cluster): each a process of its own with a pid file, waited for until its port accepts
connections, stopped with SIGTERM then SIGKILL. One-line errors name what went wrong."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class ServerError(RuntimeError):
    """A server could not be started or stopped; the message says why in one line."""


def port_in_use(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def not_running(what: str, home: Path, port: int, *, was: bool = False) -> str:
    """What `stop` (`was`) or `status` says of `what`, a server `home` has not started: with the port
    in use, that some other process serves it, as a server of another home does.

    >>> not_running("s3 server", Path("/tmp/h"), free_port(), was=True)
    's3 server of /tmp/h was not running'
    """
    busy = f" (port {port} is in use: a server of another home? give that --home)" if port_in_use(port) else ""
    return f"{what} of {home} {'was not' if was else 'not'} running{busy}"


def refused(addresses: str, timeout_s: float) -> str | None:
    """Why no address of `addresses` ('host:port,host:port') accepts a TCP connection
    ('host:port: connection refused; ...', 'host:port: no such host'), or None when one does, or
    when an address does not parse or times out (the client then decides): a server that is down
    or a mistyped host, said before a client retries it for a minute (a Kafka broker, a Spark master).

    >>> refused(f"127.0.0.1:{free_port()}", 1.0).endswith("connection refused")
    True
    >>> refused("sparkmaster.invalid:7077", 1.0)
    'sparkmaster.invalid:7077: no such host'
    >>> refused(f"PLAINTEXT://127.0.0.1:{free_port()}", 1.0).endswith("connection refused")
    True
    """
    reasons = []
    for address in (a.strip() for a in addresses.split(",") if a.strip()):
        host, _, port = address.split("://")[-1].rpartition(":")  # Kafka's clients take PLAINTEXT://host:port
        if not host or not port.isdigit():
            return None
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return None
        except ConnectionRefusedError:
            reasons.append(f"{address}: connection refused")
        except socket.gaierror as exc:
            if exc.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return None  # a lookup that failed for now (EAI_AGAIN): the client retries it
            reasons.append(f"{address}: no such host")
        except OSError:
            return None
    return "; ".join(reasons) or None


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (now).

    >>> port_in_use(free_port())
    False
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def recorded_port(config: Path, key: str) -> int | None:
    """The port ending `key`'s value in the `key=value` file `config` a server was started with, or
    None: a running server is named by the port it listens on, not by `--port`'s default.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "s.conf").write_text("endpoint=http://127.0.0.1:9010\\n")
    ...     recorded_port(Path(tmp) / "s.conf", "endpoint"), recorded_port(Path(tmp) / "none", "endpoint")
    (9010, None)
    """
    try:
        for line in config.read_text().splitlines():
            if line.startswith(f"{key}="):
                return int(line.rsplit(":", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def running_pid(pid_file: Path) -> int | None:
    """The process id in `pid_file` if that process still runs, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # alive() reaps a child of this process that died (a SIGKILLed server started here is a
    # zombie until then, and a zombie still answers a signal 0).
    return pid if alive(pid) else None


def launch(command: list[str], *, name: str, port: int, pid_file: Path, output: Path, log: Path,
           timeout_s: float, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `command` in a session of its own (a terminal's Ctrl-C does not reach it), record its
    pid and wait until it accepts connections on `port`; a ServerError with the last line of
    `log` when it exits first, and stopped when it is not up within `timeout_s`."""
    if port_in_use(port):
        raise ServerError(f"port {port} on 127.0.0.1 is taken by another program (a seclake server of another "
                          "home is one); choose another (--port)")
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while not port_in_use(port):
        if proc.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise ServerError(f"the {name} exited with code {proc.returncode} while starting; "
                              f"last log line: {last_line(tail(log))}")
        if time.monotonic() > deadline:
            terminate(pid_file)
            raise ServerError(f"the {name} did not accept connections within {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)
    return proc


def terminate(pid_file: Path, timeout_s: float = 60.0) -> bool:
    """Stop the process of `pid_file` (SIGTERM, then SIGKILL after `timeout_s`); False when none ran."""
    pid = running_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return True


def alive(pid: int) -> bool:
    """True while process `pid` runs (a child that exited is reaped, then it is gone)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def last_line(text: str) -> str:
    """The last non-blank line of `text`.

    >>> last_line("a\\nb\\n\\n")
    'b'
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535 (a socket call would fail later with OverflowError).

    >>> port_number("9000")
    9000
    >>> port_number("70000")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 70000 is not a TCP port (1 to 65535)
    """
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1 to 65535)")
    return port


def add_server_commands(sub: argparse._SubParsersAction, name: str, help: str, verbs: dict[str, str],
                        default_port: int, port_help: str, home_arg: Callable[[argparse.ArgumentParser], None],
                        func: Callable[[argparse.Namespace], int]) -> dict[str, argparse.ArgumentParser]:
    """`seclake NAME VERB [--port N] [--home DIR]` for each of `verbs` (start, stop, status), the
    verb in `args.<NAME>_command`; the verbs' parsers, for options of their own.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> _ = add_server_commands(sub, "s3", "a server", {"start": "start it"}, 9000, "its port",
    ...                         lambda p: p.add_argument("--home"), lambda args: 0)
    >>> args = parser.parse_args(["s3", "start", "--port", "19000"])
    >>> args.s3_command, args.port
    ('start', 19000)
    """
    command = sub.add_parser(name, help=help)
    verb_parsers = command.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    made = {}
    for verb, text in verbs.items():
        parser = verb_parsers.add_parser(verb, help=text)
        parser.add_argument("--port", type=port_number, default=default_port,
                            help=f"{port_help} (default {default_port})")
        home_arg(parser)
        parser.set_defaults(func=func)
        made[verb] = parser
    return made
