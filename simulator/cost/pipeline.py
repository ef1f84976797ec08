"""Pipeline parallelism: the layers split into ``pp`` stages, each a tensor-parallel group of ``tp`` GPUs.

An iteration's batch flows through the stages as ``m`` micro-batches (GPipe, Huang et al. 2019):
stage s works on micro-batch j in slot s + j, so the last micro-batch leaves the last stage after
``m + p - 1`` slots, and each stage is idle for ``p - 1`` of them, the bubble:

    bubble = (p - 1) / (m + p - 1)          (GPipe, section 2.2; Narayanan et al. 2021, eq. 1)

A slot lasts as long as the slowest stage takes for one micro-batch. Between stages each
micro-batch's hidden states (tokens x hidden x activation bytes) go point to point to the next
stage's GPUs; ``p - 1`` of those transfers lie on the critical path. So one iteration takes

    (m + p - 1) x t_stage(step / m) + (p - 1) x t_p2p(step / m) + host time per iteration

with ``m = min(pp, sequences)``: vLLM runs ``pp`` virtual engines, each scheduling its own share
of the running sequences, so the batch is in ``pp`` micro-batches (vllm/engine/llm_engine.py,
``parallel_config.pipeline_parallel_size`` schedulers). A micro-batch of a decode step still reads
all the stage's weights: splitting a memory-bound batch costs weight reads, as it does on the GPU.

The stage is costed and sized as the heaviest one: ``ceil(L / p)`` layers (the last ones, so an
MoE model's stage is all experts) together with the embedding and the LM head. That is an upper
bound: the embedding lives on the first stage and the head on the last (for untied embeddings it
charges one vocabulary matrix per GPU too many; tied ones are held by both end stages anyway).

Point to point: within a node over the GPU's interconnect (NCCL Simple protocol base + hop latency,
the GPU's achievable link bandwidth); across nodes (``tp x pp`` above ``max_gpus_per_node``) over
InfiniBand at one NIC per GPU: 25 GB/s (HDR 200 Gb/s, DGX A100 system architecture) or 50 GB/s for
NVLink 4/5 systems (NDR 400 Gb/s, DGX H100/B200), with NCCL's network hop latency (14 us, Simple
protocol, src/graph/tuning.cc ``hwLat[NCCL_HW_NET]``) on top of its base latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from simulator.cost.collectives import point_to_point_seconds
from simulator.cost.step_cost import (
    COMMUNICATION_KINDS,
    OperatorCost,
    StepCost,
    StepTotals,
)
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.interconnect import load_interconnect
from simulator.model.step import Number, Step

NET_HOP_SECONDS = 14e-6
"""NCCL's network hop latency, Simple protocol (src/graph/tuning.cc hwLat[NCCL_HW_NET], Ring)."""

NET_BYTES_PER_SECOND = {"nvlink4": 50e9, "nvlink5": 50e9}
"""InfiniBand bandwidth per GPU across nodes, by the node's interconnect (NDR 400 Gb/s on H100/B200 systems)."""
NET_BYTES_PER_SECOND_DEFAULT = 25e9
"""HDR 200 Gb/s per GPU (DGX A100), for every other node type."""

