"""The package's layers import downward only (DESIGN.md, "Target layout"), and only the CLI imports click."""

from __future__ import annotations

import ast
from pathlib import Path

import simulator

ROOT = Path(simulator.__file__).parent

# Rank of each top-level part of the package; a module may import only parts of lower or equal rank.
RANKS = {
    "errors": 0, "units": 0, "tabular": 0, "files": 0,
    "model": 1, "cost": 2, "engine": 3, "plan": 4, "calibrate": 4, "sweep": 5, "validation": 5, "report": 6, "api": 7,
    "__main__": 8, "cli": 8,
}


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "simulator":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        part = rel.parts[0] if rel.parts[0] != "__init__" else "__init__"
        out.append((part, path))
    return out


def test_every_part_has_a_rank() -> None:
    parts = {part for part, _ in _modules()} - {"__init__"}
    assert parts <= set(RANKS), f"unranked parts: {sorted(parts - set(RANKS))}"


def test_no_import_runs_upward() -> None:
    upward = []
    for part, path in _modules():
        if part == "__init__":
            continue
        for module in _imports(path):
            target = _part(module)
            if target is None or target == "__init__":
                continue
            if RANKS[target] > RANKS[part]:
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not upward, "\n".join(upward)


def test_only_the_cli_imports_click() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for part, path in _modules()
        if part != "cli" and any(m == "click" or m.startswith("click.") for m in _imports(path))
    ]
    assert not offenders, offenders


LINE_LIMIT = 600
REASON = "Why this module is over 600 lines:"
"""A module longer than LINE_LIMIT says why in its docstring, starting with these words."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolved_imports(path: Path, known: set[str], root: Path) -> set[str]:
    """The package's modules ``path`` imports (``from a.b import c`` counts as a.b.c when that is a module)."""
    name = _module_name(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in known else module)
    return {m for m in found if m in known and m != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, lazy imports inside functions included."""
    paths = sorted(root.rglob("*.py"))
    known = {_module_name(p, root) for p in paths}
    return {_module_name(p, root): _resolved_imports(p, known, root) for p in paths}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_the_circle_finder_finds_a_planted_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import x\n")
    (package / "b.py").write_text("def f():\n    from pkg import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg.a import y\n")
    assert import_circles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_import_circle_between_modules() -> None:
    circles = import_circles(import_graph())
    assert not circles, "\n".join(" -> ".join(group) for group in circles)


def test_a_long_module_says_why_at_its_top() -> None:
    unexplained = []
    for _, path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > LINE_LIMIT and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not unexplained, "\n".join(unexplained)
