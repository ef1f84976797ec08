"""The HTML report of a sweep (``simulate sweep FILE --html OUT``).

Three scatter charts of the points that fit memory (Plotly, div ids in parentheses), each with
its Pareto front, the SLO and the chosen point:

- output tokens/s per GPU against tokens/s per user (``chart-pareto-user``): per user = 1 / mean
  TPOT (tokens/s one stream sees after its first token); the front keeps the points no other beats
  on both (higher is better on both axes); points meeting the SLO and missing it are two traces;
- tokens/s per GPU against p99 TTFT (``chart-pareto-ttft``) and against p99 TPOT
  (``chart-pareto-tpot``), lower latency better, the SLO's side of its limit shaded.

The chosen point is the summary's "highest output throughput" (among the points meeting the SLO
when the scenario has one; ties to the lower cost, then the lower point, as
:func:`simulator.sweep.sweep.best_per_objective`), re-simulated once for its launch commands.
Every figure is the results file's row (the same row ``--out x.jsonl`` writes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from simulator.report.html.page import Cell, Figure, Section, Table, write_page
from simulator.sweep.scenario import Scenario
from simulator.sweep.sweep import THROUGHPUT_KEY, best_per_objective, cell_number
from simulator.units import fmt_seconds, fmt_value

LAUNCH_ENGINES = ("vllm", "sglang")
PER_USER_KEY = "latency.tpot_seconds.mean"
CHARTS = (
    # (div id, x key of the point dict, x label, whether a larger x is better, SLO metric shaded)
    ("chart-pareto-user", "tokens_per_second_per_user", "tokens/s per user (1 / mean TPOT)", True, None),
    ("chart-pareto-ttft", "p99_ttft_seconds", "p99 TTFT (ms, log scale)", False, "ttft"),
    ("chart-pareto-tpot", "p99_tpot_seconds", "p99 TPOT (ms, log scale)", False, "tpot"),
)


def _number(value: Any) -> float | None:
    """A cell a chart can draw: a finite number, else None."""
    number = cell_number(value)
    return number if number is not None and math.isfinite(number) else None


def point_figures(row: dict[str, Any]) -> dict[str, Any] | None:
    """What the charts draw of a row that fits: tokens/s per GPU = output tokens/s / GPUs; tokens/s per user =
    1 / mean TPOT; p99 TTFT and TPOT (s); None for a row that does not fit or has no throughput."""
    throughput, gpus = _number(row.get(THROUGHPUT_KEY)), _number(row.get("gpus"))
    if row.get("fits") is not True or throughput is None or not gpus:
        return None
    tpot = _number(row.get(PER_USER_KEY))
    return {
        "point": int(row["point"]),
        "gpus": int(gpus),
        "output_tokens_per_second": throughput,
        "tokens_per_second_per_gpu": throughput / gpus,
        "tokens_per_second_per_user": 1.0 / tpot if tpot else None,
        "p99_ttft_seconds": _number(row.get("p99.ttft_seconds")),
        "p99_tpot_seconds": _number(row.get("p99.tpot_seconds")),
        "p99_e2e_seconds": _number(row.get("p99.e2e_seconds")),
        "slo_met": row.get("slo.met") if isinstance(row.get("slo.met"), bool) else None,
    }


def front(points: list[dict[str, Any]], x: str, larger_x_better: bool, y: str = "tokens_per_second_per_gpu") -> list[int]:
    """Points (by id) no other point beats on both ``x`` and ``y`` (larger ``y`` better), best ``x`` first.
    Of points equal on both, the lower point stays."""
    drawn = [p for p in points if p[x] is not None]
    sign = -1.0 if larger_x_better else 1.0
    drawn.sort(key=lambda p: (sign * p[x], -p[y], p["point"]))
    kept, best = [], -math.inf
    for p in drawn:
        if p[y] > best:
            kept.append(p["point"])
            best = p[y]
    return kept


def chosen_row(rows: list[dict[str, Any]], has_slo: bool) -> tuple[str, dict[str, Any]] | None:
    """(objective label, row) of the summary's best throughput (under the SLO when there is one), else None."""
    for objective, row in best_per_objective(rows, has_slo):
        if objective.key == THROUGHPUT_KEY:
            return objective.label, row
    return None


