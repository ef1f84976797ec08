"""``explain`` checks its advice: the run simulated, and each lever re-simulated on the same workload.

The levers of :mod:`simulator.report.explain` are measured on one decode step. A whole run is more
than that step: a closed batch of long prompts spends most of its GPU time in prefill, where a
decode-only lever does little. So explain also simulates the run itself (through
:func:`simulator.plan.run.simulate_settings`, the engine every run goes through) and each lever as
a change of one setting (``batch``, ``attention``, ``weights``, ``kv``, ``tp``, ``speculative``,
``disaggregate``) on the same closed batch, and reports:

- the run's phase mix: the share of its GPU time spent on prefill and on decode, from its own
  iteration log (a mixed iteration's time is shared between its prefill tokens and its decoding
  sequences in proportion to their counts: in such an iteration every token goes through the same
  compute-bound GEMMs);
- how many sequences of the full context the engine's paged KV cache holds at once: its blocks
  over the blocks one sequence holds at its longest (``ctx - 1`` cached tokens: the last generated
  token is never written to the cache), as the engine admits them;
- for each lever, the simulated gain: output tokens/s per GPU of the lever's run over the run's
  (the whole run, prefill included), and the mean TPOT of the run over the lever's.

The workload is the run's own closed batch, capped at :data:`MAX_SIMULATED_BATCH` requests so that
explain stays fast (each re-simulation takes milliseconds to a fraction of a second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine.kvcache import blocks_for
from simulator.errors import InputError
from simulator.plan.engine_run import EngineRun
from simulator.plan.result import gpus_of
from simulator.plan.run import simulate_settings

MAX_SIMULATED_BATCH = 2048
"""Most requests in a re-simulated closed batch: a larger batch is simulated as this many (same lengths)."""


@dataclass(frozen=True)
class PhaseMix:
    """GPU time of a run by phase, seconds (summed over iterations of one replica)."""

    prefill_seconds: float
    decode_seconds: float

    @property
    def prefill_share(self) -> float:
        total = self.prefill_seconds + self.decode_seconds
        return self.prefill_seconds / total if total > 0 else 0.0

    @property
    def decode_share(self) -> float:
        total = self.prefill_seconds + self.decode_seconds
        return self.decode_seconds / total if total > 0 else 0.0


def phase_mix(run: EngineRun) -> PhaseMix:
    """Prefill and decode seconds of ``run`` from its iteration log (see the module docstring)."""
    log = run.result.log
    if not log.size:
        return PhaseMix(0.0, 0.0)
    seconds = np.asarray(log["seconds"], dtype=float)
    prefill = np.asarray(log["prefill_tokens"], dtype=float)
    decodes = np.asarray(log["decode_seqs"], dtype=float)
    tokens = prefill + decodes
    prefill_part = np.divide(prefill, tokens, out=np.zeros_like(seconds), where=tokens > 0)
    prefill_seconds = float((seconds * prefill_part).sum())
    return PhaseMix(prefill_seconds, float(seconds.sum()) - prefill_seconds)


def sequences_that_fit(run: EngineRun, ctx: int) -> int:
    """Sequences of ``ctx`` tokens the run's paged KV cache holds at once: its blocks over the blocks of one
    sequence at its longest (``ctx - 1`` cached tokens)."""
    capacity = run.capacity
    return capacity.blocks // blocks_for(max(1, ctx - 1), capacity.block_size)


@dataclass(frozen=True)
class RunFigures:
    """What explain compares between two simulated runs."""

    tokens_per_second_per_gpu: float
    """output tokens/s of the whole run over its GPUs"""
    tpot_seconds: float
    """mean time per output token"""
    gpus: int


def figures(run: EngineRun) -> RunFigures:
    m = run.metrics
    gpus = gpus_of(run)
    rate = m.output_tokens / m.duration_seconds / gpus if m.duration_seconds > 0 else 0.0
    return RunFigures(float(rate), float(m.tpot.mean), gpus)


@dataclass(frozen=True)
class LeverRun:
    """A lever re-simulated: its gains on the whole run, or why it was not simulated."""

    throughput_gain: float | None
    latency_gain: float | None
    note: str = ""


def _ratio(numerator: float, denominator: float) -> float | None:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or numerator <= 0 or denominator <= 0:
        return None
    return numerator / denominator


def simulated_batch(batch: int) -> int:
    return min(batch, MAX_SIMULATED_BATCH)


def simulate_base(settings: dict[str, Any]) -> EngineRun:
    """The run explain explains, simulated (InputError when it cannot run)."""
    return simulate_settings({**settings, "batch": simulated_batch(int(settings["batch"]))})


def simulate_lever(base: EngineRun, base_settings: dict[str, Any], change: dict[str, Any] | None) -> LeverRun:
    """The run with ``change`` applied to its settings, against ``base`` (``change`` None: not a setting)."""
    if change is None:
        return LeverRun(None, None, "not a setting of a run; not simulated")
    settings = {**base_settings, **change}
    settings["batch"] = simulated_batch(int(settings["batch"]))
    try:
        run = simulate_settings(settings)
    except InputError as exc:
        return LeverRun(None, None, f"not simulated: {exc}")
    ours, theirs = figures(base), figures(run)
    return LeverRun(_ratio(theirs.tokens_per_second_per_gpu, ours.tokens_per_second_per_gpu),
                    _ratio(ours.tpot_seconds, theirs.tpot_seconds))


def diluted_gain(decode_gain: float, mix: PhaseMix) -> float:
    """A decode-step gain on the whole run (Amdahl): only the decode share of its time gets faster."""
    if decode_gain <= 0 or not math.isfinite(decode_gain):
        return decode_gain
    return 1.0 / (mix.prefill_share + mix.decode_share / decode_gain)
