"""Validation against published measurements: predict each row of a table, compare, summarise.

Each row of ``validation/measurements.csv`` names an engine run (model, GPU, tensor-parallel
degree, weight and KV dtypes, batch, input and output tokens) and one measured figure. The
simulator models it as a *static* batch (all sequences prefill together, then decode in
lockstep), which is how the benchmark tables in the file were produced:

- ``ttft_seconds``: one prefill step of ``batch`` x ``input_tokens`` tokens.
- ``output_tokens_per_second``: a closed batch of ``batch`` sequences reaching
  ``input + output`` tokens; batch * output / (prefill + all decode steps), whole TP group.
- ``tpot_seconds``: mean decode step time of that closed batch.
- ``decode_tokens_per_second_per_sequence``: output tokens/s of one sequence of that
  closed batch (the lmdeploy batch-1 runs with a 1-token prompt: nearly pure decode).

The error of a row is (predicted - measured) / measured. Rows whose model or GPU the
simulator does not ship are skipped with the reason shown, never silently dropped.

Calibration (:func:`fit_family_efficiencies`) fits one compute and one memory efficiency per
GPU *family* (not per row): compute from the compute-bound prefill rows, memory from the
decode-dominated rows with compute fixed, each the median of the per-row values that make the
prediction match exactly. docs/readme-validation.md describes the rule and its results.
"""

from __future__ import annotations

import csv
import functools
import statistics
from dataclasses import dataclass
from pathlib import Path

from simulator.cost.analytic import run_batch
from simulator.errors import InputError
from simulator.model import GPUSpec, ModelSpec, load_gpu, load_model
from simulator.model.precision import parse_precision
from simulator.model.registry import data_path
from simulator.model.step import Step
from simulator.plan.deployment import plan_deployment

DEFAULT_TABLE = data_path("validation", "measurements.csv")

METRICS: tuple[str, ...] = (
    "ttft_seconds",
    "tpot_seconds",
    "output_tokens_per_second",
    "decode_tokens_per_second_per_sequence",
)
REQUIRED_COLUMNS: tuple[str, ...] = (
    "id", "engine", "model", "gpu", "tp", "weights", "kv", "batch", "input_tokens", "output_tokens",
    "metric", "measured", "unit", "source", "link",
)
INTEGER_COLUMNS: tuple[str, ...] = ("tp", "batch", "input_tokens", "output_tokens")

# GPU families for calibration: one compute and one memory efficiency each (GPUSpec.name).
GPU_FAMILIES: dict[str, tuple[str, ...]] = {
    "ampere": ("A100-SXM4-80GB", "A100-SXM4-40GB", "A10G"),
    "hopper": ("H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB"),
    "ada": ("L40S", "L4"),
}

# Rows over this absolute error must carry an explanation (the rule).
EXPLAIN_ABOVE = 0.50


@dataclass(frozen=True)
class Measurement:
    """One published figure and the run that produced it (units as the ``unit`` column: SI)."""

    id: str
    engine: str
    model: str
    gpu: str
    tp: int
    weights: str
    kv: str
    batch: int
    input_tokens: int
    output_tokens: int
    metric: str
    measured: float
    unit: str
    source: str
    link: str
    notes: str = ""
    explanation: str = ""

    @property
    def context_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Comparison:
    """A measurement with the simulator's prediction (``predicted`` None when skipped)."""

    measurement: Measurement
    predicted: float | None
    skipped: str = ""
    fits: bool = True

    @property
    def error(self) -> float | None:
        """Signed relative error (predicted - measured) / measured; None when skipped."""
        if self.predicted is None:
            return None
        return (self.predicted - self.measurement.measured) / self.measurement.measured

    @property
    def needs_explanation(self) -> bool:
        return self.error is not None and abs(self.error) > EXPLAIN_ABOVE


