"""The GPU time model: roofline plus the time a roofline misses. Pure functions, no simpy.

For each operator and step (docs/time-model.md describes every term, its default and source):

    tensor_seconds  = (flops + padding_flops) / (peak_flops[dtype] * clock * eta_c)
    dequant_seconds = dequant_ops / (peak_flops["fp32"] * clock * efficiency.compute)
    compute_seconds = max(tensor_seconds, dequant_seconds)
    memory_seconds  = (bytes + b_half) / (hbm_bandwidth * efficiency.memory)      (b_half: 0 if bytes = 0)
    real_seconds    = max(flops / (peak_flops[dtype] * clock * ceiling), dequant_seconds)   (eta_c without the shape factor)
    busy_seconds    = max(compute_seconds, memory_seconds) + (1 - overlap) * min(real_seconds, memory_seconds)
    seconds         = busy_seconds + launches * efficiency.kernel_launch_seconds
    host_seconds    = launches * eager_launch     outside a CUDA graph (the host launches each kernel), else 0

where bytes = weight reads + KV-cache reads + KV-cache writes + activation reads/writes, clock =
efficiency.sustained_clock (the clock held under GEMM load over the boost clock of the data-sheet
peaks; 1 unless the GPU's YAML documents less), and with
the shape-aware kernel model (``TimeModel.shape``, :mod:`simulator.cost.kernels`):
eta_c = efficiency.compute * shape(M, N) for dense GEMMs (tile and wave quantisation),
efficiency.attention_compute for FlashAttention, efficiency.compute otherwise,
b_half = bandwidth * efficiency.memory_latency_seconds (a transfer pays one DRAM latency) and
overlap = efficiency.overlap (default 0: a kernel's loads and its real rows' MMAs run one after the
other; padded rows and idle wave slots cost time only through the max). With the flat model (the
default of a bare :class:`TimeModel`) eta_c = efficiency.compute, b_half = 0 and overlap = 1: the
plain roofline of earlier versions. A measured overlay (``efficiency_by_op``) replaces compute and
memory efficiency for its op class, shape included, and keeps overlap = 1 (a measurement already
holds it).

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

Communication operators (tensor-parallel all-reduce, expert-parallel all-to-all) cost what
:mod:`simulator.cost.collectives` says for their bytes, group, interconnect and algorithm
(``TimeModel.collectives``; ``off`` makes them free).

A step's time is the sum over its operators (they run one after another), plus the time the GPU
waits for the host's launches outside a CUDA graph, plus the engine's exposed host time per
iteration (:mod:`simulator.cost.engine_overhead`; zero for the ``ideal`` engine):

    launch_wait = max(0, sum(host_seconds) - sum(seconds))

Outside a graph the host queues kernels asynchronously and the GPU runs them in order: a
two-stage pipeline, which finishes after max(GPU time, host time) when either stage dominates (the
host runs ahead of long kernels and the GPU idles between short ones), not after the sum of each
kernel's max(kernel, launch). This module is the one place that turns work into seconds (:func:`roofline`,
:func:`communication_seconds`); everything else calls :func:`operator_cost` / :func:`step_cost`
(a record per operator) or :func:`step_totals` (only the step's totals, the engine's hot path).
Inputs may be numpy arrays (one entry per step): all arithmetic is elementwise, so many steps are
costed in one call.

Why this module is over 600 lines: every term of the formula above is computed here, once, for
one operator and for a whole step (the scalar and the vectorised paths must agree bit for bit), and
so is what :func:`step_totals` remembers to cost the engine's steps faster, whose summation order
must be that of the same sum worked out afresh; kernel shapes (:mod:`simulator.cost.kernels`),
collectives and engine overhead are modules of their own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from simulator.cost.collectives import (
    CollectiveNetwork,
    all_to_all_group_seconds,
    allreduce_seconds,
    check_algorithm,
    collective_network,
    gather_phase_seconds,
)
from simulator.cost.engine_overhead import (
    graph_captured,
    has_overhead,
    iteration_overhead_seconds,
)
from simulator.cost.kernel_tables.attention import AttentionCurve
from simulator.cost.kernel_tables.collective import MessageCurve
from simulator.cost.kernel_tables.gemm import GemmCurve
from simulator.cost.kernel_tables.mla import MlaCurve
from simulator.cost.kernel_tables.moe import MoeShareCurve
from simulator.cost.kernel_tables.source import ROOFLINE, KernelSource
from simulator.cost.kernels import GEMM_TILES, WEIGHT_ONLY_TILES, gemm_shape_efficiency, memory_half_bytes
from simulator.errors import InputError
from simulator.model.engine_profile import IDEAL, EngineProfile
from simulator.model.gpu import GPUSpec
from simulator.model.interconnect import load_interconnect
from simulator.model.operators import ExpertGemm, Gemm, Operator, Work
from simulator.model.step import Number, Step, ceil_div

COMMUNICATION_KINDS: tuple[str, ...] = ("allreduce", "alltoall")
"""Operator kinds that move bytes between GPUs rather than through HBM."""

KERNEL_MODELS: tuple[str, ...] = ("shape", "flat")
"""Values of the ``kernel_efficiency`` setting: efficiency by kernel shape and size, or one flat factor."""


class TimeModel(NamedTuple):
    """How a System turns work into time beyond the GPU's peaks: engine, collectives, kernel model.

    The defaults are the plain roofline of earlier versions (no engine overhead, NCCL ring
    all-reduce, flat efficiencies); ``simulator.plan.deployment_planner`` picks the realistic ones.
    """

    engine: EngineProfile = IDEAL
    collectives: str = "ring"
    """all-reduce algorithm (simulator.cost.collectives.COLLECTIVE_ALGORITHMS); ``off``: free"""
    shape: bool = False
    """True: GEMM efficiency by tile/wave quantisation, memory efficiency by bytes, FlashAttention ceiling"""
    host_ranks: int = 1
    """engine processes that each run the host loop on their own share of a step's sequences: the tp ranks
    under attention data parallelism (each rank schedules its own requests and holds its own KV cache), else 1"""
    kernels: KernelSource = ROOFLINE
    """measured kernel tables that time the operators they cover (simulator.cost.kernel_tables); the roofline
    times the rest"""


class OperatorCost(NamedTuple):
    """Cost of one operator in one step on one GPU, all its instances (``count`` layers) together.

    A NamedTuple (immutable, and several times cheaper to build than a frozen dataclass:
    the engine builds one per operator per simulated iteration).
    """

    name: str
    kind: str
    # Shadows tuple.count(), as namedtuple allows at run time; typeshed declares tuple.count a method, so mypy
    # reports the field as an incompatible override (renaming it would change every caller and the JSON).
    count: int  # type: ignore[assignment]
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
    launch_seconds: Number = 0.0
    """the part of ``seconds`` spent launching kernels on the GPU (a graph node's or a launch's fixed cost)"""
    host_seconds: Number = 0.0
    """host time to launch the kernels outside a CUDA graph (0 in a captured step); in no ``seconds``:
    the step waits for the host where its kernels together are shorter (:attr:`StepCost.launch_wait_seconds`)"""
    measured: bool = False
    """timed by a measured kernel table (simulator.cost.kernel_tables), not the roofline"""

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
        """'communication', 'compute', 'memory', 'launch', 'fused' or 'idle' (a scalar step only).

        'fused': an operator that runs inside a neighbouring kernel (no launch, no HBM traffic).
        'launch': kernels shorter than their launch (more than half the time is launch cost).
        """
        if self.kind in COMMUNICATION_KINDS:
            return "communication"
        if not self.compute_seconds and not self.memory_seconds:
            return "idle"
        if self.kind == "elementwise" and not self.launches:
            return "fused"
        if self.launch_seconds > 0.5 * self.seconds:
            return "launch"
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def _maximum(a: Number, b: Number) -> Number:
    # A comparison of scalars is ~20x faster than np.maximum; arrays need the elementwise form.
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _where(condition: Number, a: Number, b: Number) -> Number:
    if isinstance(condition, np.ndarray):
        return np.where(condition, a, b)
    return a if condition else b


def efficiency_factors(gpu: GPUSpec, op_kind: str, tokens: Number) -> tuple[Number, Number]:
    """(compute, memory) efficiency for an op kind at a token count: a measured overlay entry or the defaults."""
    compute: Number = gpu.efficiency.compute
    memory: Number = gpu.efficiency.memory
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
    """The achievable rates one operator runs at on one GPU: the denominators of the time model.

    They depend on the step only through a measured per-op efficiency overlay (and, for GEMMs under
    the shape model, through the row count, which :func:`roofline` applies), so a
    :class:`~simulator.cost.system.System` computes them once per operator (see :func:`operator_rates`).
    """

    flops_per_second: Number
    """tensor-core rate: peak_flops[compute dtype] * efficiency.sustained_clock * ceiling (efficiency.compute, or
    attention_compute)"""
    dequant_ops_per_second: Number | None
    """CUDA-core rate for weight-only dequantisation: peak_flops.fp32 * efficiency.sustained_clock *
    efficiency.compute (None: no dequantisation)"""
    bytes_per_second: Number
    """HBM rate: hbm_bandwidth * efficiency.memory (bytes/s)"""
    launch_seconds: float
    """efficiency.kernel_launch_seconds, per launch (GPU side, inside a CUDA graph)"""
    memory_half_bytes: float = 0.0
    """b_half of the memory efficiency curve (bytes; 0: flat)"""
    gemm_columns: int = 0
    """> 0: a dense GEMM of this many output columns; its tensor rate scales by gemm_shape_efficiency"""
    gemm_depth: int = 0
    """the GEMM's reduction depth K (input features), for split-K"""
    gemm_tiles: tuple[tuple[int, int], ...] = GEMM_TILES
    """the (rows, columns) output tiles the GEMM's kernels choose from (weight-only kernels tile rows by 16)"""
    sm_count: int = 0
    """SMs for the wave quantisation of a GEMM"""
    eager_launch_seconds: float = 0.0
    """host seconds per kernel launch outside a CUDA graph (the engine profile's)"""
    network: CollectiveNetwork | None = None
    """communication operators: the group, its links and the algorithm"""
    overlap: float = 1.0
    """fraction of the shorter of compute and memory time hidden under the longer (1: the roofline's max)"""
    measured: GemmCurve | MessageCurve | AttentionCurve | MlaCurve | MoeShareCurve | None = None
    """a measured kernel table's latency, by rows for a GEMM (the roofline then only says its bound), by message
    bytes for an all-reduce, by the step for attention and MLA"""


