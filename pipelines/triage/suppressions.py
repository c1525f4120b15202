"""Suppressions as data: known-benign findings marked, with a reason and an expiry, never dropped.

A suppression names a rule (or every rule) and an entity: an IP, a CIDR (IPv4), a MAC, a device,
or a domain (found in the alert's `evidence` or `details`). Every writer of `alerts` (the rule
queries, run-once, `rules backtest --write`, the intel sweep) passes its new alerts through
`mark`: an alert that an active suppression matches is written with `suppressed_by` set to that
suppression's id, so it stays visible and countable, and the queue leaves it out. Expiring a
suppression (or its `expires_at` passing) affects alerts written after that only.
"""
from __future__ import annotations

import ipaddress
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.registry import Lake

SUPPRESSIONS_TABLE = "suppressions"
# A suppression or a triage change signed by a blank name.
NO_NAME = "--by: give a name (every change records who made it)"
MATCH_TYPES = ("ip", "cidr", "mac", "device", "domain")
MAC = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}")
DOMAIN = re.compile(r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}\.?")


@dataclass(frozen=True)
class Suppression:
    """One suppression as `seclake suppress add` is given it."""

    match_type: str
    match_value: str
    reason: str
    rule_id: str | None = None
    expires_at: datetime | None = None
    author: str = "unknown"

    def __post_init__(self) -> None:
        if self.match_type not in MATCH_TYPES:
            raise ValueError(f"match type {self.match_type!r}: expected one of {', '.join(MATCH_TYPES)}")
        if not self.reason.strip():
            raise ValueError("a suppression needs a reason")
        if not self.author.strip():
            raise ValueError(NO_NAME)
        if self.match_type == "ip":
            ipaddress.ip_address(self.match_value)
        if self.match_type == "mac" and not MAC.fullmatch(self.match_value):
            raise ValueError(f"mac {self.match_value}: expected six hex pairs such as aa:bb:cc:00:11:22 "
                             "(how Zeek's DHCP log and the enriched tables write it)")
        if self.match_type == "device" and not self.match_value.strip():
            raise ValueError("device: give the device's name as the inventory writes it (any case)")
        if self.match_type == "device" and self.match_value != self.match_value.strip():
            raise ValueError(f"device {self.match_value!r}: no spaces around the name (it would match no device)")
        if self.match_type == "domain" and not DOMAIN.fullmatch(self.match_value.lower()):
            # Matched as the name or a subdomain of it: a bare word ('com') would match every .com name.
            raise ValueError(f"domain {self.match_value!r}: expected a domain name with a dot, such as evil.test")
        if self.match_type == "cidr":
            network = ipaddress.ip_network(self.match_value, strict=False)
            if network.version != 4:
                raise ValueError(f"cidr {self.match_value}: only IPv4 networks (give IPv6 hosts with --ip)")
            try:
                ipaddress.ip_network(self.match_value)
            except ValueError:
                # A typo of the prefix (/2 for /24) would otherwise widen it silently to a quarter of IPv4.
                raise ValueError(f"cidr {self.match_value}: host bits set; that network is {network} "
                                 "(give it as such)") from None

    def stored_value(self) -> str:
        """The value as `add` stores it and `mark` compares it (a MAC or domain in lower case).

        >>> Suppression("domain", "Evil.Test.", "lab").stored_value()
        'evil.test'
        >>> Suppression("ip", "2001:DB8:0:0::1", "lab").stored_value()
        '2001:db8::1'
        """
        if self.match_type == "ip":
            return ipaddress.ip_address(self.match_value).compressed
        if self.match_type == "mac":
            return self.match_value.lower()
        if self.match_type == "domain":
            return self.match_value.lower().rstrip(".")  # evidence writes names without the root's dot
        if self.match_type == "cidr":
            return str(ipaddress.ip_network(self.match_value))
        return self.match_value


def add(spark: SparkSession, lake: Lake, suppression: Suppression, now: datetime | None = None) -> tuple[str, bool]:
    """Append `suppression` to `suppressions`: its id, and whether it is new. One in force with the
    same rule, entity and expiry is not added again (the same command run twice, or run again after
    it was killed, would otherwise leave two to expire); its id is returned instead."""
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    expires = suppression.expires_at.astimezone(timezone.utc) if suppression.expires_at else None
    lake.ensure(spark, SUPPRESSIONS_TABLE)
    rule = F.col("rule_id").isNull() if suppression.rule_id is None else F.col("rule_id") == suppression.rule_id
    until = F.col("expires_at").isNull() if expires is None else F.col("expires_at") == F.lit(expires)
    # Every match type compares without case (a device's name as any case, the others stored lower).
    same = (active(spark, lake, at).where(rule & until)
            .where((F.col("match_type") == suppression.match_type)
                   & (F.lower(F.col("match_value")) == suppression.stored_value().lower()))
            .orderBy("created_at").select("suppression_id").limit(1).collect())
    if same:
        return same[0].suppression_id, False
    ident = uuid.uuid4().hex[:12]
    row = (ident, suppression.rule_id, suppression.match_type, suppression.stored_value(), suppression.reason,
           suppression.author, at, expires, None)
    frame = spark.createDataFrame([row], lake.spec(SUPPRESSIONS_TABLE).schema)
    lake.sink(SUPPRESSIONS_TABLE, app_id=f"suppress:{ident}").write_batch(frame, 0)
    return ident, True


