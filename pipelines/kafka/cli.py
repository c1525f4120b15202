"""`seclake kafka start|stop|status`: the development Kafka broker of a home; `seclake ship`: sensor logs
to Kafka; `seclake realtime`: the real-time alert path (docs/kafka.md)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

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
    from pipelines.servers import add_server_commands

    add_server_commands(
        sub, "kafka", "the development Kafka broker (one node, KRaft, 127.0.0.1 only)",
        {"start": "start the broker (its data under HOME/kafka); a running one is left as is",
         "stop": "stop the broker (a controlled shutdown)",
         "status": "say whether the broker runs; exit 1 when it does not",
         "lag": "messages per topic partition the ETL from Kafka (etl_kafka) has not committed yet"},
        DEFAULT_PORT, "the broker's port on 127.0.0.1", home_arg, cmd_kafka)


def add_ship_command(sub: argparse._SubParsersAction) -> None:
    """Add `ship FOLDER` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_ship_command(sub)
    >>> parser.parse_args(["ship", "/var/log/zeek/current"]).kafka
    '127.0.0.1:9092'
    """
    from pipelines.kafka.broker import DEFAULT_PORT
    from pipelines.kafka.ship import ROTATE_WAIT_S

    ship = sub.add_parser("ship", help="tail a sensor's log folder (Zeek current logs, Suricata eve.json) into "
                                       "Kafka topics, each line once; Ctrl-C/SIGTERM to stop")
    ship.add_argument("folder", type=Path, metavar="FOLDER", help="the folder the sensor writes its logs in")
    ship.add_argument("--kafka", default=f"127.0.0.1:{DEFAULT_PORT}",
                      help=f"bootstrap servers (default 127.0.0.1:{DEFAULT_PORT}, the development broker)")
    ship.add_argument("--poll", type=float, default=0.5, help="seconds between looks at the files (default 0.5)")
    ship.add_argument("--rotate-wait", type=float, default=ROTATE_WAIT_S, metavar="SECONDS",
                      help="a renamed (rotated) file is read until it has had no write for this long, then "
                           f"the new file (default {ROTATE_WAIT_S:g}: logrotate renames, the sensor writes on "
                           "until its HUP)")
    ship.set_defaults(func=cmd_ship)


def add_realtime_command(sub: argparse._SubParsersAction, home_arg: HomeArg) -> None:
    """Add `realtime` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_realtime_command(sub, lambda p: p.add_argument("--home"))
    >>> parser.parse_args(["realtime", "--kafka", "k1:9092"]).kafka
    'k1:9092'
    """
    from pipelines.realtime import ALERTS_TOPIC, CHECKPOINT_EVERY

    realtime = sub.add_parser("realtime", help=f"the real-time path: per-event IDS rules from suricata.eve to "
                                               f"{ALERTS_TOPIC}, in Spark's real-time mode; Ctrl-C/SIGTERM to stop")
    home_arg(realtime)
    realtime.add_argument("--kafka", default=None, help="bootstrap servers (default $SECLAKE_KAFKA)")
    realtime.add_argument("--checkpoint-every", default=CHECKPOINT_EVERY,
                          help=f"how often offsets are checkpointed (default {CHECKPOINT_EVERY}); "
                               "records never wait for it")
    realtime.set_defaults(func=cmd_realtime)


def cmd_realtime(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from pipelines import environment
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.realtime import ALERTS_TOPIC, realtime_rules, start
    from pipelines.spark import get_spark

    bootstrap = args.kafka or environment.kafka()
    if not bootstrap:
        raise ValueError("no Kafka to read: pass --kafka HOST:PORT or set SECLAKE_KAFKA")
    lake = Lake(Home.resolve(args.home).create())
    rules = realtime_rules()
    spark = get_spark(app_name="seclake-realtime", ui=False)
    query = start(spark, lake, bootstrap, rules, args.checkpoint_every)
    print(f"seclake realtime: {len(rules)} rule(s) ({', '.join(r.slug for r in rules)}) from suricata.eve -> "
          f"{ALERTS_TOPIC} at {bootstrap}; Ctrl-C to stop", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0) and query.isActive:
        pass
    failure = query.exception()
    query.stop()
    if failure is not None:
        raise RuntimeError(f"the real-time query failed: {str(failure).splitlines()[0]}")
    print("seclake realtime: stopped", file=sys.stderr)
    return 0


def cmd_ship(args: argparse.Namespace) -> int:
    import signal
    import threading

    from pipelines.kafka.ship import Shipper

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    shipper = Shipper(args.folder, args.kafka, args.rotate_wait)
    print(f"seclake ship: {args.folder} -> Kafka {args.kafka}; Ctrl-C to stop", flush=True)
    shipped = shipper.run(stop, args.poll)
    print(f"seclake ship: stopped, {shipped:,} line(s) shipped", flush=True)
    return 0


def cmd_kafka(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.kafka.broker import Broker
    from pipelines.servers import not_running

    # A running broker is named by the port it listens on, not by --port's default.
    broker = Broker(Home.resolve(args.home), args.port).running()
    if args.kafka_command == "start":
        was = broker.pid()
        broker.start()
        state = "already running" if was else "started"
        print(f"kafka broker {state}: bootstrap servers {broker.bootstrap}, pid {broker.pid()}, log {broker.log}")
        return 0
    if args.kafka_command == "lag":
        from pipelines import environment
        from pipelines.kafka.lag import consumer_lag
        from pipelines.terminal import print_table

        bootstrap = environment.kafka() or broker.bootstrap
        # A mistyped --home is refused, not reported as a home that has read nothing (all lag).
        lag = consumer_lag(broker.home.existing(), bootstrap)
        print_table(["topic/partition", "lag"], [[name, n] for name, n in lag.items()])
        print(f"{sum(lag.values()):,} message(s) not yet in the lake from Kafka at {bootstrap}")
        return 0
    if args.kafka_command == "stop":
        print("kafka broker stopped" if broker.stop() else not_running("kafka broker", broker.home.root, broker.port,
                                                                       was=True))
        return 0
    pid = broker.pid()
    print(f"kafka broker running: bootstrap servers {broker.bootstrap}, pid {pid}" if pid
          else not_running("kafka broker", broker.home.root, broker.port))
    return 0 if pid else 1
