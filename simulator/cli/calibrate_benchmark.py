"""``simulate calibrate --from-benchmark FILE``: fit the compute/memory ceilings on the user's benchmark results."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from simulator.errors import InputError
from simulator.files import atomic_write, check_output_path
from simulator.tabular import to_json
from simulator.validation.crossval import ErrorSummary
from simulator.validation.replay import Replayer
from simulator.validation.table import Row
from simulator.validation.user_benchmark import (
    BenchmarkSetup,
    UserCalibration,
    calibrate_rows,
    overlay_text,
    rows_from_benchmark,
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _summary(name: str, s: ErrorSummary) -> str:
    return f"  {name:<34} rows {s.rows:>3}  median {_pct(s.median):>6}  p90 {_pct(s.p90):>6}  max {_pct(s.max):>6}"


def _text(c: UserCalibration, out: Path | None) -> str:
    lines = [
        f"Calibrated {c.gpu} on {len(c.validation.scored)} benchmark rows:",
        f"  compute {c.base.compute:.3f} -> {c.fitted.compute:.3f}"
        + (f" (from rows {', '.join(c.compute_rows)})" if c.compute_rows else " (no row calibrates it: base value kept)"),
        f"  memory  {c.base.memory:.3f} -> {c.fitted.memory:.3f}"
        + (f" (from rows {', '.join(c.memory_rows)})" if c.memory_rows else " (no row calibrates it: base value kept)"),
        "",
        "|error| = |predicted - measured| / measured:",
        _summary("in sample (fitted on every row)", c.in_sample),
        _summary(f"cross-validated ({c.cross_validation})", c.out_of_sample),
        "",
        f"{'row':<28} {'metric':<26} {'measured':>10} {'in sample':>10} {'cross-val':>10}",
    ]
    for s in c.validation.scored:
        lines.append(
            f"{s.row.id[:28]:<28} {s.row.metric:<26} {s.row.measured:>10.4g} "
            f"{_signed(s.error_in):>10} {_signed(s.error_out):>10}" + (f"  skipped: {s.skipped}" if s.skipped else "")
        )
    if out is not None:
        lines += ["", f"wrote {out}; use it with --gpu {out}"]
    return "\n".join(lines)


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _dict(c: UserCalibration, out: Path | None) -> dict[str, Any]:
    return {
        "gpu": c.gpu,
        "base": {"compute": c.base.compute, "memory": c.base.memory},
        "fitted": {"compute": c.fitted.compute, "memory": c.fitted.memory},
        "compute_rows": list(c.compute_rows), "memory_rows": list(c.memory_rows),
        "in_sample": c.in_sample.as_dict(), "cross_validated": c.out_of_sample.as_dict(),
        "cross_validation": c.cross_validation, "overlay": None if out is None else str(out),
        "rows": [
            {"id": s.row.id, "metric": s.row.metric, "measured": s.row.measured,
             "predicted_in_sample": s.in_sample.value, "error_in_sample": s.error_in,
             "predicted_cross_validated": s.out_of_sample.value, "error_cross_validated": s.error_out,
             "skipped": s.skipped or None}
            for s in c.validation.scored
        ],
    }


def calibrate_from_benchmark(files: tuple[Path, ...], setup: BenchmarkSetup, out: Path | None, as_json: bool) -> None:
    """Read the files, fit, print in-sample and cross-validated error, write the overlay."""
    if out is not None:
        check_output_path(out, "--out", (".yaml", ".yml"))
    with tempfile.TemporaryDirectory(prefix="memwall-bench-") as folder:
        rows: list[Row] = []
        for path in files:
            rows += rows_from_benchmark(path, setup, Path(folder))
        ids = [row.id for row in rows]
        if len(set(ids)) != len(ids):
            raise InputError("--from-benchmark: two rows share an id (the same file given twice?)")
        with Replayer() as replayer:
            calibration = calibrate_rows(rows, replayer)
    if out is not None:
        base = setup.gpu or rows[0].gpu
        atomic_write(out, overlay_text(calibration, base, list(files)), "--out")
    click.echo(to_json(_dict(calibration, out), indent=2) if as_json else _text(calibration, out))
