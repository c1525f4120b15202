"""`seclake` command line: one sub-command per user task."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

from pipelines.home import Home
from pipelines.settings import command_settings, seconds_arg

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _home_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=None,
                        help="home folder for landing/, tables/, checkpoints/ "
                             "(default: $SECLAKE_HOME or ./seclake-home)")


def _settings_arg(parser: argparse.ArgumentParser, example: str) -> None:
    """`--set NAME=VALUE`, its help naming `example`, a setting the command reads."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help=f"override a setting, e.g. --set {example} (see pipelines/settings.py)")


def _lake(args: argparse.Namespace):
    from pipelines.lake.registry import Lake

    return Lake(Home.resolve(args.home).create())


def _use_rules(args: argparse.Namespace) -> None:
    """`--rules DIR` as `$SECLAKE_RULES` for this process and those it starts (the stream's rules
    application): every stage list and rule lookup reads the pack from there."""
    if args.rules is not None:
        os.environ["SECLAKE_RULES"] = str(args.rules.resolve())


def cmd_run_once(args: argparse.Namespace) -> int:
    from pipelines.jobs import run_once
    from pipelines.query import REPORT_COLUMNS, QueryReport
    from pipelines.spark import get_spark
    from pipelines.stages import stages
    from pipelines.terminal import Progress, print_table

    _use_rules(args)
    names = [s.name for s in stages()]
    unknown = [name for name in args.only or () if name not in names]
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: no such stage; the stages are {', '.join(names)}")
    settings = command_settings(args.command, args.overrides)  # refused before the home is made
    fresh = not Home.resolve(args.home).root.exists()
    lake = _lake(args)
    # Said, since a mistyped --home otherwise looks like a home with nothing new.
    print(f"seclake run-once: home {lake.home.root}" + (f" (new: it did not exist; sensor logs go in "
                                                        f"{lake.home.landing})" if fresh else ""), file=sys.stderr)
    with Progress("run-once", steps=[n for n in names if not args.only or n in args.only]) as progress:
        def start_spark() -> SparkSession:
            progress.working_on("starting Spark")
            spark = get_spark(app_name=f"seclake-run-once {lake.home.root}")
            progress.working_on()
            return spark

        def on_report(rep: QueryReport) -> None:
            progress.step(rep.line())
            if args.json:
                print(rep.to_json(), flush=True)

        reports = run_once(start_spark, lake, settings, only=args.only or None, on_report=on_report)
    if not args.json:
        print_table(REPORT_COLUMNS, [r.cells() for r in reports])
    return 1 if any(r.error or r.disabled for r in reports) else 0


def cmd_stream(args: argparse.Namespace) -> int:
    from pipelines.jobs import stream
    from pipelines.query import REPORT_COLUMNS
    from pipelines.spark import get_spark
    from pipelines.terminal import print_table, stamped

    _use_rules(args)
    settings = command_settings(args.command, args.overrides)  # refused before the home is made and the JVM starts
    lake = _lake(args)
    child = signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the rules application, which its parent stops
    # The home in the name: a cluster's UI lists every home's applications side by side.
    app = "seclake-rules" if args.only == "rules" else "seclake-stream"
    spark = get_spark(app_name=f"{app} {lake.home.root}", ignore_ctrl_c=child)
    name = f"seclake stream --only {args.only}" if args.only else "seclake stream"
    stop = "SIGTERM" if child else "Ctrl-C"
    print(f"{name}: home {lake.home.root}, trigger every {settings.trigger_interval}; {stop} to stop",
          file=sys.stderr)
    reports = stream(spark, lake, settings, on_report=lambda r: print(stamped(r.line()), flush=True),
                     report_every=args.report_every, only=args.only)
    print_table(REPORT_COLUMNS, [r.cells() for r in reports])
    print(f"{name}: stopped", file=sys.stderr)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from sample_data.generator import run

    return run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    return run_demo(Home.resolve(args.home), hours=args.hours, hosts=args.hosts, seed=args.seed)