def rates_vary_with_tokens(op: Operator, gpu: GPUSpec) -> bool:
    """Does a measured overlay make ``op``'s efficiency depend on the step's token count?"""
    return op.kind not in COMMUNICATION_KINDS and any(entry.op_class == op.kind for entry in gpu.efficiency_by_op)


def _group_size(op: Operator) -> int:
    """GPUs in a communication operator's group (tp for an all-reduce, ep for an all-to-all)."""
    return int(getattr(op, "ep", 0) or getattr(op, "tp", 1)) if op.kind == "alltoall" else int(getattr(op, "tp", 1))


def operator_network(op: Operator, gpu: GPUSpec, model: TimeModel) -> CollectiveNetwork:
    """The collective network of a communication operator's group (tp GPUs for an all-reduce, ep for an all-to-all)."""
    gpus = _group_size(op)
    return collective_network(
        gpus=gpus,
        link_bytes_per_second=gpu.link_bandwidth_bytes_per_second,
        link_efficiency=gpu.efficiency.link,
        gpus_per_node=gpu.max_gpus_per_node,
        interconnect=load_interconnect(gpu.interconnect),
        engine=model.engine,
        algorithm=model.collectives,
        latency_override_seconds=gpu.efficiency.allreduce_latency_seconds,
        network=load_interconnect(gpu.network) if gpu.network else None,
        network_bytes_per_second=gpu.network_bandwidth_bytes_per_second,
        gpu_name=gpu.name,
    )


