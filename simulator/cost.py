"""The roofline cost model: pure functions, no simpy.

For each operator and step:

    tensor_seconds  = flops / (peak_flops[dtype] * efficiency.compute)
    dequant_seconds = dequant_ops / (peak_flops["fp32"] * efficiency.compute)
    compute_seconds = max(tensor_seconds, dequant_seconds)
    memory_seconds  = bytes / (hbm_bandwidth * efficiency.memory)
    seconds         = max(compute_seconds, memory_seconds) + launches * efficiency.kernel_launch_seconds

where bytes = weight reads + KV-cache reads + KV-cache writes + activation reads/writes.

Dequantisation of int8/int4 weights (``dequant_ops``, see :mod:`simulator.layers`) runs on
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
is the one place that turns work into seconds; everything else calls :func:`operator_cost`
or :func:`step_cost`. Inputs may be numpy arrays (one entry per step): all arithmetic is
elementwise, so many steps are costed in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from simulator.config.gpu import GPUSpec
from simulator.errors import InputError
from simulator.layers import Operator
from simulator.step import Number, Step


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
    # Python's max on scalars is ~20x faster than np.maximum; arrays need the elementwise form.
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


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


def operator_cost(op: Operator, step: Step, gpu: GPUSpec) -> OperatorCost:
    """Roofline cost of ``op`` for ``step`` on one GPU of type ``gpu`` (see module docstring)."""
    work = op.work(step)
    eff = gpu.efficiency
    count = op.count
    if op.kind == "allreduce":
        ring = 2.0 * (op.tp - 1) / op.tp
        link_seconds = ring * work.link_bytes / (gpu.link_bandwidth_bytes_per_second * eff.link)
        link_seconds = link_seconds + eff.allreduce_latency_seconds * work.launches
        zero = 0.0 * work.link_bytes
        return OperatorCost(
            name=op.name, kind=op.kind, count=count, flops=zero, weight_bytes=zero, kv_read_bytes=zero,
            kv_write_bytes=zero, activation_bytes=zero, link_bytes=count * work.link_bytes,
            launches=count * work.launches, compute_seconds=zero, memory_seconds=zero,
            link_seconds=count * link_seconds, seconds=count * link_seconds,
        )
    compute_eff, memory_eff = efficiency_factors(gpu, op.kind, op.tokens(step))
    moved = work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
    peak = gpu.peak_flops.get(op.compute_dtype) or gpu.peak(op.compute_dtype)
    compute_seconds = work.flops / (peak * compute_eff)
    if op.kind == "gemm" and op.dequant_ops_per_weight:
        dequant_seconds = work.dequant_ops / (vector_flops(gpu) * compute_eff)
        compute_seconds = _maximum(compute_seconds, dequant_seconds)
    memory_seconds = moved / (gpu.hbm_bandwidth_bytes_per_second * memory_eff)
    seconds = _maximum(compute_seconds, memory_seconds) + work.launches * eff.kernel_launch_seconds
    return OperatorCost(
        name=op.name,
        kind=op.kind,
        count=count,
        flops=count * work.flops,
        weight_bytes=count * work.weight_bytes,
        kv_read_bytes=count * work.kv_read_bytes,
        kv_write_bytes=count * work.kv_write_bytes,
        activation_bytes=count * work.activation_bytes,
        link_bytes=0.0 * moved,
        launches=count * work.launches,
        compute_seconds=count * compute_seconds,
        memory_seconds=count * memory_seconds,
        link_seconds=0.0 * moved,
        seconds=count * seconds,
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


def step_cost(operators: tuple[Operator, ...], step: Step, gpu: GPUSpec) -> StepCost:
    """Cost of every operator of a forward pass for ``step``."""
    return StepCost(tuple(operator_cost(op, step, gpu) for op in operators))
