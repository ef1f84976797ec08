"""``simulate validate``: every row of a measurement table replayed through the engine, in and out of sample."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from simulator.cli.options import reports_input_errors
from simulator.cost.kernel_tables.source import KERNEL_MODES
from simulator.errors import InputError
from simulator.files import check_output_path
from simulator.model.gpu import load_gpu
from simulator.model.gpu_family import GPU_FAMILIES
from simulator.model.kernel_ceilings import CEILING_SOURCES, CEILINGS, END_TO_END, ceilings_file, kernel_fitted
from simulator.plan.error_bands import bands_file
from simulator.report.html import check_html_path
from simulator.report.html.validation import write_validation_html
from simulator.tabular import to_json
from simulator.validation.bands import bands_document
from simulator.validation.bands import write_bands as save_bands
from simulator.validation.crossval import (
    HOST_FIT_PROFILES,
    HOST_PRIOR,
    MIN_CLASS_ROWS,
    ErrorSummary,
    FamilyFit,
    Scored,
    Validation,
    ceiling_for,
    cross_validate,
    grouped,
    predict_with_kernel_ceilings,
    report_block,
    residuals,
    summarise,
)
from simulator.validation.replay import Replayer
from simulator.validation.table import default_table, load_table

EPILOG = """\b
Examples:
  simulate validate                        # the shipped table: summary, fits, every row
  simulate validate --json > validation.json
  simulate validate --csv my-benchmarks.csv --no-rows
  simulate validate --plot validation.png  # predicted vs measured, log-log, one marker per engine
  simulate validate --write-bands          # regenerate validation/error_bands.json
  simulate validate --ceilings kernels     # ceilings fitted on measured GEMM kernels, none on the table

