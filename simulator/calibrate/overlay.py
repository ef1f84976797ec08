"""Measured efficiencies -> a GPU YAML overlay that ``--gpu PATH`` loads. Pure: no PyTorch.

For each case the cost model's FLOPs and bytes (see :mod:`work`) over the measured time give
an achieved fraction of the peaks. The per-kernel cost is the measured time of a one-element
kernel; it is subtracted first, as the cost model adds it back (``kernel_launch_seconds``):

    busy     = seconds - launch_seconds
    compute  = flops / (peak_flops[dtype] * busy)
    memory   = bytes / (hbm_bandwidth * busy)

A case is compute-bound when flops / peak_flops >= bytes / hbm_bandwidth (the roofline at
efficiency 1), else memory-bound; only its binding fraction says something about the kernel.
Cases are grouped by op class (gemm, attention, elementwise) and token count; each group
becomes one ``efficiency_by_op`` entry whose ``compute`` is the median binding fraction of
its compute-bound cases and ``memory`` that of its memory-bound ones. Token buckets run from
one measured count up to the next (the first from 0, the last open-ended), so every step
size falls in one. Fractions are capped at 1. Cases with ``busy <= 0`` carry no information
and are left out. The global ``efficiency`` block holds the best streaming fraction on the
largest bandwidth buffer (memory), the median compute-bound GEMM fraction (compute), the
measured per-kernel cost, and ``sustained_clock`` 1: the fractions were measured at whatever
clock the GPU held, so a base GPU's documented clock drop must not apply on top of them.

On a GPU the peaks are the base config's datasheet figures. On CPU they are measured (a
square matmul and the copy), and the overlay also replaces the base's peaks and bandwidth
with them: CPU numbers only exercise the code path.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.kernel_tables.csv_format import write_kernel_table
from simulator.cost.kernel_tables.table import TableOrigin
from simulator.errors import InputError
from simulator.files import atomic_write, load_json
from simulator.model.architecture import MAX_CONTEXT, ModelSpec
from simulator.model.gpu import PLAUSIBLE
from simulator.model.loader import format_validation_error, validate

SCHEMA = "memwall-calibration/1"
OP_CLASSES = ("gemm", "attention", "elementwise")


def significant(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant figures (kept > 0 for positive values)."""
    return float(f"{value:.{digits}g}")


def achieved_fraction(case: dict[str, Any], peak_flops: float, bandwidth: float, launch_seconds: float) -> tuple[str, float] | None:
    """('compute' | 'memory', achieved fraction of that peak, capped at 1), or None if the case is all launch."""
    busy = case["seconds"] - launch_seconds
    if busy <= 0 or (case["flops"] <= 0 and case["bytes"] <= 0):
        return None
    compute_bound = case["flops"] / peak_flops >= case["bytes"] / bandwidth
    if compute_bound:
        return "compute", min(1.0, case["flops"] / (peak_flops * busy))
    return "memory", min(1.0, case["bytes"] / (bandwidth * busy))


def token_buckets(token_counts: list[int]) -> list[tuple[int, int | None]]:
    """(min_tokens, max_tokens) per measured count: [0, t1], [t2, t3-1], ..., [tn, open)."""
    counts = sorted(set(token_counts))
    buckets = []
    for i, t in enumerate(counts):
        low = 0 if i == 0 else t
        high = counts[i + 1] - 1 if i + 1 < len(counts) else None
        buckets.append((low, high))
    return buckets


def bucket_entries(
    op_class: str, cases: list[dict[str, Any]], peak_flops: float, bandwidth: float, launch_seconds: float
) -> list[dict[str, Any]]:
    """The ``efficiency_by_op`` entries of one op class (see module docstring)."""
    counts = sorted({c["tokens"] for c in cases})
    entries = []
    for (low, high), tokens in zip(token_buckets(counts), counts):
        fractions: dict[str, list[float]] = {"compute": [], "memory": []}
        for case in cases:
            if case["tokens"] != tokens:
                continue
            got = achieved_fraction(case, peak_flops, bandwidth, launch_seconds)
            if got is not None:
                fractions[got[0]].append(got[1])
        entry: dict[str, Any] = {"op_class": op_class, "min_tokens": low, "max_tokens": high}
        for bound, values in fractions.items():
            if values:
                entry[bound] = significant(statistics.median(values))
        if len(entry) > 3:
            entries.append(entry)
    return entries


