"""A System: one model deployed on ``tp`` GPUs of one type at one precision.

It is built once (operators derived and checked) and then costs any number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.cost.step_cost import (
    OperatorRates,
    StepCost,
    StepTotals,
    step_cost,
    step_totals,
    system_rates,
)
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.gpu import GPUSpec
from simulator.model.layers import (
    AttentionKernel,
    Fusion,
    Operator,
    build_operators,
    kv_heads_per_gpu,
)
from simulator.model.precision import Precision
from simulator.model.step import Step


@dataclass(frozen=True)
class System:
    """Model + GPU + precision + parallelism + kernel choices, with the derived operators."""

    model: ModelSpec
    gpu: GPUSpec
    precision: Precision
    tp: int = 1
    attention_kernel: AttentionKernel = "flash"
    fusion: Fusion = "elementwise"
    operators: tuple[Operator, ...] = field(init=False, repr=False, compare=False)
    rates: tuple[OperatorRates | None, ...] = field(init=False, repr=False, compare=False)
    """each operator's roofline rates, worked out once (None where a measured overlay makes them vary)"""
    totals_memo: dict = field(init=False, repr=False, compare=False)
    """operator shares of :meth:`step_totals` by token count (see :func:`simulator.cost.step_cost.step_totals`)"""

    def __post_init__(self) -> None:
        for dtype in {self.precision.compute_dtype, self.precision.activation_dtype}:
            if dtype not in self.gpu.peak_flops:
                have = ", ".join(sorted(self.gpu.peak_flops))
                raise InputError(
                    f"--weights {self.precision.weights}: {self.gpu.name} has no {dtype} peak "
                    f"(it has: {have}); choose another precision"
                )
        ops = build_operators(self.model, self.precision, self.gpu, self.tp, self.attention_kernel, self.fusion)
        object.__setattr__(self, "operators", ops)
        object.__setattr__(self, "rates", system_rates(ops, self.gpu))
        object.__setattr__(self, "totals_memo", {})

    def step_cost(self, step: Step) -> StepCost:
        """Per-operator roofline cost of ``step`` on one GPU of the group."""
        return step_cost(self.operators, step, self.gpu, self.rates)

    def step_totals(self, step: Step) -> StepTotals:
        """``step``'s totals (seconds, FLOPs, bytes, time by bound) on one GPU, without per-operator records."""
        return step_totals(self.operators, step, self.gpu, self.rates, self.totals_memo)

    def step_seconds(self, step: Step) -> float:
        """Wall time of ``step`` (every GPU of the group works in lockstep)."""
        return self.step_totals(step).seconds

    @property
    def kv_heads_per_gpu(self) -> int:
        return kv_heads_per_gpu(self.model, self.tp)

    @property
    def peak_flops(self) -> float:
        """Peak FLOP/s of the GEMM compute dtype, one GPU."""
        return self.gpu.peak(self.precision.compute_dtype)

    def describe(self) -> str:
        return (
            f"{self.model.name} on {self.tp}x {self.gpu.name}, {self.precision.label()}, "
            f"{self.attention_kernel} attention, fusion {self.fusion}"
        )
