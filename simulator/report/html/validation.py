"""The HTML report of the validation (``simulate validate --html OUT``).

Charts (Plotly, div ids in parentheses):

- predicted (out of sample: each row predicted with parameters fitted without its source) against
  measured, log-log, one trace per engine, with y = x and the ±25% lines: latencies in seconds
  (``chart-validation-times``) and rates in tokens/s or requests/s (``chart-validation-rates``);
  a chart with no row is left out;
- the error band of each class (``chart-bands``): the 10th to 90th percentile of the signed
  out-of-sample error (predicted - measured) / measured, per class with at least
  :data:`simulator.plan.error_bands.MIN_ROWS` rows, at every level (GPU family x engine x regime x
  metric kind, family x regime x kind, regime x kind), as ``simulate validate --write-bands``
  computes them and a run looks them up.

The rows and summaries are those of ``simulate validate --json`` (:func:`validation_dict`, passed in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.model.kernel_ceilings import END_TO_END
from simulator.report.html.page import Cell, Figure, Section, Table, write_page
from simulator.report.validation_plot import BAND, validation_plot_data
from simulator.validation.bands import compute_bands
from simulator.validation.crossval import Validation, residuals

PANELS = (("times", "chart-validation-times", "latencies", "seconds"),
          ("rates", "chart-validation-rates", "throughputs", "per second (tokens or requests)"))


def band_label(entry: dict[str, Any]) -> str:
    """``full: a100 / vllm / decode / time``: the class's level and its key, left to right."""
    parts = [entry.get(name) for name in ("family", "engine", "regime", "metric_kind")]
    return f"{entry['level']}: " + " / ".join(str(part) for part in parts if part is not None)


def validation_report_data(v: Validation, json_document: dict[str, Any]) -> dict[str, Any]:
    """What the page draws: the scatter panels, the bands of every class that has one, and the ``--json``
    document's summaries (``out_of_sample``, ``in_sample``, row counts)."""
    bands = [{**entry, "label": band_label(entry)} for entry in compute_bands(residuals(v.scored))
             if entry["low"] is not None]
    return {
        "kind": "validation", "table": json_document["table"], "rows_total": json_document["rows_total"],
        "rows_compared": json_document["rows_compared"], "sources": json_document["sources"],
        "out_of_sample": json_document["out_of_sample"], "in_sample": json_document["in_sample"],
        "scatter": validation_plot_data(v.scored, "out"), "band_lines": [1 - BAND, 1 + BAND], "bands": bands,
    }


ENGINE_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#eeca3b")


def _scatter(go: Any, panel: dict[str, Any], title: str, unit: str, colors: dict[str, str]) -> Any:
    values = [x for series in panel.values() for x in series["measured"] + series["predicted"] if x > 0]
    low, high = min(values) / 1.5, max(values) * 1.5
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", name="y = x", line={"color": "black"}))
    for factor, name in ((1 + BAND, f"+{100 * BAND:.0f}%"), (1 - BAND, f"-{100 * BAND:.0f}%")):
        fig.add_trace(go.Scatter(x=[low, high], y=[low * factor, high * factor], mode="lines", name=name,
                                 line={"color": "grey", "dash": "dash"}))
    for engine, series in panel.items():
        fig.add_trace(go.Scatter(x=series["measured"], y=series["predicted"], mode="markers", opacity=0.75,
                                 marker={"color": colors[engine], "size": 8},
                                 name=f"{engine} ({len(series['measured'])})", text=[f"row {i}" for i in series["ids"]]))
    fig.update_xaxes(type="log", title=f"measured, {unit}")
    fig.update_yaxes(type="log", title=f"predicted out of sample, {unit}")
    fig.update_layout(title=f"Predicted vs measured: {title}", height=520, margin={"t": 50})
    return fig


def _bands(go: Any, bands: list[dict[str, Any]]) -> Any:
    labels = [band["label"] for band in bands]
    fig = go.Figure(go.Bar(
        y=labels, base=[100 * band["low"] for band in bands], x=[100 * (band["high"] - band["low"]) for band in bands],
        orientation="h", name="10th-90th percentile", marker_color="#4c78a8",
        text=[f"{band['rows']} rows" for band in bands], textposition="inside",
        hovertemplate="%{y}: %{base:.1f}% to %{customdata:.1f}%<extra></extra>",
        customdata=[100 * band["high"] for band in bands]))
    fig.add_vline(x=0, line_color="black")
    for edge in (-100 * BAND, 100 * BAND):
        fig.add_vline(x=edge, line_dash="dash", line_color="grey")
    fig.update_layout(title="Error band of each class (signed out-of-sample error)", xaxis_title="error, %",
                      height=max(300, 120 + 18 * len(bands)), margin={"t": 50, "l": 320},
                      yaxis={"autorange": "reversed"})
    return fig


def _summary_table(data: dict[str, Any]) -> Table:
    rows = []
    for label, prefix, block in (("all rows", "out_of_sample", data["out_of_sample"]),
                                 ("serving rows", "out_of_sample.serving", data["out_of_sample"]["serving"]),
                                 *((f"engine {name}", f"out_of_sample.by_engine.{name}", summary)
                                   for name, summary in data["out_of_sample"]["by_engine"].items())):
        cells = [Cell(label), Cell(str(block["rows"]), f"{prefix}.rows", block["rows"])]
        for quantity in ("median", "p90", "max"):
            value = block.get(quantity)
            cells.append(Cell("-" if value is None else f"{100 * value:.1f}%", f"{prefix}.{quantity}", value))
        rows.append(cells)
    return Table(["|error| out of sample", "rows", "median", "p90", "max"], rows, "error-table")


def write_validation_html(v: Validation, json_document: dict[str, Any], path: str | Path) -> Path:
    """Write the validation's HTML report to ``path`` (needs plotly); ``json_document``: the ``--json`` object."""
    import plotly.graph_objects as go

    data = validation_report_data(v, json_document)
    engines = sorted({engine for panel in data["scatter"]["panels"].values() for engine in panel})
    colors = {engine: ENGINE_COLORS[i % len(ENGINE_COLORS)] for i, engine in enumerate(engines)}  # same in both charts
    figures = [Figure(div, _scatter(go, data["scatter"]["panels"][name], title, unit, colors),
                      "one marker per replayed row, one colour per engine; the solid line is a perfect prediction, "
                      f"the dashed lines +-{100 * BAND:.0f}%")
               for name, div, title, unit in PANELS if data["scatter"]["panels"][name]]
    sections = [
        Section("Summary", [f"{data['table']}: {data['rows_total']} rows from {len(data['sources'])} sources; "
                            f"{data['rows_compared']} replayed and compared out of sample "
                            + ("(leave one source out)." if v.ceilings == END_TO_END else
                               "(ceilings fitted on measured GEMM kernels, nothing fitted on the table).")],
                tables=[_summary_table(data)]),
        Section("Predicted vs measured", figures=figures),
        Section("Error bands", figures=[Figure("chart-bands", _bands(go, data["bands"]),
                                               "each bar spans the 10th to 90th percentile of the class's signed error; "
                                               "a class needs at least 5 rows")] if data["bands"] else [],
                paragraphs=[] if data["bands"] else ["No class has enough rows for a band (5 at least)."]),
    ]
    return write_page(path, "memwall validation: predicted vs measured", sections, data,
                      subtitle="out-of-sample predictions; the embedded JSON holds the same summaries as --json")
