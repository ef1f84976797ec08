"""Formatting SI quantities for people (the only place units are converted)."""

from __future__ import annotations

from typing import Any

GIB = 2**30


def fmt_seconds(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def fmt_value(value: Any, kind: str) -> str:
    """A results-file cell for people: ``kind`` seconds, rate (tokens/s), qps, usd or bool; "-" when empty."""
    if value is None or value == "":
        return "-"
    if kind == "seconds":
        return fmt_seconds(float(value))
    if kind == "rate":
        return f"{float(value):,.1f}"
    if kind == "qps":
        return f"{float(value):.2f}"
    if kind == "usd":
        return f"${float(value):,.2f}"
    if kind == "bool":
        return "yes" if value is True else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def fmt_bytes(n: float) -> str:
    """Binary units (GiB) as nvidia-smi shows memory."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float, unit: str = "") -> str:
    """1.23 T / 4.56 G / 7.89 M style counts."""
    for suffix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def fmt_rate(n: float, unit: str) -> str:
    return f"{n:,.1f} {unit}"
