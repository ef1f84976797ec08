"""Memory: weights and KV cache per GPU, activation workspace, and whether a run fits.

All sizes in bytes. ``kv_bytes_per_token`` is the logical size for the whole model
(2 * layers * kv_heads * head_dim * bytes per element); per GPU, KV heads are split across
the tensor-parallel group (and replicated when there are fewer KV heads than GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.gpu import GPUSpec
from simulator.model.layers import Operator, build_operators, kv_heads_per_gpu
from simulator.model.precision import Precision

GIB = 2**30

# CUDA context, cuBLAS and NCCL workspaces of a serving process: 0.5-1.5 GiB per GPU as
# nvidia-smi shows for an idle PyTorch/vLLM worker. A named assumption, not a measurement.
RUNTIME_RESERVED_BYTES_PER_GPU = 1 * GIB

# Activation workspace is sized for a prefill chunk of this many tokens (vLLM's default
# max_num_batched_tokens is of this order); a larger prefill runs in chunks of this size.
WORKSPACE_TOKENS = 8192


def kv_bytes_per_token(model: ModelSpec, precision: Precision) -> float:
    """KV-cache bytes one token adds, all layers, all GPUs (logical, no replication)."""
    return 2.0 * model.num_layers * model.num_kv_heads * model.head_dim * precision.kv_bytes_per_element


def kv_bytes_per_token_per_gpu(model: ModelSpec, precision: Precision, tp: int) -> float:
    """KV-cache bytes one token adds on each GPU of a tensor-parallel group."""
    return 2.0 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * precision.kv_bytes_per_element


def weight_bytes(operators: tuple[Operator, ...]) -> float:
    """Weight bytes resident on one GPU (scales and biases included)."""
    return float(sum(op.count * op.resident_bytes for op in operators))


def model_weight_bytes(model: ModelSpec, precision: Precision, gpu: GPUSpec) -> float:
    """Weight bytes of the whole model (stored once; tp = 1 layout)."""
    return weight_bytes(build_operators(model, precision, gpu, tp=1))


def workspace_bytes_per_gpu(model: ModelSpec, precision: Precision, tp: int, step_tokens: int, sequences: int) -> float:
    """Activation workspace of the largest step on one GPU.

    Live at once: the residual stream and its normed copy, the QKV output and the attention
    output (~4 H wide), the MLP intermediate (gate and up, 2 F / tp, plus the activated F / tp),
    and fp32 logits for the sequences that emit a token.
    """
    tokens = min(step_tokens, WORKSPACE_TOKENS)
    mlp = (3 if model.gated_mlp else 2) * model.ffn_size // tp
    activations = tokens * (4 * model.hidden_size + mlp) * precision.activation_bytes_per_element
    logits = min(sequences, tokens) * (model.vocab_size / tp) * 4.0
    return activations + logits


@dataclass(frozen=True)
class MemoryPlan:
    """Where one GPU's memory goes, and whether it fits. Totals are for all GPUs."""

    tp: int
    hbm_bytes_per_gpu: float
    weights_bytes: float
    weights_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_bytes: float
    kv_bytes_per_gpu: float
    workspace_bytes_per_gpu: float
    reserved_bytes_per_gpu: float

    @property
    def needed_bytes_per_gpu(self) -> float:
        return self.weights_bytes_per_gpu + self.kv_bytes_per_gpu + self.workspace_bytes_per_gpu + self.reserved_bytes_per_gpu

    @property
    def capacity_bytes(self) -> float:
        return self.hbm_bytes_per_gpu * self.tp

    @property
    def fits(self) -> bool:
        return self.needed_bytes_per_gpu <= self.hbm_bytes_per_gpu

    def shortfall_message(self) -> str:
        return (
            f"needs {self.needed_bytes_per_gpu / GIB:.1f} GiB per GPU "
            f"(weights {self.weights_bytes_per_gpu / GIB:.1f} + KV cache {self.kv_bytes_per_gpu / GIB:.1f} + "
            f"workspace {self.workspace_bytes_per_gpu / GIB:.1f} + runtime {self.reserved_bytes_per_gpu / GIB:.1f}) "
            f"but each GPU has {self.hbm_bytes_per_gpu / GIB:.1f} GiB"
        )


def plan_memory(
    model: ModelSpec,
    precision: Precision,
    gpu: GPUSpec,
    tp: int,
    batch: int,
    context_tokens: int,
    operators: tuple[Operator, ...],
    prefill_tokens: int | None = None,
) -> MemoryPlan:
    """Memory of ``batch`` sequences of ``context_tokens`` each on ``tp`` GPUs (``operators`` built for that tp)."""
    per_token = kv_bytes_per_token(model, precision)
    step_tokens = batch * context_tokens if prefill_tokens is None else prefill_tokens
    return MemoryPlan(
        tp=tp,
        hbm_bytes_per_gpu=gpu.hbm_bytes,
        weights_bytes=model_weight_bytes(model, precision, gpu),
        weights_bytes_per_gpu=weight_bytes(operators),
        kv_bytes_per_token=per_token,
        kv_bytes=per_token * batch * context_tokens,
        kv_bytes_per_gpu=kv_bytes_per_token_per_gpu(model, precision, tp) * batch * context_tokens,
        workspace_bytes_per_gpu=workspace_bytes_per_gpu(model, precision, tp, step_tokens, batch),
        reserved_bytes_per_gpu=RUNTIME_RESERVED_BYTES_PER_GPU,
    )


def tensor_parallel_candidates(model: ModelSpec, gpu: GPUSpec) -> list[int]:
    """Powers of two up to the GPUs in a node that divide both the heads and the KV heads."""
    candidates = []
    tp = 1
    while tp <= gpu.max_gpus_per_node:
        if model.num_heads % tp == 0 and model.num_kv_heads % tp == 0 and model.ffn_size % tp == 0:
            candidates.append(tp)
        tp *= 2
    return candidates


def no_fit_error(model: ModelSpec, gpu: GPUSpec, plan: MemoryPlan, tried: list[int]) -> InputError:
    return InputError(
        f"{model.name} does not fit on {gpu.name} at any tensor-parallel degree tried "
        f"({', '.join(map(str, tried))}); at tp={plan.tp} it {plan.shortfall_message()}"
    )
