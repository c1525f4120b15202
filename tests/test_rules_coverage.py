"""`seclake rules coverage`: the ATT&CK Navigator layer it writes is valid layer format 4.5 (a JSON
Schema written from the spec, tests/schemas/), and layer and Markdown table hold every technique
id of the pack with the rules naming it."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from pipelines.rules.coverage import LAYER_FILE, TABLE_FILE
from pipelines.rules.pack import scan_rules

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "tests" / "schemas" / "navigator-layer-4.5.schema.json").read_text())
PACK = scan_rules(REPO / "rules")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("coverage") / "attack"
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "rules", "coverage", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads((out / LAYER_FILE).read_text()), (out / TABLE_FILE).read_text(), run.stdout


def test_layer_is_valid_navigator_layer_format_4_5(written):
    layer, _, _ = written
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(layer, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert layer["versions"]["layer"] == "4.5" and layer["domain"] == "enterprise-attack"


@pytest.mark.parametrize("break_it", [
    lambda layer: layer["techniques"][0].pop("techniqueID"),
    lambda layer: layer["techniques"][0].update(techniqueID="1071"),
    lambda layer: layer["versions"].update(layer="4.4"),
    lambda layer: layer.update(domain="enterprise"),
], ids=["no technique id", "bad technique id", "other layer version", "unknown domain"])
def test_the_schema_rejects_what_the_navigator_would(written, break_it):
    layer = copy.deepcopy(written[0])
    break_it(layer)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(layer, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_one_entry_per_technique_with_its_rules(written):
    layer, table, stdout = written
    expected: dict[str, list[str]] = {}
    for rule in PACK.rules:
        for technique in rule.mitre:
            expected.setdefault(technique, []).append(rule.name)
    assert PACK.rules and not PACK.errors
    entries = {t["techniqueID"]: t for t in layer["techniques"]}
    assert len(entries) == len(layer["techniques"]) and entries.keys() == expected.keys()
    for technique, names in expected.items():
        assert entries[technique]["score"] == len(names)
        assert sorted(entries[technique]["comment"].split("; ")) == sorted(names)
    rows = [line for line in table.splitlines() if line.startswith("| T")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == sorted(expected)
    dns = next(row for row in rows if row.startswith("| T1071.004 |"))
    assert "command-and-control" in dns and "`dns_tunneling`" in dns and "`dns_exfiltration`" in dns
    assert [line.split()[0] for line in stdout.splitlines()[2:]] == sorted(expected)


def test_every_technique_of_the_shipped_pack_has_its_tactics():
    # A technique missing from TACTICS shows '-' in the table: a rule added without its tactic.
    from pipelines.rules.coverage import tactics

    missing = sorted({t for rule in PACK.rules for t in rule.mitre if not tactics(t)})
    assert not missing, f"add {missing} to pipelines.rules.coverage.TACTICS"
