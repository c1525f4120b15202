"""Reading indicator feeds (no Spark): plain lists and CSV as abuse.ch and similar feeds publish them.

- **Plain list**: one indicator per line; `#` starts a comment.
- **CSV** with a header naming the indicator column: `ioc_value` (ThreatFox), `dst_ip` (Feodo
  Tracker), `url` (URLhaus: the URL's host is the indicator), or `indicator`, `value`, `domain`,
  `ip`. abuse.ch's leading `#` comment lines are skipped, and the header may be one of them.

Each value is an IPv4/IPv6 address or a domain name (lower-cased, trailing dot removed); anything
else is counted as skipped, never silently kept.
"""
from __future__ import annotations

import csv
import io
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

IP, DOMAIN = "ip", "domain"
CSV_COLUMNS = ("ioc_value", "dst_ip", "url", "indicator", "value", "domain", "ip")
_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class Feed:
    """The indicators of one file: (type, value) pairs in file order, without repeats."""

    indicators: list[tuple[str, str]]
    skipped: list[str] = field(default_factory=list)


def classify(text: str) -> tuple[str, str] | None:
    """(type, normalised value) of an indicator, or None when it is neither an IP nor a domain.

    >>> classify("Evil.Example.COM."), classify("203.0.113.9"), classify("http://x.test/a"), classify("a b")
    (('domain', 'evil.example.com'), ('ip', '203.0.113.9'), ('domain', 'x.test'), None)
    """
    value = text.strip().strip('"').strip()
    if "://" in value:
        value = urlsplit(value).hostname or ""
    if ":" in value and value.count(":") == 1:  # host:port, as ThreatFox writes ip:port
        value = value.split(":", 1)[0]
    try:
        return IP, str(ipaddress.ip_address(value))
    except ValueError:
        pass
    value = value.lower().rstrip(".")
    return (DOMAIN, value) if _DOMAIN.match(value) else None


def parse_feed(text: str) -> Feed:
    """The indicators in a feed's text: CSV when a header names an indicator column, else a list.

    >>> parse_feed("# abuse.ch\\nevil.test\\n198.51.100.7\\nnot an indicator\\n").indicators
    [('domain', 'evil.test'), ('ip', '198.51.100.7')]
    >>> parse_feed('# "first_seen_utc","dst_ip","dst_port"\\n"2026-11-01","192.0.2.4","443"\\n').indicators
    [('ip', '192.0.2.4')]
    """
    lines = text.splitlines()
    header_at, column = _csv_header(lines)
    found: dict[tuple[str, str], None] = {}
    skipped: list[str] = []
    if column is None:
        values = [line.split("#", 1)[0].strip() for line in lines]
        values = [v for v in values if v]
    else:
        body = [line for line in lines[header_at + 1:] if line.strip() and not line.lstrip().startswith("#")]
        header = lines[header_at].lstrip("#").strip()
        values = [row.get(column, "") for row in csv.DictReader(io.StringIO("\n".join([header, *body])),
                                                                skipinitialspace=True)]
    for value in values:
        indicator = classify(value)
        if indicator is None:
            skipped.append(value)
        else:
            found[indicator] = None
    return Feed(list(found), skipped)


def _csv_header(lines: list[str]) -> tuple[int, str | None]:
    """(line index, indicator column) of a CSV header among the first lines, or (-1, None)."""
    for index, line in enumerate(lines[:50]):
        names = [n.strip().strip('"').lower() for n in line.lstrip("#").split(",")]
        if len(names) > 1:
            for column in CSV_COLUMNS:
                if column in names:
                    return index, line.lstrip("#").strip().split(",")[names.index(column)].strip().strip('"')
    return -1, None


def read_feed(path: Path) -> Feed:
    """`parse_feed` of a file; ValueError names a missing file or one without any indicator."""
    if not path.is_file():
        raise ValueError(f"indicator file {path} does not exist")
    feed = parse_feed(path.read_text(errors="replace"))
    if not feed.indicators:
        raise ValueError(f"{path}: no IP address or domain found ({len(feed.skipped)} line(s) skipped)")
    return feed
