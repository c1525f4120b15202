"""`seclake rollback|maintain|retention`: the operator commands (docs/operations.md)."""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipelines.settings import command_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HomeArg = Callable[[argparse.ArgumentParser], None]
SettingsArg = Callable[[argparse.ArgumentParser, str], None]  # the parser, an example assignment


def add_commands(sub: argparse._SubParsersAction, home_arg: HomeArg, settings_arg: SettingsArg) -> None:
    """Add `rollback`, `maintain` and `retention` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"), lambda p, _: p.add_argument("--set", dest="overrides"))
    >>> parser.parse_args(["rollback", "silver_dns", "--to-version", "3", "--cascade"]).to_version
    3
    """
    rollback = sub.add_parser("rollback", help="restore a table to a version and rewind or reset the queries "
                                               "downstream (docs/operations.md)")
    rollback.add_argument("table", metavar="TABLE", help="table to restore, e.g. silver_dns")
    goal = rollback.add_mutually_exclusive_group(required=True)
    goal.add_argument("--to-version", type=int, metavar="N", help="Delta version to restore")
    goal.add_argument("--empty", action="store_true",
                      help="empty the table and rebuild it: the query that writes it starts again from its inputs")
    rollback.add_argument("--cascade", action="store_true",
                          help="also reset every query reading a changed table, and the tables they write")
    rollback.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    home_arg(rollback)
    rollback.set_defaults(func=cmd_rollback)

    maintain = sub.add_parser("maintain", help="OPTIMIZE, VACUUM and checkpoint the log of every table")
    maintain.add_argument("--dry-run", action="store_true", help="print files and sizes, change nothing")
    home_arg(maintain)
    settings_arg(maintain, "vacuum_retention_hours=336")
    maintain.set_defaults(func=cmd_maintain)

    retention = sub.add_parser("retention", help="delete rows and processed landing files older than each "
                                                 "layer's retention (pipelines/settings.py)")
    retention.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    home_arg(retention)
    settings_arg(retention, "retention_bronze_days=90")
    retention.set_defaults(func=cmd_retention)


def _lake(args: argparse.Namespace):
    from pipelines.home import Home
    from pipelines.lake.registry import Lake

    return Lake(Home.resolve(args.home).existing())  # a mistyped --home fails here, not as an empty home


def cmd_rollback(args: argparse.Namespace) -> int:
    from pipelines.operations.rollback import rollback
    from pipelines.terminal import Progress

    lake = _lake(args)
    with contextlib.ExitStack() as stack:
        progress: list[Progress] = []  # entered once the plan is printed: a live bar goes below it

        def show(plan) -> None:  # before anything changes: a long apply has said what it does
            for line in plan.lines():
                print(line, flush=True)
            if not args.dry_run and plan.steps():
                progress.append(stack.enter_context(Progress("rollback", total=len(plan.steps()))))

        def start_spark():
            from pipelines.spark import get_spark

            progress[0].working_on("starting Spark")
            return get_spark(app_name="seclake-rollback")

        try:
            plan = rollback(start_spark, lake, args.table, None if args.empty else args.to_version,
                            cascade=args.cascade, dry_run=args.dry_run, on_plan=show,
                            on_step=lambda step: progress[0].step(step.done()))
        except KeyboardInterrupt:
            from pipelines.operations.running import PENDING, pending_command

            if (lake.home.root / PENDING).exists():  # `seclake` says it after "interrupted"
                raise KeyboardInterrupt(f"`{pending_command(lake.home)}` finishes it") from None
            raise
    print("dry run: nothing changed" if args.dry_run else
          "done: the next `seclake run-once` reprocesses from here" if plan.steps() else "nothing changed")
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from pipelines.operations.maintain import MAINTENANCE_COLUMNS, maintain
    from pipelines.terminal import Progress, print_table

    lake, settings = _lake(args), command_settings("maintain", args.overrides)  # refused before Spark starts
    with Progress("maintain", total=len([n for n in lake.names() if lake.exists(n)])) as progress:
        def start_spark() -> SparkSession:
            from pipelines.spark import get_spark

            progress.working_on("starting Spark")
            return get_spark(app_name="seclake-maintain")

        done = maintain(None if args.dry_run else start_spark, lake, settings, dry_run=args.dry_run,
                        on_table=lambda step: progress.step(step.line()))
    print_table(MAINTENANCE_COLUMNS, [step.cells() for step in done])
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    from pipelines.operations.retention import apply_retention
    from pipelines.spark import get_spark

    lake, settings = _lake(args), command_settings("retention", args.overrides)  # refused before Spark starts
    for step in apply_retention(lambda: get_spark(app_name="seclake-retention"), lake, settings, dry_run=args.dry_run):
        print(step.line(args.dry_run))
    return 0