\b
Each row is replayed through the serving engine: a static batch under the static
scheduler, a serving row as arrivals at its rate with its lengths and engine settings.
Two efficiency ceilings per GPU family (compute, memory) are fitted by a fixed rule
(docs/readme-validation.md). In-sample: fitted on every row. Out-of-sample: for each
source, fitted on the OTHER sources only, then that source's rows are predicted.
error = (predicted - measured) / measured; the tables show |error|.
"""

SHORT_METRICS = {
    "ttft_seconds": "ttft ms", "tpot_seconds": "tpot ms", "e2e_seconds": "batch s",
    "output_tokens_per_second": "out tok/s", "total_tokens_per_second": "tot tok/s",
    "decode_tokens_per_second_per_sequence": "tok/s/seq", "request_throughput": "req/s",
}


def _metric_label(metric: str) -> str:
    if metric in SHORT_METRICS:
        return SHORT_METRICS[metric]
    if metric.endswith("_seconds"):
        what = metric.removesuffix("_seconds")
        return f"{what} {'s' if what.startswith('e2e') else 'ms'}"
    return metric


def _shown(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.endswith("_seconds"):
        label = _metric_label(metric)
        value = value if label.endswith(" s") else value * 1e3
    return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _signed(value: float | None) -> str:
    return "skip" if value is None else f"{100 * value:+.0f}%"


def _summary_line(name: str, inside: ErrorSummary, outside: ErrorSummary) -> str:
    cells = []
    for s in (inside, outside):
        cells.append(f"{s.rows:>5} {_pct(s.median):>7} {_pct(s.p90):>7} {_pct(s.max):>7}")
    return f"{name:<28}" + "   ".join(cells)


def _summary_text(v: Validation) -> str:
    scored = v.scored
    out_title = ("out-of-sample (leave one source out)" if v.ceilings == END_TO_END
                 else "out-of-sample (nothing fitted here)")
    header = f"{'|error|':<28}{'in-sample':^29}   {out_title:^29}"
    sub = f"{'':<28}" + "   ".join([f"{'rows':>5} {'median':>7} {'p90':>7} {'max':>7}"] * 2)
    lines = [header, sub, "-" * len(sub)]
    lines.append(_summary_line("all rows", summarise(s.error_in for s in scored), summarise(s.error_out for s in scored)))
    serving = [s for s in scored if s.row.mode == "serving"]
    lines.append(_summary_line("serving rows", summarise(s.error_in for s in serving), summarise(s.error_out for s in serving)))
    for title, key in (("engine", lambda r: r.engine), ("family", lambda r: r.family), ("regime", lambda r: r.regime)):
        inside, outside = grouped(scored, key, "in"), grouped(scored, key, "out")
        for name in inside:
            if inside[name].rows or outside[name].rows:
                lines.append(_summary_line(f"{title} {name}", inside[name], outside[name]))
    return "\n".join(lines)


def _fit_text(v: Validation) -> str:
    if v.ceilings != END_TO_END:
        return _kernel_ceilings_text(v)
    lines = ["Fitted ceilings per GPU family (in-sample fit on every row; range over the leave-one-source-out folds):"]
    for family, fit in v.in_sample_fit.items():
        folds = [f[family] for f in v.fold_fits.values() if family in f]
        lines.append(f"  {family:<9} {_one(fit, folds, 'compute')};  {_one(fit, folds, 'memory')}")
        if fit.unsolved_rows:
            lines.append(f"            rows left out (no efficiency in [0.05, 1] reproduces them): {', '.join(fit.unsolved_rows)}")
    lines.append("  (default = simulator/model/gpu.py's 0.70 / 0.80, fitted on nothing: the family has no such row; "
                 "its rows are predicted with the borrowed ceilings listed below)")
    lines.append(f"Per (family, engine) class (fewer than {MIN_CLASS_ROWS} rows of a kind: the family-wide value):")
    for (family, engine), fit in sorted(v.in_sample_fit.classes.items()):
        folds = [f.classes[(family, engine)] for f in v.fold_fits.values() if (family, engine) in f.classes]
        lines.append(f"  {family + ' / ' + engine:<24} {_one(fit, folds, 'compute')};  {_one(fit, folds, 'memory')}")
    expert = v.in_sample_fit.expert
    if expert is None:
        lines.append("Expert GEMMs of MoE models: 1 (as dense GEMMs; no row calibrates them)")
        if v.in_sample_fit.expert_unsolved:
            lines.append("  rows left out (no fraction in [0.05, 1] reproduces them): "
                         + ", ".join(v.in_sample_fit.expert_unsolved))
    else:
        values = [f.expert for f in v.fold_fits.values() if f.expert is not None] or [expert]
        rows = v.in_sample_fit.expert_rows
        lines.append(f"Expert GEMMs of MoE models: {expert:.3f} of the ceilings, from {len(rows)} "
                     f"rows of {_sources(v, rows)} sources{_spread(values, lambda x: f'{x:.3f}')}")
    for profile, value in sorted(v.in_sample_fit.host.items()):
        values = [f.host[profile] for f in v.fold_fits.values() if profile in f.host] or [value]
        rows = v.in_sample_fit.host_rows.get(profile, ())
        lines.append(f"Host time per sequence of the {profile} profile: {1e6 * value:.0f} us per iteration, from "
                     f"{len(rows)} rows of {_sources(v, rows)} sources{_spread(values, lambda x: f'{1e6 * x:.0f}', ' us')}")
    borrowed = [(pair, c) for pair, c in _ceilings(v).items() if {c["compute_from"], c["memory_from"]} - {"class", "family"}]
    if borrowed:
        lines.append("Borrowed (the family has no calibrating row of a kind: the engine's classes on other families, "
                     "else every fitted family):")
        for pair, c in borrowed:
            lines.append(f"  {pair.replace('/', ' / '):<24} compute {c['compute']:.3f} ({c['compute_from']});  "
                         f"memory {c['memory']:.3f} ({c['memory_from']})")
    return "\n".join(lines)


def _kernel_ceilings_used(v: Validation) -> dict[str, dict[str, Any]]:
    """GPU -> the kernel-fitted parameters its rows were predicted with (``--ceilings kernels``)."""
    used: dict[str, dict[str, Any]] = {}
    for name in {s.row.gpu for s in v.scored}:  # each GPU the table names once, not once per row
        try:
            gpu = load_gpu(name)
            if gpu.name not in used:
                used[gpu.name] = dict(kernel_fitted(gpu))
        except InputError:  # an unknown GPU, or one the file does not cover: its rows were skipped, with the reason
            continue
    return dict(sorted(used.items()))


def _kernel_ceilings_text(v: Validation) -> str:
    lines = [f"Ceilings fitted on measured GEMM kernels, none on this table ({ceilings_file().name}; "
             "in sample = out of sample):"]
    for name, p in _kernel_ceilings_used(v).items():
        lines.append(f"  {name:<16} compute {p['compute']:.3f}, memory {p['memory']:.3f}, DRAM latency "
                     f"{1e6 * p['memory_latency_seconds']:.2f} us, overlap {p['overlap']:.2f}  [{p['source']}]")
    lines.append("Expert GEMMs of MoE models: 1 (as dense GEMMs); host time per sequence of the "
                 + ", ".join(HOST_FIT_PROFILES) + f" profile: {1e6 * HOST_PRIOR:.0f} us (the prior, not fitted)")
    return "\n".join(lines)


def _ceilings(v: Validation) -> dict[str, dict[str, Any]]:
    """The in-sample ceilings each (family, engine) of the table is predicted with, and where each came from."""
    out: dict[str, dict[str, Any]] = {}
    for family, engine in sorted({(s.row.family, s.row.runtime) for s in v.scored if s.row.family is not None}):
        compute, compute_from = ceiling_for(v.in_sample_fit, family, engine, "compute")
        memory, memory_from = ceiling_for(v.in_sample_fit, family, engine, "memory")
        out[f"{family}/{engine}"] = {"compute": compute, "compute_from": compute_from,
                                     "memory": memory, "memory_from": memory_from}
    return out


def _one(fit: FamilyFit, folds: list[FamilyFit], what: str) -> str:
    value = getattr(fit, what)
    rows = getattr(fit, f"{what}_rows")
    if not rows:
        return f"{what} {value:.3f} ({'family' if getattr(fit, f'{what}_from_family') else 'default'})"
    # folds in which the class had no row of this kind predict with borrowed ceilings (listed below), not this value
    values = [getattr(f, what) for f in folds if getattr(f, f"{what}_rows")] or [value]
    return f"{what} {value:.3f} from {len(rows)} rows{_spread(values, lambda x: f'{x:.3f}')}"


def _spread(values: list[float], show: Callable[[float], str], unit: str = "") -> str:
    """', folds LOW-HIGH' (with ``unit``) where the folds' values differ, else nothing."""
    return f", folds {show(min(values))}-{show(max(values))}{unit}" if min(values) != max(values) else ""


