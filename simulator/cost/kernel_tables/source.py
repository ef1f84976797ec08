"""Which measured tables time a run's operators: ``--kernels auto|measured|roofline``.

``auto``: the measured tables of the run's GPU and engine where the ``measured`` extra is installed and has
them, else the roofline, with the reason. ``measured``: the same, but an error where there are none.
``roofline`` (the default; docs/measured-vs-roofline.md says why): the roofline path for every operator.

A table is chosen by the GPU (measured as itself: see
:data:`simulator.cost.kernel_tables.aiconfigurator.SYSTEMS`), the engine family (TensorRT-LLM, vLLM,
SGLang: each times its own kernels) and the release nearest the engine profile's, which the run's
notes name. Attention (:class:`~simulator.model.operators.Attention`, flash kernel) is timed by the context
and generation tables (:mod:`.attention`); DeepSeek's latent attention
(:class:`~simulator.model.operators.LatentAttention`) by the MLA context, generation and batched-matmul tables
plus the GEMM table for its ``kv_b_proj`` (:mod:`.mla`); an MoE layer's routed-expert block by the MoE tables
(:mod:`.moe`, through :meth:`KernelSource.moe_curves`, which :func:`simulator.cost.step_cost.system_rates`
applies); a tensor-parallel all-reduce by the engine's own all-reduce table, attention data parallelism's
all-gather and reduce-scatter by NCCL's (:mod:`.collective`). The expert-parallel all-to-all keeps the
roofline: the database's DeepEP collections disagree several-fold (docs/kernel-accuracy.md). An operator whose
class or format no table measures (MLA geometries, formats or kernels not measured, DSA's sparse MLA, MoE shapes
or layouts not measured, weight-only formats the GPU's table lacks, engines without tables) is timed by the
roofline, and the report says which share of the step time was measured.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from simulator.cost.kernel_tables import aiconfigurator
from simulator.cost.kernel_tables.attention import AttentionCurve, AttentionShape, AttentionTables, measured_attention
from simulator.cost.kernel_tables.collective import MessageCurve
from simulator.cost.kernel_tables.csv_format import read_kernel_table
from simulator.cost.kernel_tables.gemm import GemmCurve, GemmShape, gemm_curve
from simulator.cost.kernel_tables.mla import (
    GEOMETRY,
    BmmShape,
    MlaContextShape,
    MlaCurve,
    MlaGenerationShape,
    MlaTables,
    measured_mla,
)
from simulator.cost.kernel_tables.moe import MoeShareCurve, MoeTable, measured_moe, moe_curves
from simulator.cost.kernel_tables.table import GemmTable, TableOrigin
from simulator.errors import InputError
from simulator.model.engine_profile import EngineProfile
from simulator.model.gpu import GPUSpec
from simulator.model.operators import AllReduce, Attention, Gemm, LatentAttention, Operator

KERNEL_MODES: tuple[str, ...] = ("auto", "measured", "roofline")


def engine_family(profile_name: str) -> str | None:
    """The engine whose kernels a profile runs: trtllm, vllm or sglang (None: no measured tables exist)."""
    for family in aiconfigurator.ENGINES:
        if profile_name == family or profile_name.startswith(family + "-"):
            return family
    return None


def profile_release(version_text: str) -> tuple[int, ...] | None:
    """The first release number a profile's ``version`` text names ('V1 engine (vLLM 0.8 to 0.10)' -> (0, 8))."""
    found = re.search(r"\d+(\.\d+)+", version_text)
    return aiconfigurator.release(found.group(0)) if found else None


def gemm_format(op: Gemm) -> str | None:
    """The measured-table format that times ``op``, or None (a format no table holds)."""
    if op.dequant_ops_per_weight:
        return "int4_wo" if op.weight_bytes_per_element <= 0.5 else "int8_wo"
    return {"fp16": "bf16", "bf16": "bf16", "fp8": "fp8", "fp4": "nvfp4"}.get(op.compute_dtype)