class _Parser(argparse.ArgumentParser):
    """seclake's parser and, through `add_subparsers`, every command's: options are taken only by
    their whole name, and an unknown argument is named with its own command's usage.

    >>> parser = _Parser(prog="seclake run-once"); _ = parser.add_argument("--home")
    >>> parser.parse_args(["--home", "h"]).home
    'h'
    >>> parser.parse_args(["--hom", "h"])
    Traceback (most recent call last):
    SystemExit: 2
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A prefix (`--hom`) that silently meant `--home` would also change meaning when a longer
        # option is added.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """argparse's error, a missing command followed by the commands there are.

        >>> parser = _Parser(prog="seclake alerts")
        >>> verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
        >>> _ = verbs.add_parser("list"), verbs.add_parser("ack")
        >>> import contextlib, io
        >>> with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.suppress(SystemExit):
        ...     parser.parse_args([])
        >>> err.getvalue().splitlines()[-1]
        'seclake alerts: error: the following arguments are required: COMMAND (one of: list, ack)'
        """
        commands = [action for action in self._actions if isinstance(action, argparse._SubParsersAction)]
        if commands and message.endswith("required: COMMAND"):
            message += f" (one of: {', '.join(commands[0].choices)})"
        super().error(message)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        parsed, extras = super().parse_known_args(*args, **kwargs)
        if extras and not self._subparsers:
            # A command's parser; left to the top-level parser, the error would show its usage.
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    from pipelines.rules.cli import rules_dir_arg

    parser = _Parser(prog="seclake", description="Security-log lakehouse on Spark and Delta")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress of every micro-batch")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from sample_data.generator import DEFAULTS
    from sample_data.generator import add_arguments as add_generate_arguments

    demo = sub.add_parser("demo", help="generate a sample day, run the whole pipeline once, print a summary")
    _home_arg(demo)
    demo.add_argument("--hours", type=float, default=DEFAULTS["hours"],
                      help=f"simulated hours of logs (default {DEFAULTS['hours']:g})")
    demo.add_argument("--hosts", type=int, default=DEFAULTS["hosts"],
                      help=f"inventory devices (>= 5, default {DEFAULTS['hosts']})")
    demo.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                      help=f"random seed of the generator (default {DEFAULTS['seed']})")
    demo.set_defaults(func=cmd_demo)

    generate = sub.add_parser("generate", help="write realistic Zeek/Suricata logs with labelled attacks")
    add_generate_arguments(generate)
    generate.set_defaults(func=cmd_generate)

    run_once = sub.add_parser("run-once", help="process everything in landing/ once (Trigger.AvailableNow) and stop")
    _home_arg(run_once)
    _settings_arg(run_once, "input_ends_at=2026-11-20T02:00Z")
    run_once.add_argument("--only", action="append", metavar="STAGE",
                          help="run only this stage (repeatable), named as run-once's table names it "
                               "(etl, enriched_dns, rule_dns_tunneling, ...)")
    run_once.add_argument("--json", action="store_true",
                          help="print each stage's report on stdout as one line of JSON when the stage ends, "
                               "instead of the table at the end (for scripts; progress stays on stderr)")
    rules_dir_arg(run_once)
    run_once.set_defaults(func=cmd_run_once)

    stream = sub.add_parser("stream", help="run every query continuously until Ctrl-C/SIGTERM")
    _home_arg(stream)
    _settings_arg(stream, "trigger_interval='5 seconds'")
    stream.add_argument("--report-every", type=seconds_arg, default=60.0,
                        help="seconds between progress lines (default 60)")
    stream.add_argument("--only", choices=("tables", "rules"), default=None,
                        help="run one part in this process: the ETL and attribution, or the rules (by default "
                             "the rules run in a Spark application of their own that this command starts)")
    rules_dir_arg(stream)
    stream.set_defaults(func=cmd_stream)

    from pipelines.sql.commands import add_commands as add_sql_commands

    add_sql_commands(sub, _home_arg)

    from pipelines.rules.cli import add_commands as add_rules_commands

    add_rules_commands(sub, _home_arg)

    from pipelines.triage.cli import add_commands as add_triage_commands

    add_triage_commands(sub, _home_arg)

    from pipelines.notify.cli import add_commands as add_notify_commands

    add_notify_commands(sub, _home_arg, _settings_arg)

    from pipelines.intel.cli import add_commands as add_intel_commands

    add_intel_commands(sub, _home_arg)

    from pipelines.kafka.cli import add_commands as add_kafka_commands
    from pipelines.kafka.cli import add_realtime_command, add_ship_command

    add_kafka_commands(sub, _home_arg)
    add_ship_command(sub)
    add_realtime_command(sub, _home_arg)

    from pipelines.objectstore.cli import add_commands as add_s3_commands

    add_s3_commands(sub, _home_arg)
    _add_cluster_commands(sub)

    from pipelines.operations.cli import add_commands as add_operations_commands

    add_operations_commands(sub, _home_arg, _settings_arg)
    return parser


def _add_cluster_commands(sub: argparse._SubParsersAction) -> None:
    from pipelines.cluster import DEFAULT_PORT
    from pipelines.servers import add_server_commands

    verbs = add_server_commands(
        sub, "cluster", "a Spark standalone cluster on this machine (a master and workers)",
        {"start": "start the master and the workers; print SECLAKE_SPARK_MASTER for them",
         "stop": "stop the workers and the master",
         "status": "say how many workers are alive; exit 1 when the master does not run or no worker is alive"},
        DEFAULT_PORT, "the master's port", _home_arg, cmd_cluster)
    for parser in verbs.values():
        parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
        parser.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
        parser.add_argument("--memory", default="3g", help="memory per worker (default 3g)")


def cmd_cluster(args: argparse.Namespace) -> int:
    from pipelines.cluster import LocalCluster
    from pipelines.servers import not_running

    # A running master is named by the port it listens on, not by --port's default.
    cluster = LocalCluster(Home.resolve(args.home), args.port, args.workers, args.cores, args.memory).running()
    if args.cluster_command == "stop":
        print("spark cluster stopped" if cluster.stop() else not_running("spark cluster", cluster.home.root,
                                                                         cluster.port, was=True))
        return 0
    if args.cluster_command == "start":
        was = cluster.pids()
        cluster.start()
        state = "already running" if cluster.pids() == was else "up"  # a missing worker started: up
        print(f"spark cluster {state}: {cluster.alive_workers()} worker(s), master UI {cluster.ui_url}, logs in "
              f"{cluster.folder}; to run on it:\n  export SECLAKE_SPARK_MASTER={cluster.master_url}")
        return 0
    if not cluster.pids():
        print(not_running("spark cluster", cluster.home.root, cluster.port))
        return 1
    alive = cluster.alive_workers()
    print(f"spark cluster running: {cluster.master_url}, {alive} worker(s) alive, master UI {cluster.ui_url}"
          + ("" if alive else ": no application can run (seclake cluster start starts the missing workers)"))
    return 0 if alive else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # UTC as `terminal.stamped` writes it: a stream's log and progress lines interleave.
    said = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%SZ")
    said.converter = time.gmtime
    handler = logging.StreamHandler()
    handler.setFormatter(said)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader of the output went away (`seclake alerts list | head`): not an error. Python
        # would otherwise fail again flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, RuntimeError, FileNotFoundError, OverflowError) as exc:
        print(f"seclake {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the object store's clients (pyarrow, delta-rs): endpoint, credentials
        from pipelines.objectstore.path import store_error

        print(f"seclake {args.command}: {store_error(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        # A Spark error's message carries its plan and stack: its first line says it. (No import
        # of pyspark here: commands that start no JVM do not load it.)
        errors, py4j = sys.modules.get("pyspark.errors"), sys.modules.get("py4j.protocol")
        if not ((errors and isinstance(exc, errors.PySparkException))
                or (py4j and isinstance(exc, py4j.Py4JError))):
            raise
        from pipelines.query import error_summary

        print(f"seclake {args.command}: {error_summary(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # A command that leaves work half done says what finishes it (`KeyboardInterrupt(what)`).
        print(f"seclake {args.command}: interrupted" + (f"; {exc}" if str(exc) else ""), file=sys.stderr)
        return 130


def run() -> None:
    """The `seclake` command: `main`, then exit with its code.

    A command that read a table through delta-rs and started no JVM leaves without the
    interpreter's teardown, where delta-rs's runtime threads abort the process at random
    ("terminate called without an active exception", exit 134: 5 of 30 `rules status` runs;
    delta-rs issue 2184) after the command's work and output are done.
    """
    code = main()
    context = sys.modules.get("pyspark.core.context")
    if "deltalake" in sys.modules and (context is None or context.SparkContext._gateway is None):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
