"""The paged KV cache: its capacity in blocks, and a counting block allocator.

A block holds ``block_size`` tokens of every layer's keys and values (vLLM's PagedAttention).
A sequence with ``t`` cached tokens holds ``ceil(t / block_size)`` blocks. Blocks are
interchangeable, so the allocator only counts them (no block tables are needed to cost a run).

Capacity, per GPU of the tensor-parallel group (every GPU holds its share of every block):

    budget   = hbm_bytes * gpu_memory_utilization - weights - activation workspace - runtime reserve
    blocks   = floor(budget / (block_size * KV bytes per token per GPU))

or, for an engine whose fraction is of the *free* memory (``EngineProfile.kv_cache_memory``
``of_free``: TensorRT-LLM's ``free_gpu_memory_fraction``, measured after the model is loaded),

    budget   = (hbm_bytes - weights - activation workspace - runtime reserve) * gpu_memory_utilization

The runtime reserve (CUDA context, library workspaces) is counted because vLLM's
``gpu_memory_utilization`` bounds everything the process holds, not just tensors.

A model with linear-attention layers (Gated DeltaNet) keeps a fixed state per running sequence
beside its blocks. The budget first sets aside a state pool, as SGLang does (a Mamba state pool
beside the KV pool, its size capping the running requests): one state for each of ``max_num_seqs``
sequences, but no more than half the budget, ``states = min(max_num_seqs, floor(budget / 2 / state))``
(``KVCapacity.state_sequences``), so a large ``max_num_seqs`` does not leave the tokens nothing.
``budget -= states * state bytes per sequence per GPU``. The engine admits by blocks; a run caps its
scheduler's ``max_num_seqs`` at ``state_sequences`` (simulator.plan.engine_run.prepare).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.cost.deployment import Deployment
from simulator.cost.memory import (
    GIB,
    WORKSPACE_TOKENS,
    kv_bytes_per_token_per_gpu,
    linear_state_bytes_per_sequence,
    workspace_bytes_per_gpu,
)
from simulator.errors import InputError


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` tokens."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class KVCapacity:
    """How many blocks fit, and where each GPU's memory went (bytes, per GPU)."""

    blocks: int
    block_size: int
    bytes_per_block_per_gpu: float
    budget_bytes_per_gpu: float
    hbm_bytes_per_gpu: float
    gpu_memory_utilization: float
    weights_bytes_per_gpu: float
    workspace_bytes_per_gpu: float
    reserved_bytes_per_gpu: float
    overridden: bool = False
    of_free: bool = False
    """the fraction was of the memory left after weights, workspace and runtime (TensorRT-LLM), not of HBM"""
    state_bytes_per_gpu: float = 0.0
    """linear-attention state pool set aside (module docstring)"""
    state_sequences: int = 0
    """sequences that pool holds a state for (0: the model has no linear-attention layers)"""

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def kv_bytes_per_gpu(self) -> float:
        return self.blocks * self.bytes_per_block_per_gpu


def kv_capacity(
    deployment: Deployment,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    max_batched_tokens: int | None = None,
    max_num_seqs: int = 256,
    blocks_override: int | None = None,
) -> KVCapacity:
    """The KV-cache capacity of ``deployment`` (see module docstring); InputError when nothing is left for it."""
    if block_size < 1:
        raise InputError(f"--block-size: must be >= 1 token (got {block_size})")
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization: must be in (0, 1] (got {gpu_memory_utilization})")
    system, plan = deployment.system, deployment.memory
    # Under pipeline parallelism a GPU holds its stage's layers: the stage's model sizes its cache.
    model = getattr(system, "stage", system).model
    step_tokens = WORKSPACE_TOKENS if max_batched_tokens is None else max_batched_tokens
    workspace = workspace_bytes_per_gpu(model, system.precision, system.tp, step_tokens, max_num_seqs)
    per_block = block_size * kv_bytes_per_token_per_gpu(model, system.precision, system.tp, system.dp_attention)
    hbm = system.gpu.hbm_bytes
    of_free = system.engine.kv_cache_memory == "of_free"
    held = plan.weights_bytes_per_gpu + workspace + plan.reserved_bytes_per_gpu
    budget = (hbm - held) * gpu_memory_utilization if of_free else hbm * gpu_memory_utilization - held
    per_sequence = linear_state_bytes_per_sequence(model, system.precision, system.tp, system.dp_attention)
    states = min(max_num_seqs, max(1, math.floor(budget / 2 / per_sequence))) if per_sequence else 0
    state = states * per_sequence
    budget -= state
    if blocks_override is not None:
        if blocks_override < 1:
            raise InputError(f"--kv-blocks: must be >= 1 (got {blocks_override})")
        blocks = blocks_override
    else:
        blocks = max(0, math.floor(budget / per_block))
    if blocks < 1:
        raise InputError(
            f"{system.model.name} on {system.tp}x {system.gpu.name} does not fit: no memory left for the KV cache "
            f"({gpu_memory_utilization:g} x {hbm / GIB:.1f} GiB minus weights {plan.weights_bytes_per_gpu / GIB:.1f}, "
            f"workspace {workspace / GIB:.1f}, runtime {plan.reserved_bytes_per_gpu / GIB:.1f} and linear-attention "
            f"state for {states} sequences {state / GIB:.1f} GiB per GPU); "
            f"raise --tp or --gpu-memory-utilization, or quantise the weights"
        )
    return KVCapacity(
        blocks=blocks,
        block_size=block_size,
        bytes_per_block_per_gpu=per_block,
        budget_bytes_per_gpu=budget,
        hbm_bytes_per_gpu=hbm,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes_per_gpu=plan.weights_bytes_per_gpu,
        workspace_bytes_per_gpu=workspace,
        reserved_bytes_per_gpu=plan.reserved_bytes_per_gpu,
        overridden=blocks_override is not None,
        of_free=of_free,
        state_bytes_per_gpu=state,
        state_sequences=states,
    )


class BlockAllocator:
    """Counts free and used blocks and the high-water mark; refuses to over-allocate."""

    __slots__ = ("total", "used", "high_water")

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.high_water = 0

    @property
    def free(self) -> int:
        return self.total - self.used

    def allocate(self, blocks: int) -> None:
        if blocks > self.total - self.used:
            raise RuntimeError(f"KV allocator: {blocks} blocks asked, {self.total - self.used} free")  # engine bug
        self.used += blocks
        if self.used > self.high_water:
            self.high_water = self.used

    def release(self, blocks: int) -> None:
        self.used -= blocks
