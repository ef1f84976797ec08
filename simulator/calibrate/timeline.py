"""Where a step's time goes on the device: its kernels profiled inside the step, against the step and against
the same GEMMs timed alone.

Issue 33 (docs/measured-vs-roofline.md): kernels timed alone explain about four fifths of the step times engines
are measured at, and what is missing could be time between kernels (launch gaps, the host), kernels that run
slower inside a step than alone (clocks under sustained load, caches shared with their neighbours) or kernels no
table times (norms, rotary, the KV-cache write). One profile of a step tells them apart:

- ``kernel_seconds``: the device time of every kernel and copy of one forward pass (``torch.profiler``, CUPTI on
  CUDA), against the same case's step timed in a CUDA graph by the end-to-end section: ``busy`` = kernels / step,
  and the rest of the step passes between kernels.
- ``operators``: the device time of each operator inside the step (``record_function`` ranges around the
  decoder's operators, named as ``simulate layers`` names them), against the same GEMM timed alone by the gemm
  section (same m, k, n; per layer, so x layers): above 1, a GEMM runs slower inside the step than alone.

The forward is profiled eagerly: its kernels are the ones a CUDA graph replays, their gaps are not (the step time
is the graph's). On CPU the same code runs with CPU times: it proves the path, not the numbers.

:func:`measure_timeline` needs PyTorch; the rest of the module is pure (the check reads it).
"""

from __future__ import annotations

import statistics
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from simulator.calibrate.bench import Bench
from simulator.calibrate.endtoend import RandomDecoder, case_may_run
from simulator.model import ModelSpec
from simulator.units import fmt_seconds

SECTION = "timeline"
LABEL_PREFIX = "memwall::"
"""Names of the profiler ranges around the decoder's operators (``memwall::qkv_proj``)."""
GEMM_OPERATORS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""The operators the gemm section also times alone (:func:`simulator.calibrate.gemm.projection_shapes`)."""
PROFILED_FORWARDS = 3
"""Forward passes in one profile; the times are per forward."""


def _device_seconds(event: Any) -> float:
    """An event's device time in seconds (``device_time_total``, called ``cuda_time_total`` before torch 2.4)."""
    total = getattr(event, "device_time_total", None)
    if total is None:
        total = getattr(event, "cuda_time_total", None)
    return float(total or 0.0) * 1e-6  # the profiler counts microseconds


DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
"""Kineto's activity types of work on the device (libkineto's ActivityType.cpp); its others there are not
(``gpu_user_annotation``: a range's mirror on the device's timeline, spanning its kernels and the gaps between)."""


def _device_work(event: Any, on_cpu: bool) -> bool:
    """A kernel, copy or memset, by kineto's activity type; where the event has none (an older torch), any device
    event but a range's mirror."""
    kind = getattr(event, "activity_type", None)
    if isinstance(kind, str) and kind:
        return kind.lower() in DEVICE_WORK  # some builds spell it "Kernel"
    return not on_cpu and not getattr(event, "is_user_annotation", False)


def summarise(events: Iterable[Any], on_device: bool, forwards: int) -> dict[str, Any]:
    """Kernel time, kernel count and per-operator time of one forward, from a profile of ``forwards`` forwards.

    ``events``: the profiler's events (``prof.events()``: each with ``name``, ``device_type``, ``activity_type``
    and device and CPU times in microseconds). On a device the kernels are its work (:func:`_device_work`) and an
    operator's time is its CPU range's device time (the kernels launched inside it); on CPU there are no device
    events, an operator's time is its range's CPU time, and the ranges together are the forward.
    """
    operators: dict[str, float] = {}
    kernel_seconds, kernels = 0.0, 0
    for event in events:
        on_cpu = str(getattr(event.device_type, "name", event.device_type)) == "CPU"
        name = str(event.name)
        if on_cpu and name.startswith(LABEL_PREFIX):
            seconds = _device_seconds(event) if on_device else float(event.cpu_time_total) * 1e-6
            operator = name[len(LABEL_PREFIX):]
            operators[operator] = operators.get(operator, 0.0) + seconds
        elif on_device and _device_work(event, on_cpu):
            kernel_seconds += _device_seconds(event)
            kernels += 1
    if on_device and not kernels:
        # Not zero seconds: a profile that saw no kernel measured nothing, and the case is listed as skipped.
        raise RuntimeError("the profile holds no device kernel (is CUPTI available to torch.profiler?)")
    if not on_device:
        kernel_seconds = sum(operators.values())
    return {
        "kernel_seconds": kernel_seconds / forwards,
        "kernels": kernels // forwards if on_device else None,
        "operators": {name: seconds / forwards for name, seconds in sorted(operators.items())},
    }


def measure_timeline(bench: Bench, model: ModelSpec, dtype: str,
                     cases: tuple[tuple[str, int, int], ...]) -> list[dict[str, Any]]:
    """One profile per (phase, batch, context) case of the end-to-end decoder; cases that do not fit are skipped."""
    torch = bench.torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark(name: str) -> AbstractContextManager[Any]:
        return record_function(LABEL_PREFIX + name)

    bench.release()  # the end-to-end decoder's memory, back to the driver: the fit checks below ask the driver
    on_device = bench.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    decoder = RandomDecoder(bench, model, dtype)
    rows = []
    for phase, batch, context in cases:
        label = f"{phase} batch={batch} ctx={context}"
        if not case_may_run(bench, model, dtype, SECTION, label, batch, context):
            continue
        cache: list[tuple[Any, Any]] | None = None
        try:
            cache, ids, start, rotation = decoder.inputs(phase, batch, context)
            with torch.inference_mode():
                decoder.forward(ids, cache, start, rotation)  # workspaces and kernel choices, outside the profile
                bench.synchronize()
                with profile(activities=activities) as prof:
                    for _ in range(PROFILED_FORWARDS):
                        decoder.forward(ids, cache, start, rotation, mark=mark)
                    bench.synchronize()
            found = summarise(prof.events(), on_device, PROFILED_FORWARDS)
            del prof
        except Exception as exc:
            bench.failed(SECTION, label, exc)
            continue
        finally:
            cache = None
            bench.release()
        rows.append({"phase": phase, "batch": batch, "context": context, "forwards": PROFILED_FORWARDS, **found})
        bench.log(f"{SECTION} {label}: kernels {found['kernel_seconds'] * 1e3:.3f} ms per forward")
    return rows