def _sources(v: Validation, row_ids: Iterable[str]) -> int:
    """How many sources the rows ``row_ids`` come from."""
    wanted = set(row_ids)
    return len({s.row.source_id for s in v.scored if s.row.id in wanted})


def _rows_text(scored: tuple[Scored, ...]) -> str:
    header = (
        f"{'id':>4} {'source':<24} {'engine':<8} {'model':<15} {'gpu':<5} {'tp':>2} {'metric':<13} "
        f"{'measured':>9} {'pred in':>9} {'err in':>6} {'pred out':>9} {'err out':>7}"
    )
    lines = [header, "-" * len(header)]
    for s in scored:
        r = s.row
        flag = "" if s.in_sample.fits else "  (no fit in memory model)"
        if s.role:
            flag += f"  [fits {s.role}]"
        lines.append(
            f"{r.id:>4} {r.source_id[:24]:<24} {r.engine[:8]:<8} {r.model[:15]:<15} {r.gpu[:5]:<5} {r.tp:>2} "
            f"{_metric_label(r.metric)[:13]:<13} {_shown(r.metric, r.measured):>9} {_shown(r.metric, s.in_sample.value):>9} "
            f"{_signed(s.error_in):>6} {_shown(r.metric, s.out_of_sample.value):>9} {_signed(s.error_out):>7}{flag}"
        )
    return "\n".join(lines)


