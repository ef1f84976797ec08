"""The HTML report of one run (``simulate ... --html FILE``).

Charts (Plotly, div ids in parentheses):

- per-request latency distributions, one histogram each: TTFT (``chart-ttft``), TPOT
  (``chart-tpot``), end to end (``chart-e2e``), in milliseconds, with the run's SLO as a vertical
  line when one is set; one point per request that got there (a TPOT needs two output tokens);
- batch size and KV-cache use over time (``chart-timeline``): per iteration of the iteration log,
  the running sequences and the KV blocks used as a share of the cache, at the iteration's end;
- the time of a step by term (``chart-breakdown``): roofline (the operators' GPU time less what
  follows), collectives, kernel launches (launch time and the GPU's wait for the host to launch),
  engine overhead (host time per iteration the GPU waits for) for the first prefill iteration and
  the last decode step; the client path (HTTP, tokenisation, first chunk) once per request.

Long runs keep every n-th point (n = ceil(count / limit), stated on the page), so a page of a
10^6-request run stays a few MB. The figures come from the same :func:`engine_run_dict` as ``--json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.metrics import DONE
from simulator.plan.result import engine_run_dict, per_request_arrays
from simulator.report.html.page import Cell, Figure, Section, Table, every_nth, write_page
from simulator.units import fmt_seconds

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun

REQUEST_POINTS = 20_000
"""Most per-request points drawn per latency (every n-th request beyond)."""
ITERATION_POINTS = 5_000
"""Most iterations drawn per log segment (every n-th iteration beyond)."""

LATENCIES = (("ttft", "TTFT", "time to first token"), ("tpot", "TPOT", "time per output token after the first"),
             ("e2e", "end to end", "arrival to last token"))
TERMS = ("roofline", "collectives", "launches", "engine overhead", "client path")


def latency_samples(run: "EngineRun") -> dict[str, Any]:
    """Per metric (``ttft_seconds``, ``tpot_seconds``, ``e2e_seconds``) the finished requests' values (seconds),
    every ``stride``-th kept, and how many there were in all."""
    arrays = per_request_arrays(run)
    done = arrays["status"] == DONE
    out: dict[str, Any] = {}
    for metric, _, _ in LATENCIES:
        values = arrays[f"{metric}_seconds"][done]
        values = values[np.isfinite(values)]
        stride = every_nth(len(values), REQUEST_POINTS)
        out[f"{metric}_seconds"] = {"count": int(len(values)), "stride": stride, "values": values[::stride].tolist()}
    return out


def log_segments(end: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of rising end times: a cluster's log is its replicas' logs one after another
    (simulator.engine.cluster), each rising in time; one replica's log is one segment."""
    if len(end) == 0:
        return []
    cuts = np.flatnonzero(np.diff(end) < 0) + 1
    bounds = [0, *cuts.tolist(), len(end)]
    return list(zip(bounds[:-1], bounds[1:]))


def timeline(run: "EngineRun") -> dict[str, Any]:
    """The iteration log as drawn: per segment, end times (s), running sequences, KV blocks used / blocks."""
    log, blocks = run.result.log, max(int(run.result.kv_blocks), 1)
    end = np.asarray(log["end"])
    running, used = np.asarray(log["running"]), np.asarray(log["blocks_used"])
    segments = []
    for start, stop in log_segments(end):
        stride = every_nth(stop - start, ITERATION_POINTS)
        part = slice(start, stop, stride)
        segments.append({"iterations": stop - start, "stride": stride, "end_seconds": end[part].tolist(),
                         "running": running[part].tolist(), "kv_fraction": (used[part] / blocks).tolist()})
    return {"iterations": int(len(end)), "kv_blocks": blocks, "segments": segments}


