"""`seclake` command line: one sub-command per user task."""
from __future__ import annotations

import argparse
import sys
import time

from pipelines.home import Home


def _home_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=None,
                        help="home folder for landing/, tables/, checkpoints/ (default: $SECLAKE_HOME or ./seclake-home)")


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.lake.read import read_table
    from pipelines.lake.sink import DeltaSink
    from pipelines.spark import get_spark

    home = Home.resolve(args.home).create()
    spark = get_spark(app_name="seclake-demo")
    started = time.monotonic()
    frame = spark.range(1000).selectExpr("id", "current_timestamp() AS ingest_time", "current_date() AS event_date")
    result = DeltaSink(home.table("demo"), app_id="demo", partition_by=["event_date"]).write_batch(frame, 0)
    rows = read_table(spark, home.table("demo")).count()
    print(f"home {home.root}: table demo version {result.version}, {rows} rows read back "
          f"({time.monotonic() - started:.1f}s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seclake", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job end to end on generated sample data")
    _home_arg(demo)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"seclake {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"seclake {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
