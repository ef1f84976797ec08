"""Plots: the roofline of one run and throughput-vs-latency of a sweep (matplotlib, optional).

matplotlib is the optional extra ``[plot]`` (``pip install -e '.[plot]'``). It is imported
only when a plot is drawn; without it an InputError says how to install it. Figures are
drawn on an Agg canvas (no display, no pyplot global state).

The data each plot shows is built by a pure function (``roofline_points``,
``sweep_plot_data``) that tests check without looking at pixels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from simulator.cost.step_cost import StepCost
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.files import atomic_write, check_output_path
from simulator.model.step import Step

if TYPE_CHECKING:
    from simulator.cost.pipeline import PipelineSystem

PLOT_FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class RooflinePoint:
    """One operator (all its layers) of one phase, on one GPU: FLOP/byte and achieved FLOP/s."""

    phase: str
    name: str
    kind: str
    count: int
    flops: float
    bytes: float
    seconds: float
    intensity: float
    achieved_flops_per_second: float
    bound: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RooflineData:
    """Everything the roofline plot draws. SI units (FLOP/s, bytes/s, FLOP/byte)."""

    title: str
    compute_dtype: str
    peak_flops: float
    bandwidth_bytes_per_second: float
    compute_efficiency: float
    memory_efficiency: float
    points: tuple[RooflinePoint, ...]
    not_plotted: tuple[tuple[str, str, str], ...]
    """(phase, operator, why) for operators that are not a kernel reading HBM and doing FLOPs"""

    @property
    def ridge(self) -> float:
        """Peak FLOP/s / HBM bandwidth, FLOP/byte."""
        return self.peak_flops / self.bandwidth_bytes_per_second

    @property
    def achievable_ridge(self) -> float:
        return self.ridge * self.compute_efficiency / self.memory_efficiency


def phase_steps(batch: int, context_tokens: int, gen_tokens: int) -> dict[str, Step]:
    """The two steps a run is made of: prefill of the prompts, and the last decode step (at ``context_tokens``)."""
    return {"prefill": Step.prefill(batch, context_tokens - gen_tokens), "decode": Step.decode(batch, context_tokens)}


def _why_not_plotted(op: Any) -> str | None:
    if op.kind == "allreduce":
        return "communication (link bytes, not HBM)"
    if op.bound == "fused":
        return "fused into a neighbouring kernel"
    if not float(op.flops):
        return "no FLOPs (a table lookup)"
    if not float(op.bytes):
        return "no HBM traffic"
    return None


def roofline_points(costs: dict[str, StepCost]) -> tuple[list[RooflinePoint], list[tuple[str, str, str]]]:
    """A point for every operator of every phase that runs as a kernel with FLOPs and HBM bytes; the rest with a reason."""
    points, skipped = [], []
    for phase, cost in costs.items():
        for op in cost.operators:
            why = _why_not_plotted(op)
            if why:
                skipped.append((phase, op.name, why))
                continue
            seconds = float(op.seconds)
            points.append(
                RooflinePoint(
                    phase=phase, name=op.name, kind=op.kind, count=op.count, flops=float(op.flops),
                    bytes=float(op.bytes), seconds=seconds, intensity=float(op.intensity),
                    achieved_flops_per_second=float(op.flops) / seconds, bound=op.bound,
                )
            )
    return points, skipped


def roofline_data(system: System | PipelineSystem, batch: int, context_tokens: int, gen_tokens: int) -> RooflineData:
    """Roofline of the prefill and last decode step of a closed batch on ``system`` (per GPU; of a stage for a pipeline)."""
    if gen_tokens >= context_tokens:
        raise InputError(f"--gen: {gen_tokens} must be < --ctx {context_tokens} (the prompt is ctx - gen tokens)")
    costs = {phase: system.step_cost(step) for phase, step in phase_steps(batch, context_tokens, gen_tokens).items()}
    points, skipped = roofline_points(costs)
    gpu, precision = system.gpu, system.precision
    dtype = precision.compute_dtype
    title = (
        f"{system.model.name} on {system.tp}x {gpu.name}, weights {precision.weights}, KV {precision.kv}: "
        f"batch {batch}, prefill {context_tokens - gen_tokens} tokens, decode at context {context_tokens}"
    )
    return RooflineData(
        title=title, compute_dtype=dtype, peak_flops=gpu.peak(dtype),
        bandwidth_bytes_per_second=gpu.hbm_bandwidth_bytes_per_second,
        compute_efficiency=gpu.efficiency.compute_of_peak, memory_efficiency=gpu.efficiency.memory,
        points=tuple(points), not_plotted=tuple(skipped),
    )


def _matplotlib() -> tuple[Any, Any]:
    """(Figure, FigureCanvasAgg), or an InputError that says how to install matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError(
            "--plot: matplotlib is not installed; install the plot extra: pip install -e '.[plot]' "
            "(or pip install 'matplotlib>=3.7')"
        ) from None
    return Figure, FigureCanvasAgg


