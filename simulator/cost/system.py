"""A System: one model deployed on ``tp`` GPUs of one type at one precision, served by one engine.

It is built once (operators derived and checked, rates worked out) and then costs any number of
steps. Besides the model, GPU and precision it carries the time model's settings
(:class:`~simulator.cost.step_cost.TimeModel`): the engine profile (host time per iteration,
CUDA-graph capture, all-reduce kernels), the collective algorithm and the kernel-efficiency model.
Their defaults here are the plain roofline (``ideal`` engine, NCCL ring, flat efficiencies);
:func:`simulator.plan.deployment_planner.deployment_from_options` picks the realistic ones (vLLM, the
engine's own all-reduce choice, efficiency by kernel shape).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from simulator.cost.collectives import check_algorithm
from simulator.cost.kernel_tables.source import kernel_source
from simulator.cost.step_cost import (
    KERNEL_MODELS,
    SHARED_STEPS,
    OperatorRates,
    StepCost,
    StepTotals,
    TimeModel,
    kernel_overlap,
    step_cost,
    step_totals,
    system_rates,
)
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.engine_profile import IDEAL, EngineProfile
from simulator.model.gpu import GPUSpec
from simulator.model.layers import build_operators
from simulator.model.operators import Attention, AttentionKernel, Fusion, Gemm, Operator
from simulator.model.parallelism import kv_heads_per_gpu
from simulator.model.precision import Precision
from simulator.model.step import Number, Step

HOST_WORK: tuple[str, ...] = ("cpu", "async_cpu", "worker_rpc")
"""The engine profile's host CPU work per iteration: read only by the exposed host time of a step."""


def engine_kernels(ops: tuple[Operator, ...], engine: EngineProfile) -> tuple[Operator, ...]:
    """``ops`` as ``engine`` runs them: its naive kernel's score bytes and its expansion of quantised weights."""
    if engine.naive_score_bytes is None and not engine.dequantize_above_tokens:
        return ops
    out: list[Operator] = []
    for op in ops:
        if isinstance(op, Attention) and engine.naive_score_bytes is not None:
            op = replace(op, score_bytes_per_element=engine.naive_score_bytes)
        elif isinstance(op, Gemm) and op.dequant_ops_per_weight and engine.dequantize_above_tokens:
            op = replace(op, expand_above_tokens=engine.dequantize_above_tokens)
        out.append(op)
    return tuple(out)