def expire(spark: SparkSession, lake: Lake, ident: str, now: datetime | None = None) -> int | datetime:
    """End suppression `ident` now (one MERGE): the table version; or, writing nothing, when it
    had already ended (expired before, or past its `expires_at`). ValueError names an unknown id."""
    from pipelines.lake.merge import upsert

    found = [] if not lake.exists(SUPPRESSIONS_TABLE) else lake.read(spark, SUPPRESSIONS_TABLE).where(
        F.col("suppression_id") == ident).select("expired_at", "expires_at").collect()
    if not found:
        raise ValueError(f"no suppression {ident!r} (seclake suppress list shows them)")
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    ended = [t.astimezone(timezone.utc) for t in found[0] if t is not None]
    if ended and min(ended) <= at:
        return min(ended)
    rows = spark.createDataFrame([(ident, at)], "suppression_id string, expired_at timestamp")
    return upsert(spark, lake.path(SUPPRESSIONS_TABLE), rows, "suppression_id",
                  update={"expired_at": "coalesce(t.expired_at, s.expired_at)"}, insert={},
                  lock=lake.home.commit_lock(SUPPRESSIONS_TABLE))


def active(spark: SparkSession, lake: Lake, at: datetime | None = None) -> DataFrame:
    """The suppressions in force at `at` (now): not expired, not past `expires_at`."""
    when = F.lit((at or datetime.now(timezone.utc)).astimezone(timezone.utc))
    return (lake.read(spark, SUPPRESSIONS_TABLE)
            .where(F.col("expired_at").isNull() | (F.col("expired_at") > when))
            .where(F.col("expires_at").isNull() | (F.col("expires_at") > when)))


def domain_pattern(domain: str) -> str:
    """A regex (Java's, as Python's) finding `domain` or a subdomain of it in text, never a name that
    merely contains it: suppressing paypal.com must leave alerts on paypal.com.evil.test and
    notpaypal.com raised.

    >>> import re
    >>> [bool(re.search(domain_pattern("paypal.com."), t)) for t in
    ...  ("query paypal.com", "www.paypal.com.", '"paypal.com"', "paypal.com.evil.test", "notpaypal.com",
    ...   "paypal.community")]
    [True, True, True, False, False, False]
    """
    label = "a-z0-9_-"
    return f"(^|[^{label}])" + re.escape(domain.lower().rstrip(".")) + f"(?![{label}])(?!\\.[{label}])"


def _ipv4_number(column: Column) -> Column:
    parts = F.split(column, r"\.")
    number = F.lit(0).cast("long")
    for index in range(4):
        number = number * 256 + parts.getItem(index).cast("long")
    return F.when(column.rlike(r"^\d{1,3}(\.\d{1,3}){3}$"), number)


def mark(alerts: DataFrame, lake: Lake, at: datetime | None = None) -> DataFrame:
    """`alerts` with `suppressed_by` set to the id of the first active suppression matching each
    (by suppression id), NULL when none does. Reads `suppressions` once (it is small), and
    only its log when it holds no row."""
    from pipelines.lake.log import summary

    # The log says when there is nothing to match (the usual case) without a Spark job: every
    # rule's micro-batch comes through here.
    if not lake.exists(SUPPRESSIONS_TABLE) or summary(lake.path(SUPPRESSIONS_TABLE)).files == 0:
        return alerts
    found = active(alerts.sparkSession, lake, at).collect()
    if not found:
        return alerts
    verdict: Column = F.lit(None).cast("string")
    for s in sorted(found, key=lambda s: s.suppression_id, reverse=True):
        value = s.match_value
        if s.match_type == "ip":
            # Zeek writes an IPv6 address compressed (2001:db8::1), older Suricata in full
            # (2001:0db8:0000:...): either form of the address matches.
            address = ipaddress.ip_address(value)
            hit = F.lower(F.col("src_ip")).isin(sorted({address.compressed, address.exploded}))
        elif s.match_type == "cidr":
            network = ipaddress.ip_network(value)
            lo, hi = int(network.network_address), int(network.broadcast_address)
            hit = _ipv4_number(F.col("src_ip")).between(lo, hi)
        elif s.match_type == "mac":
            hit = F.lower(F.col("mac")) == value
        elif s.match_type == "device":
            hit = F.lower(F.col("device")) == value.lower()  # host names are case-insensitive
        else:
            pattern = domain_pattern(value)
            hit = (F.lower(F.coalesce(F.col("evidence"), F.lit(""))).rlike(pattern)
                   | F.lower(F.coalesce(F.col("details"), F.lit(""))).rlike(pattern))
        if s.rule_id is not None:
            hit = hit & (F.col("rule_id") == s.rule_id)
        verdict = F.when(F.coalesce(hit, F.lit(False)), F.lit(s.suppression_id)).otherwise(verdict)
    return alerts.withColumn("suppressed_by", F.coalesce(F.col("suppressed_by"), verdict))
