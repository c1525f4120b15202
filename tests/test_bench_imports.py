"""The benchmarks run in no CI (each takes minutes), so a name that `pipelines/` renames or drops
would break one unseen until someone runs it. Their imports of the project's code (most inside
functions) are checked here against the code, without running them."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT = ("pipelines", "sample_data", "assets")


def _project_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name` and (module, None) for each `import module`
    of the project's packages in `path`, wherever they stand in the file."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PROJECT:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] in PROJECT]
    return found


def _missing(module: str, name: str | None) -> str | None:
    """What does not resolve: the module, or the name in it (a submodule counts), else None."""
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        return f"{module}: {exc}"
    if name is None or hasattr(found, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def test_the_checker_finds_a_name_that_is_gone(tmp_path):
    bench = tmp_path / "b.py"
    bench.write_text("def main():\n    from pipelines.etl import QUERY_NAME, no_such_name\n    import pipelines.lake\n")
    assert _project_imports(bench) == [("pipelines.etl", "QUERY_NAME"), ("pipelines.etl", "no_such_name"),
                                       ("pipelines.lake", None)]
    assert [_missing(*imported) for imported in _project_imports(bench)] == \
        [None, "pipelines.etl has no no_such_name", None]


@pytest.mark.parametrize("bench", sorted(p.name for p in (REPO / "bench").glob("*.py") if _project_imports(p)))
def test_every_project_name_a_bench_imports_exists(bench):
    imports = _project_imports(REPO / "bench" / bench)
    missing = [m for m in (_missing(*imported) for imported in imports) if m]
    assert not missing, f"bench/{bench} imports what the code no longer has: {missing}"
