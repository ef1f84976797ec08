"""The roofline cost model: pure functions, no simpy.

For each operator and step:

    tensor_seconds  = flops / (peak_flops[dtype] * efficiency.compute)
    dequant_seconds = dequant_ops / (peak_flops["fp32"] * efficiency.compute)
    compute_seconds = max(tensor_seconds, dequant_seconds)
    memory_seconds  = bytes / (hbm_bandwidth * efficiency.memory)
    seconds         = max(compute_seconds, memory_seconds) + launches * efficiency.kernel_launch_seconds

where bytes = weight reads + KV-cache reads + KV-cache writes + activation reads/writes.

Dequantisation of int8/int4 weights (``dequant_ops``, see :mod:`simulator.model.layers`) runs on
the CUDA cores, not the tensor cores: it is charged at the GPU's fp32 vector rate
(``peak_flops.fp32``; packed half2 instructions handle two weights per instruction, which
roughly cancels the FMA's count of two FLOPs per lane). Weight-only kernels (Marlin, AWQ)
overlap it with the tensor-core MMAs, hence the max. Consequence: at a compute-bound batch
(tokens a multiple of the row tile t) a weight-only GEMM takes

    max(1, ops_per_weight / t * peak_fp16 / (2 * peak_fp32))

times its fp16 time. A100, int4 (4 ops, t = 16): 4 / 16 * 312 / (2 * 19.5) = 2.0 (int4 is
twice as slow as fp16 at large batch); int8 (2 ops): 1.0 (no penalty). At batch 1 the
dequantisation hides under the (3.9x smaller) weight read.
A tensor-parallel all-reduce of ``m`` bytes per GPU over a ring of ``n`` GPUs costs

    2 (n - 1) / n * m / (link_bandwidth * efficiency.link) + efficiency.allreduce_latency_seconds.

Operators run one after another, so a step's time is the sum over operators. This module
is the one place that turns work into seconds (:func:`roofline`, :func:`allreduce_seconds`);
everything else calls :func:`operator_cost` / :func:`step_cost` (a record per operator) or
:func:`step_totals` (only the step's totals, the engine's hot path). Inputs may be numpy
arrays (one entry per step): all arithmetic is elementwise, so many steps are costed in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from simulator.errors import InputError
from simulator.model.gpu import GPUSpec
from simulator.model.layers import Operator, Work
from simulator.model.step import Number, Step


class OperatorCost(NamedTuple):
    """Cost of one operator in one step on one GPU, all its instances (``count`` layers) together.

    A NamedTuple (immutable, and several times cheaper to build than a frozen dataclass:
    the engine builds one per operator per simulated iteration).
    """

    name: str
    kind: str
    count: int
    flops: Number
    weight_bytes: Number
    kv_read_bytes: Number
    kv_write_bytes: Number
    activation_bytes: Number
    link_bytes: Number
    launches: Number
    compute_seconds: Number
    memory_seconds: Number
    link_seconds: Number
    seconds: Number
    dequant_ops: Number = 0.0
    """weight-only dequantisation operations (not in ``flops``; charged at the vector rate)"""

    @property
    def bytes(self) -> Number:
        """HBM bytes moved: weights + KV read + KV write + activations."""
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def intensity(self) -> Number:
        """Arithmetic intensity in FLOP per HBM byte (0 where nothing moves)."""
        moved = self.bytes
        if isinstance(moved, np.ndarray):
            return np.divide(self.flops, moved, out=np.zeros(moved.shape), where=moved > 0)
        return self.flops / moved if moved else 0.0

    @property
    def bound(self) -> str:
        """'communication', 'compute', 'memory', 'fused' or 'idle' (a scalar step only).

        'fused': an operator that runs inside a neighbouring kernel (no launch, no HBM traffic).
        """
        if self.kind == "allreduce":
            return "communication"
        if not self.compute_seconds and not self.memory_seconds:
            return "idle"
        if self.kind == "elementwise" and not self.launches:
            return "fused"
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def _maximum(a: Number, b: Number) -> Number:
    # A comparison of scalars is ~20x faster than np.maximum; arrays need the elementwise form.
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return b if b > a else a


def _where(condition: Number, a: Number, b: Number) -> Number:
    if isinstance(condition, np.ndarray):
        return np.where(condition, a, b)
    return a if condition else b


def efficiency_factors(gpu: GPUSpec, op_kind: str, tokens: Number) -> tuple[Number, Number]:
    """(compute, memory) efficiency for an op kind at a token count: a measured overlay entry or the defaults."""
    compute, memory = gpu.efficiency.compute, gpu.efficiency.memory
    if not gpu.efficiency_by_op:
        return compute, memory
    for entry in gpu.efficiency_by_op:
        if entry.op_class != op_kind:
            continue
        upper = np.inf if entry.max_tokens is None else entry.max_tokens
        inside = (tokens >= entry.min_tokens) & (tokens <= upper)
        if entry.compute is not None:
            compute = _where(inside, entry.compute, compute)
        if entry.memory is not None:
            memory = _where(inside, entry.memory, memory)
    return compute, memory


def vector_flops(gpu: GPUSpec) -> float:
    """CUDA-core (non-tensor) operations per second that dequantisation runs at: the fp32 peak."""
    if "fp32" not in gpu.peak_flops:
        raise InputError(
            f"{gpu.name}: int8/int4 weight-only dequantisation runs on the CUDA cores and needs "
            f"peak_flops.fp32 in the GPU config"
        )
    return gpu.peak_flops["fp32"]


class OperatorRates(NamedTuple):
    """The achievable rates one operator runs at on one GPU: the denominators of the roofline.

    They depend on the step only through a measured per-op efficiency overlay, so a
    :class:`~simulator.cost.system.System` computes them once per operator (see :func:`operator_rates`).
    """

    flops_per_second: Number
    """tensor-core rate: peak_flops[compute dtype] * efficiency.compute (FLOP/s)"""
    dequant_ops_per_second: Number | None
    """CUDA-core rate for weight-only dequantisation: peak_flops.fp32 * efficiency.compute (None: no dequantisation)"""
    bytes_per_second: Number
    """HBM rate: hbm_bandwidth * efficiency.memory (bytes/s)"""
    launch_seconds: float
    """efficiency.kernel_launch_seconds, per launch"""
    ring_factor: float = 0.0
    """all-reduce: 2 (tp - 1) / tp, the share of the message each GPU sends"""
    link_bytes_per_second: float = 0.0
    """all-reduce: link_bandwidth * efficiency.link (bytes/s)"""
    allreduce_latency_seconds: float = 0.0
    """all-reduce: fixed latency per launch"""


def rates_vary_with_tokens(op: Operator, gpu: GPUSpec) -> bool:
    """Does a measured overlay make ``op``'s efficiency depend on the step's token count?"""
    return op.kind != "allreduce" and any(entry.op_class == op.kind for entry in gpu.efficiency_by_op)


def operator_rates(op: Operator, gpu: GPUSpec, tokens: Number = 0.0) -> OperatorRates:
    """Rates of ``op`` on ``gpu`` at a step of ``tokens`` tokens (the tokens matter only under an overlay)."""
    eff = gpu.efficiency
    if op.kind == "allreduce":
        return OperatorRates(
            0.0, None, 0.0, 0.0, ring_factor=2.0 * (op.tp - 1) / op.tp,
            link_bytes_per_second=gpu.link_bandwidth_bytes_per_second * eff.link,
            allreduce_latency_seconds=eff.allreduce_latency_seconds,
        )
    compute_eff, memory_eff = efficiency_factors(gpu, op.kind, tokens)
    peak = gpu.peak_flops.get(op.compute_dtype) or gpu.peak(op.compute_dtype)
    dequantises = op.kind == "gemm" and op.dequant_ops_per_weight
    return OperatorRates(
        flops_per_second=peak * compute_eff,
        dequant_ops_per_second=vector_flops(gpu) * compute_eff if dequantises else None,
        bytes_per_second=gpu.hbm_bandwidth_bytes_per_second * memory_eff,
        launch_seconds=eff.kernel_launch_seconds,
    )


def system_rates(operators: tuple[Operator, ...], gpu: GPUSpec) -> tuple[OperatorRates | None, ...]:
    """Each operator's rates, or None where an overlay makes them depend on the step."""
    return tuple(None if rates_vary_with_tokens(op, gpu) else operator_rates(op, gpu) for op in operators)