# ---------------------------------------------------------------------------------------
# Pure: what the check prints


@dataclass(frozen=True)
class OperatorTime:
    """One operator of one profiled step, all layers together (seconds): inside the step, alone (GEMMs the gemm
    section timed at the step's m, x layers; None otherwise) and as the simulator predicts it (None where it
    has no operator of that name)."""

    name: str
    in_step_seconds: float
    alone_seconds: float | None
    predicted_seconds: float | None

    @property
    def in_step_over_alone(self) -> float | None:
        return self.in_step_seconds / self.alone_seconds if self.alone_seconds else None


@dataclass(frozen=True)
class TimelineRow:
    """One profiled case: the step as the end-to-end section timed it (None where it did not), the kernels'
    time and count inside it, and its operators."""

    phase: str
    batch: int
    context: int
    step_seconds: float | None
    kernel_seconds: float
    kernels: int | None
    operators: tuple[OperatorTime, ...]

    @property
    def busy(self) -> float | None:
        """Kernel time over step time: the fraction of the step the device spends in kernels."""
        return self.kernel_seconds / self.step_seconds if self.step_seconds else None


def timeline_rows(measurements: dict[str, Any], layers: int,
                  predicted: Callable[[str, int, int], dict[str, float]]) -> list[TimelineRow]:
    """A row per profiled case of ``measurements`` (none where it has no ``timeline``).

    ``layers``: the decoder's layer count (an operator alone is timed for one layer); ``predicted(phase, batch,
    context)``: the simulator's seconds per operator name for that step, all layers together.
    """
    steps = {(c["phase"], c["batch"], c["context"]): c["seconds"] for c in measurements["endtoend"]["cases"]}
    model, dtype = measurements["endtoend"]["model"]["name"], measurements["dtype"]
    # A gemm row's model and op are the harness's own keys, which a timings file need not hold (the schema
    # checks dtype, tokens, flops, bytes and seconds only): a row without them times no operator here.
    alone = {(g.get("op"), g["tokens"]): g["seconds"] for g in measurements["gemm"]
             if g.get("model") == model and g["dtype"] == dtype}
    rows = []
    for case in measurements.get("timeline", []):
        phase, batch, context = case["phase"], case["batch"], case["context"]
        m = batch if phase == "decode" else batch * context
        expected = predicted(phase, batch, context)
        operators = []
        for name, seconds in case["operators"].items():
            one = alone.get((name, m)) if name in GEMM_OPERATORS else None
            operators.append(OperatorTime(name, seconds, None if one is None else one * layers, expected.get(name)))
        rows.append(TimelineRow(phase, batch, context, steps.get((phase, batch, context)), case["kernel_seconds"],
                                case.get("kernels"), tuple(operators)))
    return rows


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else fmt_seconds(value)


def timeline_text(rows: list[TimelineRow], label: Callable[[str, int, int], str]) -> list[str]:
    """The check's lines for the profiled steps (none when there are none)."""
    if not rows:
        return []
    lines = ["", "Where the step's time goes (one forward profiled; 'alone' is the gemm section's time x layers):"]
    for row in rows:
        kernels = "" if row.kernels is None else f", {row.kernels} kernels"
        busy = "" if row.busy is None else f", busy {100 * row.busy:.0f}% of the step"
        lines += ["", f"{label(row.phase, row.batch, row.context)}: step {_seconds(row.step_seconds)}, "
                      f"kernels {fmt_seconds(row.kernel_seconds)}{kernels}{busy}"]
        header = f"  {'operator':<14} {'in step':>10} {'alone':>10} {'step/alone':>10} {'predicted':>10}"
        lines += [header]
        for op in sorted(row.operators, key=lambda op: -op.in_step_seconds):
            lines.append(f"  {op.name:<14} {fmt_seconds(op.in_step_seconds):>10} {_seconds(op.alone_seconds):>10} "
                         f"{_ratio(op.in_step_over_alone):>10} {_seconds(op.predicted_seconds):>10}")
    ratios = [op.in_step_over_alone for row in rows for op in row.operators if op.in_step_over_alone is not None]
    if ratios:
        lines += ["", f"GEMMs inside the step over alone: median {statistics.median(ratios):.2f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} operators)"]
    return lines


def timeline_dicts(rows: list[TimelineRow]) -> list[dict[str, Any]]:
    """The ``--check --json`` form of the profiled steps (SI units)."""
    return [
        {
            "phase": row.phase, "batch": row.batch, "context": row.context, "step_seconds": row.step_seconds,
            "kernel_seconds": row.kernel_seconds, "kernels": row.kernels, "busy": row.busy,
            "operators": [
                {"name": op.name, "in_step_seconds": op.in_step_seconds, "alone_seconds": op.alone_seconds,
                 "in_step_over_alone": op.in_step_over_alone, "predicted_seconds": op.predicted_seconds}
                for op in row.operators
            ],
        }
        for row in rows
    ]
