"""`seclake alerts list|incidents|show|ack|close|reopen|assign` and `seclake suppress add|list|expire`:
the analyst's queue (docs/triage.md)."""
from __future__ import annotations

import argparse
import difflib
import getpass
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pipelines.rules.cli import find_rule, rules_dir_arg, rules_folder
from pipelines.rules.pack import rule_names
from pipelines.rules.spec import RuleError, is_rule_id
from pipelines.rules.tables import PLATFORM_RULE_IDS, PLATFORM_RULE_PREFIX
from pipelines.settings import rows_arg, utc_instant

HomeArg = Callable[[argparse.ArgumentParser], None]
LIST_COLUMNS = ["alert", "severity", "rule", "window start (UTC)", "src_ip", "device", "status", "assignee",
                "suppressed by"]


def add_commands(sub: argparse._SubParsersAction, home_arg: HomeArg) -> None:
    """Add `alerts` and `suppress` and their sub-commands to the `seclake` command line.

    >>> parser = argparse.ArgumentParser(prog="seclake"); sub = parser.add_subparsers(dest="command")
    >>> add_commands(sub, lambda p: p.add_argument("--home"))
    >>> parser.parse_args(["alerts", "ack", "3f2a9c1d", "--note", "known scanner"]).note
    'known scanner'
    >>> parser.parse_args(["alerts", "list", "--rule", "dga_nxdomain_burst", "--severity", "high"]).severity
    'high'
    """
    from pipelines.schemas import SEVERITIES

    alerts = sub.add_parser("alerts", help="the alert queue: list, show, acknowledge, close, assign")
    verbs = alerts.add_subparsers(dest="alerts_command", required=True, metavar="COMMAND")

    listing = verbs.add_parser("list", help="alerts to look at, most severe and newest first")
    listing.add_argument("--status", action="append", default=[], metavar="STATUS",
                         help="open, acknowledged, closed or all (repeatable; default: open and acknowledged)")
    listing.add_argument("--rule", help="a rule's file name or id, e.g. dga_nxdomain_burst (seclake rules list)")
    listing.add_argument("--severity", choices=SEVERITIES, help=f"{', '.join(SEVERITIES[:-1])} or {SEVERITIES[-1]}")
    listing.add_argument("--host", help="an IP, MAC or device name")
    listing.add_argument("--since", help="window start at or after this UTC time, e.g. 2026-11-20T06:00")
    listing.add_argument("--limit", type=rows_arg(1), default=50, help="at most this many rows (default 50)")
    listing.add_argument("--suppressed", action="store_true", help="include suppressed alerts")
    home_arg(listing)
    rules_dir_arg(listing)
    listing.set_defaults(func=cmd_list)

    grouped = verbs.add_parser("incidents", help="alerts grouped per host in time, with a risk score")
    grouped.add_argument("--span", type=float, default=24.0, metavar="HOURS",
                         help="an alert within this many hours of the one before joins its incident (default 24)")
    grouped.add_argument("--min-risk", type=int, default=0, help="only incidents at least this risky")
    grouped.add_argument("--all", action="store_true", help="also incidents whose alerts are all closed")
    grouped.add_argument("--limit", type=rows_arg(1), default=50, help="at most this many rows (default 50)")
    home_arg(grouped)
    rules_dir_arg(grouped)
    grouped.set_defaults(func=cmd_incidents)

    show = verbs.add_parser("show", help="one alert with its evidence, state and notes")
    show.add_argument("alert", metavar="ALERT_ID", help="an alert id or a unique prefix (8+ characters)")
    home_arg(show)
    show.set_defaults(func=cmd_show)

    for verb, status, text in (("ack", "acknowledged", "acknowledge alerts (someone is on it)"),
                               ("close", "closed", "close alerts"), ("reopen", "open", "reopen closed alerts"),
                               ("assign", None, "assign alerts to someone")):
        change = verbs.add_parser(verb, help=text)
        change.add_argument("alerts", nargs="+", metavar="ALERT_ID", help="alert ids or unique prefixes")
        if verb == "assign":
            change.add_argument("--to", required=True, metavar="USER", help="who takes them")
        change.add_argument("--note", help="a note kept with each alert")
        change.add_argument("--by", default=None, help="who makes the change (default: the login name)")
        home_arg(change)
        change.set_defaults(func=cmd_change, status=status)


    suppress = sub.add_parser("suppress", help="known-benign findings as data: add, list, expire")
    actions = suppress.add_subparsers(dest="suppress_command", required=True, metavar="COMMAND")
    adding = actions.add_parser("add", help="mark alerts of a rule (or all rules) on an entity as suppressed")
    scope = adding.add_mutually_exclusive_group(required=True)
    scope.add_argument("--rule", help="the rule it applies to: its file name or id (seclake rules list)")
    scope.add_argument("--all-rules", action="store_true", help="apply to every rule")
    entity = adding.add_mutually_exclusive_group(required=True)
    for kind in ("ip", "cidr", "mac", "device", "domain"):
        entity.add_argument(f"--{kind}", metavar=kind.upper())
    adding.add_argument("--reason", required=True, help="why it is benign (kept with it)")
    adding.add_argument("--expires", help="UTC time it ends, e.g. 2026-12-31T18:00 (a date alone: its 00:00; "
                                          "default: never)")
    adding.add_argument("--by", default=None, help="author (default: the login name)")
    home_arg(adding)
    rules_dir_arg(adding)
    adding.set_defaults(func=cmd_suppress_add)
    listing = actions.add_parser("list", help="every suppression, active or not")
    home_arg(listing)
    rules_dir_arg(listing)
    listing.set_defaults(func=cmd_suppress_list)
    ending = actions.add_parser("expire", help="end a suppression now")
    ending.add_argument("suppression", metavar="ID")
    home_arg(ending)
    ending.set_defaults(func=cmd_suppress_expire)