def check_plot_path(path: str | Path) -> Path:
    """The output path, or an InputError naming what is wrong with it (call before the work starts)."""
    return check_output_path(path, "--plot", PLOT_FORMATS)


def save_figure(fig: Any, out: Path) -> None:
    """Write the figure whole or not at all (no half-written image left by a full disk)."""
    atomic_write(out, lambda handle: fig.savefig(handle, format=out.suffix[1:].lower()), "--plot", binary=True)


def _label_groups(points: Iterable[RooflinePoint], close: float = 0.08) -> list[tuple[float, float, str]]:
    """Points of one phase closer than ``close`` decades in both axes share one label (decode GEMMs coincide)."""
    groups: list[list[RooflinePoint]] = []
    for p in sorted(points, key=lambda p: (p.intensity, p.achieved_flops_per_second)):
        for group in groups:
            g = group[0]
            if (abs(math.log10(p.intensity / g.intensity)) < close
                    and abs(math.log10(p.achieved_flops_per_second / g.achieved_flops_per_second)) < close):
                group.append(p)
                break
        else:
            groups.append([p])
    return [(g[0].intensity, g[0].achieved_flops_per_second, ", ".join(p.name for p in g)) for g in groups]


PHASE_STYLE = {"prefill": ("o", "tab:blue"), "decode": ("^", "tab:orange")}
# Label offsets (points) tried in turn so that labels of neighbouring points do not overlap.
LABEL_OFFSETS = ((8, 6), (8, -18), (8, 22), (8, -34), (8, 38), (8, -50))


def _place_labels(labels: list[tuple[float, float, str, str]]) -> list[tuple[float, float, str, str, tuple[int, int]]]:
    """(x, y, text, colour) -> with an offset: a label near an earlier one (0.6 decade in x, 0.4 in y) moves to the next slot."""
    placed: list[tuple[float, float, str, str, tuple[int, int]]] = []
    for x, y, text, colour in sorted(labels, key=lambda item: (item[0], item[1])):
        taken = {
            off for px, py, _, _, off in placed
            if abs(math.log10(x / px)) < 0.6 and abs(math.log10(y / py)) < 0.4
        }
        offset = next((o for o in LABEL_OFFSETS if o not in taken), LABEL_OFFSETS[-1])
        placed.append((x, y, text, colour, offset))
    return placed