def launch_commands(settings: dict[str, Any]) -> dict[str, str]:
    """The commands that start a point's deployment on each engine (one re-simulated run)."""
    from simulator.plan.run import simulate_settings
    from simulator.report.vllm_format import launch_command

    run = simulate_settings(dict(settings))
    return {engine: launch_command(run, engine) for engine in LAUNCH_ENGINES}


CHOSEN_KEYS = (
    ("point", "point", ""), ("gpus", "GPUs", ""), (THROUGHPUT_KEY, "output tokens/s", "rate"),
    ("p99.ttft_seconds", "p99 TTFT", "seconds"), ("p99.tpot_seconds", "p99 TPOT", "seconds"),
    ("p99.e2e_seconds", "p99 end to end", "seconds"), (PER_USER_KEY, "mean TPOT", "seconds"),
    ("slo.met", "meets the SLO", "bool"), ("cost.usd_per_million_output_tokens", "$ per million output tokens", "usd"),
)


def sweep_report_data(scenario: Scenario, rows: list[dict[str, Any]],
                      commands: Callable[[dict[str, Any]], dict[str, str]] | None = launch_commands) -> dict[str, Any]:
    """What the page draws and shows as one JSON-ready dict: points, fronts, SLO, the chosen row and its launch
    commands (``commands``: a point's settings -> engine -> command; None: no commands)."""
    slo = scenario.slo.limits() if scenario.slo is not None else {}
    points = [p for p in (point_figures(row) for row in rows) if p is not None]
    chosen = chosen_row(rows, bool(slo))
    axes = [axis.name for axis in scenario.axes]
    chosen_data = None
    if chosen is not None:
        objective, row = chosen
        settings = scenario.points()[int(row["point"])]
        chosen_data = {
            "objective": objective, "point": int(row["point"]), "row": row,
            "figures": next(p for p in points if p["point"] == int(row["point"])),
            "inputs": {name: row.get(f"input.{name}") for name in axes},
            "launch_commands": commands(settings) if commands is not None else {},
        }
    return {
        "kind": "sweep", "scenario": scenario.name, "description": scenario.description,
        "axes": axes, "slo_seconds": slo, "points": points, "rows": len(rows),
        "fronts": {div: front(points, key, larger) for div, key, _, larger, _ in CHARTS},
        "chosen": chosen_data,
        "inputs_by_point": {str(row["point"]): {name: row.get(f"input.{name}") for name in axes} for row in rows},
    }


