"""`seclake rules coverage`: the rule pack's MITRE ATT&CK coverage, from each rule's `mitre` ids.

Two views of the same mapping (technique id -> the rules naming it): an ATT&CK Navigator layer
(JSON, layer format 4.5, enterprise domain; score = number of rules) to load in the Navigator,
and a Markdown table for docs and reviews.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pipelines.rules.spec import Rule

LAYER_FILE = "attack-navigator-layer.json"
TABLE_FILE = "attack-coverage.md"

# The tactics (ATT&CK shortnames) of the techniques the pack names, by parent technique id;
# the Markdown table shows '-' for a technique not listed here. The layer names no tactic, so
# the Navigator shows each annotation under every tactic of its technique.
TACTICS: dict[str, tuple[str, ...]] = {
    "T1046": ("discovery",),
    "T1048": ("exfiltration",),
    "T1071": ("command-and-control",),
    "T1190": ("initial-access",),
    "T1200": ("initial-access",),
    "T1204": ("execution",),
    "T1498": ("impact",),
    "T1557": ("credential-access", "collection"),
    "T1568": ("command-and-control",),
    "T1571": ("command-and-control",),
    "T1572": ("command-and-control",),
    "T1573": ("command-and-control",),
}


def techniques(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    """Technique id -> the rules naming it (by rule name), in technique id order."""
    found: dict[str, list[Rule]] = {}
    for rule in rules:
        for technique in rule.mitre:
            found.setdefault(technique, []).append(rule)
    return {t: sorted(found[t], key=lambda r: r.name) for t in sorted(found)}


def tactics(technique: str) -> tuple[str, ...]:
    """The tactics of `technique` (a sub-technique has its parent's), () when not in TACTICS.

    >>> tactics("T1071.004"), tactics("T9999")
    (('command-and-control',), ())
    """
    return TACTICS.get(technique.split(".")[0], ())


def navigator_layer(rules: Sequence[Rule], name: str = "seclake rule pack") -> dict:
    """An ATT&CK Navigator layer (format 4.5): one technique entry per id, the rule names in its
    comment, score = number of rules."""
    mapped = techniques(rules)
    top = max((len(r) for r in mapped.values()), default=1)
    return {
        "name": name,
        "versions": {"layer": "4.5", "navigator": "4.9.0"},  # 4.9.0: the oldest Navigator that reads 4.5
        "domain": "enterprise-attack",
        "description": f"{len(rules)} seclake detection rules; a technique's score is the number of rules naming it",
        "sorting": 3,  # descending by score: the best-covered techniques first
        "techniques": [{"techniqueID": technique, "score": len(named),
                        "comment": "; ".join(r.name for r in named), "enabled": True}
                       for technique, named in mapped.items()],
        "gradient": {"colors": ["#ffffff", "#66b1ff"], "minValue": 0, "maxValue": max(top, 1)},
        "legendItems": [],
        "metadata": [{"name": "rules", "value": ", ".join(sorted(r.slug for r in rules))}],
    }


def markdown_table(rules: Sequence[Rule]) -> str:
    """| technique | tactic | rules | with one row per technique id."""
    lines = ["| technique | tactic | rules |", "|---|---|---|"]
    for technique, named in techniques(rules).items():
        cell = ", ".join(f"{r.name} (`{r.slug}`)" for r in named).replace("|", "\\|")
        lines.append(f"| {technique} | {', '.join(tactics(technique)) or '-'} | {cell} |")
    return "\n".join(lines) + "\n"


def write_coverage(rules: Sequence[Rule], out: str | Path) -> tuple[Path, Path]:
    """Write `LAYER_FILE` and `TABLE_FILE` into folder `out` (created); return their paths."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    layer, table = folder / LAYER_FILE, folder / TABLE_FILE
    layer.write_text(json.dumps(navigator_layer(rules), indent=2) + "\n", encoding="utf-8")
    table.write_text(f"# ATT&CK coverage of the rule pack\n\n{markdown_table(rules)}", encoding="utf-8")
    return layer, table
