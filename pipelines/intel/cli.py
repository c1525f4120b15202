"""`seclake intel load FILE`: indicators into the lake, then a sweep of history (docs/triage.md)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

HomeArg = Callable[[argparse.ArgumentParser], None]


def add_commands(sub: argparse._SubParsersAction, home_arg: HomeArg) -> None:
    """Add `intel load` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"))
    >>> parser.parse_args(["intel", "load", "feed.csv", "--sweep-days", "30"]).sweep_days
    30
    """
    intel = sub.add_parser("intel", help="threat-intelligence indicators")
    verbs = intel.add_subparsers(dest="intel_command", required=True, metavar="COMMAND")
    load = verbs.add_parser("load", help="load a feed (plain list, CSV or STIX 2.1 bundle of IPs and domains), "
                                         "then sweep history")
    load.add_argument("file", type=Path, metavar="FILE")
    load.add_argument("--source", help="the feed's name (default: the file name)")
    load.add_argument("--valid-days", type=int, default=30, help="days an indicator stays valid (default 30)")
    load.add_argument("--sweep-days", type=int, default=90, help="days of history searched (default 90)")
    home_arg(load)
    load.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.intel.feeds import skipped_summary
    from pipelines.intel.store import check_days, load
    from pipelines.lake.registry import Lake
    from pipelines.operations.running import refuse_while_rolling_back
    from pipelines.spark import get_spark

    check_days(args.valid_days, args.sweep_days)  # before Spark starts; `load` checks too
    if not args.file.is_file():  # before Spark starts: a typo costs no JVM
        raise ValueError(f"indicator file {args.file} does not exist")
    lake = Lake(Home.resolve(args.home).existing(or_landing=True))
    refuse_while_rolling_back(lake.home, f"intel load {args.file.name}")  # before Spark starts; `load` checks too
    result = load(get_spark(app_name="seclake-intel", ui=False), lake, args.file, source=args.source,
                  valid_days=args.valid_days, sweep_days=args.sweep_days)
    print(f"loaded {result.indicators} indicator(s) from {args.file} into indicators v{result.version}",
          file=sys.stderr)
    if result.skipped:
        print(f"{args.file}: {skipped_summary(result.skipped)}", file=sys.stderr)
    if not result.rules:
        print("no rule in the rules folder looks up indicators (lookups: [indicators]): history not swept; "
              "the rules of rules/intel/ do", file=sys.stderr)
    by = f" (rules {', '.join(result.rules)})" if result.rules else ""
    print(f"sweep of the last {args.sweep_days} days: {result.alerts} new alert(s){by}")
    return 0