def plot_roofline(data: RooflineData, path: str | Path) -> Path:
    """Draw ``data`` on log-log axes (intensity vs achieved TFLOP/s), ridge marked; write ``path``."""
    out = check_plot_path(path)
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    tera = 1e12
    intensities = [p.intensity for p in data.points] or [data.ridge]
    x_lo = min(min(intensities), data.ridge) / 4
    x_hi = max(max(intensities), data.ridge) * 4
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    peak, bw = data.peak_flops, data.bandwidth_bytes_per_second
    eff_peak, eff_bw = peak * data.compute_efficiency, bw * data.memory_efficiency
    ax.plot(xs, [min(peak, bw * x) / tera for x in xs], color="black", linewidth=2,
            label=f"roofline: {peak / tera:.0f} TFLOP/s {data.compute_dtype}, {bw / 1e12:.2f} TB/s HBM")
    ax.plot(xs, [min(eff_peak, eff_bw * x) / tera for x in xs], color="gray", linestyle="--", linewidth=1.5,
            label=f"achievable: compute x{data.compute_efficiency:.2f}, memory x{data.memory_efficiency:.2f}")
    ax.axvline(data.ridge, color="tab:red", linestyle=":", linewidth=1.5,
               label=f"ridge point: {data.ridge:.0f} FLOP/byte")
    ax.annotate(f"ridge {data.ridge:.0f} FLOP/byte", xy=(data.ridge, peak / tera), xytext=(6, 10),
                textcoords="offset points", fontsize=9, color="tab:red")
    ax.annotate("memory-bound", xy=(data.ridge, 0), xycoords=("data", "axes fraction"), xytext=(-8, 12),
                textcoords="offset points", ha="right", fontsize=9, color="tab:red")
    ax.annotate("compute-bound", xy=(data.ridge, 0), xycoords=("data", "axes fraction"), xytext=(8, 12),
                textcoords="offset points", ha="left", fontsize=9, color="tab:red")
    labels = []
    for phase, (marker, color) in PHASE_STYLE.items():
        pts = [p for p in data.points if p.phase == phase]
        if not pts:
            continue
        ax.scatter([p.intensity for p in pts], [p.achieved_flops_per_second / tera for p in pts], marker=marker,
                   s=70, color=color, edgecolor="black", linewidth=0.6, zorder=3,
                   label=f"{phase} operators ({len(pts)})")
        labels += [(x, y / tera, text, color) for x, y, text in _label_groups(pts)]
    for x, y, text, color, offset in _place_labels(labels):
        ax.annotate(text, xy=(x, y), xytext=offset, textcoords="offset points", fontsize=8, color=color,
                    va="center", arrowprops=None if offset == LABEL_OFFSETS[0] else
                    {"arrowstyle": "-", "color": color, "linewidth": 0.6, "shrinkA": 0, "shrinkB": 4})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    lowest = min([p.achieved_flops_per_second for p in data.points] or [peak / 100])
    ax.set_ylim(min(lowest, bw * x_lo) / tera / 2, peak / tera * 2.5)
    ax.set_xlabel("Arithmetic intensity (FLOP/byte of HBM traffic)")
    ax.set_ylabel("Achieved performance per GPU (TFLOP/s)")
    ax.set_title(data.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(loc="upper left", fontsize=9)
    save_figure(fig, out)
    return out


# Keys tried, in order, for the sweep plot's axes (flattened `--json` keys, engine metrics, plain names).
THROUGHPUT_KEYS = ("throughput.output_tokens_per_second", "output_tokens_per_second",
                   "throughput.total_tokens_per_second", "total_tokens_per_second")
LATENCY_KEYS = ("latency.tpot_p50_seconds", "latency.tpot_seconds", "tpot_p50_seconds", "tpot_seconds",
                "latency.e2e_p50_seconds", "latency.e2e_seconds", "e2e_p50_seconds", "e2e_seconds")
SERIES_KEYS = ("model", "gpu", "weights", "precision.weights", "kv", "attention", "tp", "scheduler")


def _flat(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _pick(rows: list[dict[str, Any]], wanted: str | None, candidates: tuple[str, ...], what: str) -> str:
    if wanted is not None:
        if not all(wanted in r for r in rows):
            raise InputError(f"--plot: sweep rows have no '{wanted}' column for the {what} axis")
        return wanted
    for key in candidates:
        if all(isinstance(r.get(key), (int, float)) for r in rows):
            return key
    raise InputError(f"--plot: sweep rows have none of {', '.join(candidates)} for the {what} axis")


LATENCY_NAMES = {"tpot": "time per output token", "ttft": "time to first token", "e2e": "end-to-end latency",
                 "itl": "inter-token latency"}


def _axis_label(key: str) -> str:
    """'p99.e2e_seconds' -> 'p99 end-to-end latency'; 'throughput.output_tokens_per_second' -> 'output throughput (tokens/s)'."""
    words = key.replace(".", "_").split("_")
    percentile = next((w for w in words if w in ("p50", "p90", "p95", "p99", "mean")), "")
    for short, long in LATENCY_NAMES.items():
        if short in words:
            return f"{percentile} {long}".strip()
    kind = next((w for w in words if w in ("output", "total", "input")), "")
    return f"{kind} throughput (tokens/s)".strip()


def sweep_plot_data(rows: list[dict[str, Any]], latency_key: str | None = None,
                    throughput_key: str | None = None) -> dict[str, Any]:
    """Series of (latency, throughput, batch) per combination of the string-like settings that vary.

    Rows may be nested (`simulate --json`) or flattened ('a.b' keys). Latency is in ms in the result.
    """
    flat = [_flat(r) for r in rows]
    if not flat:
        raise InputError("--plot: the sweep produced no rows to plot")
    y_key = _pick(flat, throughput_key, THROUGHPUT_KEYS, "throughput")
    x_key = _pick(flat, latency_key, LATENCY_KEYS, "latency")
    varying = [k for k in SERIES_KEYS if len({str(r.get(k)) for r in flat}) > 1]
    series: dict[str, dict[str, list[float]]] = {}
    for r in flat:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]} {r.get(k)}" for k in varying) or "sweep"
        s = series.setdefault(label, {"latency_ms": [], "throughput": [], "batch": []})
        s["latency_ms"].append(float(r[x_key]) * 1e3)
        s["throughput"].append(float(r[y_key]))
        s["batch"].append(float(r["batch"]) if isinstance(r.get("batch"), (int, float)) else math.nan)
    for s in series.values():
        order = sorted(range(len(s["batch"])), key=lambda i: (s["batch"][i], s["latency_ms"][i]))
        for name in s:
            s[name] = [s[name][i] for i in order]
    has_batch = any(len({b for b in s["batch"] if not math.isnan(b)}) > 1 for s in series.values())
    return {
        "latency_key": x_key, "throughput_key": y_key,
        "latency_label": _axis_label(x_key), "throughput_label": _axis_label(y_key),
        "series": [{"label": label, **values} for label, values in series.items()],
        "has_batch_axis": has_batch,
    }


