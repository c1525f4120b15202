"""docs/notebooks/investigate_incident.ipynb runs top to bottom (nbclient) on a small generated
home, so it cannot rot: every cell executes without error, and the timeline plot and the replay
versions it ends with are there.

The kernel is this interpreter: a kernel spec written under the test's JUPYTER_PATH (searched
before the user's own kernels) names sys.executable, and IPYTHONDIR and JUPYTER_RUNTIME_DIR point
into tmp_path, so nothing is written to the user's home."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pipelines.home import Home
from pipelines.jobs import run_once
from pipelines.lake.registry import Lake
from sample_data.generator import generate

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "notebooks" / "investigate_incident.ipynb"


@pytest.fixture(scope="module")
def home(spark, tmp_path_factory) -> Path:
    """Half an hour of 5 hosts: the smallest generated home in which rules raise alerts."""
    home = Home.resolve(tmp_path_factory.mktemp("notebook") / "home").create()
    generate(home.root, hours=0.5, hosts=5, seed=7)
    reports = run_once(spark, Lake(home))
    assert all(r.error is None for r in reports), [r.line() for r in reports]
    return home.root


def _kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "seclake (.venv)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")


def test_notebook_runs_every_cell(home, tmp_path, monkeypatch):
    _kernel_env(tmp_path, monkeypatch)
    monkeypatch.setenv("SECLAKE_HOME", str(home))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    # A failing cell raises CellExecutionError naming the cell and its traceback.
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "a cell did not run"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    plots = [base64.b64decode(o.data["image/png"]) for c in code for o in c.outputs
             if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(plots) == 1 and plots[0].startswith(b"\x89PNG") and len(plots[0]) > 10_000
    # The last cell: the alert investigated and the table versions read, for a replay.
    replay = code[-1].outputs[0].data["text/plain"]
    assert "'alert_id':" in replay and "'enriched_dns':" in replay
    lookups = next(o.text for c in code for o in c.outputs if o.output_type == "stream" and "lookups" in o.text)
    assert int(lookups.split()[0]) > 0
