"""What a serving engine adds to the GPU's step time: host CPU work and graph capture. Pure functions.

Host time of one iteration (scheduling, input preparation, sampling bookkeeping, output
processing; the profile's ``cpu`` block, sources in ``configs/engines/*.yaml``):

    cpu = fixed + per_sequence * sequences + per_token * tokens      (0 for an empty step)

where a loop that launches GPU kernels for one sequence at a time (TGI's per-request token
bookkeeping and sampling) adds its launches to ``per_sequence``: ``kernels_per_sequence`` (plus
``kernels_per_sampled_sequence`` when the requests sample) at ``graphs.eager_launch_seconds`` each
(:func:`per_sequence_seconds`).

A fraction ``f = cpu.overlap`` of it runs while the GPU computes the step (SGLang's and
TensorRT-LLM's overlap schedulers, vLLM's async scheduling: f = 1); the rest stalls the GPU. The
iteration therefore lasts its GPU time plus

    exposed = (1 - f) * cpu + max(0, f * cpu - gpu_seconds)

(a fully overlapped engine costs nothing until its CPU work outgrows the GPU's step). An engine
whose loop is synchronous except for one part it runs while the GPU computes the next iteration
(the profile's ``async_cpu``: vLLM 0.6's asynchronous output processing, vllm-project/vllm PR
#7049) adds that part the same way, ``max(0, async - gpu_seconds)``.

Multi-step scheduling (``scheduler_steps`` N > 1; vLLM 0.6's ``--num-scheduler-steps``, PR #7000):
the engine schedules, prepares inputs and processes outputs once for N decode steps, which the
GPU runs back to back, so a decode-only iteration pays ``cpu / N`` (both parts); an iteration with
prefill tokens starts a new pass and pays it whole.

CUDA graphs: a step is replayed from a captured graph when the engine captures (not
``enforce_eager``), the step has at most ``graphs.max_batch`` tokens, and it is decode-only or the
engine captures mixed steps too (vLLM V1's piecewise graphs). Captured kernels cost
``efficiency.kernel_launch_seconds`` each on the GPU; the others also wait for the host to launch
them, ``graphs.eager_launch_seconds`` each (:mod:`simulator.cost.step_cost` charges both).

Inputs may be numpy arrays (one entry per step, as the engine's decode stretches): all arithmetic
is elementwise.
"""

from __future__ import annotations

import numpy as np

from simulator.model.engine_profile import EngineProfile, HostWork
from simulator.model.step import Number, Step


def iteration_cpu_seconds(profile: EngineProfile, sequences: Number, tokens: Number,
                          work: HostWork | None = None) -> Number:
    """Host seconds of one iteration of ``sequences`` sequences and ``tokens`` new tokens (0 when empty).

    ``work``: which host work (default: the profile's ``cpu``; its ``async_cpu`` for that part).
    """
    cpu = profile.cpu if work is None else work
    per_sequence = per_sequence_seconds(profile) if work is None else cpu.per_sequence_seconds
    seconds = cpu.fixed_seconds + per_sequence * sequences + cpu.per_token_seconds * tokens
    if isinstance(seconds, np.ndarray) or isinstance(sequences, np.ndarray):
        return np.where(sequences > 0, seconds, 0.0)
    return seconds if sequences > 0 else 0.0


def per_sequence_launches(profile: EngineProfile) -> float:
    """Kernels the engine loop launches for each sequence every iteration, one sequence at a time."""
    cpu = profile.cpu
    return cpu.kernels_per_sequence + (cpu.kernels_per_sampled_sequence if profile.sampling else 0.0)


def per_sequence_seconds(profile: EngineProfile) -> float:
    """The loop's host seconds per sequence: ``cpu.per_sequence_seconds`` plus its per-sequence launches."""
    return profile.cpu.per_sequence_seconds + per_sequence_launches(profile) * profile.graphs.eager_launch_seconds


def exposed_seconds(profile: EngineProfile, cpu_seconds: Number, gpu_seconds: Number) -> Number:
    """The part of ``cpu_seconds`` the GPU waits for: ``(1 - f) cpu + max(0, f cpu - gpu)``."""
    overlap = profile.cpu.overlap
    if not overlap:
        return cpu_seconds
    return (1.0 - overlap) * cpu_seconds + _beyond(overlap * cpu_seconds, gpu_seconds)


def _beyond(host_seconds: Number, gpu_seconds: Number) -> Number:
    """``max(0, host - gpu)``: the part of host work run alongside the GPU's step that outlasts it."""
    excess = host_seconds - gpu_seconds
    if isinstance(excess, np.ndarray):
        return np.maximum(excess, 0.0)
    return excess if excess > 0 else 0.0


def iteration_overhead_seconds(profile: EngineProfile, sequences: Number, tokens: Number,
                               gpu_seconds: Number, decode_only: Number = False) -> Number:
    """Seconds an iteration lasts beyond its GPU time: the exposed host CPU work (module docstring).

    ``decode_only``: the iteration has no prefill tokens (multi-step scheduling then shares its host work).
    """
    share = _pass_share(profile, decode_only)
    seconds = exposed_seconds(profile, share * iteration_cpu_seconds(profile, sequences, tokens), gpu_seconds)
    if profile.async_cpu is None:
        return seconds
    return seconds + _beyond(share * iteration_cpu_seconds(profile, sequences, tokens, profile.async_cpu), gpu_seconds)


def _pass_share(profile: EngineProfile, decode_only: Number) -> Number:
    """The share of a loop pass's host work one iteration pays: 1/N for decode-only ones under N-step scheduling."""
    steps = profile.scheduler_steps
    if steps == 1:
        return 1.0
    if isinstance(decode_only, np.ndarray):
        return np.where(decode_only, 1.0 / steps, 1.0)
    return 1.0 / steps if decode_only else 1.0


def graph_captured(profile: EngineProfile, step: Step) -> Number:
    """True where ``step`` is replayed from a CUDA graph (module docstring); an array for array steps."""
    graphs = profile.graphs
    if profile.enforce_eager or graphs.max_batch <= 0:
        return False if not isinstance(step.tokens, np.ndarray) else np.zeros(np.shape(step.tokens), dtype=bool)
    fits = step.tokens <= graphs.max_batch
    if graphs.mixed:
        return fits
    return fits & (step.prefill_tokens <= 0)


def has_overhead(profile: EngineProfile) -> bool:
    """Does the profile add any host time per iteration (the cost model skips the work when not)?"""
    return bool(per_sequence_seconds(profile)) or any(
        work is not None and bool(work.fixed_seconds or work.per_sequence_seconds or work.per_token_seconds)
        for work in (profile.cpu, profile.async_cpu))
