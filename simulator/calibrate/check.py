"""Predicted vs measured end-to-end step times. Pure: no PyTorch.

The timed decoder (:mod:`endtoend`) runs every elementwise step as its own kernel and
attention through SDPA, so each case is predicted for ``attention_kernel='flash'``,
``fusion='none'``, tp = 1, weights and KV cache in the run's dtype, twice: on the base GPU
with its shipped efficiencies, and on the measured overlay. Error % = 100 x (predicted -
measured) / measured; the summary gives the median and max of |error %|. Where the timings hold profiled
steps (:mod:`simulator.calibrate.timeline`), their table comes before the summary, which stays last.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Final

from simulator.calibrate.timeline import TimelineRow, timeline_dicts, timeline_rows, timeline_text
from simulator.cost.system import System
from simulator.model import GPUSpec, ModelSpec, Precision, load_gpu
from simulator.model.step import Step
from simulator.units import fmt_seconds

ATTENTION_KERNEL: Final = "flash"
FUSION: Final = "none"


def error_percent(predicted: float, measured: float) -> float:
    """100 x (predicted - measured) / measured: positive when the simulator is slower than the device."""
    return 100.0 * (predicted - measured) / measured


def case_step(phase: str, batch: int, context: int) -> Step:
    """The simulator's step for an end-to-end case (see :mod:`endtoend`)."""
    if phase == "decode":
        return Step.decode(batch, context)
    return Step.prefill(batch, context)


def case_label(phase: str, batch: int, context: int) -> str:
    if phase == "decode":
        return f"decode  batch {batch:>3}  ctx {context:>5}"
    return f"prefill batch {batch:>3}  prompt {context:>4}"


@dataclass(frozen=True)
class CheckRow:
    """One end-to-end case: measured and predicted seconds."""

    phase: str
    batch: int
    context: int
    measured_seconds: float
    shipped_seconds: float
    overlay_seconds: float

    @property
    def shipped_error_percent(self) -> float:
        return error_percent(self.shipped_seconds, self.measured_seconds)

    @property
    def overlay_error_percent(self) -> float:
        return error_percent(self.overlay_seconds, self.measured_seconds)


def base_gpu(measurements: dict[str, Any]) -> GPUSpec:
    """The base GPU with its shipped efficiencies; on CPU with the measured peaks in place of its own."""
    gpu = load_gpu(measurements["base_gpu"])
    peaks = measurements["peaks"]
    if peaks["source"] != "measured":
        return gpu
    return gpu.model_copy(update={
        "name": f"{measurements['device']['name']} (CPU code path)",
        "peak_flops": dict(peaks["flops"]),
        "hbm_bandwidth_bytes_per_second": peaks["hbm_bandwidth_bytes_per_second"],
    })


def endtoend_model(measurements: dict[str, Any]) -> ModelSpec:
    return ModelSpec.model_validate(measurements["endtoend"]["model"])


def check_system(model: ModelSpec, gpu: GPUSpec, dtype: str) -> System:
    """The simulator configuration that matches the timed decoder."""
    # The dtype comes from the measurements file: validated here, where it enters the simulator.
    precision = Precision.model_validate({"weights": dtype, "kv": dtype})
    return System(model, gpu, precision, tp=1, attention_kernel=ATTENTION_KERNEL, fusion=FUSION)


def check_rows(measurements: dict[str, Any], shipped: GPUSpec, overlay: GPUSpec) -> list[CheckRow]:
    """A row per measured end-to-end case (none, and no model read, where the timings hold none)."""
    if not measurements["endtoend"]["cases"]:
        return []
    model, dtype = endtoend_model(measurements), measurements["dtype"]
    shipped_system, overlay_system = check_system(model, shipped, dtype), check_system(model, overlay, dtype)
    rows = []
    for case in measurements["endtoend"]["cases"]:
        step = case_step(case["phase"], case["batch"], case["context"])
        rows.append(CheckRow(
            phase=case["phase"], batch=case["batch"], context=case["context"], measured_seconds=case["seconds"],
            shipped_seconds=float(shipped_system.step_seconds(step)), overlay_seconds=float(overlay_system.step_seconds(step)),
        ))
    return rows