def step_terms(step: dict[str, Any] | None) -> dict[str, float] | None:
    """A step's seconds by term from the JSON's keys: ``seconds``, ``communication``, ``launch``, ``launch_wait``,
    ``overhead``; roofline is what is left of the step (the operators' time at roofline rates)."""
    if step is None or not step["seconds"]:
        return None
    launches = step["launch"] + step["launch_wait"]
    return {"roofline": step["seconds"] - step["communication"] - launches - step["overhead"],
            "collectives": step["communication"], "launches": launches, "engine overhead": step["overhead"],
            "client path": 0.0, "total": step["seconds"]}


def breakdown(result: dict[str, Any]) -> dict[str, Any]:
    """Seconds by term of the first prefill iteration, the last decode step, and the client path per request."""
    prefill, decode, client = result["prefill"], result["decode"], result["client_path"]
    first = {"seconds": prefill["seconds"], "communication": prefill["communication_seconds"],
             "launch": prefill["launch_seconds"], "launch_wait": prefill["launch_wait_seconds"],
             "overhead": prefill["overhead_seconds"]}
    last = {"seconds": decode["last_step_seconds"], "communication": decode["last_step_communication_seconds"],
            "launch": decode["last_step_launch_seconds"], "launch_wait": decode["last_step_launch_wait_seconds"],
            "overhead": decode["last_step_overhead_seconds"]}
    path = {**dict.fromkeys(TERMS, 0.0), "client path": client["total_seconds"], "total": client["total_seconds"]}
    return {"first prefill iteration": step_terms(first), "last decode step": step_terms(last),
            "client path (per request)": path}


def run_report_data(run: "EngineRun") -> dict[str, Any]:
    """What the page draws and shows, as one JSON-ready dict (``summary`` is the ``--json`` object)."""
    result = engine_run_dict(run)
    return {"kind": "run", "summary": result, "latency_samples": latency_samples(run), "timeline": timeline(run),
            "breakdown": breakdown(result)}


def _latency_figure(go: Any, data: dict[str, Any], metric: str, label: str, slo: float | None) -> Any:
    samples = data["latency_samples"][f"{metric}_seconds"]
    fig = go.Figure(go.Histogram(x=[1e3 * v for v in samples["values"]], name=label,
                                 marker_color="#4c78a8"))
    summary = data["summary"]["latency"][f"{metric}_seconds"]
    for name, color in (("p50", "#54a24b"), ("p99", "#e45756")):
        fig.add_vline(x=1e3 * summary[name], line_dash="dot", line_color=color,
                      annotation_text=f"{name} {fmt_seconds(summary[name])}", annotation_position="top")
    if slo is not None:
        fig.add_vline(x=1e3 * slo, line_width=3, line_color="black",
                      annotation_text=f"SLO {fmt_seconds(slo)}", annotation_position="bottom right")
    fig.update_layout(title=f"{label}: {samples['count']:,} requests", xaxis_title=f"{label} (ms)",
                      yaxis_title="requests", height=340, margin={"t": 50, "b": 45}, showlegend=False)
    return fig


def _timeline_figure(go: Any, data: dict[str, Any]) -> Any:
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    segments = data["timeline"]["segments"]
    for index, segment in enumerate(segments):
        suffix = f" (log part {index + 1})" if len(segments) > 1 else ""
        fig.add_trace(go.Scatter(x=segment["end_seconds"], y=segment["running"], mode="lines", line_shape="hv",
                                 name="running sequences" + suffix), secondary_y=False)
        fig.add_trace(go.Scatter(x=segment["end_seconds"], y=[100 * f for f in segment["kv_fraction"]], mode="lines",
                                 line_shape="hv", name="KV cache used (%)" + suffix), secondary_y=True)
    fig.update_layout(title=f"Batch size and KV-cache use per iteration ({data['timeline']['iterations']:,} iterations)",
                      xaxis_title="time (s, end of the iteration)", height=380, margin={"t": 50})
    fig.update_yaxes(title_text="running sequences", secondary_y=False)
    fig.update_yaxes(title_text=f"KV cache used (% of {data['timeline']['kv_blocks']:,} blocks)", secondary_y=True,
                     rangemode="tozero")
    return fig


