"""Importing ds_gravac changes nothing global, and its modules import each other without circles.

Circles are read from the source (every ``import`` of a ``ds_gravac`` module, module-level, lazy inside functions,
or under ``TYPE_CHECKING``); none is left, and a new one fails here with the modules that form it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "ds_gravac"


def _module_level_calls(tree: ast.Module) -> list[ast.Call]:
    """Calls that run when the module is imported: everything outside function bodies (class bodies run too)."""
    calls: list[ast.Call] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return calls


def test_importing_ds_gravac_leaves_the_warning_filters_alone() -> None:
    """A library must not change its user's warning filters when imported: no module-level ``filterwarnings`` or
    ``simplefilter`` anywhere in the package (a call scoped by ``warnings.catch_warnings`` inside a function is
    fine)."""
    offenders = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        for call in _module_level_calls(ast.parse(path.read_text(encoding="utf-8"))):
            name = ast.unparse(call.func)
            if name.split(".")[-1] in ("filterwarnings", "simplefilter", "resetwarnings"):
                offenders.append(f"{path.relative_to(ROOT)}:{call.lineno} {name}")
    assert not offenders, offenders


def test_the_scan_sees_a_module_level_filter() -> None:
    tree = ast.parse("import warnings\nwarnings.filterwarnings('ignore')\ndef f():\n    warnings.simplefilter('x')\n")
    assert [ast.unparse(c.func) for c in _module_level_calls(tree)] == ["warnings.filterwarnings"]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every ds_gravac module this file imports, anywhere in it."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            # ``from package import submodule`` depends on the submodule; ``from module import name`` on the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name and target.startswith(PACKAGE):
                out.add(target)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_circle_finder_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    files = {_module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    graph = {name: _imports(path, name, set(files)) for name, path in files.items()}
    assert _circles(graph) == []
