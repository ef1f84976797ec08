"""Choosing a deployment: build the System at the requested (or smallest fitting) tensor-parallel degree."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model.gpu import GPUSpec
from simulator.model.architecture import ModelSpec
from simulator.model.precision import Precision
from simulator.errors import InputError
from simulator.model.layers import AttentionKernel, Fusion
from simulator.cost.memory import MemoryPlan, no_fit_error, plan_memory, tensor_parallel_candidates
from simulator.cost.system import System


@dataclass(frozen=True)
class Deployment:
    """A built System with its memory plan; ``auto_tp`` says the TP degree was chosen for the user."""

    system: System
    memory: MemoryPlan
    auto_tp: bool

    @property
    def note(self) -> str:
        if not self.auto_tp or self.system.tp == 1:
            return ""
        return (
            f"does not fit on one {self.system.gpu.name}; using the smallest tensor-parallel degree "
            f"that fits: --tp {self.system.tp}"
        )


def check_gen_tokens(gen_tokens: int, context_tokens: int) -> None:
    """``--gen`` output tokens must be >= 1 and leave a prompt within ``--ctx`` tokens."""
    if gen_tokens < 1:
        raise InputError(f"--gen: must be >= 1 (got {gen_tokens})")
    if gen_tokens >= context_tokens:
        raise InputError(
            f"--gen: {gen_tokens} output tokens leave no prompt within --ctx {context_tokens}; "
            f"--gen must be < --ctx"
        )


def plan_deployment(
    model: ModelSpec,
    gpu: GPUSpec,
    precision: Precision,
    batch: int,
    context_tokens: int,
    tp: int | None = None,
    attention_kernel: AttentionKernel = "flash",
    fusion: Fusion = "elementwise",
    require_fit: bool = True,
) -> Deployment:
    """The System for ``batch`` sequences reaching ``context_tokens`` each.

    With ``tp`` given, that degree is used and (when ``require_fit``) an InputError names the
    GiB needed vs available if it does not fit. With ``tp`` None, the smallest power of two
    dividing the heads and KV heads that fits is chosen.
    """
    if batch < 1:
        raise InputError(f"--batch: must be >= 1 (got {batch})")
    if context_tokens < 1:
        raise InputError(f"--ctx: must be >= 1 (got {context_tokens})")
    if context_tokens > model.max_context:
        raise InputError(
            f"--ctx: {context_tokens} tokens exceeds the maximum context of {model.name} ({model.max_context} tokens)"
        )

    def build(degree: int) -> Deployment:
        system = System(model, gpu, precision, degree, attention_kernel, fusion)
        plan = plan_memory(model, precision, gpu, degree, batch, context_tokens, system.operators)
        return Deployment(system, plan, auto_tp=tp is None)

    if tp is not None:
        deployment = build(tp)
        if require_fit and not deployment.memory.fits:
            raise InputError(f"{model.name} on {tp}x {gpu.name} does not fit: {deployment.memory.shortfall_message()}")
        return deployment
    candidates = tensor_parallel_candidates(model, gpu)
    deployment = None
    for degree in candidates:
        deployment = build(degree)
        if deployment.memory.fits:
            return deployment
    assert deployment is not None  # tp = 1 is always a candidate
    if require_fit:
        raise no_fit_error(model, gpu, deployment.memory, candidates)
    return deployment