def operator_rates(op: Operator, gpu: GPUSpec, tokens: Number = 0.0, model: TimeModel | None = None,
                   network: CollectiveNetwork | None = None) -> OperatorRates:
    """Rates of ``op`` on ``gpu`` at a step of ``tokens`` tokens (the tokens matter only under an overlay);
    ``network``: a communication operator's :func:`operator_network`, where the caller has it."""
    model = model or TimeModel()
    eff = gpu.efficiency
    eager = model.engine.graphs.eager_launch_seconds
    if op.kind in COMMUNICATION_KINDS:
        return OperatorRates(0.0, None, 0.0, 0.0, eager_launch_seconds=eager,
                             network=network or operator_network(op, gpu, model),
                             measured=model.kernels.curve(op, gpu) if model.kernels.measured else None)
    measured = rates_vary_with_tokens(op, gpu)
    compute_eff, memory_eff = efficiency_factors(gpu, op.kind, tokens)
    if isinstance(op, ExpertGemm) and not measured:
        compute_eff, memory_eff = compute_eff * eff.expert, memory_eff * eff.expert
    shape = model.shape and not measured
    # FlashAttention's ceiling: per-head attention prefills with the same kernel (its decode is memory-bound).
    if shape and op.kind == "attention" and getattr(op, "kernel", "flash") != "naive":
        compute_eff = eff.attention_compute
    # The data-sheet peaks assume the boost clock; some GPUs hold a lower one under GEMM load.
    clock = eff.sustained_clock
    peak = (gpu.peak_flops.get(op.compute_dtype) or gpu.peak(op.compute_dtype)) * clock
    dequantises = op.kind == "gemm" and bool(getattr(op, "dequant_ops_per_weight", 0.0))
    bandwidth = gpu.hbm_bandwidth_bytes_per_second
    return OperatorRates(
        flops_per_second=peak * compute_eff,
        dequant_ops_per_second=vector_flops(gpu) * clock * compute_eff if dequantises else None,
        bytes_per_second=bandwidth * memory_eff,
        launch_seconds=eff.kernel_launch_seconds,
        memory_half_bytes=memory_half_bytes(bandwidth, eff.memory_latency_seconds) if shape else 0.0,
        gemm_columns=op.out_features if shape and isinstance(op, Gemm) else 0,
        gemm_depth=op.in_features if shape and isinstance(op, Gemm) else 0,
        gemm_tiles=WEIGHT_ONLY_TILES if dequantises else GEMM_TILES,
        sm_count=gpu.sm_count,
        eager_launch_seconds=eager,
        # Weight-only kernels pipeline their weight loads (Marlin: several stages of asynchronous copies in
        # flight per SM) so that dequantisation and MMAs hide under them: "close to ideal (4x) speedups up to
        # batchsizes of 16-32 tokens" over fp16 (IST-DASLab/marlin README) leaves no serial compute period.
        overlap=kernel_overlap(gpu, model) if not (measured or dequantises) else 1.0,
        measured=model.kernels.curve(op, gpu) if model.kernels.measured else None,
    )


def kernel_overlap(gpu: GPUSpec, model: TimeModel) -> float:
    """The fraction of a kernel's shorter time (real MMAs or loads) hidden under the longer: the GPU's
    ``efficiency.overlap`` under the shape model, 1 (the roofline's max) under the flat one."""
    return gpu.efficiency.overlap if model.shape else 1.0


