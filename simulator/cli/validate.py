"""``simulate validate``: the simulator against published measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from simulator.cli.options import reports_input_errors
from simulator.errors import InputError
from simulator.model import load_gpu
from simulator.plan.validate import (
    DEFAULT_TABLE,
    EXPLAIN_ABOVE,
    GPU_FAMILIES,
    Comparison,
    FamilyFit,
    Summary,
    compare_all,
    fit_family_efficiencies,
    load_measurements,
    summarise,
)
from simulator.tabular import to_json

EPILOG = """\b
Examples:
  simulate validate
  simulate validate --csv validation/measurements.csv --json
  simulate validate --calibrate     # also fit one compute + one memory efficiency per GPU family

\b
Each row is simulated as a static batch: ttft = one prefill of batch x input tokens;
output tokens/s = batch x output / (prefill + every decode step), whole TP group;
tpot = mean decode step; decode tokens/s per sequence = output tokens/s / batch.
error = (predicted - measured) / measured. Rows over 50% carry an explanation
(the `explanation` column of the CSV); they are listed under the table.
"""

METRIC_LABELS = {
    "ttft_seconds": ("ttft", "ms", 1e3),
    "tpot_seconds": ("tpot", "ms", 1e3),
    "output_tokens_per_second": ("out tok/s", "", 1.0),
    "decode_tokens_per_second_per_sequence": ("tok/s/seq", "", 1.0),
}


def _shown(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    _, _, scale = METRIC_LABELS[metric]
    scaled = value * scale
    return f"{scaled:,.1f}" if scaled < 1000 else f"{scaled:,.0f}"


def _table(comparisons: list[Comparison]) -> str:
    header = (
        f"{'id':>3} {'model':<11} {'gpu':<15} {'tp':>2} {'w/kv':<9} {'batch':>5} {'in/out':>9} "
        f"{'metric':<12} {'measured':>9} {'predicted':>9} {'error':>7}"
    )
    lines = [header, "-" * len(header)]
    for c in comparisons:
        m = c.measurement
        label, unit, _ = METRIC_LABELS[m.metric]
        metric = f"{label} {unit}".strip()
        error = "skip" if c.error is None else f"{100 * c.error:+.0f}%"
        flag = "" if c.fits else "  (no fit in memory model)"
        lines.append(
            f"{m.id:>3} {m.model:<11} {_gpu_name(m.gpu):<15} {m.tp:>2} {m.weights + '/' + m.kv:<9} {m.batch:>5} "
            f"{str(m.input_tokens) + '/' + str(m.output_tokens):>9} {metric:<12} {_shown(m.metric, m.measured):>9} "
            f"{_shown(m.metric, c.predicted):>9} {error:>7}{flag}"
        )
    return "\n".join(lines)


def _gpu_name(name: str) -> str:
    try:
        return load_gpu(name).name
    except InputError:  # an unknown GPU is reported as a skip; show the name as written
        return name


def _summary_text(summary: Summary, comparisons: list[Comparison]) -> str:
    worst = sorted((c for c in comparisons if c.error is not None), key=lambda c: -abs(c.error))  # type: ignore[arg-type]
    lines = [
        f"{summary.rows} rows, {summary.compared} compared, {summary.skipped} skipped",
        f"median |error| {100 * summary.median_abs_error:.1f}%, max |error| {100 * summary.max_abs_error:.1f}% (row {summary.worst_id})",
        f"rows over {100 * EXPLAIN_ABOVE:.0f}%: {summary.over_limit}"
        + (f" (no explanation: {', '.join(summary.unexplained)})" if summary.unexplained else ""),
    ]
    over = [c for c in worst if c.needs_explanation]
    if over:
        lines.append("")
        lines.append(f"Rows over {100 * EXPLAIN_ABOVE:.0f}%, worst first:")
        for c in over:
            lines.append(f"  {c.measurement.id:>3} {100 * c.error:+.0f}%: {c.measurement.explanation or '(no explanation given)'}")  # type: ignore[operator]
    skipped = [c for c in comparisons if c.error is None]
    if skipped:
        lines.append("")
        lines.append("Skipped:")
        for c in skipped:
            lines.append(f"  {c.measurement.id:>3}: {c.skipped}")
    return "\n".join(lines)


def _calibration_text(fits: list[FamilyFit]) -> str:
    lines = ["Calibration (one compute and one memory efficiency per GPU family; median of per-row solutions):"]
    for fit in fits:
        compute = "-" if fit.compute is None else f"{fit.compute:.3f}"
        memory = "-" if fit.memory is None else f"{fit.memory:.3f}"
        lines.append(
            f"  {fit.family:<7} compute {compute} from rows {','.join(fit.compute_rows) or '-'}; "
            f"memory {memory} from rows {','.join(fit.memory_rows) or '-'}"
        )
        lines.append(f"          applies to: {', '.join(GPU_FAMILIES[fit.family])}")
    return "\n".join(lines)


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    m = c.measurement
    return {
        "id": m.id, "engine": m.engine, "model": m.model, "gpu": m.gpu, "tp": m.tp, "weights": m.weights, "kv": m.kv,
        "batch": m.batch, "input_tokens": m.input_tokens, "output_tokens": m.output_tokens, "metric": m.metric,
        "unit": m.unit, "measured": m.measured, "predicted": c.predicted, "error": c.error, "fits": c.fits,
        "skipped": c.skipped or None, "explanation": m.explanation or None, "source": m.source, "link": m.link,
    }


@click.command("validate", epilog=EPILOG)
@click.option("--csv", "table", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_TABLE,
              show_default="validation/measurements.csv", help="Measurements table to compare against.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: rows, summary (and calibration).")
@click.option("--calibrate", is_flag=True, help="Also fit one compute and one memory efficiency per GPU family (slower).")
@reports_input_errors
def validate_command(table: Path, as_json: bool, calibrate: bool) -> None:
    """Compare the simulator with published measurements: predicted vs measured, error %."""
    rows = load_measurements(table)
    comparisons = compare_all(rows)
    summary = summarise(comparisons)
    fits = fit_family_efficiencies(rows) if calibrate else None
    if as_json:
        out: dict[str, Any] = {
            "rows": [_comparison_dict(c) for c in comparisons],
            "summary": {
                "rows": summary.rows, "compared": summary.compared, "skipped": summary.skipped,
                "median_abs_error": summary.median_abs_error, "max_abs_error": summary.max_abs_error,
                "worst_id": summary.worst_id, "over_limit": summary.over_limit,
                "unexplained": list(summary.unexplained),
            },
        }
        if fits is not None:
            out["calibration"] = [
                {"family": f.family, "gpus": list(GPU_FAMILIES[f.family]), "compute": f.compute,
                 "compute_rows": list(f.compute_rows), "memory": f.memory, "memory_rows": list(f.memory_rows)}
                for f in fits
            ]
        click.echo(to_json(out, indent=2))
        return
    click.echo(_table(comparisons))
    click.echo("")
    click.echo(_summary_text(summary, comparisons))
    if fits is not None:
        click.echo("")
        click.echo(_calibration_text(fits))