def profiled_rows(measurements: dict[str, Any], shipped: GPUSpec) -> list[TimelineRow]:
    """The profiled steps (:mod:`simulator.calibrate.timeline`), each operator beside its shipped prediction."""
    if not measurements.get("timeline"):
        return []
    model, dtype = endtoend_model(measurements), measurements["dtype"]
    system = check_system(model, shipped, dtype)

    def predicted(phase: str, batch: int, context: int) -> dict[str, float]:
        return {op.name: float(op.seconds) for op in system.step_cost(case_step(phase, batch, context)).operators}

    return timeline_rows(measurements, model.num_layers, predicted)


def summary(rows: list[CheckRow]) -> dict[str, float]:
    """Median and max |error %| with shipped and with measured efficiencies (empty when no rows)."""
    if not rows:
        return {}
    shipped = [abs(r.shipped_error_percent) for r in rows]
    overlay = [abs(r.overlay_error_percent) for r in rows]
    return {
        "shipped_median_abs_error_percent": statistics.median(shipped),
        "shipped_max_abs_error_percent": max(shipped),
        "overlay_median_abs_error_percent": statistics.median(overlay),
        "overlay_max_abs_error_percent": max(overlay),
    }


def check_dict(measurements: dict[str, Any], rows: list[CheckRow], shipped: GPUSpec, overlay: GPUSpec) -> dict[str, Any]:
    """The ``--check --json`` contract (SI units)."""
    return {
        "device": measurements["device"]["name"],
        "model": measurements["endtoend"]["model"].get("name"),
        "dtype": measurements["dtype"],
        "attention_kernel": ATTENTION_KERNEL,
        "fusion": FUSION,
        "shipped_gpu": shipped.name,
        "overlay_gpu": overlay.name,
        "rows": [
            {
                "phase": r.phase, "batch": r.batch, "context": r.context, "measured_seconds": r.measured_seconds,
                "shipped_seconds": r.shipped_seconds, "shipped_error_percent": r.shipped_error_percent,
                "overlay_seconds": r.overlay_seconds, "overlay_error_percent": r.overlay_error_percent,
            }
            for r in rows
        ],
        "skipped": [s for s in measurements["skipped"] if s["section"] in ("endtoend", "timeline")],
        "summary": summary(rows),
        "timeline": timeline_dicts(profiled_rows(measurements, shipped)),
    }


def check_text(measurements: dict[str, Any], rows: list[CheckRow], shipped: GPUSpec, overlay: GPUSpec) -> str:
    """The predicted-vs-measured table for a terminal."""
    model = measurements["endtoend"]["model"].get("name") or "no end-to-end model"
    lines = [
        f"Calibration check: {model}, {measurements['dtype']}, tp 1, {ATTENTION_KERNEL} attention, "
        f"fusion {FUSION} (plain PyTorch), on {measurements['device']['name']}",
        f"shipped = {shipped.name} with its shipped efficiencies; measured = {overlay.name}",
        "",
    ]
    header = f"{'case':<30} {'measured':>10} {'shipped':>10} {'error':>8} {'measured-eff':>12} {'error':>8}"
    lines += [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{case_label(r.phase, r.batch, r.context):<30} {fmt_seconds(r.measured_seconds):>10} "
            f"{fmt_seconds(r.shipped_seconds):>10} {r.shipped_error_percent:>+7.1f}% "
            f"{fmt_seconds(r.overlay_seconds):>12} {r.overlay_error_percent:>+7.1f}%"
        )
    for s in measurements["skipped"]:
        if s["section"] == "endtoend":
            lines.append(f"{s['case']:<30} skipped: {s['reason']}")
    lines += timeline_text(profiled_rows(measurements, shipped), case_label)
    for s in measurements["skipped"]:
        if s["section"] == "timeline":
            lines.append(f"profile {s['case']}: skipped: {s['reason']}")
    stats = summary(rows)
    if stats:
        lines += [
            "",
            f"|error| with shipped efficiencies:  median {stats['shipped_median_abs_error_percent']:.1f}%, "
            f"max {stats['shipped_max_abs_error_percent']:.1f}%",
            f"|error| with measured efficiencies: median {stats['overlay_median_abs_error_percent']:.1f}%, "
            f"max {stats['overlay_max_abs_error_percent']:.1f}%",
        ]
    return "\n".join(lines)