def _spark_and_lake(args: argparse.Namespace):
    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.spark import get_spark
    from pipelines.terminal import Progress

    lake = Lake(Home.resolve(args.home).existing(or_landing=True))  # before Spark starts: a typo costs no JVM
    with Progress(f"seclake {args.command}") as progress:  # most of a triage command's 10-17 s
        progress.working_on("starting Spark")
        return get_spark(app_name="seclake-alerts", ui=False), lake


def rule_id(name: str, rules_dir: Path) -> str:
    """The id of the rule `name` names by file name (as `seclake rules list` shows it) or id;
    a platform alert's rule id (`seclake.*`) as given. Alerts and suppressions hold ids.

    >>> from pipelines.rules.pack import RULES_DIR
    >>> rule_id("internal_port_scan", RULES_DIR) == rule_id("af17274f-539a-4731-afe7-60af887fc10e", RULES_DIR)
    True
    >>> rule_id("port_scan", RULES_DIR)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: no rule 'port_scan' in ...; did you mean 'internal_port_scan'? rules: c2_beaconing, ...
    >>> rule_id("seclake.rule_disabld", RULES_DIR)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: no platform rule 'seclake.rule_disabld'; did you mean 'seclake.rule_disabled'? platform rules: ...
    """
    if name.startswith(PLATFORM_RULE_PREFIX):
        if name in PLATFORM_RULE_IDS:
            return name
        close = difflib.get_close_matches(name, PLATFORM_RULE_IDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"no platform rule {name!r}; {hint}platform rules: {', '.join(PLATFORM_RULE_IDS)}")
    try:
        return find_rule(name, rules_dir).id
    except RuleError:
        # A rule file being edited still names the alerts its earlier text raised.
        by_name = {slug: id_ for id_, slug in rule_names(rules_dir).items()}
        if name in by_name:
            return by_name[name]
        raise


def _listed_rule(name: str, rules_dir: Path) -> str:
    """`rule_id`; or `name` itself when it is a rule id no rule of `rules_dir` has (a rule of another
    folder, or one since removed: its alerts keep its id, which `alerts list` shows for it).

    >>> from pipelines.rules.pack import RULES_DIR
    >>> _listed_rule("0b0c9a52-3c1e-4d8e-9f0a-5c3d2a1b7e11", RULES_DIR)
    '0b0c9a52-3c1e-4d8e-9f0a-5c3d2a1b7e11'
    """
    try:
        return rule_id(name, rules_dir)
    except ValueError:
        if is_rule_id(name):
            return name
        raise


