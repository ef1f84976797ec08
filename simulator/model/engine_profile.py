"""Serving-engine profiles: what a real engine adds to the GPU's time, as data.

A profile (``configs/engines/*.yaml``; user files in ``$MEMWALL_CONFIG_DIR/engines/`` or a path)
describes one engine at one version (``vllm.yaml`` is vLLM's V1 engine, ``vllm-v0.yaml`` the V0
engine before 0.6, ``vllm-v0.6.yaml`` the V0 engine of 0.6 and 0.7):

- ``cpu``: host time per iteration spent outside the GPU's forward pass (scheduling, input
  preparation, sampling bookkeeping, output processing), as ``fixed_seconds`` +
  ``per_sequence_seconds`` x sequences in the batch + ``per_token_seconds`` x new tokens, and
  ``overlap``, the fraction of it that runs while the GPU computes (SGLang's overlap scheduler,
  TensorRT-LLM's overlap scheduler, vLLM's async scheduling: 1; a synchronous loop: 0).
- ``async_cpu`` (optional): a second part of the same form that an otherwise synchronous loop runs
  while the GPU computes the next iteration (vLLM 0.6's asynchronous output processing).
- ``worker_rpc`` (optional): host work the driver does once for each tensor-parallel worker process
  every iteration, one worker after another (vLLM before 0.2.7 passed each iteration's inputs to
  every worker by a Ray remote call); a group of N > 1 GPUs adds N times it to ``cpu``
  (:meth:`EngineProfile.for_workers`).
- ``graphs``: CUDA-graph capture: steps of up to ``max_batch`` tokens are replayed from a graph
  (decode-only steps, or any step when ``mixed`` as vLLM V1's piecewise graphs); other steps
  launch each kernel from the host at ``eager_launch_seconds`` per kernel. ``enforce_eager``
  turns capture off (vLLM's ``--enforce-eager``).
- ``allreduce``: ``custom`` (the engine's one-shot/two-shot kernels for messages up to
  ``custom_allreduce_max_bytes`` where the interconnect allows them, NCCL beyond) or ``nccl``.
- ``scheduler_steps``: decode iterations per pass of the engine loop (vLLM 0.6-0.7's multi-step
  scheduling, ``--num-scheduler-steps``; 1 otherwise): decode-only iterations pay 1/N of the host work.
- ``fusion``: how the engine runs norms, rotary embeddings, activations and residual adds
  (``kernels``: kernels of their own, as vLLM, SGLang and TGI; ``elementwise``: folded into the
  GEMMs; simulator.model.layers); a run's ``fusion`` setting overrides it.
- ``attention_kernel``: the attention kernel the engine runs by default (``flash``; llama.cpp's
  builds of 2024 ``naive``: without ``-fa`` they write the score matrix to HBM), with
  ``naive_score_bytes``, the bytes of one materialised score (None: the activation dtype's); a
  run's ``attention_kernel`` setting overrides the kernel.
- ``dequantize_above_tokens``: weight-only quantised GEMMs of more than this many rows first expand
  the weights to the activation dtype in HBM and run a dense GEMM on the copy (llama.cpp's cuBLAS
  path); 0: never (the dequantisation happens inside the GEMM, as Marlin and Machete do).
- ``honours_sliding_window``: False when the engine attends (and caches) the whole context even
  where the model has a sliding window (TensorRT engines without ``max_attention_window_size``).
- ``gemm_accumulate``: ``fp16`` when the engine's FP16 GEMMs accumulate in FP16 (llama.cpp), which
  GeForce parts run at twice their FP32-accumulate tensor rate (``GPUSpec.fp16_accumulate_flops``).
- ``scheduler``: the engine's defaults (kind, max sequences, token budget, KV block size, the most
  tokens one forward pass carries), with other values on GPUs of more memory (``large_gpu``, vLLM) or by
  tiers of GPU memory (``by_gpu_memory``, SGLang; also the CUDA-graph bound), applied by :meth:`EngineProfile.for_gpu`.
- ``client``: the client path a benchmark client's TTFT holds beyond the engine (HTTP and hand-off to
  the engine core, tokenisation per prompt token, first streamed chunk; :mod:`simulator.cost.client_path`).

Every number carries its source in the YAML. :mod:`simulator.cost.engine_overhead` turns a
profile into seconds; units are SI (seconds, bytes, tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import InputError
from simulator.files import is_file
from simulator.model.loader import load_validated, looks_like_path, suggest
from simulator.model.operators import AttentionKernel, Fusion
from simulator.model.registry import config_files, find_named

ALLREDUCE_KINDS: tuple[str, ...] = ("custom", "nccl")


class HostWork(BaseModel):
    """Host time per engine iteration: fixed + per sequence + per new token (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    fixed_seconds: float = Field(default=0.0, ge=0.0, le=1.0)
    per_sequence_seconds: float = Field(default=0.0, ge=0.0, le=1e-2)
    per_token_seconds: float = Field(default=0.0, ge=0.0, le=1e-3)


class CpuOverhead(HostWork):
    """The engine loop's host time per iteration, and the fraction of it that overlaps the GPU."""

    overlap: float = Field(default=0.0, ge=0.0, le=1.0)
    """fraction of the CPU time that runs concurrently with the GPU's forward pass"""
    kernels_per_sequence: float = Field(default=0.0, ge=0.0, le=1000.0)
    """GPU kernels the loop launches from the host for each sequence, one sequence at a time, every iteration
    (outside the forward pass and any CUDA graph: ``graphs.eager_launch_seconds`` each)"""
    kernels_per_sampled_sequence: float = Field(default=0.0, ge=0.0, le=1000.0)
    """more such kernels for each sequence that samples its next token rather than taking the argmax
    (a run's ``sampling`` setting; :attr:`EngineProfile.sampling`)"""


class ClientPath(BaseModel):
    """What a benchmark client's TTFT holds beyond the engine: the API server's work on each request (seconds).

    See :mod:`simulator.cost.client_path` for how it is charged; every shipped value cites its source in the
    profile YAML. All zero (the default, and ``ideal``): the engine is measured bare.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    http_seconds: float = Field(default=0.0, ge=0.0, le=10.0)
    """per request: HTTP parsing, request validation and the hand-off to the engine core (seconds)"""
    tokenize_seconds_per_token: float = Field(default=0.0, ge=0.0, le=1e-3)
    """per prompt token: tokenisation on the API server (seconds per token)"""
    first_chunk_seconds: float = Field(default=0.0, ge=0.0, le=10.0)
    """per request: the engine's first token to the client's first streamed chunk (seconds)"""
    detokenize_seconds_per_token: float = Field(default=0.0, ge=0.0, le=1e-2)
    """detokenising one output token before its chunk is sent (seconds); charged to the first and the last token
    only, since later tokens are detokenised while the engine computes the next step in every shipped profile"""
    jitter_cv: float = Field(default=0.0, ge=0.0, le=10.0)
    """coefficient of variation of a request's client-path time (lognormal, mean 1)"""

    @property
    def is_zero(self) -> bool:
        return not (self.http_seconds or self.tokenize_seconds_per_token or self.first_chunk_seconds
                    or self.detokenize_seconds_per_token)


class GraphCapture(BaseModel):
    """CUDA-graph capture of forward passes and the cost of launching kernels without it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_batch: int = Field(default=0, ge=0, le=1 << 20)
    """largest step (tokens) replayed from a captured graph; 0: none"""
    mixed: bool = False
    """steps with prefill tokens are captured too (vLLM V1 piecewise graphs); else decode-only steps"""
    eager_launch_seconds: float = Field(default=0.0, ge=0.0, le=1e-3)
    """host time to launch one kernel outside a graph (driver + framework dispatch)"""


class LargeGpuDefaults(BaseModel):
    """Scheduler defaults an engine picks on GPUs with a lot of memory (vLLM: 70 GiB or more, A100 excepted)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    min_hbm_bytes: float = Field(gt=0.0, le=2.0**50)
    exclude_names: list[str] = Field(default_factory=list)
    """GPU names containing any of these (case-insensitive) keep the ordinary defaults"""
    max_num_seqs: int = Field(ge=1, le=1 << 20)
    max_batched_tokens: int | None = Field(default=None, ge=1, le=1 << 24)

    def applies_to(self, name: str, hbm_bytes: float) -> bool:
        return hbm_bytes >= self.min_hbm_bytes and not any(x.lower() in name.lower() for x in self.exclude_names)


class GpuMemoryTier(BaseModel):
    """Defaults an engine picks on GPUs with less than ``below_hbm_bytes`` of memory (SGLang's
    ``ServerArgs._handle_gpu_memory_settings``: chunked_prefill_size and cuda_graph_max_bs by GPU memory).

    A field left None keeps the profile's own value. See :attr:`SchedulerDefaults.by_gpu_memory`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    below_hbm_bytes: float = Field(gt=0.0, le=2.0**50)
    """the tier holds GPUs with less memory than this (bytes; SGLang compares MiB, so N GiB = N * 2**30)"""
    max_num_seqs: int | None = Field(default=None, ge=1, le=1 << 20)
    max_batched_tokens: int | None = Field(default=None, ge=1, le=1 << 24)
    graph_max_batch: int | None = Field(default=None, ge=0, le=1 << 20)
    """the largest step replayed from a CUDA graph on these GPUs (``graphs.max_batch``)"""


class SchedulerDefaults(BaseModel):
    """The engine's default scheduler settings (names as simulator.engine.scheduler.SchedulerConfig)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["static", "continuous", "chunked", "prefill-first"] = "continuous"
    max_num_seqs: int = Field(default=256, ge=1, le=1 << 20)
    max_batched_tokens: int | None = Field(default=None, ge=1, le=1 << 24)
    block_size: int = Field(default=16, ge=1, le=1 << 16)
    kv_admission: Literal["incremental", "reserve", "fit"] = "incremental"
    """KV blocks as sequences grow, with preemption (vLLM, SGLang), the whole request reserved at admission
    (TensorRT-LLM's GUARANTEED_NO_EVICT), or blocks as they grow with SGLang's test that every output still to
    come fits (``fit``); see simulator.engine.scheduler"""
    large_gpu: LargeGpuDefaults | None = None
    """other max_num_seqs / max_batched_tokens on GPUs with a lot of memory (:meth:`EngineProfile.for_gpu`)"""
    by_gpu_memory: list[GpuMemoryTier] = Field(default_factory=list)
    """defaults by GPU memory, smallest bound first: a GPU takes the first tier whose ``below_hbm_bytes`` exceeds its
    memory, and GPUs at or above the last bound keep the profile's own values (:meth:`EngineProfile.for_gpu`).
    For engines with several memory tiers (SGLang); ``large_gpu`` is vLLM's one threshold with names excluded"""
    pass_tokens: int | None = Field(default=None, ge=1, le=1 << 24)
    """the most tokens one forward pass carries (llama.cpp's n_ubatch); None: no limit. A static batch
    prefills in passes of at most this many tokens and a chunked token budget is cut to it (a larger
    logical batch runs as several passes, each reading the weights again); see simulator.plan.engine_run.scheduler_config.
    A static batch's decode steps are not split (a simplification for batches of more sequences than this)"""

    @model_validator(mode="after")
    def _tiers_ascend(self) -> SchedulerDefaults:
        bounds = [tier.below_hbm_bytes for tier in self.by_gpu_memory]
        if any(upper <= lower for lower, upper in zip(bounds, bounds[1:], strict=False)):
            raise ValueError("scheduler.by_gpu_memory: tiers must be listed by strictly increasing below_hbm_bytes")
        if self.by_gpu_memory and self.large_gpu is not None:
            raise ValueError("scheduler: give large_gpu or by_gpu_memory, not both")
        return self


class EngineProfile(BaseModel):
    """One serving engine at one version (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    version: str = ""
    description: str = ""
    cpu: CpuOverhead = Field(default_factory=CpuOverhead)
    async_cpu: HostWork | None = None
    """host work of an iteration done while the GPU runs the next one (vLLM 0.6's asynchronous output
    processing): it costs time only where it outlasts that step"""
    worker_rpc: HostWork | None = None
    """host work the driver does for each worker process of a tensor-parallel group every iteration, serially
    (vLLM before 0.2.7: a Ray remote call carrying the iteration's inputs to each worker); see :meth:`for_workers`"""
    graphs: GraphCapture = Field(default_factory=GraphCapture)
    enforce_eager: bool = False
    scheduler_steps: int = Field(default=1, ge=1, le=256)
    """decode iterations per pass of the engine loop (vLLM V0's multi-step scheduling, --num-scheduler-steps):
    the host work of a decode-only iteration is paid once per this many"""
    sampling: bool = False
    """the run's requests sample their next token (temperature, top-k/top-p) rather than decode greedily: a
    run-time choice (the ``sampling`` setting), which costs ``cpu.kernels_per_sampled_sequence`` more launches"""
    allreduce: Literal["custom", "nccl"] = "nccl"
    custom_allreduce_max_bytes: float = Field(default=8 * 2**20, ge=0.0, le=2.0**40)
    fusion: Fusion = "elementwise"
    """how the engine runs norms, rotary embeddings, activations and residual adds (simulator.model.layers):
    ``kernels`` for the PyTorch engines' own elementwise kernels, ``elementwise`` folded into GEMMs; a run's
    ``fusion`` setting overrides it"""
    attention_kernel: AttentionKernel = "flash"
    """the engine's attention kernel (simulator.model.layers); a run's ``attention_kernel`` setting overrides it"""
    naive_score_bytes: float | None = Field(default=None, gt=0.0, le=8.0)
    """bytes of one score element the naive kernel writes and reads (llama.cpp's KQ is F32: 4); None: the
    activation dtype's"""
    dequantize_above_tokens: int = Field(default=0, ge=0, le=1 << 24)
    """weight-only quantised GEMMs of more than this many rows expand the weights to the activation dtype in
    HBM and run a dense GEMM on the copy (llama.cpp's cuBLAS path for batches above 32); 0: never"""
    honours_sliding_window: bool = True
    """False: the engine attends the whole context in every layer, the model's sliding window notwithstanding"""
    gemm_accumulate: Literal["fp32", "fp16"] = "fp32"
    """what the engine's FP16 GEMMs accumulate in: ``fp16`` (llama.cpp's cuBLAS calls, CUBLAS_COMPUTE_16F) runs at
    the GPU's ``fp16_accumulate_flops`` where it has a faster one (GeForce parts)"""
    kv_cache_memory: Literal["of_total", "of_free"] = "of_total"
    """What the KV-cache memory fraction (``gpu_memory_utilization``) is a fraction of: ``of_total`` HBM,
    bounding everything the process holds (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static),
    or ``of_free``, the memory left after weights, activations and runtime (TensorRT-LLM's
    KvCacheConfig.free_gpu_memory_fraction, default 0.9)"""
    scheduler: SchedulerDefaults = Field(default_factory=SchedulerDefaults)
    client: ClientPath = Field(default_factory=ClientPath)
    """the client path a benchmark client measures in TTFT (API server, tokenisation, first chunk);
    :mod:`simulator.cost.client_path`"""

    def for_gpu(self, name: str, hbm_bytes: float) -> EngineProfile:
        """This profile with the scheduler defaults the engine picks on this GPU (``scheduler.large_gpu`` or
        ``scheduler.by_gpu_memory``)."""
        tier = next((t for t in self.scheduler.by_gpu_memory if hbm_bytes < t.below_hbm_bytes), None)
        if tier is not None:
            update: dict[str, object] = {"by_gpu_memory": []}
            if tier.max_num_seqs is not None:
                update["max_num_seqs"] = tier.max_num_seqs
            if tier.max_batched_tokens is not None:
                update["max_batched_tokens"] = tier.max_batched_tokens
            graphs = self.graphs if tier.graph_max_batch is None else \
                self.graphs.model_copy(update={"max_batch": tier.graph_max_batch})
            return self.model_copy(update={"scheduler": self.scheduler.model_copy(update=update), "graphs": graphs})
        large = self.scheduler.large_gpu
        if large is None or not large.applies_to(name, hbm_bytes):
            return self
        scheduler = self.scheduler.model_copy(update={"max_num_seqs": large.max_num_seqs,
                                                      "max_batched_tokens": large.max_batched_tokens, "large_gpu": None})
        return self.model_copy(update={"scheduler": scheduler})

    def for_workers(self, workers: int) -> EngineProfile:
        """This profile driving ``workers`` GPU processes: ``workers`` x ``worker_rpc`` added to ``cpu``.

        A single GPU runs in the driver's own process (no remote call), so one worker adds nothing.
        """
        rpc = self.worker_rpc
        if rpc is None or workers <= 1:
            return self
        cpu = self.cpu.model_copy(update={
            "fixed_seconds": self.cpu.fixed_seconds + workers * rpc.fixed_seconds,
            "per_sequence_seconds": self.cpu.per_sequence_seconds + workers * rpc.per_sequence_seconds,
            "per_token_seconds": self.cpu.per_token_seconds + workers * rpc.per_token_seconds,
        })
        return self.model_copy(update={"cpu": cpu, "worker_rpc": None})

    def with_sampling(self, sampling: bool) -> EngineProfile:
        """This profile serving requests that sample (True) or decode greedily (False)."""
        return self if sampling == self.sampling else self.model_copy(update={"sampling": sampling})

    def with_scheduler_steps(self, steps: int) -> EngineProfile:
        """This profile running ``steps`` decode iterations per scheduler pass (vLLM's ``--num-scheduler-steps``)."""
        return self if steps == self.scheduler_steps else self.model_copy(update={"scheduler_steps": steps})

    def eager(self) -> EngineProfile:
        """This profile with CUDA graphs off (``--enforce-eager``)."""
        return self if self.enforce_eager else self.model_copy(update={"enforce_eager": True})


IDEAL = EngineProfile(
    name="ideal",
    aliases=["none", "roofline"],
    description="no engine overhead (CPU time, eager launches); GPU time only",
    graphs=GraphCapture(max_batch=1 << 20, mixed=True),
)
"""The pure GPU time model: what a :class:`~simulator.cost.system.System` uses unless told otherwise."""


def _load_profile_file(path: Path) -> EngineProfile:
    return load_validated(EngineProfile, path)


def list_engine_profiles() -> list[EngineProfile]:
    """Every engine profile: $MEMWALL_CONFIG_DIR's first, then the shipped ones."""
    return [_load_profile_file(path) for path in config_files("engines")]


def load_engine_profile(name_or_path: str) -> EngineProfile:
    """A shipped engine profile by name or alias (case-insensitive), or a profile YAML by path."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not is_file(path, "--engine"):
            raise InputError(f"--engine: no such file {name_or_path}")
        return load_validated(EngineProfile, path)
    found = find_named("engines", name_or_path, _load_profile_file, lambda profile: [profile.name, *profile.aliases])
    if found is not None:
        return found
    known = [n for profile in list_engine_profiles() for n in (profile.name, *profile.aliases)]
    raise InputError(
        f"--engine: unknown engine '{name_or_path}'{suggest(name_or_path, known)}; "
        f"known: {', '.join(p.name for p in list_engine_profiles())} (or a path to an engine profile YAML)"
    )