def system_rates(operators: tuple[Operator, ...], gpu: GPUSpec,
                 model: TimeModel | None = None) -> tuple[OperatorRates | None, ...]:
    """Each operator's rates, or None where an overlay makes them depend on the step.

    A measured MoE table times a layer's whole routed-expert block, so its curves are looked up over the operator
    list (simulator.cost.kernel_tables.moe) and replace the block operators' own (which are None)."""
    model = model or TimeModel()
    check_algorithm(model.collectives)
    # Communication operators of one group size share their network (looking its links up costs file checks).
    networks: dict[int, CollectiveNetwork] = {}
    for op in operators:
        if op.kind in COMMUNICATION_KINDS and _group_size(op) not in networks:
            networks[_group_size(op)] = operator_network(op, gpu, model)
    rates = tuple(None if rates_vary_with_tokens(op, gpu) else operator_rates(
        op, gpu, model=model, network=networks.get(_group_size(op)) if op.kind in COMMUNICATION_KINDS else None)
        for op in operators)
    moe = model.kernels.moe_curves(operators, gpu) if model.kernels.measured else {}
    if moe and all(rates[i] is not None for i in moe):
        rates = tuple(r._replace(measured=moe[i]) if i in moe and r is not None else r for i, r in enumerate(rates))
    return rates


def host_launch_seconds(launches: Number, rates: OperatorRates, captured: Number) -> Number:
    """Host seconds to launch ``launches`` kernels: the engine's eager launch cost each outside a CUDA graph, 0 inside."""
    if not rates.eager_launch_seconds or captured is True:
        return 0.0 * launches
    host = launches * rates.eager_launch_seconds
    if isinstance(captured, np.ndarray):
        return np.where(captured, 0.0, host)
    return 0.0 * host if captured else host


def launch_wait(gpu_seconds: Number, host_seconds: Number) -> Number:
    """Seconds the GPU waits for the host's launches in a step: max(0, host - GPU) (module docstring)."""
    return _maximum(host_seconds - gpu_seconds, 0.0)


def roofline(work: Work, rates: OperatorRates, count: int, rows: Number = 0.0,
             captured: Number = True, step: Step | None = None) -> tuple[Number, Number, Number, Number, Number]:
    """(compute, memory, total, launch, host) seconds of ``count`` instances of a non-communication operator.

    ``rows``: the GEMM's row count (tokens) for the shape model; ``captured``: the step is replayed
    from a CUDA graph (see :func:`simulator.cost.engine_overhead.graph_captured`); ``step``: the step itself,
    which a measured attention curve reads (batch, context, prefill). The one roofline
    formula (module docstring): :func:`operator_cost` and :func:`operator_totals` both call it.
    """
    flops = work.flops
    padding = work.padding_flops
    if type(padding) is not float or padding:
        flops = flops + padding
    flops_rate = rates.flops_per_second
    if rates.gemm_columns:
        flops_rate = flops_rate * gemm_shape_efficiency(rows, rates.gemm_columns, rates.sm_count, rates.gemm_depth,
                                                        rates.gemm_tiles)
    compute_seconds = flops / flops_rate
    if rates.dequant_ops_per_second is not None:
        compute_seconds = _maximum(compute_seconds, work.dequant_ops / rates.dequant_ops_per_second)
    moved = work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
    if rates.memory_half_bytes:
        moved_or_ramp = moved + rates.memory_half_bytes * (moved > 0)
        memory_seconds = moved_or_ramp / rates.bytes_per_second
    else:
        memory_seconds = moved / rates.bytes_per_second
    busy = _maximum(compute_seconds, memory_seconds)
    if rates.overlap < 1.0:
        # Only the real rows' MMAs run in series with the loads: padded tile rows and idle wave
        # slots are lanes left empty, a cost only when compute is the bottleneck (the max above).
        real = work.flops / rates.flops_per_second
        if rates.dequant_ops_per_second is not None:
            real = _maximum(real, work.dequant_ops / rates.dequant_ops_per_second)
        shorter = real + memory_seconds - _maximum(real, memory_seconds)
        busy = busy + (1.0 - rates.overlap) * shorter
    if rates.measured is not None:
        # The table's latency is the kernel's device time in a CUDA graph, its GPU-side launch included: it
        # replaces the busy time and the launch term; the roofline's split only says what bounds it.
        if isinstance(rates.measured, (AttentionCurve, MlaCurve)):
            assert step is not None  # operator_cost and operator_totals pass the step
            measured = rates.measured.step_seconds(step)
        else:
            measured = rates.measured.seconds(rows)
        scale = measured / _maximum(busy, 1e-300)
        compute_seconds, memory_seconds, busy = compute_seconds * scale, memory_seconds * scale, measured
        seconds = busy
    else:
        seconds = busy + work.launches * rates.launch_seconds
    host = host_launch_seconds(work.launches, rates, captured)
    return count * compute_seconds, count * memory_seconds, count * seconds, count * (seconds - busy), count * host