@dataclass(frozen=True)
class KernelSource:
    """The measured tables of one run (none under the roofline), and why."""

    mode: str
    origin: TableOrigin | None = None
    gemm: dict[str, GemmTable] = field(default_factory=dict)
    allreduce: dict[int, MessageCurve] = field(default_factory=dict)
    """measured all-reduce curves by GPU count (the engine's own all-reduce kernel, bf16 messages)"""
    allreduce_version: str = ""
    """the release whose all-reduce was measured, where it differs from the GEMMs' (``origin.version``)"""
    note: str = ""
    """why the roofline times everything, or which release was chosen and why"""
    attention: AttentionTables | None = None
    """measured context- and generation-attention tables (simulator.cost.kernel_tables.attention), or None"""
    moe: MoeTable | None = None
    """measured MoE expert-block latencies (simulator.cost.kernel_tables.moe), or None; they time a whole layer's
    routed experts, so they are looked up over the operator list (:meth:`moe_curves`), not one operator"""
    mla: MlaTables | None = None
    """measured MLA context, generation and batched-matmul tables (simulator.cost.kernel_tables.mla), or None"""
    gathers: dict[tuple[str, int], MessageCurve] = field(default_factory=dict)
    """measured NCCL all-gather and reduce-scatter curves (attention data parallelism's collectives), by
    (collective, GPU count)"""
    _curves: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def measured(self) -> bool:
        return self.origin is not None

    def curve(self, op: Operator, gpu: GPUSpec) -> GemmCurve | MessageCurve | AttentionCurve | MlaCurve | None:
        """The measured curve that times ``op`` on ``gpu``, or None (the roofline times it)."""
        if type(op) is Attention:
            return self.attention_curve(op, gpu)
        if type(op) is LatentAttention:
            return self.mla_curve(op, gpu)
        if type(op) is AllReduce:
            # Only the group sizes and the message dtype measured: a larger group, or one across nodes, is not.
            if op.activation_bytes_per_element != aiconfigurator.ALLREDUCE_BYTES_PER_ELEMENT:
                return None
            if op.collective != "allreduce":  # attention DP's all-gather and reduce-scatter, which NCCL runs
                return self.gathers.get((op.collective, op.tp))
            return self.allreduce.get(op.tp)
        if not self.gemm or type(op) is not Gemm:
            return None
        dtype = gemm_format(op)
        table = self.gemm.get(dtype) if dtype else None
        if table is None:
            return None
        key = (dtype, op.out_features, op.in_features, op.weight_bytes_per_element, op.activation_bytes_per_element)
        if key not in self._curves:
            shape = GemmShape(op.out_features, op.in_features, op.weight_bytes_per_element + op.scale_bytes_per_weight,
                              op.activation_bytes_per_element, gpu.peak(op.compute_dtype),
                              gpu.hbm_bandwidth_bytes_per_second)
            self._curves[key] = gemm_curve(table, shape)
        return self._curves[key]

    def attention_curve(self, op: Attention, gpu: GPUSpec) -> AttentionCurve | None:
        """The measured curve of a flash-attention operator (the naive and per-head kernels are no table's, nor are
        values narrower than keys or block-sparse attention: the tables measure dense attention of one head width)."""
        if self.attention is None or op.kernel != "flash" or op.topk or op.value_head_dim:
            return None
        key = ("attention", op.q_heads, op.kv_heads, op.head_dim, op.kv_bytes_per_element,
               op.activation_bytes_per_element, op.compute_dtype, op.window, op.data_parallel)
        if key not in self._curves:
            shape = AttentionShape(op.q_heads, op.kv_heads, op.head_dim, op.kv_bytes_per_element,
                                   op.activation_bytes_per_element, gpu.peak(op.compute_dtype),
                                   gpu.hbm_bandwidth_bytes_per_second, op.window or 0)
            self._curves[key] = self.attention.curve(shape, op.compute_dtype, op.data_parallel)
        return self._curves[key]

    def mla_curve(self, op: LatentAttention, gpu: GPUSpec) -> MlaCurve | None:
        """The measured curve of an MLA operator: DeepSeek's geometry, dense attention (DSA's sparse kernels are no
        table's), a bf16 or fp8 cache, bf16 or 1-byte absorbed weights whose ``kv_b_proj`` the GEMM tables hold.

        The operator does not carry its weight format, only its bytes: 1-byte weights are timed as FP8, the only
        1-byte format the engines' absorbed matmuls run (TensorRT-LLM's ``fp8_block_scaling_bmm_out`` raises for
        others), and the ``kv_b_proj`` by the per-tensor FP8 GEMM table, as the run's other FP8 GEMMs."""
        if self.mla is None or op.topk or (op.kv_lora_rank, op.rope_dim, op.nope_dim, op.v_dim) != GEOMETRY:
            return None
        kv = "bf16" if op.kv_bytes_per_element == 2 else "fp8" if op.kv_bytes_per_element == 1 else None
        weights = "bf16" if op.weight_bytes_per_element == 2 else "fp8" if op.weight_bytes_per_element == 1 else None
        peak = gpu.peak_flops.get(weights or "", 0.0) or (gpu.peak_flops.get("fp16", 0.0) if weights == "bf16" else 0.0)
        table = self.gemm.get(weights or "")
        if kv is None or table is None or not peak:
            return None  # a cache or weight format (FP4, int4) no table measures, or a GPU without its tensor cores
        key = ("mla", op.q_heads, kv, weights, op.weight_bytes_per_element, op.scale_bytes_per_weight,
               op.activation_bytes_per_element, op.data_parallel)
        if key not in self._curves:
            _, _, d_n, d_v = GEOMETRY
            bandwidth = gpu.hbm_bandwidth_bytes_per_second
            # The attention kernels compute in bf16 whatever the weights (the tables' mla_dtype).
            attention_peak = gpu.peak_flops.get("bf16") or gpu.peak("fp16")
            b_w, b_a = op.weight_bytes_per_element + op.scale_bytes_per_weight, op.activation_bytes_per_element
            kv_b = gemm_curve(table, GemmShape(op.q_heads * (d_n + d_v), op.kv_lora_rank, b_w, b_a, peak, bandwidth))
            self._curves[key] = self.mla.curve(
                op.q_heads, kv, str(weights),
                MlaContextShape(op.q_heads, op.kv_bytes_per_element, b_a, attention_peak, bandwidth),
                MlaGenerationShape(op.q_heads, op.kv_bytes_per_element, b_a, attention_peak, bandwidth),
                BmmShape(op.q_heads, d_n, op.kv_lora_rank, b_w, b_a, peak, bandwidth),
                BmmShape(op.q_heads, op.kv_lora_rank, d_v, b_w, b_a, peak, bandwidth),
                kv_b, op.data_parallel)
        return self._curves[key]

    def moe_curves(self, operators: tuple[Operator, ...], gpu: GPUSpec) -> dict[int, MoeShareCurve]:
        """The measured share of each MoE block operator of ``operators``, by index ({} where none is measured)."""
        return moe_curves(self.moe, operators, gpu)

    def describe(self) -> str:
        """``measured, H100 SXM / TensorRT-LLM 1.3.0rc20`` or ``roofline (why)``."""
        if self.origin is None:
            return f"roofline ({self.note})" if self.note else "roofline"
        return f"measured, {self.origin.label()}"


