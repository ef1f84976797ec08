"""Parameter counts (total, and active per token for MoE) and MoE facts, counted off the built operators."""

from __future__ import annotations

from typing import NamedTuple

from simulator.model.architecture import ModelSpec
from simulator.model.gpu import GPUSpec
from simulator.model.layers import build_operators
from simulator.model.operators import (
    Embedding,
    ExpertGemm,
    Gemm,
    Operator,
)
from simulator.model.precision import Precision


class MoEFacts(NamedTuple):
    """What the report says about a mixture-of-experts deployment at one step size."""

    experts: int
    top_k: int
    shared_experts: int
    moe_layers: int
    ep: int
    experts_per_gpu: int
    touched_per_gpu: float
    """expected distinct experts per MoE layer a step of ``tokens`` touches on the busiest GPU"""


def moe_facts(model: ModelSpec, operators: tuple[Operator, ...], tokens: float) -> MoEFacts | None:
    """Routed experts, their split over GPUs and the experts a step of ``tokens`` tokens touches (None: dense)."""
    experts = next((op for op in operators if isinstance(op, ExpertGemm)), None)
    if experts is None:
        return None
    per_gpu = len(experts.probabilities)
    return MoEFacts(
        experts=model.moe_experts,
        top_k=model.moe_top_k,
        shared_experts=model.moe_shared_experts,
        moe_layers=model.moe_layers,
        ep=model.moe_experts // per_gpu,
        experts_per_gpu=per_gpu,
        touched_per_gpu=float(experts.experts_touched(tokens)),
    )


class ParameterCounts(NamedTuple):
    """A model's parameters (element counts, whole model).

    ``active``: weights one token multiplies with: the top-k routed experts (not the others), the
    LM head, every dense weight, but not the input embedding table (a lookup of one row), as
    DeepSeek and OpenAI count active parameters. ``active_with_embedding`` adds the table, as
    Mistral (Mixtral 12.9B) and Qwen (Qwen3-30B-A3B 3.3B) count them.
    """

    total: int
    active: int
    embedding: int
    active_with_embedding: int


def parameter_count(operators: tuple[Operator, ...]) -> int:
    """Parameters of the whole model (all GPUs): sum of count x params over operators."""
    return int(sum(op.count * op.params for op in operators))


def parameter_counts(operators: tuple[Operator, ...]) -> ParameterCounts:
    """Total, active and embedding parameters of the model the operators belong to (see ParameterCounts)."""
    total = parameter_count(operators)
    embedding = int(sum(op.count * op.params for op in operators if isinstance(op, Embedding)))
    active = 0
    tied = False
    for op in operators:
        if isinstance(op, Embedding):
            continue
        own = getattr(op, "active_params", None)
        if isinstance(op, Gemm) and own is not None and op.params == 0:
            tied = True  # a tied LM head: its matrix is the embedding table
        active += op.count * (op.params if own is None else own)
    return ParameterCounts(total, int(active), embedding, int(active + (0 if tied else embedding)))


# Any GPU builds the operator list for counting (only the FlashAttention tile reads it).
_COUNTING_GPU = GPUSpec(name="parameter counting", peak_flops={"fp16": 1.0}, hbm_bytes=1.0,
                        hbm_bandwidth_bytes_per_second=1.0, sram_bytes_per_sm=1.0, link_bandwidth_bytes_per_second=1.0)


def model_parameters(model: ModelSpec) -> ParameterCounts:
    """Total and active parameters of ``model`` (tp = 1, default precision)."""
    return parameter_counts(build_operators(model, Precision(), _COUNTING_GPU))
