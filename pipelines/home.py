"""One home folder for all state: landing files, Delta tables, checkpoints, reference data."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipelines import environment

DEFAULT_HOME = "seclake-home"


@dataclass(frozen=True)
class Home:
    """The folder that holds every piece of seclake state.

    >>> h = Home.resolve("/tmp/x")
    >>> str(h.table("silver_dns"))
    '/tmp/x/tables/silver_dns'
    """

    root: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike | None = None) -> "Home":
        """`home`, else `$SECLAKE_HOME`, else `./seclake-home`; always absolute."""
        chosen = home or environment.home() or DEFAULT_HOME
        return cls(Path(chosen).expanduser().resolve())

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def reference(self) -> Path:
        return self.root / "reference"

    def table(self, name: str) -> Path:
        return self.tables / name

    def checkpoint(self, name: str) -> Path:
        return self.checkpoints / name

    @property
    def intel(self) -> Path:
        """Indicator feeds dropped here are loaded by Dagster's `intel_sensor` (docs/triage.md)."""
        return self.root / "intel"

    def create(self) -> "Home":
        """Create the standard sub-folders (idempotent) and return self."""
        for d in (self.landing, self.tables, self.checkpoints, self.reference):
            d.mkdir(parents=True, exist_ok=True)
        return self
