"""Kernel choices of ``simulate explain``: per decoder layer, the attention bytes of each attention kernel and
the kernels and activation bytes of each fusion level, for a prefill and a decode step."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simulator.cost.system import System
from simulator.model.operators import ATTENTION_KERNELS, FUSIONS
from simulator.model.step import Step
from simulator.report.compare import text_table
from simulator.report.explain import NOT_IN_LAYER, count_of, rebuild_system
from simulator.units import fmt_bytes, fmt_seconds


@dataclass(frozen=True)
class LayerProfile:
    """Per decoder layer, per GPU, one step: kernels launched, activation and attention HBM bytes, and the step's time."""

    kernels: float
    activation_bytes: float
    attention_bytes: float
    step_seconds: float


def layer_profile(system: System, step: Step) -> LayerProfile:
    """Sum over the operators of one decoder layer (one instance each) of ``op.work(step)``."""
    layer = [op for op in system.operators if op.name not in NOT_IN_LAYER]
    works = [(op, op.work(step)) for op in layer]
    attention = next(w for op, w in works if op.kind == "attention")
    return LayerProfile(
        kernels=float(sum(w.launches for _, w in works)),
        activation_bytes=float(sum(w.activation_bytes for _, w in works)),
        attention_bytes=float(attention.kv_read_bytes + attention.kv_write_bytes + attention.activation_bytes),
        step_seconds=float(system.step_seconds(step)),
    )


def kernel_choices(system: System, batch: int, ctx: int, gen: int) -> dict[str, Any]:
    """Attention bytes per layer for both kernels, kernels and activation bytes per layer for each fusion level."""
    steps = {"prefill": Step.prefill(batch, ctx - gen), "decode": Step.decode(batch, ctx)}
    attention = {}
    for kernel in ATTENTION_KERNELS:
        other = rebuild_system(system, attention_kernel=kernel, fusion="elementwise" if system.fusion == "full" and kernel != "flash" else system.fusion)
        attention[kernel] = {phase: asdict(layer_profile(other, s)) for phase, s in steps.items()} if other else None
    fusion = {}
    for level in FUSIONS:
        other = rebuild_system(system, fusion=level, attention_kernel="flash" if level == "full" else system.attention_kernel)
        fusion[level] = {phase: asdict(layer_profile(other, s)) for phase, s in steps.items()} if other else None
    return {"attention_kernel": attention, "fusion": fusion, "current": {"attention_kernel": system.attention_kernel,
                                                                        "fusion": system.fusion}}


def kernel_choices_text(choices: dict[str, Any], batch: int, ctx: int, gen: int) -> list[str]:
    mark = choices["current"]
    lines = [f"Attention kernel (per layer, per GPU; prefill {batch} x {count_of(ctx - gen, 'token')}, decode at context {ctx})"]
    rows = []
    for kernel, phases in choices["attention_kernel"].items():
        if phases is None:
            continue  # a kernel this model cannot run (MLA and DeepSeek-V4's attention run flash-style kernels only)
        rows.append([kernel + (" *" if kernel == mark["attention_kernel"] else ""),
                     fmt_bytes(phases["prefill"]["attention_bytes"]), fmt_seconds(phases["prefill"]["step_seconds"]),
                     fmt_bytes(phases["decode"]["attention_bytes"]), fmt_seconds(phases["decode"]["step_seconds"])])
    lines += ["  " + line for line in text_table(
        ["kernel", "prefill attention bytes", "prefill", "decode attention bytes", "decode step"], rows, {1, 2, 3, 4})]
    lines += ["", "Fusion (per layer, per GPU)"]
    rows = []
    for level, phases in choices["fusion"].items():
        if phases is None:
            continue
        rows.append([level + (" *" if level == mark["fusion"] else ""), f"{phases['decode']['kernels']:.0f}",
                     fmt_bytes(phases["prefill"]["activation_bytes"]), fmt_seconds(phases["prefill"]["step_seconds"]),
                     fmt_bytes(phases["decode"]["activation_bytes"]), fmt_seconds(phases["decode"]["step_seconds"])])
    lines += ["  " + line for line in text_table(
        ["fusion", "kernels", "prefill activation bytes", "prefill", "decode activation bytes", "decode step"],
        rows, {1, 2, 3, 4, 5})]
    lines.append("  (* = this run; 'full' fuses the attention block and always uses flash attention)")
    return lines