def _worst_text(scored: tuple[Scored, ...], count: int = 5) -> str:
    ran = sorted((s for s in scored if s.error_out is not None), key=lambda s: -abs(s.error_out))  # type: ignore[arg-type]
    lines = [f"Worst {min(count, len(ran))} rows out of sample:"]
    for s in ran[:count]:
        r = s.row
        why = r.explanation or "(no explanation in the table)"
        lines.append(f"  {r.id:>4} {100 * s.error_out:+.0f}% ({r.source_id}, {r.model} on {r.tp}x {r.gpu}, {r.metric}): {why}")  # type: ignore[operator]
    return "\n".join(lines)


FAR_OFF = 0.40
"""|error| out of sample beyond which a row's ``explanation`` should say why (the issue's p90 bound)."""


def far_off(scored: tuple[Scored, ...]) -> tuple[list[str], list[str]]:
    """(ids of the rows beyond :data:`FAR_OFF` out of sample, those of them without an explanation)."""
    far = [s.row for s in scored if s.error_out is not None and abs(s.error_out) > FAR_OFF]
    return [r.id for r in far], [r.id for r in far if not r.explanation.strip()]


def _compared(scored: tuple[Scored, ...]) -> int:
    """Rows replayed and scored out of sample (the others were skipped, each with its reason)."""
    return sum(1 for s in scored if s.error_out is not None)


def _far_off_text(scored: tuple[Scored, ...]) -> str:
    far, bare = far_off(scored)
    line = f"Rows beyond {FAR_OFF:.0%} out of sample: {len(far)} of {_compared(scored)}"
    if not far:
        return line
    if bare:
        return line + f"; {len(bare)} without an explanation in the table ({_ids(bare)})"
    return line + ", each with an explanation in the table"


def _skipped_text(scored: tuple[Scored, ...]) -> str:
    reasons: dict[str, list[str]] = {}
    for s in scored:
        if s.skipped:
            reasons.setdefault(s.skipped, []).append(s.row.id)
    if not reasons:
        return ""
    lines = ["Skipped rows (never dropped silently):"]
    for reason, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(ids):>3} rows ({_ids(ids)}): {reason}")
    return "\n".join(lines)


def _ids(ids: list[str], most: int = 8) -> str:
    return ", ".join(ids[:most]) + (f", ... ({len(ids) - most} more)" if len(ids) > most else "")


def _fit_dict(fit: FamilyFit) -> dict[str, Any]:
    return {
        "gpus": list(GPU_FAMILIES.get(fit.family, ())), "compute": fit.compute, "memory": fit.memory,
        "compute_rows": list(fit.compute_rows), "memory_rows": list(fit.memory_rows),
        "compute_is_default": fit.compute_is_default, "memory_is_default": fit.memory_is_default,
        "unsolved_rows": list(fit.unsolved_rows),
        "engine": fit.engine, "compute_from_family": fit.compute_from_family, "memory_from_family": fit.memory_from_family,
    }


def _row_dict(s: Scored) -> dict[str, Any]:
    r = s.row
    return {
        "id": r.id, "source_id": r.source_id, "engine": r.engine, "model": r.model, "gpu": r.gpu, "family": r.family,
        "tp": r.tp, "replicas": r.replicas, "mode": r.mode, "regime": r.regime, "metric": r.metric,
        "metric_kind": r.kind, "unit": r.unit, "measured": r.measured,
        "predicted_in_sample": s.in_sample.value, "error_in_sample": s.error_in,
        "predicted_out_of_sample": s.out_of_sample.value, "error_out_of_sample": s.error_out,
        "fits_memory": s.in_sample.fits, "calibrates": s.role, "skipped": s.skipped or None,
        "notes": list(dict.fromkeys(s.in_sample.notes + s.out_of_sample.notes)),
        "explanation": r.explanation or None, "source": r.source, "link": r.link,
    }