def communication_seconds(op: Operator, work: Work, rates: OperatorRates, count: int) -> Number:
    """Seconds of ``count`` instances of a communication operator (simulator.cost.collectives)."""
    net = rates.network
    assert net is not None  # operator_rates gives every communication operator its network
    if rates.measured is not None and not isinstance(rates.measured, (AttentionCurve, MlaCurve)) and net.algorithm != "off":
        # The engine's own all-reduce kernel, measured inside a CUDA graph (simulator.cost.kernel_tables.collective).
        seconds = rates.measured.seconds(work.link_bytes)
    elif getattr(op, "collective", "allreduce") != "allreduce":
        seconds = gather_phase_seconds(work.link_bytes, net)  # attention DP's gather and reduce-scatter
    elif op.kind == "alltoall":
        # link_bytes: what the busiest GPU sends to the others in one dispatch or combine; NCCL runs
        # all-to-all as grouped sends, one step over the Simple protocol (and the NICs across nodes).
        seconds = all_to_all_group_seconds(work.link_bytes, net)
    else:
        seconds = allreduce_seconds(work.link_bytes, net)
    return count * seconds


def operator_cost(op: Operator, step: Step, gpu: GPUSpec, rates: OperatorRates | None = None,
                  captured: Number = True, model: TimeModel | None = None) -> OperatorCost:
    """Cost of ``op`` for ``step`` on one GPU of type ``gpu`` (see module docstring).

    ``rates``: the operator's precomputed :func:`operator_rates` (None: worked out here, with ``model``).
    """
    work = op.work(step)
    count = op.count
    if rates is None:
        rates = operator_rates(op, gpu, op.tokens(step), model)
    if op.kind in COMMUNICATION_KINDS:
        link_seconds = communication_seconds(op, work, rates, count)
        zero = 0.0 * work.link_bytes
        return OperatorCost(
            name=op.name, kind=op.kind, count=count, flops=zero, weight_bytes=zero, kv_read_bytes=zero,
            kv_write_bytes=zero, activation_bytes=zero, link_bytes=count * work.link_bytes,
            launches=count * work.launches, compute_seconds=zero, memory_seconds=zero,
            link_seconds=link_seconds, seconds=link_seconds,
            host_seconds=count * host_launch_seconds(work.launches, rates, captured), measured=rates.measured is not None,
        )
    compute_seconds, memory_seconds, seconds, launch_seconds, host_seconds = roofline(
        work, rates, count, op.tokens(step), captured, step)
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
        launch_seconds=launch_seconds,
        host_seconds=host_seconds,
        measured=rates.measured is not None,
    )


@dataclass(frozen=True)
class StepCost:
    """Cost of one step on one GPU (every GPU of a tensor-parallel group does the same work).

    ``overhead_seconds``: the engine's host time per iteration that the GPU waits for
    (:mod:`simulator.cost.engine_overhead`); ``launch_wait_seconds``: the time the GPU waits for the
    host to launch the forward pass's kernels outside a CUDA graph (:func:`launch_wait`). Both are
    part of :attr:`seconds` and in no operator.
    """

    operators: tuple[OperatorCost, ...]
    overhead_seconds: Number = 0.0
    launch_wait_seconds: Number = 0.0

    @property
    def gpu_seconds(self) -> Number:
        """Time of the operators alone (the forward pass on the GPU)."""
        return sum(op.seconds for op in self.operators)

    @property
    def host_seconds(self) -> Number:
        """Host time to launch the operators' kernels outside a CUDA graph (0 in a captured step)."""
        return sum(op.host_seconds for op in self.operators)

    @property
    def seconds(self) -> Number:
        return self.gpu_seconds + self.launch_wait_seconds + self.overhead_seconds

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
            if op.kind not in COMMUNICATION_KINDS
        )

    @property
    def memory_bound_seconds(self) -> Number:
        return (self.seconds - self.compute_bound_seconds - self.communication_seconds - self.overhead_seconds
                - self.launch_wait_seconds)

    @property
    def launches(self) -> Number:
        return sum(op.launches for op in self.operators)

    @property
    def measured_seconds(self) -> Number:
        """Time of the operators a measured kernel table timed (the rest: the roofline)."""
        return sum(op.seconds for op in self.operators if op.measured)

    @property
    def launch_seconds(self) -> Number:
        """Time spent launching kernels (included in the operators' time)."""
        return sum(op.launch_seconds for op in self.operators)


def _host_share(model: TimeModel | None, step: Step) -> Step:
    """The part of ``step`` the busiest host loop handles (:func:`rank_share`), which graph capture and host time read."""
    return step if model is None else rank_share(step, model.host_ranks)


def _captured(model: TimeModel | None, share: Step) -> Number:
    return True if model is None else graph_captured(model.engine, share)


def _overhead(model: TimeModel | None, step: Step, share: Step, gpu_seconds: Number) -> Number:
    if model is None or not has_overhead(model.engine):
        return 0.0
    return iteration_overhead_seconds(model.engine, share.sequences, share.tokens, gpu_seconds, step.prefill_tokens <= 0)


def rank_share(step: Step, ranks: int) -> Step:
    """The busiest of ``ranks`` host loops' part of ``step``: its sequences and tokens split evenly, rounded up.

    Under attention data parallelism each rank's engine process schedules, prepares inputs for and
    captures CUDA graphs of its own sequences only, while the whole step's tokens pass through every
    GPU's MoE layers; the ranks run in lockstep, so the one with the most work sets the pace.
    """
    if ranks <= 1:
        return step
    return Step(tokens=ceil_div(step.tokens, ranks), prefill_tokens=ceil_div(step.prefill_tokens, ranks),
                sequences=ceil_div(step.sequences, ranks), logit_tokens=step.logit_tokens,
                attention_pairs=step.attention_pairs, prefill_attention_pairs=step.prefill_attention_pairs,
                score_elements=step.score_elements, context_tokens=step.context_tokens)