ROOFLINE = KernelSource("roofline", note="--kernels roofline")


def source_of(system: object) -> KernelSource | None:
    """The tables that time ``system``'s operators (its time model's), or None for a system without one (a
    :class:`~simulator.cost.pipeline.PipelineSystem`)."""
    return getattr(getattr(system, "time_model", None), "kernels", None)


def check_mode(mode: str) -> None:
    if mode not in KERNEL_MODES:
        raise InputError(f"--kernels: '{mode}' is not one of {', '.join(KERNEL_MODES)}")


def kernel_source(gpu: GPUSpec, engine: EngineProfile, mode: str, table_path: str | None = None) -> KernelSource:
    """The tables that time a run on ``gpu`` under ``engine`` (module docstring); InputError for ``measured``
    where there are none. ``table_path``: a memwall kernel-table file, which replaces the choice by ``mode``."""
    check_mode(mode)
    if table_path is not None:
        return file_source(gpu, table_path)
    if mode == "roofline":
        return ROOFLINE
    return _measured_source(gpu.name, engine.name, engine.version or "", mode)


@functools.lru_cache(maxsize=64)
def _measured_source(gpu_name: str, engine_name: str, engine_version: str, mode: str) -> KernelSource:
    def none(reason: str) -> KernelSource:
        if mode == "measured":
            raise InputError(f"--kernels measured: {reason}; use --kernels roofline or auto")
        return KernelSource(mode, note=reason)

    root = aiconfigurator.data_root()
    if root is None or not aiconfigurator.has_pyarrow():
        return none(f"no measured kernel tables installed ({aiconfigurator.EXTRA_HINT})")
    system = aiconfigurator.SYSTEMS.get(gpu_name)
    if system is None:
        return none(f"no measured tables for {gpu_name}")
    family = engine_family(engine_name)
    if family is None:
        return none(f"no measured tables for the {engine_name} engine's kernels (TensorRT-LLM, vLLM and SGLang have them)")
    folder, display = system
    versions = aiconfigurator.measured_versions(root, folder, "gemm", family, "gemm_perf.parquet")
    if not versions:
        return none(f"no measured GEMM tables for {display} under {family}")
    wanted = profile_release(engine_version)
    version = aiconfigurator.nearest_release(versions, wanted)
    path = root / folder / "gemm" / family / version / "gemm_perf.parquet"
    tables = aiconfigurator.read_gemm_tables(str(path), display, family, version)
    stated = ".".join(str(v) for v in wanted) if wanted else "unstated"
    notes = []  # what the run's tables depart from: the profile's release, or one class's own release
    if wanted is None or aiconfigurator.release(version)[: len(wanted)] != wanted:
        notes.append(f"the {engine_name} profile's release ({stated}) is timed by the nearest measured one, "
                     f"{family} {version}")
    allreduce: dict[int, MessageCurve] = {}
    allreduce_version = ""
    comm_versions = aiconfigurator.measured_versions(root, folder, "comm", family, "custom_allreduce_perf.parquet")
    if comm_versions:
        # The release nearest the GEMMs' own, so that one run's kernels come from one release where possible.
        comm = aiconfigurator.nearest_release(comm_versions, aiconfigurator.release(version))
        allreduce = aiconfigurator.read_allreduce_curves(str(root / folder / "comm" / family / comm /
                                                             "custom_allreduce_perf.parquet"))
        if comm != version:
            allreduce_version = comm
            notes.append(f"all-reduce measured under {family} {comm}")
    attention, attention_version = measured_attention(root, folder, display, family, version)
    if attention is not None and attention_version != version:
        notes.append(f"attention measured under {family} {attention_version}")
    moe, moe_version = measured_moe(root, folder, display, family, version)
    if moe is not None and moe_version != version:
        notes.append(f"MoE experts measured under {family} {moe_version}")
    mla, mla_version = measured_mla(root, folder, display, family, version)
    if mla is not None and mla_version != version:
        notes.append(f"MLA measured under {family} {mla_version}")
    gathers: dict[tuple[str, int], MessageCurve] = {}
    nccl_versions = aiconfigurator.measured_versions(root, folder, "comm", "nccl", "nccl_perf.parquet")
    if nccl_versions:
        # The engine profiles do not name their NCCL release: the newest measured one, said so.
        gathers = aiconfigurator.read_nccl_curves(str(root / folder / "comm" / "nccl" / nccl_versions[-1] /
                                                      "nccl_perf.parquet"))
        notes.append(f"all-gather and reduce-scatter measured with NCCL {nccl_versions[-1]}, the newest measured "
                     "(engine profiles name no NCCL release)")
    return KernelSource(mode, next(iter(tables.values())).origin if tables else None, tables, allreduce,
                        allreduce_version, "; ".join(notes), attention, moe=moe, mla=mla, gathers=gathers)


def file_source(gpu: GPUSpec, path: str) -> KernelSource:
    """The tables of a memwall kernel-table file; InputError where it was measured on another GPU."""
    tables = read_kernel_table(path)
    origin = next(iter(tables.values())).origin
    if origin.gpu != gpu.name:
        raise InputError(f"--kernel-table: {path} was measured on {origin.gpu}, the run's GPU is {gpu.name}; "
                         "give the table of this GPU or --gpu " + origin.gpu)
    return KernelSource("file", origin, tables)