def overlay_cases(measurements: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Cases per op class in the overlay's dtype."""
    dtype = measurements["dtype"]
    return {
        "gemm": [c for c in measurements["gemm"] if c["dtype"] == dtype],
        "attention": [c for c in measurements["attention"] if c["dtype"] == dtype],
        "elementwise": [c for c in measurements["elementwise"] if c["dtype"] == dtype],
    }


def global_efficiency(measurements: dict[str, Any]) -> dict[str, float]:
    """The overlay's ``efficiency`` block (see module docstring)."""
    peaks, launch = measurements["peaks"], measurements["launch_seconds"]
    bandwidth = peaks["hbm_bandwidth_bytes_per_second"]
    peak = peaks["flops"][measurements["dtype"]]
    # Fractions of the data-sheet peak measured at the clock the GPU held: the base's clock drop is in them.
    block: dict[str, float] = {"kernel_launch_seconds": significant(launch), "sustained_clock": 1.0}
    rows = measurements["bandwidth"]
    if rows:
        largest = max(r["buffer_bytes"] for r in rows)
        best = max(r["bytes_per_second"] for r in rows if r["buffer_bytes"] == largest)
        block["memory"] = significant(min(1.0, best / bandwidth))
    compute = []
    for case in overlay_cases(measurements)["gemm"]:
        got = achieved_fraction(case, peak, bandwidth, launch)
        if got is not None and got[0] == "compute":
            compute.append(got[1])
    if compute:
        block["compute"] = significant(statistics.median(compute))
    return block


def provenance(measurements: dict[str, Any]) -> dict[str, str]:
    """The overlay's ``measured`` block: strings naming when, where and with what it was measured."""
    env = measurements["device"]
    info = {
        "date": env["date"],
        "device": env["name"],
        "torch": env["torch"],
        "cuda": env.get("cuda") or "none",
        "dtype": measurements["dtype"],
        "plan": measurements["plan"],
        "timing": measurements["timing"]["method"],
        "peaks": measurements["peaks"]["source"],
        "launch_seconds": f"{measurements['launch_seconds']:.4g}",
    }
    for row in measurements["bandwidth"]:
        info[f"{row['kernel']}_bytes_per_second_{row['buffer_bytes']}"] = f"{row['bytes_per_second']:.4g}"
    for dtype in sorted({c["dtype"] for c in measurements["gemm"]}):
        # A case timed at 0 s (below the clock's resolution) says nothing about its rate.
        rates = [c["flops"] / c["seconds"] for c in measurements["gemm"] if c["dtype"] == dtype and c["seconds"] > 0]
        if rates:
            info[f"best_gemm_flops_per_second_{dtype}"] = f"{max(rates):.4g}"
    return info


def derive_overlay(measurements: dict[str, Any]) -> dict[str, Any]:
    """The overlay mapping (``base``, ``name``, ``measured``, ``efficiency``, ``efficiency_by_op``)."""
    peaks, launch = measurements["peaks"], measurements["launch_seconds"]
    bandwidth = peaks["hbm_bandwidth_bytes_per_second"]
    peak = peaks["flops"][measurements["dtype"]]
    base = measurements["base_gpu"]
    overlay: dict[str, Any] = {"base": base}
    if peaks["source"] == "measured":
        overlay["name"] = f"{measurements['device']['name']} (CPU code path, not a GPU)"
        overlay["peak_flops"] = {dtype: significant(flops) for dtype, flops in peaks["flops"].items()}
        overlay["hbm_bandwidth_bytes_per_second"] = significant(bandwidth)
    else:
        overlay["name"] = f"{base}-measured"
    overlay["measured"] = provenance(measurements)
    overlay["efficiency"] = global_efficiency(measurements)
    entries = []
    for op_class, cases in overlay_cases(measurements).items():
        entries += bucket_entries(op_class, cases, peak, bandwidth, launch)
    overlay["efficiency_by_op"] = entries
    return overlay


def overlay_yaml(overlay: dict[str, Any]) -> str:
    """The overlay as YAML, with a header saying what it is and how it was made."""
    measured = overlay["measured"]
    header = (
        f"# Measured overlay on {overlay['base']}: written by `simulate calibrate` on {measured['date']}\n"
        f"# from {measured['device']} (torch {measured['torch']}, CUDA {measured['cuda']}, {measured['dtype']}).\n"
        "# Efficiencies are achieved fractions of the peaks (see simulator/calibrate/overlay.py);\n"
        "# efficiency_by_op entries replace them per op class and token bucket. Load with --gpu PATH.\n"
    )
    return header + yaml.safe_dump(overlay, sort_keys=False, default_flow_style=False)


def write_overlay(path: Path, overlay: dict[str, Any]) -> None:
    """Write the overlay YAML whole or not at all (the folder is created if missing)."""
    _make_folder(path, "--out")
    atomic_write(path, overlay_yaml(overlay), f"--out {path}")


def _make_folder(path: Path, what: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what}: cannot create folder '{path.parent}' ({exc.strerror or exc})") from None


# ---------------------------------------------------------------------------------------
# The timings file: its schema, checked whole when it is read, so that deriving an overlay or
# a check table never meets a missing key or a value of the wrong type.

Seconds = Annotated[float, Field(ge=0)]
Count = Annotated[float, Field(ge=0)]
Rate = Annotated[float, Field(gt=0)]


class _Part(BaseModel):
    # Extra keys are kept (the harness records more than is read here); numbers must be finite.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class _Device(_Part):
    name: str
    torch: str
    date: str
    cuda: str | None = None


class _Peaks(_Part):
    source: str
    flops: dict[str, Annotated[float, Field(ge=PLAUSIBLE["peak_flops"][0], le=PLAUSIBLE["peak_flops"][1])]]
    hbm_bandwidth_bytes_per_second: Annotated[
        float, Field(ge=PLAUSIBLE["hbm_bandwidth_bytes_per_second"][0], le=PLAUSIBLE["hbm_bandwidth_bytes_per_second"][1])
    ]


class _Timing(_Part):
    method: str


class _BandwidthRow(_Part):
    kernel: str
    buffer_bytes: Annotated[int, Field(ge=1)]
    bytes_per_second: Rate


class _Case(_Part):
    dtype: str
    tokens: Annotated[int, Field(ge=0, le=MAX_CONTEXT)]
    flops: Count
    bytes: Count
    seconds: Seconds


StepSeconds = Annotated[float, Field(ge=1e-9, le=1e6)]
"""A measured step: no GPU kernel finishes in under a nanosecond, and a smaller figure is not a measurement
(its relative error would overflow to infinity)."""


class _EndToEndCase(_Part):
    phase: Literal["prefill", "decode"]
    batch: Annotated[int, Field(ge=1, le=2**16)]
    context: Annotated[int, Field(ge=1, le=MAX_CONTEXT)]
    seconds: StepSeconds


class _EndToEnd(_Part):
    model: dict[str, Any]
    cases: list[_EndToEndCase]


class _TimelineCase(_Part):
    phase: Literal["prefill", "decode"]
    batch: Annotated[int, Field(ge=1, le=2**16)]
    context: Annotated[int, Field(ge=1, le=MAX_CONTEXT)]
    kernel_seconds: Seconds
    kernels: Annotated[int, Field(ge=0)] | None = None
    operators: dict[str, Seconds]


class _Skipped(_Part):
    section: str
    case: str
    reason: str


class Measurements(_Part):
    """The raw timings ``simulate calibrate`` saves (``"schema": "memwall-calibration/1"``); SI units."""

    schema_: Literal["memwall-calibration/1"] = Field(alias="schema")
    device: _Device
    base_gpu: str
    dtype: str
    plan: str
    peaks: _Peaks
    launch_seconds: Seconds
    timing: _Timing
    bandwidth: list[_BandwidthRow]
    elementwise: list[_Case]
    gemm: list[_Case]
    attention: list[_Case]
    endtoend: _EndToEnd
    skipped: list[_Skipped]
    timeline: list[_TimelineCase] = []
    """Profiled steps (simulator.calibrate.timeline); absent from timings saved before it existed."""


REQUIRED_KEYS = tuple(info.alias or name for name, info in Measurements.model_fields.items() if info.is_required())


def load_measurements(path: Path) -> dict[str, Any]:
    """Timings saved by ``simulate calibrate``; InputError naming the file and field if it is not one."""
    where = f"--measurements {path}"
    data = load_json(path, "--measurements")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError(f"{where}: not a calibration timings file (expected \"schema\": \"{SCHEMA}\")")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    try:
        checked = Measurements.model_validate(data)
    except pydantic.ValidationError as exc:
        raise InputError(format_validation_error(where, exc)) from None
    if checked.dtype not in checked.peaks.flops:
        have = ", ".join(checked.peaks.flops) or "none"
        raise InputError(f"{where}: field 'dtype': peaks.flops has no entry for '{checked.dtype}' (it has: {have})")
    if checked.endtoend.cases or checked.timeline:  # the check predicts each case with this model
        validate(ModelSpec, checked.endtoend.model, f"{where}: endtoend.model")
    return checked.model_dump(by_alias=True)


def save_measurements(path: Path, measurements: dict[str, Any]) -> None:
    """Write the raw timings (strict JSON) whole or not at all."""
    _make_folder(path, "--save-measurements")
    text = json.dumps(measurements, indent=1, allow_nan=False) + "\n"
    atomic_write(path, text, f"--save-measurements {path}")


CALIBRATE_INCLUDES = ("PyTorch matmul (cuBLAS/hipBLASLt) timed by device events around CUDA-graph replays of "
                      "back-to-back calls (eager calls where a capture fails: the timings' graph_capture_failures), "
                      "weights rotated through copies larger than the L2 so they come from HBM; each latency holds "
                      "a graph node's launch, not the host's")


def kernel_table_rows(measurements: dict[str, Any]) -> list[tuple[str, int, int, int, float]]:
    """The timed GEMMs as kernel-table rows (dtype, m, n, k, seconds): ``m`` is the tokens asked for, the time
    that of the rows actually run (fp8 pads to 16, as an engine's kernel does)."""
    rows = []
    for case in measurements["gemm"]:
        dtype = "bf16" if case["dtype"] in ("fp16", "bf16") else case["dtype"]
        if case["seconds"] > 0:
            rows.append((dtype, int(case["tokens"]), int(case["n"]), int(case["k"]), float(case["seconds"])))
    return rows


def write_kernel_table_of(path: Any, measurements: dict[str, Any]) -> int:
    """Write the timed GEMMs of ``measurements`` as a memwall kernel table (--kernel-table); the rows written."""
    rows = kernel_table_rows(measurements)
    if not rows:
        raise InputError("--kernel-table-out: the timings hold no GEMM (was the gemm section skipped or cut short?)")
    env = measurements["device"]
    origin = TableOrigin(measurements["base_gpu"], "torch", str(env.get("torch", "unstated")), str(path),
                         f"{CALIBRATE_INCLUDES}; measured on {env.get('name', 'unstated')} {env.get('date', '')}".strip())
    write_kernel_table(path, origin, rows)
    return len(rows)
