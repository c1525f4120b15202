"""Stream settings with their defaults and the reasons for them; one object passed to every job."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Settings:
    """Knobs shared by the ETL, attribution and rule queries.

    >>> Settings().with_overrides({"trigger_interval": "5 seconds"}).trigger_interval
    '5 seconds'
    """

    # Processing-time trigger of `seclake stream`: Zeek rotates hourly and Suricata flushes
    # every few seconds, so 10 s keeps alert latency low without spinning on empty batches.
    trigger_interval: str = "10 seconds"
    # Bounds one micro-batch of landing files so a backlog is eaten in steps that fit in memory.
    max_files_per_trigger: int = 50
    # Events may trail the DHCP log by a rotation period (1 h files) plus shipping delay.
    event_watermark: str = "2 hours"
    lease_watermark: str = "2 hours"
    # A lease is searched at most this far before an event: longest DHCP lease we expect (1 day).
    max_lease_age: str = "24 hours"
    # Delta writes a log checkpoint every N commits (delta.checkpointInterval) so opening a table stays flat.
    checkpoint_interval: int = 100
    # `seclake maintain`: VACUUM keeps files younger than this. Delta's default (7 days) and its
    # floor: a stream lagging less than this, and time travel within it, still find their files.
    vacuum_retention_hours: int = 168
    # `seclake retention`: days of data kept per layer (by event_date; 0 keeps everything).
    # Landing files are only the ETL's input: once processed they are replayable from bronze.
    retention_landing_days: int = 7
    # Raw lines serve re-parsing after a parser fix and quarantine triage: a month covers both.
    retention_bronze_days: int = 30
    # Silver and enriched events are what investigations and rule backtests look back over: a year.
    retention_silver_days: int = 365
    retention_enriched_days: int = 365
    # Alerts are the audit trail of what was detected and when: kept.
    retention_gold_days: int = 0

    def with_overrides(self, overrides: dict[str, object]) -> "Settings":
        """A copy with `overrides` applied; unknown names are a ValueError naming them."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(known)}")
        return replace(self, **overrides)  # type: ignore[arg-type]  # each value was checked by its caller