def roofline(work: Work, rates: OperatorRates, count: int) -> tuple[Number, Number, Number]:
    """(compute, memory, total) seconds of ``count`` instances of a non-communication operator.

    The one roofline formula (module docstring): :func:`operator_cost` and :func:`operator_totals` both call it.
    """
    compute_seconds = work.flops / rates.flops_per_second
    if rates.dequant_ops_per_second is not None:
        compute_seconds = _maximum(compute_seconds, work.dequant_ops / rates.dequant_ops_per_second)
    moved = work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
    memory_seconds = moved / rates.bytes_per_second
    seconds = _maximum(compute_seconds, memory_seconds) + work.launches * rates.launch_seconds
    return count * compute_seconds, count * memory_seconds, count * seconds


def allreduce_seconds(work: Work, rates: OperatorRates, count: int) -> Number:
    """Seconds of ``count`` ring all-reduce instances (module docstring)."""
    link_seconds = rates.ring_factor * work.link_bytes / rates.link_bytes_per_second
    return count * (link_seconds + rates.allreduce_latency_seconds * work.launches)


def operator_cost(op: Operator, step: Step, gpu: GPUSpec, rates: OperatorRates | None = None) -> OperatorCost:
    """Roofline cost of ``op`` for ``step`` on one GPU of type ``gpu`` (see module docstring).

    ``rates``: the operator's precomputed :func:`operator_rates` (None: worked out here).
    """
    work = op.work(step)
    count = op.count
    if rates is None:
        rates = operator_rates(op, gpu, op.tokens(step))
    if op.kind == "allreduce":
        link_seconds = allreduce_seconds(work, rates, count)
        zero = 0.0 * work.link_bytes
        return OperatorCost(
            name=op.name, kind=op.kind, count=count, flops=zero, weight_bytes=zero, kv_read_bytes=zero,
            kv_write_bytes=zero, activation_bytes=zero, link_bytes=count * work.link_bytes,
            launches=count * work.launches, compute_seconds=zero, memory_seconds=zero,
            link_seconds=link_seconds, seconds=link_seconds,
        )
    compute_seconds, memory_seconds, seconds = roofline(work, rates, count)
    no_link = 0.0 * memory_seconds
    return OperatorCost(
        name=op.name,
        kind=op.kind,
        count=count,
        flops=count * work.flops,
        weight_bytes=count * work.weight_bytes,
        kv_read_bytes=count * work.kv_read_bytes,
        kv_write_bytes=count * work.kv_write_bytes,
        activation_bytes=count * work.activation_bytes,
        link_bytes=no_link,
        launches=count * work.launches,
        compute_seconds=compute_seconds,
        memory_seconds=memory_seconds,
        link_seconds=no_link,
        seconds=seconds,
        dequant_ops=count * work.dequant_ops,
    )


