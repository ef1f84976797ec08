"""The closed-form run of a closed batch: prefill together, then decode in lockstep.

``batch`` sequences each reach ``context_tokens`` tokens at the end: the prompt is
``context_tokens - gen_tokens`` long. Prefill emits the first output token; decode step k
(k = 1 .. gen-1) feeds output token k back and attends ``prompt + k`` keys. Hence

    TTFT = prefill seconds,  e2e = TTFT + sum of decode steps,  TPOT = (e2e - TTFT) / (gen - 1).

The decode steps are costed in one vectorised call (numpy over steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cost.deployment import Deployment, check_gen_tokens
from simulator.cost.step_cost import StepCost
from simulator.model.step import Step


@dataclass(frozen=True)
class BatchRun:
    """Result of :func:`run_batch`; seconds, FLOPs and bytes are per GPU unless named otherwise."""

    deployment: Deployment
    batch: int
    context_tokens: int
    gen_tokens: int
    prefill: StepCost
    decode_first: StepCost
    decode_last: StepCost
    decode_seconds_total: float
    decode_flops_total: float
    decode_bytes_total: float

    @property
    def prompt_tokens(self) -> int:
        return self.context_tokens - self.gen_tokens

    @property
    def decode_steps(self) -> int:
        return self.gen_tokens - 1

    @property
    def ttft_seconds(self) -> float:
        return float(self.prefill.seconds)

    @property
    def e2e_seconds(self) -> float:
        return self.ttft_seconds + self.decode_seconds_total

    @property
    def tpot_seconds(self) -> float:
        if self.decode_steps == 0:
            return 0.0
        return self.decode_seconds_total / self.decode_steps

    @property
    def output_tokens_per_second(self) -> float:
        return self.batch * self.gen_tokens / self.e2e_seconds

    @property
    def total_tokens_per_second(self) -> float:
        return self.batch * self.context_tokens / self.e2e_seconds


def run_batch(deployment: Deployment, batch: int, context_tokens: int, gen_tokens: int) -> BatchRun:
    """Cost a closed batch analytically (see module docstring)."""
    check_gen_tokens(gen_tokens, context_tokens)
    system = deployment.system
    prompt = context_tokens - gen_tokens
    prefill = system.step_cost(Step.prefill(batch, prompt))
    steps = max(gen_tokens - 1, 1)
    contexts = prompt + np.arange(1, steps + 1, dtype=float)
    decode = system.step_cost(Step.decode(float(batch), contexts))
    if gen_tokens > 1:
        seconds, flops, moved = float(np.sum(decode.seconds)), float(np.sum(decode.flops)), float(np.sum(decode.bytes))
    else:
        seconds = flops = moved = 0.0
    return BatchRun(
        deployment=deployment,
        batch=batch,
        context_tokens=context_tokens,
        gen_tokens=gen_tokens,
        prefill=prefill,
        decode_first=system.step_cost(Step.decode(batch, prompt + 1)),
        decode_last=system.step_cost(Step.decode(batch, prompt + steps)),
        decode_seconds_total=seconds,
        decode_flops_total=flops,
        decode_bytes_total=moved,
    )