def validation_dict(v: Validation, table: Path) -> dict[str, Any]:
    """The ``--json`` object: in_sample / out_of_sample summaries, the fits, and every row."""
    return {
        "table": str(table),
        "rows_total": len(v.scored),
        "rows_compared": _compared(v.scored),
        "sources": sorted({s.row.source_id for s in v.scored}),
        "in_sample": report_block(v.scored, "in"),
        "out_of_sample": report_block(v.scored, "out"),
        "beyond_40_percent": dict(zip(("rows", "without_explanation"), far_off(v.scored))),
        "ceilings": v.ceilings,
        "fit": _fit_json(v),
        "rows": [_row_dict(s) for s in v.scored],
    }


def _fit_json(v: Validation) -> dict[str, Any]:
    """The ``fit`` object of ``--json``: the kernel-fitted ceilings used (``--ceilings kernels``), else every fit."""
    if v.ceilings != END_TO_END:
        return {"kernel_ceilings": _kernel_ceilings_used(v), "file": str(ceilings_file())}
    return {
        "in_sample": {family: _fit_dict(f) for family, f in v.in_sample_fit.items()},
        "folds": {source: {family: _fit_dict(f) for family, f in fits.items()} for source, fits in v.fold_fits.items()},
        "classes_in_sample": {f"{family}/{engine}": _fit_dict(f) for (family, engine), f in v.in_sample_fit.classes.items()},
        "ceilings_in_sample": _ceilings(v),
        "classes_folds": {source: {f"{family}/{engine}": _fit_dict(f) for (family, engine), f in fits.classes.items()}
                          for source, fits in v.fold_fits.items()},
        "expert_in_sample": {"value": v.in_sample_fit.expert, "rows": list(v.in_sample_fit.expert_rows),
                             "unsolved_rows": list(v.in_sample_fit.expert_unsolved)},
        "expert_folds": {source: fits.expert for source, fits in v.fold_fits.items()},
        "host_per_sequence_in_sample": {profile: {"value_seconds": value, "rows": list(v.in_sample_fit.host_rows[profile])}
                                        for profile, value in v.in_sample_fit.host.items()},
        "host_per_sequence_folds": {source: dict(fits.host) for source, fits in v.fold_fits.items()},
    }


def _check_outputs(plot_path: Path | None, bands_out: Path | None, write: bool) -> None:
    """Output paths checked before minutes of replaying, so a bad path never loses a run."""
    if plot_path is not None:
        check_output_path(plot_path, "--plot", (".png", ".svg", ".pdf"))
    if bands_out is not None and not write:
        raise InputError("--bands-out: only used with --write-bands")
    if write:
        check_output_path(bands_out or bands_file(), "--bands-out" if bands_out else "--write-bands", (".json",))