def load_measurements(path: Path = DEFAULT_TABLE) -> list[Measurement]:
    """Rows of a measurements CSV; InputError names the file, line, column and what is allowed."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--csv: {path}: no such file") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"--csv: {path}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED_COLUMNS)}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            rows.append(_measurement(raw, f"{path}:{line}"))
    return rows


def _measurement(raw: dict[str, str], where: str) -> Measurement:
    values: dict[str, object] = {k: (raw.get(k) or "").strip() for k in Measurement.__dataclass_fields__}
    for column in INTEGER_COLUMNS:
        try:
            values[column] = int(values[column])  # type: ignore[arg-type]
        except ValueError:
            raise InputError(f"{where}: column '{column}': expected an integer (got {values[column]!r})") from None
        if values[column] < (0 if column == "input_tokens" else 1):  # type: ignore[operator]
            raise InputError(f"{where}: column '{column}': must be >= 1 (got {values[column]})")
    try:
        values["measured"] = float(values["measured"])  # type: ignore[arg-type]
    except ValueError:
        raise InputError(f"{where}: column 'measured': expected a number (got {values['measured']!r})") from None
    if values["measured"] <= 0:  # type: ignore[operator]
        raise InputError(f"{where}: column 'measured': must be > 0 (got {values['measured']})")
    if values["metric"] not in METRICS:
        raise InputError(f"{where}: column 'metric': unknown metric {values['metric']!r}; allowed: {', '.join(METRICS)}")
    return Measurement(**values)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=None)
def _model(name: str) -> ModelSpec:
    # Loading reads every shipped YAML; a table names a handful of configs many times.
    return load_model(name)


@functools.lru_cache(maxsize=None)
def _gpu(name: str) -> GPUSpec:
    return load_gpu(name)


def predict(m: Measurement, gpu: GPUSpec | None = None) -> tuple[float, bool]:
    """(predicted value in the row's unit, whether the run fits in the simulator's memory model).

    ``gpu`` replaces the row's GPU (calibration passes one with trial efficiencies).
    """
    model = _model(m.model)
    gpu = gpu if gpu is not None else _gpu(m.gpu)
    precision = parse_precision(m.weights, m.kv)
    # The published run fitted on its hardware; a no-fit here is reported, not fatal.
    deployment = plan_deployment(model, gpu, precision, m.batch, m.context_tokens, tp=m.tp, require_fit=False)
    fits = deployment.memory.fits
    if m.metric == "ttft_seconds":
        return float(deployment.system.step_seconds(Step.prefill(m.batch, m.input_tokens))), fits
    if m.output_tokens < 2:
        raise InputError(f"row {m.id}: metric {m.metric} needs output_tokens >= 2 (got {m.output_tokens})")
    run = run_batch(deployment, m.batch, m.context_tokens, m.output_tokens)
    if m.metric == "tpot_seconds":
        return run.tpot_seconds, fits
    if m.metric == "output_tokens_per_second":
        return run.output_tokens_per_second, fits
    return run.output_tokens_per_second / m.batch, fits


def compare(m: Measurement, gpu: GPUSpec | None = None) -> Comparison:
    """Predict one row; a model/GPU/precision the simulator lacks becomes a skip with the reason."""
    try:
        predicted, fits = predict(m, gpu)
    except InputError as exc:
        return Comparison(m, None, skipped=str(exc))
    return Comparison(m, predicted, fits=fits)


def compare_all(rows: list[Measurement]) -> list[Comparison]:
    return [compare(m) for m in rows]


@dataclass(frozen=True)
class Summary:
    """Median and max absolute relative error over the rows that ran."""

    rows: int
    compared: int
    skipped: int
    median_abs_error: float
    max_abs_error: float
    worst_id: str
    over_limit: int
    unexplained: tuple[str, ...]


def summarise(comparisons: list[Comparison]) -> Summary:
    ran = [c for c in comparisons if c.error is not None]
    errors = [abs(c.error) for c in ran]  # type: ignore[arg-type]
    worst = max(ran, key=lambda c: abs(c.error), default=None)  # type: ignore[arg-type]
    over = [c for c in ran if c.needs_explanation]
    return Summary(
        rows=len(comparisons),
        compared=len(ran),
        skipped=len(comparisons) - len(ran),
        median_abs_error=statistics.median(errors) if errors else 0.0,
        max_abs_error=max(errors, default=0.0),
        worst_id=worst.measurement.id if worst else "",
        over_limit=len(over),
        unexplained=tuple(c.measurement.id for c in over if not c.measurement.explanation),
    )


# --- calibration -------------------------------------------------------------------------

def family_of(gpu_name: str) -> str | None:
    for family, names in GPU_FAMILIES.items():
        if gpu_name in names:
            return family
    return None


def is_compute_calibration_row(m: Measurement) -> bool:
    """Single-GPU prefill of >= 2048 tokens: GEMMs far above every GPU's ridge point, no all-reduce."""
    return m.metric == "ttft_seconds" and m.input_tokens >= 2048 and m.tp == 1


