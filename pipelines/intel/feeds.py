"""Reading indicator feeds (no Spark): plain lists, CSV as abuse.ch publishes it, and STIX 2.1 bundles.

- **Plain list**: one indicator per line; `#` or `;` starts a comment (Spamhaus DROP's
  `1.10.16.0/20 ; SBL256894`).
- **CSV** with a header naming the indicator column: `ioc_value` (ThreatFox), `dst_ip` (Feodo
  Tracker), `url` (URLhaus: the URL's host is the indicator), or `indicator`, `value`, `domain`,
  `ip`. abuse.ch's leading `#` comment lines are skipped, and the header may be one of them.
- **STIX 2.1** bundle (JSON, as TAXII servers and MISP export it), read with the OASIS `stix2`
  library: each `indicator` with a STIX pattern gives the values its pattern compares for
  equality on `domain-name:value`, `ipv4-addr:value`, `ipv6-addr:value` or `url:value` (the URL's
  host), and the ranges an address is compared to with `ISSUBSET`. Other comparisons (file
  hashes, ports), revoked indicators and those whose `valid_until` has passed are skipped and
  reported. A pattern that ANDs an address with other conditions counts as the address alone:
  matching is by address, range or domain only.

Each value is an IPv4/IPv6 address, an IPv4 range in CIDR notation (`/8` or longer; `/32` is
the address) or a domain name (lower-cased, trailing dot removed, an internationalised name in
its `xn--` form as DNS carries it); anything else is skipped and named in the load's report (an
IPv6 range or a range wider than `/8` with that reason), never silently kept.
"""
from __future__ import annotations

import csv
import io
import ipaddress
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

IP, CIDR, DOMAIN = "ip", "cidr", "domain"
WIDEST_RANGE = 8
"""The shortest prefix of a range matched: rules/intel/threat_intel_ip.sql looks a range up by its
first octet (a join needs an equality), so a range must lie within one. Feeds list /8 and longer
(Spamhaus DROP, firewall block lists); a wider range is skipped with this reason."""
CSV_COLUMNS = ("ioc_value", "dst_ip", "url", "indicator", "value", "domain", "ip")
_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class Feed:
    """The indicators of one file: (type, value) pairs in file order, without repeats."""

    indicators: list[tuple[str, str]]
    skipped: list[str] = field(default_factory=list)


def classify(text: str) -> tuple[str, str] | None:
    """(type, normalised value) of an indicator, or None when it is neither an IP, an IPv4 range
    nor a domain.

    >>> classify("Evil.Example.COM."), classify("203.0.113.9"), classify("http://x.test/a"), classify("a b")
    (('domain', 'evil.example.com'), ('ip', '203.0.113.9'), ('domain', 'x.test'), None)
    >>> classify("http://[bad") is None
    True
    >>> classify("Bücher.example")
    ('domain', 'xn--bcher-kva.example')
    >>> classify("198.51.100.7/24"), classify("198.51.100.7/32"), classify("10.0.0.0/7"), classify("2001:db8::/32")
    (('cidr', '198.51.100.0/24'), ('ip', '198.51.100.7'), None, None)
    """
    value = text.strip().strip('"').strip()
    if "/" in value and "://" not in value:
        return _range(value)
    if "://" in value:
        try:
            value = urlsplit(value).hostname or ""
        except ValueError:  # "http://[bad": not a URL
            return None
    if ":" in value and value.count(":") == 1:  # host:port, as ThreatFox writes ip:port
        value = value.split(":", 1)[0]
    try:
        return IP, str(ipaddress.ip_address(value))
    except ValueError:
        pass
    value = value.lower().rstrip(".")
    if not value.isascii():  # DNS logs carry an internationalised name in its xn-- (punycode) form
        try:
            value = value.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    return (DOMAIN, value) if _DOMAIN.match(value) else None


def parse_feed(text: str) -> Feed:
    """The indicators in a feed's text: CSV when a header names an indicator column, else a list.

    >>> parse_feed("# abuse.ch\\nevil.test\\n198.51.100.7\\nnot an indicator\\n").indicators
    [('domain', 'evil.test'), ('ip', '198.51.100.7')]
    >>> parse_feed("; Spamhaus DROP\\n1.10.16.0/20 ; SBL256894\\n").indicators
    [('cidr', '1.10.16.0/20')]
    >>> feed = parse_feed('# "first_seen_utc","dst_ip"\\n"2026-11-01","192.0.2.4"\\n"2026-11-02"\\n')  # a short row
    >>> feed.indicators, len(feed.skipped)
    ([('ip', '192.0.2.4')], 1)

    Every indicator column of a CSV is read, a row's empty cells left out:

    >>> parse_feed("domain,ip\\nevil.test,203.0.113.9\\n,198.51.100.7\\n").indicators
    [('domain', 'evil.test'), ('ip', '203.0.113.9'), ('ip', '198.51.100.7')]
    """
    if text.lstrip().startswith("{"):
        return parse_stix(text)
    lines = text.splitlines()
    header_at, columns = _csv_header(lines)
    found: dict[tuple[str, str], None] = {}
    skipped: list[str] = []
    if not columns:
        values = [line.split("#", 1)[0].split(";", 1)[0].strip() for line in lines]
        values = [v for v in values if v]
    else:
        body = [line for line in lines[header_at + 1:] if line.strip() and not line.lstrip().startswith("#")]
        header = lines[header_at].lstrip("#").strip()
        values = []
        for row in csv.DictReader(io.StringIO("\n".join([header, *body])), skipinitialspace=True):
            # A short (truncated) row has None for its missing columns: with no value, skipped as empty.
            values += [v for c in columns if (v := row.get(c))] or [""]
    for value in values:
        indicator = classify(value)
        if indicator is None:
            skipped.append(_why_skipped(value))
        else:
            found[indicator] = None
    return Feed(list(found), skipped)


