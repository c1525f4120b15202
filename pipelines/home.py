"""One home folder for all state: landing files, Delta tables, checkpoints, reference data.

The tables and checkpoints may live on object storage instead (`SECLAKE_LAKE=s3a://bucket/prefix`,
docs/deploy.md): the home then records that location in its `lake` file, and a command on the home
without that same `SECLAKE_LAKE` is refused (it would otherwise see, or start, another lake). The lake
records its home too (its `home` object): a second home is refused the prefix, whose checkpoints
would take its landing files for the first home's and skip them.
"""
from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipelines.objectstore.path import ObjectPath, check_reachable, configured_lake

DEFAULT_HOME = "seclake-home"
LAKE_FILE = "lake"
# In a lake on object storage: the home folder that recorded it.
OWNER_FILE = "home"


def home_folder(home: str | os.PathLike | None = None) -> Path:
    """`home`, else `$SECLAKE_HOME`, else `./seclake-home`; always absolute. A URI is a ValueError: it
    would be made a local folder of that name.

    >>> home_folder("s3a://lake/soc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: home s3a://lake/soc: a home is a local folder; ... with SECLAKE_LAKE=s3a://lake/soc (docs/deploy.md)
    >>> home_folder("file:///tmp/h")
    Traceback (most recent call last):
    ...
    ValueError: home file:///tmp/h: a home is a local folder, given as a path
    """
    from pipelines import environment

    given = str(home or environment.home() or DEFAULT_HOME)
    scheme = re.match(r"([A-Za-z][\w+.-]*)://", given)
    if scheme and scheme.group(1) in ("s3a", "s3"):
        raise ValueError(f"home {given}: a home is a local folder; keep its tables on object storage with "
                         f"SECLAKE_LAKE={given} (docs/deploy.md)")
    if scheme:
        raise ValueError(f"home {given}: a home is a local folder, given as a path")
    return Path(given).expanduser().resolve()


