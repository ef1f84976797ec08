"""Flat rows for CSV: nested dicts flattened to dotted keys, rows to CSV text."""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {'a.b': value}; lists are left out (CSV holds scalars)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif not isinstance(value, list):
            flat[name] = value
    return flat


def to_csv(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