def skipped_summary(skipped: list[str] | tuple[str, ...], shown: int = 3) -> str:
    """The skipped entries of a feed in one line: how many, and the first few by name.

    >>> skipped_summary(["'a b'", "'10.0.0.0/7': a range wider than /8"])
    "2 entries not loaded: 'a b'; '10.0.0.0/7': a range wider than /8"
    >>> skipped_summary(["'x'"] * 5, shown=2)
    "5 entries not loaded: 'x'; 'x'; and 3 more"
    """
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return f"{len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} not loaded: {'; '.join(skipped[:shown])}{more}"


def _range(value: str) -> tuple[str, str] | None:
    """An address range as an indicator: an IPv4 range of /8 or longer, a /32 (or /128) as its
    address; None for anything else (`_why_skipped` says why)."""
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None
    if network.num_addresses == 1:
        return IP, str(network.network_address)
    if network.version != 4 or network.prefixlen < WIDEST_RANGE:
        return None
    return CIDR, str(network)


def _why_skipped(value: str) -> str:
    """A skipped value as the load's report names it, with the reason when one is recognisable.

    >>> _why_skipped("2001:db8::/32"), _why_skipped("10.0.0.0/7"), _why_skipped("xn--")
    ("'2001:db8::/32': an IPv6 range (IPv6 is matched by address)", "'10.0.0.0/7': a range wider than /8", "'xn--'")
    """
    try:
        network = ipaddress.ip_network(value.strip().strip('"'), strict=False)
    except ValueError:
        return repr(value)
    if network.version == 6:
        return f"{value!r}: an IPv6 range (IPv6 is matched by address)"
    return f"{value!r}: a range wider than /{WIDEST_RANGE}"


STIX_VALUE_TYPES = ("domain-name", "ipv4-addr", "ipv6-addr", "url")


def parse_stix(text: str, now: datetime | None = None) -> Feed:
    """The domains and IPs of a STIX 2.1 bundle's indicators (see the module's docstring).

    >>> bundle = {"type": "bundle", "id": "bundle--0d6b1c5e-5f3a-4b8e-9a53-3c1e2f0a9b11", "objects": [
    ...     {"type": "indicator", "spec_version": "2.1", "id": "indicator--8e2e2d2b-17d4-4cbf-938f-98ee46b3cd3f",
    ...      "created": "2026-11-01T00:00:00Z", "modified": "2026-11-01T00:00:00Z", "pattern_type": "stix",
    ...      "valid_from": "2026-11-01T00:00:00Z",
    ...      "pattern": "[domain-name:value = 'Evil.test'] OR [ipv4-addr:value = '203.0.113.9']"}]}
    >>> import json; parse_stix(json.dumps(bundle)).indicators
    [('domain', 'evil.test'), ('ip', '203.0.113.9')]
    """
    import stix2
    from stix2patterns.v21.pattern import Pattern

    at = now or datetime.now(timezone.utc)
    try:
        parsed = stix2.parse(text, allow_custom=True)
    except Exception as exc:  # the library raises several types; all mean "not a bundle we can read"
        raise ValueError(f"not a STIX 2.1 bundle: {str(exc).splitlines()[0]}") from None
    objects = getattr(parsed, "objects", None) or [parsed]
    found: dict[tuple[str, str], None] = {}
    skipped: list[str] = []
    for obj in objects:
        if obj.get("type") != "indicator":
            continue
        if obj.get("pattern_type") is None and obj.get("spec_version") != "2.1":
            skipped.append(f"{obj.id}: a STIX 2.0 indicator (only STIX 2.1 bundles are read)")
            continue
        if obj.get("pattern_type") != "stix":
            skipped.append(f"{obj.id}: pattern type {obj.get('pattern_type')!r} (only STIX patterns are read)")
            continue
        if obj.get("revoked"):
            skipped.append(f"{obj.id}: revoked")
            continue
        if obj.get("valid_until") and obj.valid_until <= at:
            skipped.append(f"{obj.id}: expired {obj.valid_until:%Y-%m-%d}")
            continue
        comparisons = Pattern(obj.pattern).inspect().comparisons
        usable = 0
        for kind in STIX_VALUE_TYPES:
            for path, operator, literal in comparisons.get(kind, ()):
                compared = operator == "=" or (operator == "ISSUBSET" and kind.endswith("-addr"))
                indicator = classify(literal.strip("'")) if path == ["value"] and compared else None
                if indicator is not None:
                    found[indicator] = None
                    usable += 1
        if not usable:
            skipped.append(f"{obj.id}: {obj.pattern} (no domain or IP compared for equality)")
    return Feed(list(found), skipped)


def _csv_header(lines: list[str]) -> tuple[int, list[str]]:
    """(line index, indicator columns as written) of a CSV header among the first lines, or (-1, [])."""
    for index, line in enumerate(lines[:50]):
        written = [n.strip().strip('"') for n in line.lstrip("#").strip().split(",")]
        if len(written) > 1:
            columns = [name for name in written if name.lower() in CSV_COLUMNS]
            if columns:
                return index, columns
    return -1, []


def read_feed(path: Path) -> Feed:
    """`parse_feed` of a file; ValueError names a missing file or one without any indicator."""
    if not path.is_file():
        raise ValueError(f"indicator file {path} does not exist")
    # utf-8-sig: a byte-order mark (an export from Windows) would hide a bundle's '{' and the first value.
    feed = parse_feed(path.read_text(encoding="utf-8-sig", errors="replace"))
    if not feed.indicators:
        raise ValueError(f"{path}: no IP address or domain found"
                         + (f" ({skipped_summary(feed.skipped)})" if feed.skipped else ""))
    return feed
