"""The layering rules of docs/architecture.md, checked on the source: no import cycle among the
modules of `pipelines/` and `assets/` (imports inside functions included, `TYPE_CHECKING` blocks not),
and `pipelines/` never imports Dagster or `assets/`."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "assets")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, known: set[str]) -> set[str]:
    """Modules of `known` that `path` imports at run time."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
               for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pipelines import jobs` imports the module pipelines.jobs
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        # A package's __init__ re-exporting its submodules is not a cycle through the package.
        graph[name] = {m for m in _imports(path, known) if m != name and not name.startswith(f"{m}.")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_among_pipelines_and_assets_modules():
    graph = _graph()
    assert "pipelines.jobs" in graph and "pipelines.stages" in graph["pipelines.jobs"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_pipelines_never_imports_dagster_or_assets():
    for name, path in _modules().items():
        if not name.startswith("pipelines"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [module or ""]
            assert not any(n.split(".")[0] in ("dagster", "assets") for n in names), f"{name} imports {names}"