P2P_KIND = "allreduce"
"""Operator kind of the stage-to-stage transfer in a StepCost: one of COMMUNICATION_KINDS, so it is
shown and summed as communication."""
assert P2P_KIND in COMMUNICATION_KINDS


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of an iteration each stage is idle: (p - 1) / (m + p - 1) (GPipe)."""
    if stages < 1 or micro_batches < 1:
        raise InputError(f"pipeline: stages and micro-batches must be >= 1 (got {stages}, {micro_batches})")
    return (stages - 1) / (micro_batches + stages - 1)


def pipeline_slots(stages: int, micro_batches: Number) -> Number:
    """Slots from the first micro-batch entering stage 1 to the last leaving stage p: m + p - 1."""
    return micro_batches + stages - 1


def micro_batch(step: Step, parts: Number) -> Step:
    """One of ``parts`` equal micro-batches of ``step`` (every field of a Step is a sum over its sequences)."""
    return Step(**{f.name: getattr(step, f.name) / parts for f in fields(Step)})


def stage_model(model: ModelSpec, pp: int) -> ModelSpec:
    """The heaviest stage's model: the last ``ceil(L / pp)`` layers, their windows and experts as in the full model."""
    layers = model.num_layers
    count = math.ceil(layers / pp)
    if pp == 1:
        return model
    first = layers - count
    update: dict[str, Any] = {"num_layers": count, "name": f"{model.name} (stage of {count} layers)"}
    if model.block_pattern:
        update["block_pattern"] = model.block_pattern[first:]  # Nemotron-H: the stage's own blocks
        if "*" not in update["block_pattern"]:
            # The stage would hold no KV cache at all, which the paged cache's sizing cannot represent.
            raise InputError(f"--pp: {pp} stages leave the last {count} layers of {model.name} without an attention "
                             f"layer (blocks {update['block_pattern']}); use fewer stages")
    if model.compress_ratios:
        update["compress_ratios"] = model.compress_ratios[first:]  # DeepSeek-V4: the stage's own ratios
    if model.sliding_window is not None or model.layer_types:
        update["layer_types"] = [model.layer_kind(i) for i in range(first, layers)]
        update["sliding_window_pattern"] = 0
        if not {"full", "sliding", "sparse"} & set(update["layer_types"]):
            raise InputError(f"--pp: {pp} stages leave the last {count} layers of {model.name} without an attention "
                             "layer; use fewer stages")
        if model.linear_layers and "linear" not in update["layer_types"]:
            # No linear layer in the stage (a one-layer draft head of Qwen3.5 or Kimi-K3): none of their widths.
            update.update({"linear_key_heads": 0, "linear_value_heads": 0, "linear_key_head_dim": 0,
                           "linear_value_head_dim": 0, "linear_conv_kernel": 0, "linear_state_dtype": None,
                           "linear_kind": "gated_deltanet", "linear_gate_rank": 0})
    if model.attention_residual_block:
        # Kimi-K3: the stage's block boundaries count from the whole model's layer 0.
        update["attention_residual_offset"] = model.attention_residual_offset + first
    if model.ffn_sizes:
        update["ffn_sizes"] = model.ffn_sizes[first:]  # DeciLM: the stage's own MLP widths, the widest its ffn_size
        update["ffn_size"] = max(update["ffn_sizes"]) or model.ffn_size
    if model.indexer_types:
        # GLM-5.2: a stage that opens on 'shared' layers attends the top-k its predecessor's last full layer chose
        # (sent beside the hidden state; its int32 indices are not charged to the transfer).
        update["indexer_types"] = model.indexer_types[first:]
    if model.is_moe and not model.block_pattern:
        update["moe_first_dense_layers"] = 0
        update["moe_layer_step"] = 1
        update["moe_dense_layer_indices"] = [i - first for i in range(first, layers) if not model.layer_is_moe(i)]
    return ModelSpec.model_validate({**model.model_dump(), **update})


def check_pipeline(model: ModelSpec, pp: int) -> None:
    if pp < 1:
        raise InputError(f"--pp: must be >= 1 (got {pp})")
    if pp > model.num_layers:
        raise InputError(f"--pp: {pp} stages exceed the {model.num_layers} layers of {model.name}")


@dataclass(frozen=True)
class P2PLink:
    """One stage-to-stage hop: achievable bandwidth (bytes/s) and fixed latency (s)."""

    bytes_per_second: float
    base_seconds: float
    hop_seconds: float
    across_nodes: bool


def p2p_link(stage: System, pp: int) -> P2PLink:
    """The hop between stages: over the node's interconnect, or InfiniBand when the pipeline spans nodes."""
    gpu = stage.gpu
    interconnect = load_interconnect(gpu.interconnect)
    simple = interconnect.nccl.get("simple") or next(iter(interconnect.nccl.values()))
    if stage.tp * pp <= gpu.max_gpus_per_node:
        return P2PLink(gpu.link_bandwidth_bytes_per_second * gpu.efficiency.link, simple.base_latency_seconds,
                       simple.hop_latency_seconds, False)
    network = NET_BYTES_PER_SECOND.get(interconnect.name, NET_BYTES_PER_SECOND_DEFAULT)
    return P2PLink(network * gpu.efficiency.link, simple.base_latency_seconds, NET_HOP_SECONDS, True)


