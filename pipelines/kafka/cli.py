"""`seclake kafka start|stop|status`: the development Kafka broker of a home (docs/kafka.md)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

HomeArg = Callable[[argparse.ArgumentParser], None]


def add_commands(sub: argparse._SubParsersAction, home_arg: HomeArg) -> None:
    """Add `kafka start|stop|status` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"))
    >>> args = parser.parse_args(["kafka", "start", "--port", "19092"])
    >>> args.kafka_command, args.port
    ('start', 19092)
    """
    from pipelines.kafka.broker import DEFAULT_PORT

    kafka = sub.add_parser("kafka", help="the development Kafka broker (one node, KRaft, 127.0.0.1 only)")
    verbs = kafka.add_subparsers(dest="kafka_command", required=True)
    for verb, text in (("start", "start the broker (its data under HOME/kafka); a running one is left as is"),
                       ("stop", "stop the broker (a controlled shutdown)"),
                       ("status", "say whether the broker runs; exit 1 when it does not")):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                            help=f"the broker's port on 127.0.0.1 (default {DEFAULT_PORT})")
        home_arg(parser)
        parser.set_defaults(func=cmd_kafka)


def cmd_kafka(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.kafka.broker import Broker

    broker = Broker(Home.resolve(args.home), args.port)
    if args.kafka_command == "start":
        was = broker.pid()
        broker.start()
        state = "already running" if was else "started"
        print(f"kafka broker {state}: bootstrap servers {broker.bootstrap}, pid {broker.pid()}, log {broker.log}")
        return 0
    if args.kafka_command == "stop":
        print("kafka broker stopped" if broker.stop() else "kafka broker was not running")
        return 0
    pid = broker.pid()
    print(f"kafka broker running: bootstrap servers {broker.bootstrap}, pid {pid}" if pid
          else "kafka broker not running")
    return 0 if pid else 1