def plot_sweep(rows: list[dict[str, Any]], path: str | Path, latency_key: str | None = None,
               throughput_key: str | None = None) -> dict[str, Any]:
    """Throughput vs latency (and vs batch when batch varies) of sweep rows; writes ``path``, returns the data drawn."""
    out = check_plot_path(path)
    data = sweep_plot_data(rows, latency_key, throughput_key)
    Figure, FigureCanvasAgg = _matplotlib()
    panels = 2 if data["has_batch_axis"] else 1
    fig = Figure(figsize=(6.5 * panels, 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    # Milliseconds read well up to ~10 s; beyond that the axis is in seconds.
    longest = max(max(s["latency_ms"]) for s in data["series"])
    scale, unit = (1e-3, "s") if longest > 10_000 else (1.0, "ms")
    for s in data["series"]:
        axes[0].plot([v * scale for v in s["latency_ms"]], s["throughput"], marker="o", label=s["label"])
        if panels == 2:
            axes[1].plot(s["batch"], s["throughput"], marker="o", label=s["label"])
    axes[0].set_xlabel(f"{data['latency_label']} ({unit})")
    axes[0].set_ylabel(data["throughput_label"])
    axes[0].set_title("Throughput vs latency")
    if panels == 2:
        axes[1].set_xscale("log", base=2)
        from matplotlib.ticker import (
            ScalarFormatter,  # batch ticks as 1, 2, 4, ... not 2^k
        )

        axes[1].xaxis.set_major_formatter(ScalarFormatter())
        axes[1].set_xlabel("batch (sequences)")
        axes[1].set_ylabel(data["throughput_label"])
        axes[1].set_title("Throughput vs batch")
    for ax in axes:
        ax.grid(True, alpha=0.4)
        ax.legend(fontsize=8)
    save_figure(fig, out)
    return data
