"""`seclake s3 start|stop|status`: the development S3-compatible server of a home (docs/deploy.md)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

HomeArg = Callable[[argparse.ArgumentParser], None]


def add_commands(sub: argparse._SubParsersAction, home_arg: HomeArg) -> None:
    """Add `s3 start|stop|status` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"))
    >>> args = parser.parse_args(["s3", "start", "--port", "19000"])
    >>> args.s3_command, args.port
    ('start', 19000)
    """
    from pipelines.objectstore.server import DEFAULT_PORT
    from pipelines.servers import add_server_commands

    add_server_commands(
        sub, "s3", "the development S3-compatible server (S3Proxy over HOME/s3/data, 127.0.0.1 only)",
        {"start": "start the server with a bucket `lake`; print the variables that point seclake at it",
         "stop": "stop the server",
         "status": "say whether the server runs; exit 1 when it does not"},
        DEFAULT_PORT, "the server's port on 127.0.0.1", home_arg, cmd_s3)


def cmd_s3(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.objectstore.server import S3Server
    from pipelines.servers import not_running

    # A running server is named by the port it listens on, not by --port's default.
    server = S3Server(Home.resolve(args.home), args.port).running()
    if args.s3_command == "stop":
        print("s3 server stopped" if server.stop() else not_running("s3 server", server.home.root, server.port,
                                                                   was=True))
        return 0
    if args.s3_command == "start":
        was = server.pid()
        server.start()
        print(f"s3 server {'already running' if was else 'started'}: {server.endpoint}, pid {server.pid()}, "
              f"bucket lake; to keep the lake there:")
        for name, value in {**server.environment(), "SECLAKE_LAKE": "s3a://lake/seclake"}.items():
            print(f"  export {name}={value}")
        print("one prefix per home: give another home its own SECLAKE_LAKE, such as s3a://lake/<name>")
        return 0
    pid = server.pid()
    print(f"s3 server running: {server.endpoint}, pid {pid}" if pid
          else not_running("s3 server", server.home.root, server.port))
    return 0 if pid else 1