def step_cost(
    operators: tuple[Operator, ...],
    step: Step,
    gpu: GPUSpec,
    rates: tuple[OperatorRates | None, ...] | None = None,
    model: TimeModel | None = None,
) -> StepCost:
    """Cost of every operator of a forward pass for ``step``, plus the engine's exposed host time.

    ``rates``: from :func:`system_rates` (optional); ``model``: the System's :class:`TimeModel`
    (None: a bare one, the plain roofline).
    """
    share = _host_share(model, step)
    captured = _captured(model, share)
    if rates is None:
        costs = tuple(operator_cost(op, step, gpu, None, captured, model) for op in operators)
    else:
        costs = tuple(operator_cost(op, step, gpu, r, captured, model) for op, r in zip(operators, rates))
    gpu_seconds = sum(c.seconds for c in costs)
    wait = launch_wait(gpu_seconds, sum(c.host_seconds for c in costs))
    overhead = _overhead(model, step, share, gpu_seconds + wait)
    return StepCost(costs, overhead, wait)


class StepTotals(NamedTuple):
    """A step's totals on one GPU, equal to the same-named :class:`StepCost` properties.

    ``seconds`` includes the engine's exposed host time and the wait for the host's launches, which are
    in none of the bound columns: :attr:`overhead_seconds` is what remains after the wait.
    """

    seconds: Number
    flops: Number
    bytes: Number
    compute_bound_seconds: Number
    memory_bound_seconds: Number
    communication_seconds: Number
    launch_wait_seconds: Number = 0.0

    @property
    def overhead_seconds(self) -> Number:
        """The engine's exposed host time: seconds less the time by bound, communication and launch wait."""
        return (self.seconds - self.compute_bound_seconds - self.memory_bound_seconds - self.communication_seconds
                - self.launch_wait_seconds)


def operator_totals(op: Operator, step: Step, gpu: GPUSpec, rates: OperatorRates | None,
                    captured: Number = True, model: TimeModel | None = None) -> tuple:
    """One operator's share of :class:`StepTotals`: (seconds, FLOPs, bytes, compute-bound s, communication s,
    host launch s)."""
    work = op.work(step)
    count = op.count
    if rates is None:
        rates = operator_rates(op, gpu, op.tokens(step), model)
    if op.kind in COMMUNICATION_KINDS:
        link_seconds = communication_seconds(op, work, rates, count)
        return link_seconds, 0.0, 0.0, 0.0, link_seconds, count * host_launch_seconds(work.launches, rates, captured)
    compute_seconds, memory_seconds, seconds, _, host = roofline(work, rates, count, op.tokens(step), captured, step)
    moved = (count * work.weight_bytes + count * work.kv_read_bytes + count * work.kv_write_bytes
             + count * work.activation_bytes)
    compute_wins = compute_seconds >= memory_seconds
    compute_bound: Number
    if isinstance(compute_wins, np.ndarray):
        compute_bound = np.where(compute_wins, seconds, 0.0)
    else:
        compute_bound = seconds if compute_wins else 0.0
    return seconds, count * work.flops, moved, compute_bound, 0.0, host


MEMO_MAX = 100_000
"""Per-operator shares remembered by :func:`step_totals` (cleared when full), and whole steps in
:data:`SHARED_STEPS`."""

SHARED_STEPS = "shared steps"
"""The key, in a step-cost memo shared by Systems that differ only in their host CPU work, of the dict of whole
steps' operator sums (see :func:`step_totals`; absent from a memo of one System, whose engine remembers its
steps itself)."""



class _Facts(NamedTuple):
    """Facts about an operator tuple that step_totals needs on every call (see :func:`_operator_facts`)."""

    operators: tuple
    rates: tuple
    """the tuples themselves, so their ids stay their own"""
    key_ok: bool
    """(tokens, logit tokens, graph capture) is a valid key for the summed share of the token-only operators: each
    takes its token count from ``step.tokens`` or ``step.logit_tokens`` (checked on a probe step whose fields all
    differ)"""
    context: list
    """the (operator, rates) pairs that are not token-only, in order"""
    token_only: list
    """the (index, operator, rates) of the token-only ones, in order"""
    leading: int
    """how many of ``token_only``, from the first, take their count from ``step.tokens`` (all but the LM head's):
    their sum is a function of (tokens, graph capture), the rest of it is added to it in order"""


_OPERATOR_FACTS: OrderedDict[tuple[int, int], _Facts] = OrderedDict()
OPERATOR_FACTS_KEPT = 16
"""Operator tuples whose facts (see :func:`_operator_facts`) are kept, the most recently used."""


