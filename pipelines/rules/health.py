"""Whether a rule may run: the pure state machine behind `rule_status` (no Spark here).

A rule that fails at run time (an error in its query, a micro-batch over its time budget, the
Spark application dying while it ran) is retried after a back-off that doubles per failure in
a row; at `max_failures` in a row it is disabled until someone re-enables it
(`seclake rules enable`) or its file changes. A successful batch clears the count. A rule file
that does not validate is `invalid` until its file changes.

>>> from datetime import datetime
>>> t = datetime(2026, 11, 23, 2, 0)
>>> h = RuleHealth.fresh("bomb", "hash1")
>>> h = h.failed("boom", t, max_failures=2, retry_s=60)
>>> h.state, h.failures, h.retry_at.time(), h.may_start(t)
('failing', 1, datetime.time(2, 1), False)
>>> h = h.failed("boom", t, max_failures=2, retry_s=60)
>>> h.state, h.may_start(t), h.enabled().state
('disabled', False, 'ok')
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

OK, FAILING, DISABLED, INVALID = "ok", "failing", "disabled", "invalid"


@dataclass(frozen=True)
class RuleHealth:
    """One rule's health: `state` (ok, failing, disabled, invalid), `failures` in a row, the
    last `reason`, when it may be retried (`retry_at`, failing only) and the hash of the rule
    file it applies to (a changed file starts fresh)."""

    rule: str
    content_hash: str
    state: str = OK
    failures: int = 0
    reason: str | None = None
    retry_at: datetime | None = None

    @classmethod
    def fresh(cls, rule: str, content_hash: str) -> RuleHealth:
        """A rule never seen failing."""
        return cls(rule, content_hash)

    def for_file(self, content_hash: str) -> RuleHealth:
        """This health if it is about the file with `content_hash`, else a fresh one: editing a
        rule file is a new deploy, whatever happened to the old content.

        >>> RuleHealth("r", "a", DISABLED, 3, "x").for_file("b").state
        'ok'
        """
        return self if content_hash == self.content_hash else RuleHealth.fresh(self.rule, content_hash)

    def may_start(self, now: datetime) -> bool:
        """True when the rule is ok, or failing and its back-off has passed."""
        if self.state == FAILING:
            return self.retry_at is None or now >= self.retry_at
        return self.state == OK

    def failed(self, reason: str, now: datetime, *, max_failures: int, retry_s: float) -> RuleHealth:
        """After a run-time failure: back off `retry_s` doubled per earlier failure in a row, or
        disable at `max_failures` in a row."""
        failures = self.failures + 1
        if failures >= max_failures:
            return replace(self, state=DISABLED, failures=failures, reason=reason, retry_at=None)
        return replace(self, state=FAILING, failures=failures, reason=reason,
                       retry_at=now + timedelta(seconds=retry_s * 2 ** (failures - 1)))

    def suspected(self, reason: str, now: datetime, *, max_failures: int, retry_s: float) -> RuleHealth:
        """After the application died while this rule and others were in a batch: counted like
        `failed`, except that it never disables; only a death while the rule was the one on
        probation does (the culprit is then known).

        >>> RuleHealth("r", "a", FAILING, 1, "x").suspected("died", datetime(2026, 1, 1),
        ...                                                 max_failures=2, retry_s=5).state
        'failing'
        """
        failures = min(self.failures + 1, max_failures - 1)
        return replace(self, state=FAILING, failures=failures, reason=reason,
                       retry_at=now + timedelta(seconds=retry_s * 2 ** max(failures - 1, 0)))

    def succeeded(self) -> RuleHealth:
        """After a batch that committed: the failure count starts again from zero.

        >>> RuleHealth("r", "a", FAILING, 2, "x").succeeded().state
        'ok'
        """
        return RuleHealth.fresh(self.rule, self.content_hash)

    def enabled(self) -> RuleHealth:
        """Re-enabled by hand (`seclake rules enable`): ok, nothing counted."""
        return RuleHealth.fresh(self.rule, self.content_hash)

    def validated(self) -> RuleHealth:
        """For a file that validates now: an `invalid` verdict, which may have come from the rest of
        the pack (an id another file had, since removed), is cleared; any other state is kept.

        >>> RuleHealth("r", "a", INVALID, 0, "duplicate id").validated().state
        'ok'
        """
        return RuleHealth.fresh(self.rule, self.content_hash) if self.state == INVALID else self

    def invalid(self, reason: str) -> RuleHealth:
        """The file does not validate: it cannot run until it changes."""
        return replace(self, state=INVALID, failures=0, reason=reason, retry_at=None)
