"""Explanations in words: why a run is as fast as it is, and which lever moves it most.

``explain_run`` looks at the last decode step of a closed batch (and its prefill):
which operators are memory-bound, the weight GEMMs' arithmetic intensity against the
ridge point, the batch at which those GEMMs would become compute-bound, and what the
KV-cache reads cost. It then *measures* the levers with the same cost model, at the same
tensor-parallel degree unless the lever is more GPUs:

- bigger batch: the larger of 2x the batch and the ridge batch, capped by memory;
- fewer KV heads: MHA -> GQA-8, GQA-g (g > 8) -> GQA-8, GQA -> MQA (a model change);
- lower precision: int4 weight-only, fp8 weights (where the GPU has fp8), fp8 KV cache;
- more GPUs: twice the tensor-parallel degree.

The biggest lever for throughput (decode tokens/s of the deployment) and for latency
(decode step time) are named. ``kernel_choices`` shows, per layer, the attention bytes
of both kernels and the kernels and activation bytes of each fusion level
(simulator.report.kernel_choices).

With the run's settings, explain also checks its advice on the run itself, simulated, and on each
lever re-simulated (simulator.report.explain_simulated): the run's phase mix, the sequences its
paged KV cache holds, and each lever's gain on the whole run, by which the levers are ranked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from simulator.cost.collectives import collective_path
from simulator.cost.deployment import Deployment
from simulator.cost.kv_transfer import kv_link, kv_transfer_seconds
from simulator.cost.memory import kv_bytes_per_sequence
from simulator.cost.speculation import SpeculativeSystem
from simulator.cost.step_cost import StepCost
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec, with_attention
from simulator.model.parallelism import check_tensor_parallel
from simulator.model.step import Step
from simulator.plan.engine_run import EngineRun
from simulator.plan.settings import SpeculativeSettings
from simulator.plan.speculative_run import draft_system
from simulator.report.compare import max_batch_that_fits
from simulator.report.explain_simulated import (
    PhaseMix,
    diluted_gain,
    figures,
    phase_mix,
    sequences_that_fit,
    simulate_base,
    simulate_lever,
)
from simulator.units import fmt_bytes, fmt_seconds

# Operators outside the repeated decoder layer.
NOT_IN_LAYER = frozenset({"embedding", "final_norm", "lm_head"})
# Largest batch the ridge search tries.
RIDGE_BATCH_LIMIT = 1 << 16


@dataclass(frozen=True)
class Lever:
    """One alternative, measured: decode step at its batch and decode tokens/s (whole deployment and per GPU).

    ``throughput_gain`` compares tokens/s per GPU (what a fleet pays for); ``latency_gain`` the step time.
    """

    lever: str
    change: str
    batch: int
    tp: int
    step_seconds: float
    tokens_per_second: float
    throughput_gain: float
    latency_gain: float
    caveat: str = ""
    latency_only: bool = False
    """measured for latency only (disaggregation: its tokens/s per GPU depends on the pools, not on one step)"""
    run_change: dict[str, Any] | None = None
    """the settings a run changes to pull this lever (None: not a setting of a run, e.g. an engine's own behaviour)"""
    simulated_throughput_gain: float | None = None
    """output tokens/s per GPU of the whole run with the lever over without, both simulated (None: not simulated)"""
    simulated_latency_gain: float | None = None
    """mean TPOT of the run without the lever over with it, both simulated (None: not simulated)"""
    run_gain: float | None = None
    """the gain on the whole run explain ranks by: the simulated one, else the decode-step gain diluted by the
    run's phase mix (only the decode share of its time gets faster); None when the run was not simulated"""
    simulated_note: str = ""

    @property
    def tokens_per_second_per_gpu(self) -> float:
        return self.tokens_per_second / self.tp


@dataclass(frozen=True)
class Explanation:
    paragraph: str
    facts: dict[str, Any]
    levers: tuple[Lever, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"paragraph": self.paragraph, "facts": self.facts, "levers": [asdict(lever) for lever in self.levers]}


def _gemms(cost: StepCost) -> list:
    return [op for op in cost.operators if op.kind == "gemm"]


def gemm_intensity(cost: StepCost) -> float:
    """FLOPs over HBM bytes of all weight GEMMs of a step together, FLOP/byte."""
    gemms = _gemms(cost)
    return float(sum(op.flops for op in gemms)) / float(sum(op.bytes for op in gemms))


def _gemms_compute_bound(system: System, batch: int, context_tokens: int) -> bool:
    gemms = _gemms(system.step_cost(Step.decode(batch, context_tokens)))
    return sum(float(op.compute_seconds) for op in gemms) >= sum(float(op.memory_seconds) for op in gemms)


def ridge_batch(system: System, context_tokens: int) -> int | None:
    """Smallest decode batch at which the weight GEMMs' compute time reaches their memory time (efficiencies and dequantisation included)."""
    if _gemms_compute_bound(system, 1, context_tokens):
        return 1
    low, high = 1, 2
    while not _gemms_compute_bound(system, high, context_tokens):
        low, high = high, high * 2
        if high > RIDGE_BATCH_LIMIT:
            return None
    while high - low > 1:  # low memory-bound, high compute-bound
        mid = (low + high) // 2
        if _gemms_compute_bound(system, mid, context_tokens):
            high = mid
        else:
            low = mid
    return high


def _step(system: System, batch: int, context_tokens: int) -> float:
    return float(system.step_seconds(Step.decode(batch, context_tokens)))


def _lever(name: str, change: str, system: System, batch: int, ctx: int, base_step: float, base_rate: float,
           caveat: str = "") -> Lever | None:
    """The lever measured, or None when its step time is not a positive finite number (nothing to compare)."""
    step = _step(system, batch, ctx)
    if not (math.isfinite(step) and step > 0):
        return None
    rate = batch / step
    return Lever(name, change, batch, system.tp, step, rate, (rate / system.tp) / base_rate, base_step / step, caveat)


def _changed(lever: Lever | None, **change: Any) -> Lever | None:
    """``lever`` with the settings a run changes to pull it."""
    return None if lever is None else replace(lever, run_change=change)


def _usable_step(seconds: float, system: System) -> float:
    """``seconds`` if it is a positive finite time; else InputError (only absurd efficiencies get here)."""
    if math.isfinite(seconds) and seconds > 0:
        return seconds
    eff = system.gpu.efficiency
    raise InputError(
        f"explain: the decode step time is {seconds:g} s with efficiencies compute {eff.compute:g}, memory {eff.memory:g}, "
        f"link {eff.link:g}; nothing can be explained (give efficiencies of 0.001 or more)"
    )


def rebuild_system(system: System, **changes: Any) -> System | None:
    """The system with some fields changed, or None where that combination is not valid."""
    fields = {"model": system.model, "gpu": system.gpu, "precision": system.precision, "tp": system.tp,
              "attention_kernel": system.attention_kernel, "fusion": system.fusion, "engine": system.engine,
              "collectives": system.collectives, "kernel_efficiency": system.kernel_efficiency, **changes}
    try:
        check_tensor_parallel(fields["model"], fields["tp"])
        return System(**fields)
    except InputError:
        return None


def single_stage_system(deployment: Deployment) -> System:
    """The deployment's System. The levers are measured by rebuilding it with one field changed, which a
    pipeline's stage (a PipelineSystem) cannot be, so a pipeline-parallel deployment is refused."""
    system = deployment.system
    if not isinstance(system, System):
        raise InputError(f"explain: a pipeline-parallel deployment (--pp {deployment.pp}) cannot be explained; use --pp 1")
    return system


def measure_levers(deployment: Deployment, batch: int, ctx: int, largest_batch: int, ridge: int | None,
                   speculative: SpeculativeSettings | None = None, gen: int = 1,
                   configured: ModelSpec | None = None) -> list[Lever]:
    """The levers, each measured with the cost model. ``configured``: the model as its config has it, when the
    engine runs it otherwise (an engine that ignores its sliding window: the window is then a lever)."""
    system = single_stage_system(deployment)
    model, gpu, precision = system.model, system.gpu, system.precision
    base_step = _usable_step(_step(system, batch, ctx), system)
    base_rate = batch / base_step / system.tp  # decode tokens/s per GPU
    levers: list[Lever | None] = []
    target = min(largest_batch, max(2 * batch, ridge or 0))
    if target > batch:
        levers.append(_changed(_lever("bigger batch", f"batch {target}", system, target, ctx, base_step, base_rate,
                                      "raises each token's latency"), batch=target))
    g, n = model.num_kv_heads, model.num_heads
    fewer = 8 if g > 8 and n % 8 == 0 else 1 if g > 1 else None
    # A latent (MLA) or compressed (DeepSeek-V4) cache has no MHA/MQA/GQA variant (with_attention): no such lever.
    if fewer is not None and not (model.is_mla or model.compress_ratios):
        spelled = "mqa" if fewer == 1 else f"gqa:{fewer}"
        variant = with_attention(model, spelled)
        other = rebuild_system(system, model=variant)
        if other is not None:
            levers.append(_changed(_lever("fewer KV heads", variant.attention_kind, other, batch, ctx, base_step, base_rate,
                                          "a model change: needs a model trained or uptrained that way"), attention=spelled))
    options = []
    if precision.weight_bytes_per_element >= 2:
        options.append(("int4 weights (weight-only)", {"weights": "int4"}))
        if "fp8" in gpu.peak_flops:
            options.append(("fp8 weights (W8A8)", {"weights": "fp8"}))
    if precision.kv_bytes_per_element >= 2:
        options.append(("fp8 KV cache", {"kv": "fp8"}))
    for label, change in options:
        other = rebuild_system(system, precision=precision.model_copy(update=change))
        if other is not None:
            levers.append(_changed(_lever("lower precision", label, other, batch, ctx, base_step, base_rate,
                                          "accuracy to be checked"), **change))
    wider = rebuild_system(system, tp=2 * system.tp) if 2 * system.tp <= gpu.max_gpus_per_node else None
    if wider is not None:
        lever = _lever("more GPUs", f"tensor parallel {2 * system.tp}", wider, batch, ctx, base_step, base_rate)
        if lever is not None:
            levers.append(replace(lever, caveat=f"{2 * lever.throughput_gain:.2f}x the deployment's tokens/s on 2x the GPUs",
                                  run_change={"tp": 2 * system.tp}))
    levers.append(window_lever(system, configured, batch, ctx, base_step, base_rate))
    levers.append(speculative_lever(system, batch, ctx, base_step, base_rate, speculative))
    levers.append(disaggregation_lever(system, batch, ctx, gen, base_step))
    return [lever for lever in levers if lever is not None]


def window_lever(system: System, configured: ModelSpec | None, batch: int, ctx: int, base_step: float,
                 base_rate: float) -> Lever | None:
    """The model's own sliding window, where the engine attends the whole context instead (None otherwise)."""
    if configured is None or configured.sliding_window is None or system.engine.honours_sliding_window:
        return None
    honouring = system.engine.model_copy(update={"honours_sliding_window": True})
    other = rebuild_system(system, model=configured, engine=honouring)
    if other is None:
        return None
    return _lever("sliding window", f"attend {configured.name}'s {configured.sliding_window}-token window", other, batch,
                  ctx, base_step, base_rate,
                  f"an engine setting: the {system.engine.name} engine attends the whole context (TensorRT-LLM: give "
                  "max_attention_window_size)")


DEFAULT_SPECULATION = SpeculativeSettings(speculative="eagle", num_speculative_tokens=1, acceptance="0.85")
"""The speculation explain measures when none is asked for: a one-layer draft head (EAGLE, DeepSeek MTP) drafting
one token accepted 85% of the time, the low end of DeepSeek-V3's measured MTP acceptance (0.85-0.90, DeepSeek-V3
technical report, section 5.4.3)."""


def speculative_lever(system: System, batch: int, ctx: int, base_step: float, base_rate: float,
                      settings: SpeculativeSettings | None) -> Lever | None:
    """Speculative decoding (simulator.cost.speculation): an iteration's time per expected token as the step."""
    given = settings is not None and settings.speculative is not None
    chosen = settings if given and settings is not None else DEFAULT_SPECULATION
    try:
        method, name, draft = draft_system(chosen, system)
    except InputError:
        return None
    spec = SpeculativeSystem(system, draft, method, chosen.acceptance_rates, name)
    iteration = float(spec.step_seconds(Step.decode(batch, ctx)))
    tokens = spec.expected_tokens
    step = iteration / tokens
    if not (math.isfinite(step) and step > 0):
        return None
    rate = batch / step
    what = f"draft {name}" if method == "draft" else f"{method} head"
    caveat = (f"{tokens:.2f} tokens per {fmt_seconds(iteration)} iteration"
              + ("" if given else "; assumes a trained draft head accepted 85% of the time (DeepSeek-V3's MTP: 85-90%)"))
    return Lever("speculative decoding", f"{what}, k {spec.tokens}", batch, system.tp, step, rate,
                 (rate / system.tp) / base_rate, base_step / step, caveat,
                 run_change={"speculative": chosen.speculative, "num_speculative_tokens": spec.tokens,
                             "acceptance": chosen.acceptance})


def disaggregation_lever(system: System, batch: int, ctx: int, gen: int, base_step: float) -> Lever | None:
    """Disaggregated prefill/decode: the decode step alone against one that carries a prefill chunk.

    Colocated under chunked prefill (the engine profile's token budget) a decode iteration that a new
    prompt joins also runs a chunk of budget - batch prompt tokens; without a budget the decodes wait
    for the whole prefill. Moving prefill to its own GPUs leaves the decode step alone, at the price of
    sending each prompt's KV cache (simulator.cost.kv_transfer) over the node's links.
    """
    prompt = max(1, ctx - gen)
    budget = system.engine.scheduler.max_batched_tokens if system.engine.scheduler.kind == "chunked" else None
    if budget is None:
        stalled = float(system.step_seconds(Step.prefill(1, prompt))) + base_step
    else:
        chunk = min(prompt, budget - batch)
        if chunk < 1:
            return None
        stalled = float(system.step_seconds(Step.decode(batch, ctx) + Step.prefill(1, chunk, emits_token=chunk == prompt)))
    if not (math.isfinite(stalled) and stalled > base_step):
        return None
    link = kv_link(system.gpu, system.gpu, system.tp, system.tp, 2 * system.tp)
    moved = kv_bytes_per_sequence(system.model, system.precision, prompt)
    caveat = (f"the decode iterations that carry a prefill chunk go from {fmt_seconds(stalled)} to {fmt_seconds(base_step)} "
              f"(the TPOT tail); "
              f"needs prefill GPUs of its own (--disaggregate P:D) and sends {fmt_bytes(moved)} of KV per request "
              f"({fmt_seconds(float(kv_transfer_seconds(moved, link)))} over {link.name})")
    return Lever("disaggregate prefill", "prefill on separate GPUs", batch, system.tp, base_step, batch / base_step,
                 1.0, stalled / base_step, caveat, latency_only=True, run_change={"disaggregate": "1:1"})


def count_of(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _names(ops: list) -> str:
    return ", ".join(op.name for op in ops)


BEYOND_ROOFLINE_SHARE = 0.10
"""A term outside the roofline is named when it takes at least this share of the decode step."""


def beyond_roofline(system: System, decode: StepCost, step: float) -> dict[str, Any]:
    """The decode step's time outside the roofline (collectives, kernel launches, engine host CPU), and a
    sentence naming those that take :data:`BEYOND_ROOFLINE_SHARE` of the step or more."""
    communication = float(decode.communication_seconds) / step
    launch = float(decode.launch_seconds + decode.launch_wait_seconds) / step
    overhead = float(decode.overhead_seconds) / step
    parts = []
    if communication >= BEYOND_ROOFLINE_SHARE:
        calls = sum(int(op.count) for op in decode.operators if op.kind in ("allreduce", "alltoall"))
        gpu = system.gpu
        path = collective_path(gpu.interconnect, gpu.network, max(system.tp, system.ep), gpu.max_gpus_per_node)
        parts.append(f"{100 * communication:.0f}% in {count_of(calls, 'collective')} over {path} "
                     f"({system.collectives}; each about {fmt_seconds(float(decode.communication_seconds) / max(calls, 1))}, "
                     f"mostly fixed latency at this size)")
    if launch >= BEYOND_ROOFLINE_SHARE:
        waiting = " (mostly waiting for the host, outside a CUDA graph)" if float(
            decode.launch_wait_seconds) > float(decode.launch_seconds) else ""
        parts.append(f"{100 * launch:.0f}% launching {int(float(decode.launches)):,} kernels{waiting}")
    if overhead >= BEYOND_ROOFLINE_SHARE:
        parts.append(f"{100 * overhead:.0f}% waiting for {system.engine.name}'s host CPU work per iteration")
    text = ("Beyond the roofline: " + "; ".join(parts) + ".") if parts else ""
    return {"text": text, "communication_share": communication, "launch_share": launch,
            "engine_overhead_share": overhead}


def explain_run(deployment: Deployment, batch: int, ctx: int, gen: int,
                speculative: SpeculativeSettings | None = None, configured: ModelSpec | None = None,
                simulate: dict[str, Any] | None = None) -> Explanation:
    """One paragraph on the run's last decode step and prefill, with the levers measured (``configured``: see
    :func:`measure_levers`).

    ``simulate``: the settings of the run (RunSettings fields) to check the advice on: the run is simulated,
    the sequences that fit come from its paged KV cache, each lever is re-simulated and the levers are ranked
    by their simulated gain on the whole run (simulator.report.explain_simulated)."""
    if gen >= ctx:
        raise InputError(f"--gen: {gen} must be < --ctx {ctx} (the prompt is ctx - gen tokens)")
    system = single_stage_system(deployment)
    model, gpu, precision = system.model, system.gpu, system.precision
    dtype = precision.compute_dtype
    ridge = gpu.ridge_point(dtype)
    achievable_ridge = ridge * gpu.efficiency.compute_of_peak / gpu.efficiency.memory
    decode = system.step_cost(Step.decode(batch, ctx))
    prefill = system.step_cost(Step.prefill(batch, ctx - gen))
    step = _usable_step(float(decode.seconds), system)
    kernels = [op for op in decode.operators if op.kind != "allreduce" and op.bound not in ("fused", "idle")]
    memory_bound = [op for op in kernels if op.bound == "memory"]
    memory_share = sum(float(op.seconds) for op in memory_bound) / step
    # Name only the memory-bound operators that matter (1% of the step or more).
    named = [op for op in memory_bound if float(op.seconds) >= 0.01 * step]
    intensity = gemm_intensity(decode)
    attention = next(op for op in decode.operators if op.kind == "attention")
    attention_share = float(attention.seconds) / step
    kv_read_total = float(attention.kv_read_bytes) * system.tp
    prefill_intensity = gemm_intensity(prefill)
    prefill_bound = "compute-bound" if prefill_intensity >= achievable_ridge else "memory-bound"
    reach = ridge_batch(system, ctx)
    checked = _simulate_run(simulate, system, batch, ctx, gen)
    if checked.run is not None:
        largest = sequences_that_fit(checked.run, ctx)
        memory_words = "the engine's KV cache"
    else:
        largest = max_batch_that_fits(model, precision, gpu, system.tp, ctx, system)
        memory_words = "memory"
    levers = measure_levers(deployment, batch, ctx, largest, reach, speculative, gen, configured)
    if checked.run is not None:
        levers = _verified(levers, checked)

    where = f"{model.name} on {system.tp}x {gpu.name} ({precision.weights} weights, {precision.kv} KV cache)"
    text = [
        f"{where} at batch {batch}, context {ctx}: a decode step takes {fmt_seconds(step)}, "
        f"{100 * memory_share:.0f}% of it in memory-bound operators"
        + (f" ({_names(named)})." if named else ".")
    ]
    compute_bound = intensity >= achievable_ridge
    text.append(
        f"The weight GEMMs run at {intensity:.1f} FLOP/byte against a ridge point of {ridge:.0f} FLOP/byte "
        f"({gpu.peak(dtype) / 1e12:.0f} TFLOP/s {dtype} / {gpu.hbm_bandwidth_bytes_per_second / 1e12:.2f} TB/s; "
        f"{achievable_ridge:.0f} with the assumed efficiencies), "
        + ("so they are compute-bound." if compute_bound else
           f"so the tensor cores wait on memory ({intensity / achievable_ridge:.0%} of the way to the ridge).")
    )
    if reach is None:
        text.append("No batch up to 65536 makes them compute-bound.")
    elif reach > batch:
        fits = (f"which fits in {memory_words} (up to {count_of(largest, 'sequence')} of {count_of(ctx, 'token')})"
                if reach <= largest
                else f"more than the {count_of(largest, 'sequence')} of {count_of(ctx, 'token')} that fit in {memory_words}")
        limit = " (dequantising the weights on the CUDA cores becomes the limit)" if precision.weight_only_quant else ""
        text.append(f"They would turn compute-bound near batch {reach}{limit}, {fits}.")
    text.append(
        f"Attention reads {fmt_bytes(kv_read_total)} of KV cache per step at {float(attention.intensity):.1f} FLOP/byte "
        f"({100 * attention_share:.0f}% of the step); batching cannot raise that intensity, only fewer KV heads "
        f"(GQA/MQA) or a smaller KV dtype can."
    )
    text.append(
        f"Prefill of {batch} x {count_of(ctx - gen, 'token')} takes {fmt_seconds(float(prefill.seconds))} and is {prefill_bound} "
        f"(GEMMs at {prefill_intensity:.0f} FLOP/byte)."
    )
    beyond = beyond_roofline(system, decode, step)
    if beyond["text"]:
        text.append(beyond["text"])
    text.extend(_simulated_text(checked, largest, ctx))
    if levers:
        text.extend(_lever_text(levers, simulated=checked.run is not None))
    facts = {
        "decode_step_seconds": step,
        "memory_bound_share": memory_share,
        "memory_bound_operators": [op.name for op in memory_bound],
        "gemm_intensity_flop_per_byte": intensity,
        "ridge_flop_per_byte": ridge,
        "achievable_ridge_flop_per_byte": achievable_ridge,
        "ridge_batch": reach,
        "max_batch_that_fits": largest,
        "max_batch_that_fits_from": "engine KV cache" if checked.run is not None else "memory plan",
        "attention_kv_read_bytes": kv_read_total,
        "attention_share": attention_share,
        "prefill_seconds": float(prefill.seconds),
        "prefill_gemm_intensity_flop_per_byte": prefill_intensity,
        "communication_share": beyond["communication_share"],
        "launch_share": beyond["launch_share"],
        "engine_overhead_share": beyond["engine_overhead_share"],
        **_simulated_facts(checked),
    }
    return Explanation(" ".join(text), facts, tuple(levers))


@dataclass(frozen=True)
class _Checked:
    """The run explain checks its advice on (None where not asked for or it cannot run, with why)."""

    run: EngineRun | None = None
    settings: dict[str, Any] | None = None
    mix: PhaseMix | None = None
    note: str = ""


def _simulate_run(simulate: dict[str, Any] | None, system: System, batch: int, ctx: int, gen: int) -> _Checked:
    if simulate is None:
        return _Checked()
    settings = {**simulate, "tp": system.tp, "pp": 1, "batch": batch, "ctx": ctx, "gen": gen}
    try:
        run = simulate_base(settings)
    except InputError as exc:
        return _Checked(note=str(exc))
    return _Checked(run, settings, phase_mix(run))


def _verified(levers: list[Lever], checked: _Checked) -> list[Lever]:
    """Each lever re-simulated on the run's workload, ranked: throughput levers by their gain on the whole run
    (simulated, else the decode-step gain diluted by the phase mix), then those for latency only."""
    assert checked.run is not None and checked.settings is not None and checked.mix is not None
    out = []
    for lever in levers:
        result = simulate_lever(checked.run, checked.settings, lever.run_change)
        estimate = result.throughput_gain
        if estimate is None and not lever.latency_only:
            estimate = diluted_gain(lever.throughput_gain, checked.mix)
        out.append(replace(lever, simulated_throughput_gain=result.throughput_gain,
                           simulated_latency_gain=result.latency_gain, run_gain=estimate, simulated_note=result.note))
    return sorted(out, key=lambda lv: (lv.latency_only, -(lv.run_gain or 0.0)))


def _simulated_text(checked: _Checked, largest: int, ctx: int) -> list[str]:
    if checked.run is None:
        return [f"(The run itself could not be simulated: {checked.note})"] if checked.note else []
    run, mix = checked.run, checked.mix
    assert mix is not None
    cap = run.capacity
    requests = len(run.workload)
    shape = f"this closed batch of {count_of(requests, 'request')}"
    text = [f"Simulated, {shape} spends {100 * mix.prefill_share:.0f}% of its GPU time in prefill and "
            f"{100 * mix.decode_share:.0f}% in decode"]
    if mix.prefill_share > 0:
        text[0] += f", so a lever on the decode step alone moves the whole run by at most {1 / mix.prefill_share:.2f}x"
    text[0] += (f"; the engine's paged KV cache ({cap.blocks:,} blocks of {cap.block_size} tokens) holds "
                f"{count_of(largest, 'sequence')} of {count_of(ctx, 'token')} at once.")
    return text


def _lever_text(levers: list[Lever], simulated: bool) -> list[str]:
    text = []
    if simulated:
        by_throughput = [lv for lv in levers if not lv.latency_only and lv.run_gain is not None]  # already ranked
    else:
        by_throughput = sorted((lv for lv in levers if not lv.latency_only), key=lambda lv: lv.throughput_gain,
                               reverse=True)
    if by_throughput:
        best = by_throughput[0]
        if simulated:
            how = ("simulated" if best.simulated_throughput_gain is not None
                   else "estimated from the decode step and the phase mix")
            text.append(f"Biggest lever for throughput: {best.lever} ({best.change}: {best.run_gain:.2f}x output "
                        f"tokens/s per GPU on the whole run, {how}; {best.throughput_gain:.2f}x on the decode step alone"
                        + (f"; {best.caveat}" if best.caveat else "") + ")")
            if len(by_throughput) > 1:
                runner = by_throughput[1]
                text[-1] += f", then {runner.lever} ({runner.change}: {runner.run_gain:.2f}x)"
        else:
            text.append(
                f"Biggest lever for throughput: {best.lever} ({best.change}: {best.throughput_gain:.2f}x decode tokens/s "
                f"per GPU, step {fmt_seconds(best.step_seconds)}" + (f"; {best.caveat}" if best.caveat else "") + ")"
            )
            if len(by_throughput) > 1:
                runner = by_throughput[1]
                text[-1] += f", then {runner.lever} ({runner.change}: {runner.throughput_gain:.2f}x)"
        text[-1] += "."

    def latency(lv: Lever) -> float:
        return lv.simulated_latency_gain if simulated and lv.simulated_latency_gain is not None else lv.latency_gain

    by_latency = sorted((lv for lv in levers if lv.lever != "bigger batch"), key=latency, reverse=True)
    if by_latency and latency(by_latency[0]) > 1.0:
        fast = by_latency[0]
        if simulated and fast.simulated_latency_gain is not None:
            text.append(f"For latency: {fast.lever} ({fast.change}) cuts the mean TPOT {fast.simulated_latency_gain:.2f}x, "
                        f"simulated ({fast.latency_gain:.2f}x on the decode step alone).")
        elif fast.latency_only:
            text.append(f"For latency: {fast.lever}: {fast.caveat} ({fast.latency_gain:.2f}x).")
        else:
            text.append(f"For latency: {fast.lever} ({fast.change}) cuts the step to {fmt_seconds(fast.step_seconds)} "
                        f"({fast.latency_gain:.2f}x faster).")
    return text


def _simulated_facts(checked: _Checked) -> dict[str, Any]:
    if checked.run is None:
        return {"simulated": None, "simulated_note": checked.note or None}
    run, mix = checked.run, checked.mix
    assert mix is not None
    return {"simulated": {
        "requests": len(run.workload),
        "prefill_share": mix.prefill_share,
        "decode_share": mix.decode_share,
        "prefill_seconds": mix.prefill_seconds,
        "decode_seconds": mix.decode_seconds,
        "kv_cache_blocks": run.capacity.blocks,
        "block_size": run.capacity.block_size,
        "output_tokens_per_second_per_gpu": figures(run).tokens_per_second_per_gpu,
        "tpot_mean_seconds": figures(run).tpot_seconds,
    }, "simulated_note": None}