@dataclass(frozen=True)
class Home:
    """The folder that holds every piece of seclake state.

    >>> h = Home.resolve("/tmp/x")
    >>> str(h.table("silver_dns"))
    '/tmp/x/tables/silver_dns'
    """

    root: Path
    # Where tables/ and checkpoints/ are when not in `root`: an ObjectPath.
    lake: ObjectPath | None = None

    @classmethod
    def resolve(cls, home: str | os.PathLike | None = None) -> "Home":
        """The home in `home_folder(home)`. Its lake is `$SECLAKE_LAKE`, else the home folder; a home
        that recorded another lake is a ValueError naming both."""
        root = home_folder(home)
        lake = configured_lake()
        if not (root / LAKE_FILE).is_file():
            local = root / "tables"
            if lake is not None and local.is_dir() and any(local.iterdir()):
                raise ValueError(f"home {root} keeps its tables in {local}: SECLAKE_LAKE={lake} would start another, "
                                 "empty lake; copy tables/ and checkpoints/ there first, then remove them here "
                                 "(docs/deploy.md)")
            return cls(root, lake)
        recorded = (root / LAKE_FILE).read_text().strip()
        if str(lake) != recorded:
            raise ValueError(f"home {root} keeps its tables at {recorded} (its {LAKE_FILE} file); "
                             f"set SECLAKE_LAKE={recorded}" + (f", not {lake}" if lake else ""))
        return cls(root, lake)

    @property
    def lake_root(self) -> Path:
        """The folder (or prefix) holding tables/ and checkpoints/."""
        return self.lake or self.root

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def tables(self) -> Path:
        return self.lake_root / "tables"

    @property
    def checkpoints(self) -> Path:
        return self.lake_root / "checkpoints"

    @property
    def reference(self) -> Path:
        return self.root / "reference"

    @property
    def dagster(self) -> Path:
        """The home's Dagster instance (run history): `DAGSTER_HOME` unless that says otherwise."""
        return self.root / "dagster"

    def table(self, name: str) -> Path:
        return self.tables / name

    def checkpoint(self, name: str) -> Path:
        return self.checkpoints / name

    @property
    def intel(self) -> Path:
        """Indicator feeds dropped here are loaded by Dagster's `intel_sensor` (docs/triage.md)."""
        return self.root / "intel"

    @contextmanager
    def commit_lock(self, table: str) -> Iterator[None]:
        """Hold this home's lock on commits to `table` (`locks/<table>.lock`), waiting while another
        process of this machine holds it.

        Delta commits to a lake on object storage are atomic only within one Spark driver
        (docs/deploy.md): two drivers committing one table at the same moment can both succeed, and
        one commit is lost. The processes of a home that append to one table take turns here
        instead: the stream's rules application, `seclake rules enable` (rule_status),
        `seclake rules backtest --write` or `intel load` (alerts), and the commands that MERGE into
        a state table or replace `incidents` (`pipelines/lake/merge.py`).

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with Home.resolve(tmp).commit_lock("alerts"):
        ...         print(sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*")))
        ['locks', 'locks/alerts.lock']
        """
        folder = self.root / "locks"
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"{table}.lock", os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies holding it
            yield
        finally:
            os.close(fd)

    def existing(self, *, or_landing: bool = False) -> "Home":
        """Self, when it holds a tables/ folder (a home some run has written), or with `or_landing` a
        landing/ folder (logs generated or delivered, no run yet: state such as indicators may be
        kept before the first run); else a ValueError naming it, before any Spark starts: a
        mistyped --home would read as an empty home, or be written as a new one.

        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> generated = Home.resolve(tmp.name)
        >>> (generated.root / "landing").mkdir()
        >>> generated.existing(or_landing=True) is generated
        True
        >>> generated.existing()
        Traceback (most recent call last):
        ...
        ValueError: ... is not a seclake home (no tables/ folder); is the path given (--home) or SECLAKE_HOME right?
        >>> tmp.cleanup()
        """
        if not (self.tables.is_dir() or (or_landing and self.landing.is_dir())):
            raise ValueError(f"{self.root} is not a seclake home (no tables/ folder); "
                             "is the path given (--home) or SECLAKE_HOME right?")
        return self

    def folder(self) -> "Home":
        """Self, unless its root is a file: a ValueError naming it (a home is a folder, made if missing)."""
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"home {self.root} is a file, not a folder")
        return self

    def create(self) -> "Home":
        """Create the standard sub-folders (idempotent), record a lake on object storage once it
        is reached (`check_reachable`), return self."""
        self.folder()
        unrecorded = self.lake if not (self.root / LAKE_FILE).exists() else None
        if unrecorded is not None:
            check_reachable(unrecorded)
        if self.lake is not None:
            self._claim(self.lake, new=unrecorded is not None)
        for d in (self.landing, self.tables, self.checkpoints, self.reference):
            d.mkdir(parents=True, exist_ok=True)
        if unrecorded is not None:
            (self.root / LAKE_FILE).write_text(f"{unrecorded}\n")
        return self

    def _claim(self, lake: ObjectPath, *, new: bool) -> None:
        """Record this home in `lake` unless a home is recorded there (a lake recorded before the
        lakes named their home gets this one's); a `new` home (recording the lake now) is refused
        another home's lake: a ValueError naming it. A home moved keeps its `lake` file, and the lake."""
        owner = lake / OWNER_FILE
        if not owner.is_file():
            owner.write_text(f"{self.root}\n")
            return
        if not new:  # a home that recorded its lake is not asked again: no read on every command
            return
        recorded = owner.read_text().strip()
        if recorded != str(self.root):
            raise ValueError(f"the lake {lake} belongs to the home {recorded}: a second home there would share its "
                             "checkpoints and skip its own logs as already read; give this home a prefix of its "
                             f"own (SECLAKE_LAKE), or, if it replaces {recorded}, record the lake in it: "
                             f"mkdir -p {self.root} && echo {lake} > {self.root / LAKE_FILE}")


def dagster_instance(folder: str | os.PathLike) -> Path:
    """Make `folder` a Dagster instance's home (`DAGSTER_HOME`) with telemetry off, unless it has its
    own `dagster.yaml`: a seclake instance sends nothing anywhere. The folder, absolute.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     print((dagster_instance(Path(tmp, "dagster")) / "dagster.yaml").read_text(), end="")
    telemetry:
      enabled: false
    """
    path = Path(folder).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    return path