@dataclass(frozen=True)
class System:
    """Model + GPU + precision + parallelism + kernel choices, with the derived operators."""

    model: ModelSpec
    gpu: GPUSpec
    precision: Precision
    tp: int = 1
    attention_kernel: AttentionKernel = "flash"
    fusion: Fusion = "elementwise"
    ep: int = 1
    """expert-parallel degree (1, or tp: the routed experts split over the tensor-parallel GPUs)"""
    routing_skew: float = 0.0
    """Zipf-like exponent of expert popularity (0: uniform routing; simulator.model.routing)"""
    engine: EngineProfile = IDEAL
    """the serving engine (host time per iteration, graph capture, all-reduce kernels)"""
    collectives: str = "ring"
    """all-reduce algorithm: auto (the engine's choice), nccl/ring, tree, one-shot, two-shot, off"""
    kernel_efficiency: str = "flat"
    """shape: efficiency by GEMM shape, bytes moved and FlashAttention's ceiling; flat: one factor each"""
    dp_attention: bool = False
    """attention data-parallel over the tp GPUs (each: all heads, 1/tp of the sequences), experts expert-parallel"""
    kernels: str = "roofline"
    """what times the operators: roofline, measured (kernel tables; an error where none exist) or auto"""
    kernel_table: str | None = None
    """a memwall kernel-table file (simulator.cost.kernel_tables.csv_format) that times the operators it covers"""
    time_model: TimeModel = field(init=False, repr=False, compare=False)
    operators: tuple[Operator, ...] = field(init=False, repr=False, compare=False)
    rates: tuple[OperatorRates | None, ...] = field(init=False, repr=False, compare=False)
    """each operator's roofline rates, worked out once (None where a measured overlay makes them vary)"""
    totals_memo: dict = field(init=False, repr=False, compare=False)
    """operator shares of :meth:`step_totals` by token count (see :func:`simulator.cost.step_cost.step_totals`)"""

    def __post_init__(self) -> None:
        if self.engine.gemm_accumulate == "fp16":
            # The engine's FP16 GEMMs accumulate in FP16: a GeForce part runs them at twice its FP32-accumulate peak.
            object.__setattr__(self, "gpu", self.gpu.with_fp16_accumulation())
        # fp4 weights run on FP4 tensor cores only where the GPU has an fp4 peak (else weight-only).
        object.__setattr__(self, "precision", self.precision.on_gpu(self.gpu.peak_flops))
        for dtype in self.precision.compute_dtypes:
            if dtype not in self.gpu.peak_flops:
                have = ", ".join(sorted(self.gpu.peak_flops))
                raise InputError(
                    f"--weights {self.precision.text()}: {self.gpu.name} has no {dtype} peak "
                    f"(it has: {have}); choose another precision"
                )
        check_algorithm(self.collectives)
        if self.kernel_efficiency not in KERNEL_MODELS:
            raise InputError(
                f"--kernel-efficiency: unknown '{self.kernel_efficiency}'; allowed: {', '.join(KERNEL_MODELS)}"
            )
        # The driver's per-worker host work (EngineProfile.worker_rpc) depends on the group's size, known only here.
        model = TimeModel(self.engine.for_workers(self.tp), self.collectives, self.kernel_efficiency == "shape",
                          host_ranks=self.tp if self.dp_attention else 1,
                          kernels=kernel_source(self.gpu, self.engine, self.kernels, self.kernel_table))
        object.__setattr__(self, "time_model", model)
        ops = build_operators(self.model, self.precision, self.gpu, self.tp, self.attention_kernel, self.fusion,
                              self.ep, self.routing_skew, self.dp_attention)
        if model.shape:
            # FlashAttention's row tiles share K/V through L2 (Attention.l2_reuse): part of the shape-aware model.
            ops = tuple(replace(op, l2_bytes=self.gpu.l2_bytes, sm_count=self.gpu.sm_count)
                        if isinstance(op, Attention) else op for op in ops)
        ops = engine_kernels(ops, self.engine)
        object.__setattr__(self, "operators", ops)
        object.__setattr__(self, "rates", system_rates(ops, self.gpu, model))
        object.__setattr__(self, "totals_memo", {})

    def with_efficiency(self, **overrides: float | None) -> System:
        """This System with some of its GPU's efficiency factors replaced (:meth:`GPUSpec.with_efficiency`).

        Equal to ``replace(self, gpu=self.gpu.with_efficiency(**overrides))``, built without deriving the
        operators and the time model again: neither reads the GPU's efficiency (the operators read its SRAM and
        peaks, the kernel tables its name), so they are shared; the rates, which do, are worked out again, and
        the step-cost memo starts empty. A validation replays one deployment at hundreds of efficiencies.
        """
        gpu = self.gpu.with_efficiency(**overrides)
        if gpu is self.gpu:
            return self
        rebuilt = copy.copy(self)
        object.__setattr__(rebuilt, "gpu", gpu)
        object.__setattr__(rebuilt, "rates", system_rates(self.operators, gpu, self.time_model))
        object.__setattr__(rebuilt, "totals_memo", {})
        return rebuilt

    def with_engine(self, engine: EngineProfile) -> System:
        """This System served by ``engine`` (``replace(self, engine=engine)``).

        Where ``engine`` differs from this System's profile only in its host CPU work (:data:`HOST_WORK`), which
        only the step's exposed host time reads (:mod:`simulator.cost.engine_overhead`), after the operators'
        shares, the two Systems have the same operators, rates and graph capture, and they share their step-cost
        memo (:data:`~simulator.cost.step_cost.SHARED_STEPS`): a validation replays one run at seven host times
        per sequence (crossval rule 8), the same steps each time.
        """
        rebuilt = replace(self, engine=engine)
        same_kernels = engine.model_copy(update={name: getattr(self.engine, name) for name in HOST_WORK}) == self.engine
        if same_kernels and rebuilt.operators == self.operators and rebuilt.rates == self.rates:
            self.totals_memo.setdefault(SHARED_STEPS, {})
            object.__setattr__(rebuilt, "totals_memo", self.totals_memo)
        return rebuilt

    @property
    def kernel_overlap(self) -> float:
        """This system's :func:`~simulator.cost.step_cost.kernel_overlap` (what the report and JSON show)."""
        return kernel_overlap(self.gpu, self.time_model)

    def step_cost(self, step: Step) -> StepCost:
        """Per-operator cost of ``step`` on one GPU of the group, plus the engine's exposed host time."""
        return step_cost(self.operators, step, self.gpu, self.rates, self.time_model)

    def step_totals(self, step: Step) -> StepTotals:
        """``step``'s totals (seconds, FLOPs, bytes, time by bound) on one GPU, without per-operator records."""
        return step_totals(self.operators, step, self.gpu, self.rates, self.totals_memo, self.time_model)

    def step_seconds(self, step: Step) -> Number:
        """Wall time of ``step`` in seconds (every GPU of the group works in lockstep); an array for an array step."""
        return self.step_totals(step).seconds

    @property
    def kv_heads_per_gpu(self) -> int:
        return kv_heads_per_gpu(self.model, self.tp)

    @property
    def peak_flops(self) -> float:
        """Peak FLOP/s of the GEMM compute dtype, one GPU."""
        return self.gpu.peak(self.precision.compute_dtype)

    def describe(self) -> str:
        experts = f", experts split over {self.ep} GPUs" if self.ep > 1 else ""
        return (
            f"{self.model.name} on {self.tp}x {self.gpu.name}{experts}, {self.precision.label()}, "
            f"{self.attention_kernel} attention, fusion {self.fusion}, engine {self.engine.name}"
        )