class StatusLine:
    """What the validation is doing, as one line on stderr rewritten in place; only when stderr is a terminal
    (a redirected or captured stderr gets nothing), and wiped when done."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.perf_counter()
        self._shown = 0

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"validate [{time.perf_counter() - self.started:4.0f} s] {message}"
        click.echo("\r" + line.ljust(self._shown), err=True, nl=False)
        self._shown = len(line)

    def close(self) -> None:
        if self.enabled and self._shown:
            click.echo("\r" + " " * self._shown + "\r", err=True, nl=False)
            self._shown = 0


def run_validation(table: Path, jobs: int = 1, kernels: str = "roofline",
                   progress: Callable[[str], None] | None = None,
                   ceilings: str = END_TO_END) -> tuple[Validation, float]:
    started = time.perf_counter()
    rows = load_table(table)
    if not rows:
        raise InputError(f"--csv: {table}: the table has no rows")
    with Replayer(kernels=kernels) as replayer:
        if ceilings == CEILINGS:
            result = predict_with_kernel_ceilings(rows, replayer, progress=progress, workers=jobs)
        else:
            result = cross_validate(rows, replayer, progress=progress, workers=jobs)
    return result, time.perf_counter() - started


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _text(v: Validation, table: Path, seconds: float, no_rows: bool) -> str:
    compared = _compared(v.scored)
    sources = len({s.row.source_id for s in v.scored})
    parts = [
        (f"{table}: {len(v.scored)} rows from {sources} sources; {compared} replayed through the engine, "
        f"{len(v.scored) - compared} skipped ({v.engine_runs} engine runs, {seconds:.1f} s)"),
        _summary_text(v),
        _fit_text(v),
    ]
    if not no_rows:
        parts.append(_rows_text(v.scored))
    parts.append(_worst_text(v.scored) + "\n" + _far_off_text(v.scored))
    skipped = _skipped_text(v.scored)
    if skipped:
        parts.append(skipped)
    return "\n\n".join(parts)


@click.command("validate", epilog=EPILOG, context_settings={"max_content_width": 110})
@click.option("--csv", "table", type=click.Path(dir_okay=True, path_type=Path), default=None,
              show_default="validation/published.csv", help="Measurement table (published.csv schema) to replay.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: in_sample, out_of_sample, fit, rows.")
@click.option("--no-rows", is_flag=True, help="Text output: leave out the per-row table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw predicted vs measured (out of sample, log-log) to this .png/.svg/.pdf.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write a self-contained HTML report: predicted vs measured by engine with the +-25% lines and "
                   "the error band of each class (.html; needs plotly: pip install 'memwall[html]').")
@click.option("--write-bands", is_flag=True, help="Write the out-of-sample error bands (validation/error_bands.json).")
@click.option("--bands-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --write-bands: write them here instead of the shipped file.")
@click.option("--jobs", type=click.IntRange(min=1, max=256), default=None,
              help="Processes that simulate the runs (same results). [default: the CPUs available]")
@click.option("--kernels", type=click.Choice(KERNEL_MODES), default="roofline", show_default=True,
              help="What times the operators of every replayed run: roofline, measured (NVIDIA's kernel tables, "
              "an error for a row whose GPU has none) or auto (measured where tables exist).")
@click.option("--ceilings", type=click.Choice(CEILING_SOURCES), default=END_TO_END, show_default=True,
              help="end-to-end: fit the ceilings on the table (in sample, and per left-out source); kernels: predict "
              "every row with its GPU's ceilings fitted on measured GEMM kernels (validation/kernel_ceilings.json), "
              "nothing fitted on the table, so in sample = out of sample: what the kernels plus the rest of the "
              "time model explain.")
@reports_input_errors
def validate_command(table: Path | None, as_json: bool, no_rows: bool, plot_path: Path | None, write_bands: bool,
                     bands_out: Path | None, jobs: int | None, kernels: str, html_path: Path | None = None,
                     ceilings: str = END_TO_END) -> None:
    """Replay published measurements through the engine; in-sample and out-of-sample error."""
    table = default_table() if table is None else table
    if write_bands and ceilings != END_TO_END:
        raise InputError("--write-bands: the shipped error bands are those of the default ceilings; "
                         "leave out --ceilings kernels")
    _check_outputs(plot_path, bands_out, write_bands)
    if html_path is not None:
        check_html_path(html_path)  # before minutes of replaying, as the other outputs
    status = StatusLine()  # what is being done, on stderr, when that is a terminal
    try:
        v, seconds = run_validation(table, jobs or _cpus(), kernels, status, ceilings)
    finally:
        status.close()
    if write_bands:
        target = bands_out or bands_file()
        document = bands_document(residuals(v.scored), {
            "table": table.name, "rows": len(v.scored), "rows_compared": _compared(v.scored),
            "sources": len({s.row.source_id for s in v.scored}), "command": "simulate validate --write-bands",
        })
        save_bands(target, document)
        click.echo(f"wrote {len(document['classes'])} error-band classes to {target}", err=True)
    if plot_path is not None:
        from simulator.report.validation_plot import plot_validation

        plot_validation(v.scored, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if html_path is not None:
        write_validation_html(v, validation_dict(v, table), html_path)
        click.echo(f"wrote {html_path}", err=True)
    if as_json:
        click.echo(to_json(validation_dict(v, table), indent=1))
    else:
        click.echo(_text(v, table, seconds, no_rows))
    if not any(s.error_in is not None or s.error_out is not None for s in v.scored):
        # The report above lists why each row was skipped; a validation of no row is not a pass.
        raise InputError(f"--csv {table}: no row could be replayed; every one was skipped (the reasons are listed in "
                         "the report)")