def _breakdown_figure(go: Any, data: dict[str, Any]) -> Any:
    bars = {name: terms for name, terms in data["breakdown"].items() if terms is not None}
    fig = go.Figure()
    for term in TERMS:
        fig.add_trace(go.Bar(x=list(bars), y=[1e3 * terms[term] for terms in bars.values()], name=term))
    fig.update_layout(barmode="stack", title="Step time by term", yaxis_title="milliseconds", height=380,
                      margin={"t": 50})
    return fig


def _summary_table(summary: dict[str, Any]) -> Table:
    rows = []
    for metric, label, _ in (*LATENCIES, ("itl", "ITL", ""), ("queue", "queueing", "")):
        values = summary["latency"][f"{metric}_seconds"]
        rows.append([Cell(label), *(Cell(fmt_seconds(values[q]), f"latency.{metric}_seconds.{q}", values[q])
                                   for q in ("mean", "p50", "p90", "p99"))])
    return Table(["latency", "mean", "p50", "p90", "p99"], rows, "latency-table")


def _throughput_table(summary: dict[str, Any]) -> Table:
    throughput, rows = summary["throughput"], []
    for key, label, unit in (("output_tokens_per_second", "output", "tokens/s"),
                             ("total_tokens_per_second", "total", "tokens/s"),
                             ("requests_per_second", "requests", "requests/s"),
                             ("goodput_requests_per_second", "goodput", "requests/s")):
        rows.append([Cell(label), Cell(f"{throughput[key]:,.2f} {unit}", f"throughput.{key}", throughput[key])])
    rows.append([Cell("GPUs"), Cell(str(summary["gpus"]), "gpus", summary["gpus"])])
    return Table(["throughput", "value"], rows, "throughput-table")


def write_run_html(run: "EngineRun", path: str | Path) -> Path:
    """Write the run's HTML report to ``path`` (needs plotly)."""
    import plotly.graph_objects as go

    data = run_report_data(run)
    summary = data["summary"]
    slo = summary["slo"]
    latency_figures = [
        Figure(f"chart-{metric}", _latency_figure(go, data, metric, label, slo[f"{metric}_seconds"]),
               f"{label}: {what}; dotted lines p50 and p99"
               + ("" if slo[f"{metric}_seconds"] is None else ", the thick line the SLO")
               + ("" if data["latency_samples"][f"{metric}_seconds"]["stride"] == 1
                  else f"; every {data['latency_samples'][f'{metric}_seconds']['stride']}th request drawn"))
        for metric, label, what in LATENCIES
    ]
    strides = sorted({segment["stride"] for segment in data["timeline"]["segments"]})
    sections = [
        Section("Summary", [f"{summary['workload']['description']}; {summary['requests']['completed']:,} of "
                            f"{summary['requests']['total']:,} requests completed in "
                            f"{fmt_seconds(summary['time']['duration_seconds'])}."],
                tables=[_summary_table(summary), _throughput_table(summary)]),
        Section("Per-request latency", figures=latency_figures),
        Section("Batch size and KV-cache use over time", figures=[Figure(
            "chart-timeline", _timeline_figure(go, data),
            "one point per iteration at its end" + ("" if strides in ([], [1]) else f" (every {strides[-1]}th drawn)")
            + "; a cluster's replicas (or a disaggregated run's pools) are drawn as separate log parts")]),
        Section("Step time by term", figures=[Figure(
            "chart-breakdown", _breakdown_figure(go, data),
            "roofline: the operators' GPU time at roofline (or measured-kernel) rates; collectives: tensor/expert-"
            "parallel communication; launches: kernel launch time and the GPU's wait for the host to launch; engine "
            "overhead: the engine's host time per iteration the GPU waits for; client path: HTTP, tokenisation and the "
            "first chunk, once per request")]),
    ]
    title = f"memwall: {summary['model']} on {summary['gpus']}x {summary['gpu']}"
    return write_page(path, title, sections, data, subtitle="simulated run; SI units in the embedded JSON")