@dataclass(frozen=True)
class StepCost:
    """Cost of one step on one GPU (every GPU of a tensor-parallel group does the same work)."""

    operators: tuple[OperatorCost, ...]

    @property
    def seconds(self) -> Number:
        return sum(op.seconds for op in self.operators)

    @property
    def flops(self) -> Number:
        """FLOPs on one GPU; multiply by tp for the whole group."""
        return sum(op.flops for op in self.operators)

    @property
    def bytes(self) -> Number:
        """HBM bytes on one GPU."""
        return sum(op.bytes for op in self.operators)

    @property
    def communication_seconds(self) -> Number:
        return sum(op.link_seconds for op in self.operators)

    @property
    def compute_bound_seconds(self) -> Number:
        """Time in operators whose compute time exceeds their memory time."""
        return sum(
            _where(op.compute_seconds >= op.memory_seconds, op.seconds, 0.0 * op.seconds)
            for op in self.operators
            if op.kind != "allreduce"
        )

    @property
    def memory_bound_seconds(self) -> Number:
        return self.seconds - self.compute_bound_seconds - self.communication_seconds

    @property
    def launches(self) -> Number:
        return sum(op.launches for op in self.operators)


def step_cost(
    operators: tuple[Operator, ...],
    step: Step,
    gpu: GPUSpec,
    rates: tuple[OperatorRates | None, ...] | None = None,
) -> StepCost:
    """Cost of every operator of a forward pass for ``step`` (``rates``: from :func:`system_rates`, optional)."""
    if rates is None:
        return StepCost(tuple(operator_cost(op, step, gpu) for op in operators))
    return StepCost(tuple(operator_cost(op, step, gpu, r) for op, r in zip(operators, rates)))