def _operator_facts(operators: tuple[Operator, ...], rates: tuple[OperatorRates | None, ...]) -> _Facts:
    """Facts about an operator tuple that step_totals needs on every call, worked out once per tuple."""
    key = (id(operators), id(rates))
    facts = _OPERATOR_FACTS.get(key)
    if facts is None or facts.operators is not operators or facts.rates is not rates:
        probe = Step(*(float(k + 1) for k in range(8)))
        token_only = [(index, op, op_rates) for index, (op, op_rates) in enumerate(zip(operators, rates))
                      if op.works_from_tokens]
        counts = [op.tokens(probe) for _, op, _ in token_only]
        key_ok = all(count in (probe.tokens, probe.logit_tokens) for count in counts)
        leading = next((k for k, count in enumerate(counts) if count != probe.tokens), len(counts))
        context = [(op, op_rates) for op, op_rates in zip(operators, rates) if not op.works_from_tokens]
        facts = _OPERATOR_FACTS[key] = _Facts(operators, rates, key_ok, context, token_only, leading)
        while len(_OPERATOR_FACTS) > OPERATOR_FACTS_KEPT:
            _OPERATOR_FACTS.popitem(last=False)
    return facts


def _sum_shares(shares, start: tuple | None = None) -> tuple:
    """Shares summed component by component, in order, starting from 0.0 (one summation order for every path), or
    added in order to ``start``, the same sum of the shares before them."""
    seconds = flops = moved = compute_bound = communication = host = 0.0
    if start is not None:
        seconds, flops, moved, compute_bound, communication, host = start
    for op_seconds, op_flops, op_bytes, op_compute_bound, op_communication, op_host in shares:
        seconds = seconds + op_seconds
        flops = flops + op_flops
        moved = moved + op_bytes
        compute_bound = compute_bound + op_compute_bound
        communication = communication + op_communication
        host = host + op_host
    return seconds, flops, moved, compute_bound, communication, host


def _forget(memo: dict) -> None:
    """Empty a full memo of operator shares; a memo shared by Systems (:data:`SHARED_STEPS`) stays shared."""
    steps = memo.get(SHARED_STEPS)
    memo.clear()
    if steps is not None:
        memo[SHARED_STEPS] = steps


def _memo_share(index: int, op: Operator, step: Step, gpu: GPUSpec, op_rates: OperatorRates | None, captured: Number,
                model: TimeModel | None, memo: dict) -> tuple:
    """A token-only operator's share at a scalar step, remembered by (operator, token count, graph capture)."""
    key = (index, op.tokens(step), captured)
    share = memo.get(key)
    if share is None:
        if len(memo) >= MEMO_MAX:
            _forget(memo)
        share = memo[key] = operator_totals(op, step, gpu, op_rates, captured, model)
    return share


def _fixed_scalar(operators, step: Step, gpu: GPUSpec, rates, captured: Number, model: TimeModel | None,
                  memo: dict, group: bool) -> tuple:
    """Summed share of the token-only operators at a step whose token counts and capture are scalars.

    With ``group`` (the key is valid) the sum is remembered by (tokens, logit tokens, capture), and the sum of its
    leading operators, which read only the tokens, by (tokens, capture): a step with other logit tokens adds the LM
    head's share to it."""
    key = ("fixed", step.tokens, step.logit_tokens, captured) if group else None
    fixed = memo.get(key) if group else None
    if fixed is None:
        facts = _operator_facts(operators, rates)
        token_only, leading = facts.token_only, facts.leading if group else 0
        head = None
        if leading:
            head_key = ("tokens", step.tokens, captured)
            head = memo.get(head_key)
            if head is None:
                head = _sum_shares(_memo_share(index, op, step, gpu, op_rates, captured, model, memo)
                                   for index, op, op_rates in token_only[:leading])
                if len(memo) >= MEMO_MAX:
                    _forget(memo)
                memo[head_key] = head
        fixed = _sum_shares((_memo_share(index, op, step, gpu, op_rates, captured, model, memo)
                             for index, op, op_rates in token_only[leading:]), head)
        if group:
            if len(memo) >= MEMO_MAX:
                _forget(memo)
            memo[key] = fixed
    return fixed


