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
