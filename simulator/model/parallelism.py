"""Which tensor-, expert- and attention-data-parallel degrees a model allows, and the KV heads each GPU keeps."""

from __future__ import annotations

from typing import Literal

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec


def kv_heads_per_gpu(model: ModelSpec, tp: int, kind: Literal["full", "sliding"] = "full") -> int:
    """KV heads each GPU holds in the layers of ``kind``: g / tp, or 1 (replicated) when there are fewer KV heads
    than GPUs."""
    return max(1, model.attention_shape(kind).kv_heads // tp)


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """TP must divide the heads, and divide or be a multiple of the KV heads."""
    if tp < 1:
        raise InputError(f"--tp: must be >= 1 (got {tp})")
    if model.num_heads % tp:
        divisors = [d for d in range(1, model.num_heads + 1) if model.num_heads % d == 0 and d <= 64]
        raise InputError(
            f"--tp: {tp} does not divide the {model.num_heads} attention heads of {model.name}; "
            f"allowed: {', '.join(map(str, divisors))}"
        )
    for g in sorted({model.num_kv_heads, model.attention_shape("sliding").kv_heads}):
        if g % tp and tp % g:
            raise InputError(
                f"--tp: {tp} neither divides nor is a multiple of the {g} KV heads of {model.name}"
            )
    if model.o_groups % tp:
        # DeepSeek-V4's grouped output projection is split by whole groups (vLLM: n_local_groups = o_groups // tp).
        divisors = [d for d in range(1, model.o_groups + 1) if model.o_groups % d == 0]
        raise InputError(f"--tp: {tp} does not divide the {model.o_groups} output groups (o_groups) of {model.name}; "
                         f"allowed: {', '.join(map(str, divisors))}")


def check_expert_parallel(model: ModelSpec, tp: int, ep: int) -> None:
    """EP splits the routed experts over the ``tp`` GPUs that run attention tensor-parallel: ep is 1 or tp."""
    if ep < 1:
        raise InputError(f"--ep: must be >= 1 (got {ep})")
    if ep == 1:
        return
    if not model.is_moe:
        raise InputError(f"--ep: {model.name} has no routed experts; expert parallelism needs a mixture-of-experts model")
    if ep != tp:
        raise InputError(
            f"--ep: {ep} must be 1 or equal --tp {tp} (attention tensor-parallel and the experts split over the "
            "same GPUs, as SGLang's --tp N --ep N and vLLM's --enable-expert-parallel deploy them)"
        )
    if model.moe_experts % ep:
        raise InputError(f"--ep: {ep} does not divide the {model.moe_experts} routed experts of {model.name}")


def check_attention_data_parallel(model: ModelSpec, tp: int, dp_attention: bool) -> None:
    """Attention data parallelism runs attention on 1/tp of the sequences per GPU; the MoE layers see every token,
    their experts split over the same GPUs (``--ep`` tp: whole experts, all-to-all) or sliced (``--ep`` 1)."""
    if not dp_attention:
        return
    if not model.is_moe:
        raise InputError(f"--dp-attention: {model.name} has no routed experts; attention data parallelism is "
                         "deployed with expert parallelism (SGLang's --enable-dp-attention, TensorRT-LLM's "
                         "enable_attention_dp); use --replicas for a dense model")
    if tp < 2:
        raise InputError(f"--dp-attention: needs --tp N with N >= 2 GPUs to split the sequences over (got --tp {tp})")