def _fixed_runs(operators, step: Step, gpu: GPUSpec, rates, captured: Number, model: TimeModel | None,
                memo: dict) -> tuple:
    """:func:`_fixed_scalar` for an array step whose token counts (or capture) vary: once per run of equal
    (tokens, logit tokens, capture) entries, repeated over the run (the engine's decode stretches
    hold a few runs: the batch only shrinks as decoders finish)."""
    columns = [np.asarray(column) for column in (step.tokens, step.logit_tokens, captured)]
    size = max(column.size for column in columns if column.ndim)
    columns = [np.broadcast_to(column, (size,)) for column in columns]
    change = np.zeros(size, dtype=bool)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    starts = np.flatnonzero(change)
    if len(starts) > max(16, size // 8):
        # Runs too short to look up one by one: the operators on the arrays themselves (the same IEEE
        # operations entry by entry, summed in the same order, so the same values bit for bit).
        return _sum_shares(operator_totals(op, step, gpu, op_rates, captured, model)
                           for op, op_rates in zip(operators, rates) if op.works_from_tokens)
    tokens, logits, capture = (column[starts].tolist() for column in columns)
    values = []
    for t, logit, cap in zip(tokens, logits, capture):
        scalar = Step(tokens=t, prefill_tokens=0.0, sequences=0.0, logit_tokens=logit, attention_pairs=0.0,
                      prefill_attention_pairs=0.0, score_elements=0.0, context_tokens=0.0)
        # Token-only operators read only tokens and logit tokens (checked by _operator_facts), so a step
        # with just those fields set has their shares.
        values.append(_fixed_scalar(operators, scalar, gpu, rates, cap, model, memo, True))
    if len(values) == 1:
        return values[0]
    lengths = np.diff(np.append(starts, size))
    table = np.array(values, dtype=float)
    return tuple(np.repeat(table[:, k], lengths) for k in range(table.shape[1]))


def _array_key(fields: tuple) -> tuple | None:
    """``fields`` (a step's and its capture) with each array by its dtype, shape and bytes (a decode stretch's); None
    where one is not a plain array (a traced symbol: :mod:`simulator.cost.tracing`), whose costs are not kept."""
    if any(isinstance(value, np.ndarray) and type(value) is not np.ndarray for value in fields):
        return None
    return tuple((value.dtype.str, value.shape, value.tobytes()) if isinstance(value, np.ndarray) else value
                 for value in fields)


def _operator_sums(operators: tuple[Operator, ...], step: Step, gpu: GPUSpec, rates: tuple[OperatorRates | None, ...],
                   memo: dict | None, model: TimeModel | None, captured: Number) -> tuple:
    """The operators' shares of ``step`` summed (:func:`_sum_shares`' six totals): the token-only ones', then the
    others', each part in operator order (see :func:`step_totals`)."""
    facts = _operator_facts(operators, rates)
    key_ok, context_operators = facts.key_ok, facts.context
    memo_ok = memo is not None and key_ok
    varying = (isinstance(step.tokens, np.ndarray) or isinstance(step.logit_tokens, np.ndarray)
               or isinstance(captured, np.ndarray))
    if memo is None or (varying and not memo_ok):
        fixed = _sum_shares(operator_totals(op, step, gpu, op_rates, captured, model)
                            for op, op_rates in zip(operators, rates) if op.works_from_tokens)
    elif varying:
        fixed = _fixed_runs(operators, step, gpu, rates, captured, model, memo)
    else:
        fixed = _fixed_scalar(operators, step, gpu, rates, captured, model, memo, memo_ok)
    rest = _sum_shares([operator_totals(op, step, gpu, op_rates, captured, model)
                        for op, op_rates in context_operators])
    return (fixed[0] + rest[0], fixed[1] + rest[1], fixed[2] + rest[2], fixed[3] + rest[3], fixed[4] + rest[4],
            fixed[5] + rest[5])


def step_totals(
    operators: tuple[Operator, ...],
    step: Step,
    gpu: GPUSpec,
    rates: tuple[OperatorRates | None, ...],
    memo: dict | None = None,
    model: TimeModel | None = None,
) -> StepTotals:
    """The totals of :func:`step_cost` without building a cost record per operator (the engine's hot path).

    The same work and the same :func:`roofline` as :func:`step_cost`, so the results equal StepCost's
    properties up to the order of summation (tests check it on random steps to 1e-12). One order for
    every path: the shares of the token-only operators (``works_from_tokens``: every operator but
    attention) in operator order, then the others in operator order. So an array step equals its
    entries costed one at a time as scalar steps, bit for bit (elementwise IEEE arithmetic in the
    same order), which the engine's decode stretches rely on.

    ``memo`` (a dict owned by the caller, e.g. the System) remembers each token-only operator's share by
    its token count and whether the step is replayed from a CUDA graph, and their sum by (tokens, logit
    tokens, capture): consecutive decode steps differ only in their context, which only attention reads,
    so a decode tick costs one attention evaluation. An array step whose token counts vary (a stretch in
    which decoders finish) looks the sum up once per run of equal entries.

    A memo shared by Systems that differ only in their engine's host CPU work (:meth:`System.with_engine`: the
    same operators, rates and graph capture) holds :data:`SHARED_STEPS`, where the operators' summed shares of
    each step (a decode stretch's arrays too, read-only) are remembered by the step and its capture: only the
    exposed host time, which reads that CPU work, is worked out again, so the runs of those Systems cost each
    step they share once.
    """
    share = _host_share(model, step)
    captured = _captured(model, share)
    steps: dict | None = None if memo is None else memo.get(SHARED_STEPS)
    key: tuple | None = None
    sums = None
    if steps is not None:
        key = (step.tokens, step.prefill_tokens, step.sequences, step.logit_tokens, step.attention_pairs,
               step.prefill_attention_pairs, step.score_elements, step.context_tokens, captured)
        try:
            sums = steps.get(key)
        except TypeError:  # array fields, which do not hash: a decode stretch's, or a traced symbol
            key = _array_key(key)
            sums = None if key is None else steps.get(key)
    if sums is None:
        sums = _operator_sums(operators, step, gpu, rates, memo, model, captured)
        if steps is not None and key is not None:
            for value in sums:
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False  # shared by the Systems' runs: none may change it
            if len(steps) >= MEMO_MAX:
                steps.clear()
            steps[key] = sums
    seconds, flops, moved, compute_bound, communication, host = sums
    wait = launch_wait(seconds, host)
    overhead = _overhead(model, step, share, seconds + wait)
    return StepTotals(seconds + wait + overhead, flops, moved, compute_bound, seconds - compute_bound - communication,
                      communication, wait)