def is_memory_calibration_row(m: Measurement, gpu: GPUSpec) -> bool:
    """Decode-dominated rows whose decode steps are memory-bound in the model.

    Decode-dominated: batch-1 decode (tpot, per-sequence decode rate), or a static batch that
    generates >= 16x its prompt. Memory-bound: at the row's last decode step, memory-bound
    operators take most of the time on ``gpu`` at the bare roofline (every efficiency 1, no
    overheads), so the choice of rows does not depend on the efficiencies being fitted; a
    compute-bound step says nothing about bandwidth.
    """
    if m.metric in ("tpot_seconds", "decode_tokens_per_second_per_sequence"):
        decode_dominated = m.batch == 1
    else:
        decode_dominated = m.metric == "output_tokens_per_second" and m.output_tokens >= 16 * m.input_tokens
    if not decode_dominated:
        return False
    roofline = gpu.with_efficiency(compute=1.0, memory=1.0, link=1.0, kernel_launch_seconds=0.0, allreduce_latency_seconds=0.0)
    deployment = plan_deployment(
        _model(m.model), roofline, parse_precision(m.weights, m.kv), m.batch, m.context_tokens, tp=m.tp, require_fit=False
    )
    last = deployment.system.step_cost(Step.decode(m.batch, m.context_tokens - 1))
    return float(last.memory_bound_seconds) > 0.5 * float(last.seconds)


def solve_efficiency(m: Measurement, gpu: GPUSpec, field: str, low: float = 0.05, high: float = 1.0) -> float | None:
    """The ``field`` efficiency (compute or memory) at which the prediction matches the measurement.

    Bisection on a monotone function: a higher efficiency lowers times and raises throughputs.
    Returns None when even the bounds do not bracket the measurement (clamped rows say so).
    """
    times = m.metric in ("ttft_seconds", "tpot_seconds")

    def too_fast(eff: float) -> bool:
        value, _ = predict(m, gpu.with_efficiency(**{field: eff}))
        return value < m.measured if times else value > m.measured

    if too_fast(low) or not too_fast(high):
        return None
    for _ in range(20):  # bracket width 0.95 / 2**20 < 1e-6
        mid = (low + high) / 2
        if too_fast(mid):
            high = mid
        else:
            low = mid
    return (low + high) / 2


@dataclass(frozen=True)
class FamilyFit:
    """Fitted efficiencies of one GPU family, with the rows each came from."""

    family: str
    compute: float | None
    compute_rows: tuple[str, ...]
    memory: float | None
    memory_rows: tuple[str, ...]


def _median_solution(pairs: list[tuple[Measurement, GPUSpec]], field: str) -> tuple[float | None, tuple[str, ...]]:
    solved = [(m.id, solve_efficiency(m, g, field)) for m, g in pairs]
    kept = [(i, v) for i, v in solved if v is not None]
    if not kept:
        return None, ()
    return statistics.median(v for _, v in kept), tuple(i for i, _ in kept)


def fit_family_efficiencies(rows: list[Measurement], rounds: int = 3) -> list[FamilyFit]:
    """One compute and one memory efficiency per GPU family (see module docstring).

    compute = median over the family's compute-calibration rows of the compute efficiency
    that reproduces each; memory = the same over its memory-calibration rows. The two are
    solved alternately (compute with memory held, then memory with compute held) for
    ``rounds`` rounds, starting from each GPU's configured memory efficiency; prefill is
    nearly all compute-bound, so this settles in two rounds to well under 0.01.
    """
    fits = []
    for family in GPU_FAMILIES:
        members = [(m, _gpu(m.gpu)) for m in rows if _loads(m) and family_of(_gpu(m.gpu).name) == family]
        compute_members = [(m, g) for m, g in members if is_compute_calibration_row(m)]
        memory_members = [(m, g) for m, g in members if is_memory_calibration_row(m, g)]
        compute = memory = None
        compute_rows: tuple[str, ...] = ()
        memory_rows: tuple[str, ...] = ()
        for _ in range(rounds):
            compute, compute_rows = _median_solution([(m, g.with_efficiency(memory=memory)) for m, g in compute_members], "compute")
            memory, memory_rows = _median_solution([(m, g.with_efficiency(compute=compute)) for m, g in memory_members], "memory")
        fits.append(FamilyFit(family, compute, compute_rows, memory, memory_rows))
    return fits


def _loads(m: Measurement) -> bool:
    try:
        _model(m.model)
        _gpu(m.gpu)
    except InputError:
        return False
    return True
