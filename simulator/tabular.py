"""Flat rows for CSV: nested dicts flattened to dotted keys, rows to CSV text."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from typing import Any


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
    # A NaN or infinite figure becomes an empty cell (as a missing one), never "nan"/"inf".
    writer.writerows(finite_or_none(row) for row in rows)
    return buffer.getvalue()


def finite_or_none(data: Any) -> Any:
    """``data`` with every NaN or infinite float (and numpy scalar) replaced by None, recursively."""
    if isinstance(data, dict):
        return {key: finite_or_none(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_or_none(value) for value in data]
    if hasattr(data, "tolist") and not isinstance(data, (str, bytes)):
        data = data.tolist()  # numpy scalar -> Python number, array -> (nested) list
        if isinstance(data, list):
            return [finite_or_none(value) for value in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data


def to_json(data: Any, indent: int | None = None) -> str:
    """Strict JSON: a quantity that cannot be computed is null, never NaN or Infinity."""
    return json.dumps(finite_or_none(data), indent=indent, allow_nan=False)