class StepTotals(NamedTuple):
    """A step's totals on one GPU, equal to the same-named :class:`StepCost` properties."""

    seconds: Number
    flops: Number
    bytes: Number
    compute_bound_seconds: Number
    memory_bound_seconds: Number
    communication_seconds: Number


def operator_totals(op: Operator, step: Step, gpu: GPUSpec, rates: OperatorRates | None) -> tuple:
    """One operator's share of :class:`StepTotals`: (seconds, FLOPs, bytes, compute-bound s, communication s)."""
    work = op.work(step)
    count = op.count
    if rates is None:
        rates = operator_rates(op, gpu, op.tokens(step))
    if op.kind == "allreduce":
        link_seconds = allreduce_seconds(work, rates, count)
        return link_seconds, 0.0, 0.0, 0.0, link_seconds
    compute_seconds, memory_seconds, seconds = roofline(work, rates, count)
    moved = (count * work.weight_bytes + count * work.kv_read_bytes + count * work.kv_write_bytes
             + count * work.activation_bytes)
    compute_wins = compute_seconds >= memory_seconds
    if isinstance(compute_wins, np.ndarray):
        compute_bound = np.where(compute_wins, seconds, 0.0)
    else:
        compute_bound = seconds if compute_wins else 0.0
    return seconds, count * work.flops, moved, compute_bound, 0.0


MEMO_MAX = 100_000
"""Per-operator shares remembered by :func:`step_totals` (cleared when full)."""


def step_totals(
    operators: tuple[Operator, ...],
    step: Step,
    gpu: GPUSpec,
    rates: tuple[OperatorRates | None, ...],
    memo: dict | None = None,
) -> StepTotals:
    """The totals of :func:`step_cost` without building a cost record per operator (the engine's hot path).

    The same work and the same :func:`roofline` as :func:`step_cost`, so the results equal StepCost's
    properties up to the order of summation (tests check it on random steps to 1e-12): operators whose
    share varies over the steps of an array step (in a decode stretch only attention) are summed apart
    from the scalar ones, so each total needs a few array additions rather than one per operator.

    ``memo`` (a dict owned by the caller, e.g. the System) remembers the share of each operator whose
    work depends only on its token count (``works_from_tokens``) by that count: consecutive decode
    steps differ only in their context, which only attention reads.
    """
    seconds = flops = moved = compute_bound = communication = 0.0  # scalar parts
    varying = []  # shares that are arrays over the steps of an array step
    for index, (op, op_rates) in enumerate(zip(operators, rates)):
        share = None
        if memo is not None and op.works_from_tokens:
            tokens = op.tokens(step)
            if not isinstance(tokens, np.ndarray):
                key = (index, tokens)
                share = memo.get(key)
                if share is None:
                    if len(memo) >= MEMO_MAX:
                        memo.clear()
                    share = memo[key] = operator_totals(op, step, gpu, op_rates)
        if share is None:
            share = operator_totals(op, step, gpu, op_rates)
            if any(isinstance(part, np.ndarray) for part in share):
                varying.append(share)
                continue
        op_seconds, op_flops, op_bytes, op_compute_bound, op_communication = share
        seconds += op_seconds
        flops += op_flops
        moved += op_bytes
        compute_bound += op_compute_bound
        communication += op_communication
    for op_seconds, op_flops, op_bytes, op_compute_bound, op_communication in varying:
        seconds = seconds + op_seconds
        flops = flops + op_flops
        moved = moved + op_bytes
        compute_bound = compute_bound + op_compute_bound
        communication = communication + op_communication
    return StepTotals(seconds, flops, moved, compute_bound, seconds - compute_bound - communication, communication)
