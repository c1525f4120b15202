"""Delivering alerts to a webhook (no Spark): Slack-compatible JSON, retries, a dead letter.

At least once: an alert is POSTed until the receiver answers 2xx, with the alert id as the
`Idempotency-Key` header so a receiver can drop a repeat (one happens when the process dies
between the receiver's 2xx and the record of it). A 4xx other than 408/429 is final: the payload
will not get better. Other failures (5xx, 408, 429, a refused or timed-out connection, an answer
that is not HTTP) are retried with a doubling back-off; after `max_attempts` the alert goes to the
dead letter with its last error, and the next alerts still go out.
"""
from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pipelines.schemas import SEVERITIES

RETRIABLE_STATUS = {408, 429}


@dataclass(frozen=True)
class Destination:
    """A webhook and the least severity it receives.

    >>> Destination("soc", "http://127.0.0.1:9/hook", "high").wants("critical")
    True
    >>> Destination("soc", "https://hooks.example/T0 B1")
    Traceback (most recent call last):
    ...
    ValueError: destination soc: url 'https://hooks.example/T0 B1' is not a valid URL ...
    """

    name: str
    url: str
    min_severity: str = "high"

    def __post_init__(self) -> None:
        if self.min_severity not in SEVERITIES:
            raise ValueError(f"destination {self.name}: min_severity {self.min_severity!r}: "
                             f"expected one of {', '.join(SEVERITIES)}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"destination {self.name}: url {self.url!r} is not http(s)")
        if not _valid_url(self.url):
            raise ValueError(f"destination {self.name}: url {self.url!r} is not a valid URL "
                             "(a host, a port of digits, no spaces)")

    def wants(self, severity: str | None) -> bool:
        return severity in SEVERITIES and SEVERITIES.index(severity) >= SEVERITIES.index(self.min_severity)


def _valid_url(url: str) -> bool:
    """Whether urlopen takes `url` (it refuses the rest with http.client's InvalidURL, at the first
    alert): a host, a port of digits if any, no whitespace or control character."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (reading it raises ValueError for a port that is not a number)
    except ValueError:
        return False
    return bool(parts.hostname)


@dataclass
class Outcome:
    """What one `deliver` call did: alert ids delivered, and (alert id, last error) dead-lettered."""

    delivered: list[str] = field(default_factory=list)
    dead: list[tuple[str, str]] = field(default_factory=list)


def payload(alert: dict) -> dict:
    """The JSON body for one alert: Slack's incoming-webhook shape (`text`), plus the alert's fields.

    The text escapes `&`, `<` and `>` as Slack asks: evidence holds names from the logs (a queried
    domain), and Slack reads `<!channel>` or `<url|label>` in a message as a mention or a link.

    >>> payload({"alert_id": "a1", "severity": "high", "rule_name": "DNS exfiltration", "src_ip": "10.0.0.5",
    ...          "device": "laptop-5", "evidence": "9 MB of queries to x.<!channel>"})["text"]
    '[HIGH] DNS exfiltration on laptop-5 (10.0.0.5): 9 MB of queries to x.&lt;!channel&gt;'
    """
    who = alert.get("device") or alert.get("mac") or alert.get("src_ip") or "(no host)"
    ip = f" ({alert['src_ip']})" if alert.get("device") and alert.get("src_ip") else ""
    text = f"[{str(alert.get('severity', '')).upper()}] {alert.get('rule_name')} on {who}{ip}: {alert.get('evidence')}"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return {"text": text, "alert": {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in alert.items()}}


def post(url: str, body: dict, key: str, timeout_s: float = 10.0) -> int:
    """POST `body` as JSON with `Idempotency-Key: key`; the HTTP status (raises on no answer)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def deliver(alerts: Iterable[dict], destination: Destination, max_attempts: int = 5, backoff_s: float = 1.0,
            send: Callable[[str, dict, str], int] = post, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Deliver each alert `destination` wants, in order; see the module docstring for the rules."""
    outcome = Outcome()
    for alert in alerts:
        if not destination.wants(alert.get("severity")):
            continue
        key = str(alert["alert_id"])
        error = ""
        for attempt in range(1, max_attempts + 1):
            try:
                status = send(destination.url, payload(alert), key)
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out; an answer not HTTP
                status, error = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                outcome.delivered.append(key)
                break
            if status:
                error = f"HTTP {status}"
            if 400 <= status < 500 and status not in RETRIABLE_STATUS:
                break
            if attempt < max_attempts:
                sleep(backoff_s * 2 ** (attempt - 1))
        if not outcome.delivered or outcome.delivered[-1] != key:
            outcome.dead.append((key, error))
    return outcome