@dataclass(frozen=True)
class PipelineSystem:
    """A model on ``pp`` stages of ``stage.tp`` GPUs: costs an iteration as in the module docstring.

    ``model`` is the whole model (for reports); everything else a System has (GPU, precision, tp,
    operators of a stage, ...) is the stage's.
    """

    stage: System
    model: ModelSpec
    pp: int
    link: P2PLink = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "link", p2p_link(self.stage, self.pp))

    def __getattr__(self, name: str) -> Any:
        if name == "stage":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.stage, name)

    def micro_batches(self, step: Step) -> Number:
        """min(pp, sequences), at least 1."""
        return np.minimum(self.pp, np.maximum(step.sequences, 1.0))

    def message_bytes(self, part: Step) -> Number:
        """One hop's message per GPU: a micro-batch's hidden states (tokens x hidden x activation bytes), and under
        Attention Residuals the block snapshots taken before the stage (vLLM's Kimi-K3 sends its block_residual
        beside the hidden states), counted at the last hop's number for every hop (an upper bound)."""
        stage, block = self.stage.model, self.model.attention_residual_block
        snapshots = -(-stage.attention_residual_offset // block) if block else 0
        return part.tokens * self.model.hidden_size * (1 + snapshots) * self.stage.precision.activation_bytes_per_element

    def p2p_seconds(self, part: Step) -> Number:
        """One hop of a micro-batch's message (:meth:`message_bytes`)."""
        return point_to_point_seconds(self.message_bytes(part), self.link.bytes_per_second, self.link.base_seconds,
                                      self.link.hop_seconds)

    def step_totals(self, step: Step) -> StepTotals:
        """Totals of one iteration on one GPU of a stage (see the module docstring)."""
        parts = self.micro_batches(step)
        part = self.stage.step_totals(micro_batch(step, parts))
        whole = self.stage.step_totals(step)  # only for the host time per iteration (once, not per micro-batch)
        slots = pipeline_slots(self.pp, parts)
        hops = (self.pp - 1) * self.p2p_seconds(micro_batch(step, parts))
        gpu = (part.compute_bound_seconds + part.memory_bound_seconds + part.communication_seconds
               + part.launch_wait_seconds)
        return StepTotals(
            seconds=slots * gpu + hops + whole.overhead_seconds,
            flops=parts * part.flops,
            bytes=parts * part.bytes,
            compute_bound_seconds=slots * part.compute_bound_seconds,
            memory_bound_seconds=slots * part.memory_bound_seconds,
            communication_seconds=slots * part.communication_seconds + hops,
            launch_wait_seconds=slots * part.launch_wait_seconds,
        )

    def step_cost(self, step: Step) -> StepCost:
        """Per-operator cost of one iteration on one GPU of a stage: each operator's time over the m + p - 1 slots,
        its FLOPs and bytes over the m micro-batches, plus the stage-to-stage transfers as one operator."""
        parts = self.micro_batches(step)
        part_step = micro_batch(step, parts)
        part = self.stage.step_cost(part_step)
        whole = self.stage.step_cost(step)
        slots = pipeline_slots(self.pp, parts)
        work = ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "activation_bytes", "link_bytes",
                "dequant_ops")
        time = ("launches", "compute_seconds", "memory_seconds", "link_seconds", "seconds", "launch_seconds",
                "host_seconds")
        operators = [op._replace(**{name: getattr(op, name) * parts for name in work},
                                 **{name: getattr(op, name) * slots for name in time}) for op in part.operators]
        message = self.message_bytes(part_step)
        hops = (self.pp - 1) * self.p2p_seconds(part_step)
        zero = 0.0 * hops
        operators.append(OperatorCost(
            name="pipeline_p2p", kind=P2P_KIND, count=self.pp - 1, flops=zero, weight_bytes=zero, kv_read_bytes=zero,
            kv_write_bytes=zero, activation_bytes=zero, link_bytes=parts * message, launches=zero, compute_seconds=zero,
            memory_seconds=zero, link_seconds=hops, seconds=hops))
        return StepCost(tuple(operators), whole.overhead_seconds, slots * part.launch_wait_seconds)

    def step_seconds(self, step: Step) -> float:
        """Wall time of one iteration of ``step`` (a scalar step)."""
        return float(self.step_totals(step).seconds)

    def describe(self) -> str:
        return f"{self.stage.describe()}, {self.pp} pipeline stages"