def _who(by: str | None) -> str:
    """`--by`, else the login name; ValueError when neither says who (a container with no user name).
    A blank `--by` is refused by the change or suppression it signs."""
    if by is not None:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no LOGNAME/USER and no passwd entry for the uid
        raise ValueError("who is making this change? give --by NAME (no login name here)") from None


def _utc_time(text: str | None, flag: str) -> datetime | None:
    if not text:
        return None
    try:
        return utc_instant(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected an ISO time such as 2026-11-20T06:00") from None


def cmd_suppress_add(args: argparse.Namespace) -> int:
    from pipelines.triage.suppressions import MATCH_TYPES, Suppression, add

    kind = next(k for k in MATCH_TYPES if getattr(args, k) is not None)
    # Stored by id, which is what `mark` compares with each alert's rule_id.
    rule = rule_id(args.rule, rules_folder(args)) if args.rule else None
    expires = _utc_time(args.expires, "--expires")
    if expires is not None and expires <= datetime.now(timezone.utc):
        raise ValueError(f"--expires {args.expires}: that is past ({expires:%Y-%m-%d %H:%M} UTC); "
                         "a suppression that has already ended would mark nothing")
    suppression = Suppression(kind, getattr(args, kind), args.reason, rule_id=rule, expires_at=expires,
                              author=_who(args.by))
    spark, lake = _spark_and_lake(args)
    ident, new = add(spark, lake, suppression)
    named = f"{rule_names(rules_folder(args)).get(rule, rule)} ({rule})" if rule else "every rule"
    print(f"suppression {ident}{'' if new else ' (already in force, not added again)'}: {named} on {kind} "
          f"{suppression.stored_value()}{f' until {expires:%Y-%m-%d %H:%M} UTC' if expires else ''}")
    if new:
        print("it marks alerts written from now on; alerts already in the queue stay there (seclake alerts close)"
              + ("" if expires else f"; with no --expires it lasts until `seclake suppress expire {ident}`"),
              file=sys.stderr)
    return 0


def cmd_suppress_list(args: argparse.Namespace) -> int:
    from pipelines.terminal import print_table
    from pipelines.triage.suppressions import SUPPRESSIONS_TABLE

    spark, lake = _spark_and_lake(args)
    rows = lake.read(spark, SUPPRESSIONS_TABLE).orderBy("created_at").collect() if lake.exists(
        SUPPRESSIONS_TABLE) else []
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    names = rule_names(rules_folder(args))
    # Before rules were looked up by name, `--rule NAME` stored the name, which no alert's rule_id equals.
    by_name = {r.suppression_id for r in rows if r.rule_id in set(names.values())}
    print_table(["id", "rule", "match", "reason", "by", "created (UTC)", "state"],
                [(r.suppression_id, names.get(r.rule_id, r.rule_id) if r.rule_id else "(all)",
                  f"{r.match_type} {r.match_value}", r.reason, r.author, f"{r.created_at:%Y-%m-%d %H:%M}",
                  "expired" if r.expired_at or (r.expires_at and r.expires_at <= now)
                  else "matches nothing (saved by rule name): expire it and add it again"
                  if r.suppression_id in by_name
                  else f"until {r.expires_at:%Y-%m-%d %H:%M}" if r.expires_at else "active") for r in rows])
    return 0


def cmd_suppress_expire(args: argparse.Namespace) -> int:
    from pipelines.triage.suppressions import expire

    spark, lake = _spark_and_lake(args)
    version = expire(spark, lake, args.suppression)
    if isinstance(version, datetime):
        print(f"suppression {args.suppression} already ended at {version:%Y-%m-%d %H:%M} UTC: nothing written")
    else:
        print(f"suppression {args.suppression} expired (suppressions v{version}); alerts written from now on "
              "are no longer marked by it")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from pipelines.terminal import print_table
    from pipelines.triage.store import ACKNOWLEDGED, MIN_PREFIX, OPEN, STATUSES, queue

    unknown = [s for s in args.status if s not in (*STATUSES, "all")]
    if unknown:  # before Spark starts
        raise ValueError(f"--status {', '.join(unknown)}: expected {', '.join(STATUSES)} or all")
    statuses = tuple(STATUSES) if "all" in args.status else tuple(args.status) or (OPEN, ACKNOWLEDGED)
    rule = _listed_rule(args.rule, rules_folder(args)) if args.rule else None  # refused before Spark starts
    names = rule_names(rules_folder(args))
    spark, lake = _spark_and_lake(args)
    rows = queue(spark, lake, statuses, rule=rule, severity=args.severity, host=args.host,
                 since=_utc_time(args.since, "--since"), suppressed=args.suppressed).limit(args.limit).collect()
    print_table(LIST_COLUMNS, [(r.alert_id[:MIN_PREFIX + 4], r.severity, names.get(r.rule_id, r.rule_id),
                                f"{r.window_start:%Y-%m-%d %H:%M}" if r.window_start else None,
                                r.src_ip, r.device, r.status, r.assignee, r.suppressed_by) for r in rows])
    print(f"{len(rows)} alert(s){' (--limit reached)' if len(rows) == args.limit else ''}", file=sys.stderr)
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from pyspark.sql import functions as F

    from pipelines.settings import MAX_DAYS
    from pipelines.terminal import print_table
    from pipelines.triage.incidents import incidents

    if not 0 < args.span <= 24 * MAX_DAYS:  # NaN and inf too
        raise ValueError(f"--span {args.span:g}: give a positive number of hours, at most {24 * MAX_DAYS}")
    spark, lake = _spark_and_lake(args)
    frame = incidents(spark, lake, timedelta(hours=args.span)).where(F.col("risk") >= args.min_risk)
    if not args.all:
        frame = frame.where(F.col("open_alerts") > 0)
    rows = frame.limit(args.limit).collect()
    names = rule_names(rules_folder(args))
    print_table(["entity", "risk", "top severity", "alerts", "open", "first (UTC)", "last (UTC)", "rules"],
                [(r.entity, r.risk, r.max_severity, r.alerts, r.open_alerts, f"{r.first_seen:%Y-%m-%d %H:%M}",
                  f"{r.last_seen:%Y-%m-%d %H:%M}", ", ".join(sorted(names.get(i, i) for i in r.rules))) for r in rows])
    print(f"{len(rows)} incident(s){' (--limit reached)' if len(rows) == args.limit else ''}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from pipelines.triage.store import resolve_ids, triaged_alerts

    spark, lake = _spark_and_lake(args)
    alert_id = resolve_ids(spark, lake, [args.alert])[0]
    row = triaged_alerts(spark, lake).where(F.col("alert_id") == alert_id).first()
    if row is None:  # resolved a moment ago: only a concurrent rollback of alerts removes it
        raise ValueError(f"alert {alert_id} is no longer in the alerts table")
    fields = row.asDict()
    notes = fields.pop("notes") or []
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        print(f"{key:<{width}}  {', '.join(value) if isinstance(value, list) else '-' if value is None else value}")
    for note in notes:
        print(f"note  {note.at:%Y-%m-%d %H:%M} {note.by}: {note.text}")
    return 0


def _ids(alert_ids: list[str], shown: int = 3) -> str:
    """Alerts named as `alerts list` shows them, a long list counted.

    >>> _ids(["a" * 32]), _ids([str(n) * 32 for n in range(5)])
    ('1 alert (aaaaaaaaaaaa)', '5 alerts (000000000000, 111111111111, 222222222222, ...)')
    """
    from pipelines.triage.store import MIN_PREFIX

    named = ", ".join(i[:MIN_PREFIX + 4] for i in alert_ids[:shown]) + (", ..." if len(alert_ids) > shown else "")
    return f"{len(alert_ids)} alert{'' if len(alert_ids) == 1 else 's'} ({named})"


def cmd_change(args: argparse.Namespace) -> int:
    from pipelines.triage.store import Change, apply

    change = Change(status=args.status, assignee=getattr(args, "to", None), note=args.note,
                    by=_who(args.by))
    spark, lake = _spark_and_lake(args)
    applied = apply(spark, lake, args.alerts, change)
    what = f"status {change.status}" if change.status else f"assigned to {change.assignee}"
    already = f"{_ids(applied.unchanged)} already {what.removeprefix('status ')}"
    if applied.version is None:
        print(f"{already}: nothing written")
    else:
        print(f"{_ids(applied.changed)}: {what}{' with a note' if change.note else ''} "
              f"(alert_triage v{applied.version})" + (f"; {already}" if applied.unchanged else ""))
    return 0
