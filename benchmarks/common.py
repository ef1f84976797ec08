"""Timing helpers shared by the benchmark scripts (plain Python; nothing here is a test)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def best_seconds(func: Callable[[], Any], repeats: int = 5) -> float:
    """Fastest of ``repeats`` wall-clock runs of ``func``, in seconds (least disturbed by noise)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def report(name: str, value: float, unit: str, target: str = "") -> dict[str, Any]:
    """Print one figure and return it as a record."""
    suffix = f"   (target {target})" if target else ""
    print(f"{name:<58} {value:>14,.1f} {unit}{suffix}", flush=True)
    return {"name": name, "value": value, "unit": unit, "target": target}


def write_results(path: str | None, section: str, figures: list[dict[str, Any]]) -> None:
    """Merge ``figures`` under ``section`` into the JSON file at ``path`` (if given)."""
    if not path:
        return
    out = Path(path)
    data = json.loads(out.read_text()) if out.exists() else {}
    data["machine"] = machine()
    data[section] = figures
    out.write_text(json.dumps(data, indent=2) + "\n")
