"""Predicted vs measured of the validation rows on log-log axes (matplotlib, optional).

Two panels, since a table mixes units: times (seconds: TTFT, TPOT, ITL, end to end) and rates
(tokens/s, requests/s). One marker per engine; the line y = x is a perfect prediction and the
dashed lines y = 1.25 x and y = 0.75 x bound +-25% error. Out-of-sample predictions by default
(each row predicted with parameters fitted without its source).

:func:`validation_plot_data` builds what is drawn (tested without pixels); :func:`plot_validation`
draws it with the Agg canvas of :mod:`simulator.report.plots`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.report.plots import _matplotlib, check_plot_path, save_figure
from simulator.validation.crossval import Scored
from simulator.validation.table import is_time_metric

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
BAND = 0.25


def validation_plot_data(scored: Iterable[Scored], which: str = "out") -> dict[str, Any]:
    """{"panels": {"times": {engine: {"measured": [...], "predicted": [...], "ids": [...]}}, "rates": {...}}, "rows": n}."""
    panels: dict[str, dict[str, dict[str, list]]] = {"times": {}, "rates": {}}
    count = 0
    for s in scored:
        prediction = s.out_of_sample if which == "out" else s.in_sample
        if prediction.value is None:
            continue
        panel = panels["times" if is_time_metric(s.row.metric) else "rates"]
        series = panel.setdefault(s.row.engine, {"measured": [], "predicted": [], "ids": []})
        series["measured"].append(s.row.measured)
        series["predicted"].append(prediction.value)
        series["ids"].append(s.row.id)
        count += 1
    return {"panels": {k: dict(sorted(v.items())) for k, v in panels.items()}, "rows": count, "which": which}


def plot_validation(scored: Iterable[Scored], path: str | Path, which: str = "out") -> Path:
    """Draw predicted vs measured to ``path`` (.png/.svg/.pdf); InputError when nothing can be drawn."""
    out = check_plot_path(path)
    data = validation_plot_data(scored, which)
    if data["rows"] == 0:
        raise InputError("--plot: no row was replayed, nothing to plot")
    Figure, FigureCanvasAgg = _matplotlib()
    shown = [(name, panel) for name, panel in data["panels"].items() if panel]
    fig = Figure(figsize=(6.5 * len(shown), 6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    engines = sorted({engine for _, panel in shown for engine in panel})
    marker = {engine: MARKERS[i % len(MARKERS)] for i, engine in enumerate(engines)}
    for index, (name, panel) in enumerate(shown, start=1):
        ax = fig.add_subplot(1, len(shown), index)
        values = [v for series in panel.values() for v in series["measured"] + series["predicted"]]
        low, high = min(values) / 1.5, max(values) * 1.5
        ax.plot([low, high], [low, high], color="black", linewidth=1, label="y = x")
        for factor, label in ((1 + BAND, f"+-{100 * BAND:.0f}%"), (1 - BAND, None)):
            ax.plot([low, high], [low * factor, high * factor], color="grey", linestyle="--", linewidth=1, label=label)
        for engine, series in panel.items():
            ax.scatter(series["measured"], series["predicted"], marker=marker[engine], alpha=0.75,
                       label=f"{engine} ({len(series['measured'])})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        unit = "seconds" if name == "times" else "per second (tokens or requests)"
        ax.set_xlabel(f"measured, {unit}")
        ax.set_ylabel(f"predicted ({'out of sample' if which == 'out' else 'in sample'}), {unit}")
        ax.set_title("latencies" if name == "times" else "throughputs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, out)  # whole or not at all
    return out