def _chart(go: Any, data: dict[str, Any], div: str, key: str, label: str, metric: str | None) -> Any:
    points = [p for p in data["points"] if p[key] is not None]
    scale = 1.0 if metric is None else 1e3  # latencies in ms on the axis

    def trace(members: list[dict[str, Any]], name: str, **style: Any) -> Any:
        return go.Scatter(x=[scale * p[key] for p in members], y=[p["tokens_per_second_per_gpu"] for p in members],
                          mode=style.pop("mode", "markers"), name=f"{name} ({len(members)})",
                          text=[f"point {p['point']}: " + ", ".join(f"{a}={data_inputs(data, p['point'], a)}"
                                                                      for a in data["axes"]) for p in members],
                          **style)

    fig = go.Figure()
    if data["slo_seconds"]:
        met = [p for p in points if p["slo_met"] is True]
        missed = [p for p in points if p["slo_met"] is not True]
        fig.add_trace(trace(met, "meets the SLO", marker={"color": "#54a24b", "size": 9}))
        fig.add_trace(trace(missed, "misses the SLO", marker={"color": "#bab0ac", "size": 9}))
    else:
        fig.add_trace(trace(points, "points", marker={"color": "#4c78a8", "size": 9}))
    by_id = {p["point"]: p for p in points}
    fig.add_trace(trace([by_id[i] for i in data["fronts"][div]], "Pareto front", mode="lines+markers",
                        line={"color": "#4c78a8", "dash": "dot"}, marker={"size": 5}))
    chosen = data["chosen"]
    if chosen is not None and chosen["figures"][key] is not None:
        fig.add_trace(trace([chosen["figures"]], f"chosen: point {chosen['point']}",
                            marker={"symbol": "star", "size": 18, "color": "#e45756"}))
    limit = data["slo_seconds"].get(metric) if metric else None
    if metric is not None:
        fig.update_xaxes(type="log")  # latencies of a sweep span decades
    if metric is not None and limit is not None:
        left = min([scale * p[key] for p in points] + [scale * limit]) / 2  # a log axis has no 0
        fig.add_vrect(x0=left, x1=scale * limit, fillcolor="#54a24b", opacity=0.08, line_width=0)
        # An annotation on a log axis is placed in log10 units (a shape in data units).
        fig.add_annotation(x=math.log10(scale * limit), xref="x", y=1, yref="paper", showarrow=False, xanchor="right",
                           yanchor="bottom", text=f"SLO: p99 {metric.upper()} <= {fmt_seconds(limit)}")
    fig.update_layout(title=f"tokens/s per GPU vs {label}", xaxis_title=label,
                      yaxis_title="output tokens/s per GPU", height=420, margin={"t": 50})
    return fig


def data_inputs(data: dict[str, Any], point: int, axis: str) -> Any:
    return data["inputs_by_point"].get(str(point), {}).get(axis)


def write_sweep_html(scenario: Scenario, rows: list[dict[str, Any]], path: str | Path,
                     commands: Callable[[dict[str, Any]], dict[str, str]] | None = launch_commands) -> Path:
    """Write the sweep's HTML report to ``path`` (needs plotly)."""
    import plotly.graph_objects as go

    data = sweep_report_data(scenario, rows, commands)
    slo = data["slo_seconds"]
    limits = ", ".join(f"p99 {m.upper()} <= {fmt_seconds(v)}" for m, v in slo.items()) or "none"
    met = sum(1 for p in data["points"] if p["slo_met"] is True)
    sections = [Section("Scenario", [
        f"{(scenario.description or scenario.name).rstrip('.')}: {len(rows)} points, {len(data['points'])} fit memory; "
        f"axes: {', '.join(data['axes']) or 'none'}; SLO: {limits}"
        + (f" ({met} points meet it)." if slo else ".")])]
    chosen = data["chosen"]
    if chosen is None:
        sections.append(Section("Chosen point", ["No point fits memory" + (" and meets the SLO" if slo else "") + "."]))
    else:
        row = chosen["row"]
        table = Table(["", "value"], [[Cell(label), Cell(fmt_value(row.get(key), kind), key, row.get(key))]
                                      for key, label, kind in CHOSEN_KEYS if key in row], "chosen-table")
        inputs = "; ".join(f"{name}={value}" for name, value in chosen["inputs"].items())
        sections.append(Section(
            f"Chosen point: {chosen['point']} ({chosen['objective']}"
            + (" among the points meeting the SLO)" if slo else ")"),
            [f"inputs: {inputs or '(the base options)'}"], tables=[table],
            code=[f"# {engine}\n{command}" for engine, command in chosen["launch_commands"].items()]))
    sections.append(Section("Pareto fronts", figures=[
        Figure(div, _chart(go, data, div, key, label, metric),
               "one marker per point that fits memory; the dotted line joins the Pareto front (no other point has "
               "both more tokens/s per GPU and a better x); the star is the chosen point")
        for div, key, label, _, metric in CHARTS]))
    return write_page(path, f"memwall sweep: {scenario.name}", sections, data,
                      subtitle="every figure is the results file's row; SI units in the embedded JSON")
