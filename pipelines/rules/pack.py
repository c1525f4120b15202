"""The rule pack: every `rules/**/<rule>.sql` file, validated together (ids and names unique)."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import environment
from pipelines.rules.spec import Rule, RuleError, split_metadata, validate_rule

log = logging.getLogger("seclake.rules")

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"


def default_rules_dir() -> Path:
    """`$SECLAKE_RULES`, else the repository's `rules/` folder.

    >>> default_rules_dir() == RULES_DIR  # with $SECLAKE_RULES unset
    True
    """
    return environment.rules_dir() or RULES_DIR


@dataclass
class RulePack:
    """The valid rules of a folder (sorted by slug) and, per invalid file, the reason."""

    rules: list[Rule] = field(default_factory=list)
    errors: dict[Path, str] = field(default_factory=dict)

    def by_slug(self) -> dict[str, Rule]:
        return {r.slug: r for r in self.rules}


def rule_files(rules_dir: str | os.PathLike) -> list[Path]:
    """Every rule file under `rules_dir`, sorted; ValueError when the folder does not exist."""
    root = Path(rules_dir)
    if not root.is_dir():
        raise ValueError(f"rules folder {root} does not exist")
    # Hidden below the folder only: a pack under ~/.seclake/rules or given as ../rules is read.
    return sorted(p for p in root.rglob("*.sql") if not any(part.startswith(".") for part in p.relative_to(root).parts))


def scan_rules(rules_dir: str | os.PathLike, deployed: Collection[Path] = ()) -> RulePack:
    """Validate every rule file under `rules_dir`; duplicates of an id or a file name are
    errors of every file but one: a file in `deployed` (the resolved paths of the rules a stream
    runs), else the oldest (by modification time, then path). So a rule copied to
    start a new one, its id not yet changed, is the one refused, not the deployed rule, even once
    the deployed file is edited after the copy was made.

    >>> pack = scan_rules(RULES_DIR)
    >>> "dga_nxdomain_burst" in [r.slug for r in pack.rules], pack.errors
    (True, {})
    """
    pack = RulePack()
    ids: dict[str, Path] = {}
    slugs: dict[str, Path] = {}
    for path in sorted(rule_files(rules_dir), key=lambda p: (p.resolve() not in deployed, _modified(p), p)):
        try:
            rule = validate_rule(path)
        except RuleError as exc:
            pack.errors[path] = str(exc)
            continue
        if rule.id in ids:
            pack.errors[path] = duplicate_id(path, rule.id, _elder(ids[rule.id], path, deployed))
            continue
        if rule.slug in slugs:
            pack.errors[path] = duplicate_name(path, rule.slug, f"{_elder(slugs[rule.slug], path, deployed)} keeps it")
            continue
        ids[rule.id] = path
        slugs[rule.slug] = path
        pack.rules.append(rule)
    pack.rules.sort(key=lambda r: r.slug)
    return pack


def duplicate_id(path: Path, rule_id: str, holder: object) -> str:
    """Why the rule file at `path` is refused: its id is the id of `holder` (a file).

    >>> duplicate_id(Path("b.sql"), "1234", "a.sql").split(": give")[0]
    'b.sql: duplicate id 1234, the id of a.sql'
    """
    return (f"{path}: duplicate id {rule_id}, the id of {holder}: give this rule an id of its own "
            "(python -c 'import uuid; print(uuid.uuid4())')")


def duplicate_name(path: Path, slug: str, holder: object) -> str:
    """Why the rule file at `path` is refused: another file (`holder`) has its name.

    >>> duplicate_name(Path("x/dga.sql"), "dga", "y/dga.sql")
    "x/dga.sql: duplicate rule file name 'dga' (y/dga.sql): rename this file"
    """
    return f"{path}: duplicate rule file name {slug!r} ({holder}): rename this file"


def _elder(kept: Path, refused: Path, deployed: Collection[Path]) -> str:
    """How a duplicate's message names the file that keeps the id or name."""
    if kept.resolve() in deployed:
        return f"the running {kept}"
    if _modified(kept) == _modified(refused):  # a copy that kept its time (cp -p, a checkout): path order
        return f"{kept} (same modification time; the first by path keeps it)"
    return f"the older {kept}"


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile: validate_rule says so
        return 0.0


def load_rules(rules_dir: str | os.PathLike | None = None,
               on_error: Callable[[Path, str], None] | None = None) -> list[Rule]:
    """The valid rules under `rules_dir` (default `default_rules_dir()`); each invalid file is
    logged with its reason and passed to `on_error`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "draft.sql").write_text("SELECT 1")
    ...     load_rules(tmp, on_error=lambda path, reason: print(path.name, "->", reason.split(": ", 1)[1]))
    draft.sql -> the file must open with the metadata block: YAML inside /* ... */
    []
    """
    pack = scan_rules(rules_dir or default_rules_dir())
    for path, reason in pack.errors.items():
        log.warning("invalid rule skipped: %s", reason)
        if on_error:
            on_error(path, reason)
    return pack.rules


def rule_names(rules_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Rule id -> file name for the pack in `rules_dir` (default `default_rules_dir()`), an invalid
    file's too when its metadata names an id (a rule being edited): listings show names, and an
    id missing here (a rule since removed, a platform alert) as itself."""
    pack = scan_rules(rules_dir or default_rules_dir())
    names = {}
    for path in pack.errors:
        try:
            meta, _ = split_metadata(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, RuleError):
            continue
        if isinstance(meta.get("id"), str):
            names[meta["id"]] = path.stem
    return {**names, **{rule.id: rule.slug for rule in pack.rules}}
