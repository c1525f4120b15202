"""`seclake notify`: deliver new alerts to the webhook in settings (docs/triage.md)."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from pipelines.settings import seconds_arg

Adder = Callable[[argparse.ArgumentParser], None]
SettingsArg = Callable[[argparse.ArgumentParser, str], None]  # the parser, an example assignment


def add_commands(sub: argparse._SubParsersAction, home_arg: Adder, settings_arg: SettingsArg) -> None:
    """Add `notify` to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"), lambda p, _: p.add_argument("--set", dest="overrides"))
    >>> parser.parse_args(["notify", "--follow", "--every", "30"]).every
    30.0
    """
    notify = sub.add_parser(
        "notify", help="deliver new alerts to the webhook in settings (notify_webhook_url)",
        description="Deliver the alerts not yet delivered (at least notify_min_severity) to one webhook "
                    "(Slack-compatible JSON), each once: --set notify_webhook_url=https://... (required).")
    notify.add_argument("--follow", action="store_true", help="keep going: deliver new alerts every --every seconds")
    notify.add_argument("--retry-dead", action="store_true",
                        help="on the first pass, also send again the alerts dead-lettered before")
    notify.add_argument("--every", type=seconds_arg, default=None,
                        help="seconds between passes with --follow (default 60)")
    home_arg(notify)
    settings_arg(notify, "notify_min_severity=critical")
    notify.set_defaults(func=cmd_notify)


def cmd_notify(args: argparse.Namespace) -> int:
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.notify.delivery import Destination
    from pipelines.notify.outbox import notify
    from pipelines.settings import command_settings
    from pipelines.spark import get_spark

    if args.every is not None and not args.follow:
        raise ValueError(f"--every {args.every:g} paces --follow's passes: add --follow, or leave --every out")
    settings = command_settings("notify", args.overrides)
    if not settings.notify_webhook_url:
        raise ValueError("no destination: set notify_webhook_url (--set notify_webhook_url=https://...)")
    # Named for its role, not its URL: pointing the setting at a new webhook must not replay every old alert.
    destination = Destination("webhook", settings.notify_webhook_url, settings.notify_min_severity)
    lake = Lake(Home.resolve(args.home).existing(or_landing=True))  # before Spark starts: a typo costs no JVM
    spark = get_spark(app_name="seclake-notify", ui=False)
    retry_dead = args.retry_dead
    while True:
        outcome = notify(spark, lake, destination, max_attempts=settings.notify_max_attempts, retry_dead=retry_dead)
        # Once: with --follow, retrying every pass would hold new alerts behind the old ones' back-offs.
        retry_dead = False
        for key, error in outcome.dead:
            print(f"seclake notify: alert {key} not delivered after retries: {error} (kept in notifications; "
                  f"`seclake notify --retry-dead` sends it again)", file=sys.stderr)
        print(f"{len(outcome.delivered)} alert(s) delivered, {len(outcome.dead)} dead-lettered", flush=True)
        if not args.follow:
            return 1 if outcome.dead else 0
        time.sleep(args.every or 60.0)
