"""Roofline laws every cost must obey, for random models, GPUs, precisions and steps (hypothesis).

Expected values are the roofline formulas, written out here:
time = max(FLOPs / peak, bytes / bandwidth) per operator with efficiencies 1 and no overhead,
and decode GEMM intensity 2 B K N / (b_w K N + b_a B (K + N)) (DESIGN.md 'Exact counts').
"""

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import (
    EXACT,
    FULL_PRECISION_WEIGHTS,
    TP_DEGREES,
    batches,
    contexts,
    gpus,
    models,
    precisions,
)

from simulator.cost.step_cost import operator_cost
from simulator.cost.system import System
from simulator.model import GPUSpec, Precision, load_model
from simulator.model.step import Step

REL = 1e-9


@st.composite
def steps(draw: st.DrawFn) -> Step:
    """A decode step, a prefill step, or both in one forward pass (as continuous batching runs)."""
    kind = draw(st.sampled_from(["decode", "prefill", "mixed"]))
    decode = Step.decode(draw(st.integers(1, 256)), draw(contexts))
    prefill = Step.prefill(draw(st.integers(1, 4)), draw(st.integers(1, 1024)), draw(st.integers(0, 1024)))
    return {"decode": decode, "prefill": prefill, "mixed": decode + prefill}[kind]


def costs(system: System, step: Step):
    return [c for c in system.step_cost(step).operators if c.kind != "allreduce"]


def op_peak(system: System, name: str) -> float:
    op = next(o for o in system.operators if o.name == name)
    return system.gpu.peak(op.compute_dtype)


# --- never faster than physics --------------------------------------------------------------

@given(models(), gpus(exact=False), precisions(), steps(), st.sampled_from(["flash", "naive"]),
       st.sampled_from(["none", "elementwise"]))
def test_every_operator_takes_at_least_flops_over_peak_and_bytes_over_bandwidth(
    model, gpu, precision, step, kernel, fusion
):
    system = System(model, gpu, precision, attention_kernel=kernel, fusion=fusion)
    bandwidth = gpu.hbm_bandwidth_bytes_per_second
    for c in costs(system, step):
        assert c.seconds >= c.flops / op_peak(system, c.name) * (1 - REL), c.name
        assert c.seconds >= c.bytes / bandwidth * (1 - REL), c.name


@given(models(), gpus(exact=True), precisions(FULL_PRECISION_WEIGHTS), steps(), st.sampled_from(["flash", "naive"]))
def test_with_efficiency_1_and_no_overhead_time_is_exactly_the_roofline_max(model, gpu, precision, step, kernel):
    system = System(model, gpu, precision, attention_kernel=kernel)
    bandwidth = gpu.hbm_bandwidth_bytes_per_second
    total = 0.0
    for c in costs(system, step):
        expected = max(c.flops / op_peak(system, c.name), c.bytes / bandwidth)
        assert c.seconds == pytest.approx(expected, rel=REL), c.name
        total += expected
    assert system.step_seconds(step) == pytest.approx(total, rel=REL)


# --- monotonicity in context and batch -----------------------------------------------------

@given(models(), gpus(exact=False), precisions(), batches, contexts, st.integers(1, 2048))
def test_decode_step_time_is_non_decreasing_in_context(model, gpu, precision, batch, ctx, more):
    system = System(model, gpu, precision)
    assert system.step_seconds(Step.decode(batch, ctx + more)) >= system.step_seconds(Step.decode(batch, ctx))


@given(models(), gpus(exact=False), precisions(), batches, contexts, st.integers(1, 512))
def test_decode_step_time_is_non_decreasing_in_batch(model, gpu, precision, batch, ctx, more):
    system = System(model, gpu, precision)
    assert system.step_seconds(Step.decode(batch + more, ctx)) >= system.step_seconds(Step.decode(batch, ctx))


@given(models(), gpus(exact=False), precisions(), batches, contexts)
def test_time_per_token_never_rises_when_the_batch_doubles(model, gpu, precision, batch, ctx):
    """Each operator costs max(a B, b + c B) (+ launches): per token max(a, b / B + c), non-increasing.

    Doubling (not B + 1) because weight-only dequantisation runs per 16-row tile:
    ceil(2B / 16) <= 2 ceil(B / 16), so it too never rises per token under doubling.
    """
    system = System(model, gpu, precision)
    one = system.step_seconds(Step.decode(batch, ctx)) / batch
    two = system.step_seconds(Step.decode(2 * batch, ctx)) / (2 * batch)
    assert two <= one * (1 + REL)


@given(models(), gpus(exact=True), precisions(FULL_PRECISION_WEIGHTS), batches, contexts)
def test_a_compute_bound_operator_has_constant_time_per_token(model, gpu, precision, batch, ctx):
    """Past its ridge an operator's time is FLOPs / peak, linear in tokens: doubling B doubles it exactly."""
    system = System(model, gpu, precision)
    at_b = {c.name: c for c in costs(system, Step.decode(batch, ctx))}
    at_2b = {c.name: c for c in costs(system, Step.decode(2 * batch, ctx))}
    for name, c in at_b.items():
        if c.compute_seconds >= c.memory_seconds and c.compute_seconds > 0:
            assert at_2b[name].seconds == pytest.approx(2 * c.seconds, rel=REL), name


@given(models(), gpus(exact=True), precisions(FULL_PRECISION_WEIGHTS), batches, contexts)
def test_once_every_operator_is_compute_bound_time_per_token_is_constant(model, gpu, precision, batch, ctx):
    """Bandwidth 1000x the peak (ridge 0.001 FLOP/byte): the whole step is past the ridge, t(2B) = 2 t(B)."""
    fast_memory = gpu.model_copy(update={"hbm_bandwidth_bytes_per_second": 1e3 * gpu.peak("fp8")})
    system = System(model, fast_memory, precision)
    one = system.step_seconds(Step.decode(batch, ctx)) / batch
    two = system.step_seconds(Step.decode(2 * batch, ctx)) / (2 * batch)
    assert two == pytest.approx(one, rel=REL)


# --- decode GEMM intensity and the ridge ------------------------------------------------------

def o_proj_dims(model):
    """o_proj: K = n d inputs, N = H outputs (tp = 1)."""
    return model.num_heads * model.head_dim, model.hidden_size


@given(models(bias=False), gpus(exact=True), precisions(FULL_PRECISION_WEIGHTS), st.integers(1, 64), contexts)
def test_decode_gemm_intensity_is_2b_over_bw_up_to_the_activation_correction(model, gpu, precision, batch, ctx):
    """Intensity = 2BKN / (b_w KN + b_a B (K+N)) = (2B / b_w) / (1 + eps), eps = b_a B (K+N) / (b_w K N).

    Fusion 'none' so the GEMM reads its K-wide input and writes its N-wide output through HBM.
    """
    system = System(model, gpu, precision, fusion="none")
    K, N = o_proj_dims(model)
    b_w, b_a = precision.weight_bytes_per_element, precision.activation_bytes_per_element
    o_proj = next(c for c in system.step_cost(Step.decode(batch, ctx)).operators if c.name == "o_proj")
    eps = b_a * batch * (K + N) / (b_w * K * N)
    assert o_proj.intensity == pytest.approx((2 * batch / b_w) / (1 + eps), rel=REL)
    assert o_proj.intensity <= 2 * batch / b_w
    if batch * (K + N) <= K * N / 100:  # B << H: within 1% (times b_a / b_w) of 2B / b_w
        assert o_proj.intensity >= (2 * batch / b_w) * (1 - 0.01 * b_a / b_w)


@given(models(bias=False), precisions(FULL_PRECISION_WEIGHTS), st.floats(0.05, 0.95), st.data())
def test_decode_gemm_crosses_the_ridge_at_the_predicted_batch(model, precision, reach, data):
    """Ridge R = peak / bandwidth. Solving 2BKN / (b_w KN + b_a B (K+N)) = R for B:
    B* = R b_w K N / (2 K N - R b_a (K + N)). Below B* the GEMM is memory-bound, above compute-bound.

    The GPU's bandwidth is chosen so that R is ``reach`` of the largest ridge this GEMM can
    reach (2KN / (b_a (K+N)), its intensity as B -> infinity), so B* exists.
    """
    K, N = o_proj_dims(model)
    b_w, b_a = precision.weight_bytes_per_element, precision.activation_bytes_per_element
    gpu = data.draw(gpus(exact=True))
    peak = gpu.peak(precision.compute_dtype)
    ridge = reach * 2 * K * N / (b_a * (K + N))
    gpu = gpu.model_copy(update={"hbm_bandwidth_bytes_per_second": peak / ridge})
    b_star = ridge * b_w * K * N / (2 * K * N - ridge * b_a * (K + N))
    assume(1.0 < b_star < 1e6 and abs(b_star - round(b_star)) > 1e-6)
    system = System(model, gpu, precision, fusion="none")
    below, above = math.floor(b_star), math.floor(b_star) + 1

    def bound(batch: int) -> str:
        return next(c for c in system.step_cost(Step.decode(batch, 1)).operators if c.name == "o_proj").bound

    assert bound(below) == "memory"
    assert bound(above) == "compute"


# --- scaling the machine ------------------------------------------------------------------------

@given(models(), gpus(exact=True), precisions(), steps())
def test_doubling_bandwidth_halves_memory_bound_operators_and_leaves_compute_bound_ones(model, gpu, precision, step):
    fast = gpu.model_copy(update={"hbm_bandwidth_bytes_per_second": 2 * gpu.hbm_bandwidth_bytes_per_second})
    base = costs(System(model, gpu, precision), step)
    doubled = {c.name: c for c in costs(System(model, fast, precision), step)}
    for c in base:
        if c.memory_seconds >= 2 * c.compute_seconds:  # still memory-bound at twice the bandwidth
            assert doubled[c.name].seconds == pytest.approx(c.seconds / 2, rel=REL), c.name
        elif c.compute_seconds >= c.memory_seconds:
            assert doubled[c.name].seconds == pytest.approx(c.seconds, rel=REL), c.name
    old, new = System(model, gpu, precision).step_seconds(step), System(model, fast, precision).step_seconds(step)
    assert old / 2 * (1 - REL) <= new <= old * (1 + REL)


@given(models(), gpus(exact=True), precisions(), steps())
def test_doubling_peak_flops_halves_compute_bound_operators_and_leaves_memory_bound_ones(model, gpu, precision, step):
    fast = gpu.model_copy(update={"peak_flops": {k: 2 * v for k, v in gpu.peak_flops.items()}})
    base = costs(System(model, gpu, precision), step)
    doubled = {c.name: c for c in costs(System(model, fast, precision), step)}
    for c in base:
        if c.compute_seconds >= 2 * c.memory_seconds:
            assert doubled[c.name].seconds == pytest.approx(c.seconds / 2, rel=REL), c.name
        elif c.memory_seconds >= c.compute_seconds:
            assert doubled[c.name].seconds == pytest.approx(c.seconds, rel=REL), c.name
    old, new = System(model, gpu, precision).step_seconds(step), System(model, fast, precision).step_seconds(step)
    assert old / 2 * (1 - REL) <= new <= old * (1 + REL)


@given(models(), gpus(exact=True), precisions(FULL_PRECISION_WEIGHTS), st.integers(1, 8), contexts)
def test_batch_1_decode_of_a_memory_bound_gpu_halves_with_twice_the_bandwidth(model, gpu, precision, batch, ctx):
    """A GPU with a huge ridge (1e6 FLOP/byte): every operator of a small decode step is memory-bound."""
    slow_memory = gpu.model_copy(update={"hbm_bandwidth_bytes_per_second": gpu.peak("fp32") / 1e6})
    fast_memory = slow_memory.model_copy(update={"hbm_bandwidth_bytes_per_second": 2 * slow_memory.hbm_bandwidth_bytes_per_second})
    step = Step.decode(batch, ctx)
    moving = [c for c in costs(System(model, slow_memory, precision, fusion="none"), step)]
    assume(all(c.memory_seconds >= 2 * c.compute_seconds for c in moving))
    old = System(model, slow_memory, precision, fusion="none").step_seconds(step)
    new = System(model, fast_memory, precision, fusion="none").step_seconds(step)
    assert new == pytest.approx(old / 2, rel=REL)


# --- tensor parallelism ----------------------------------------------------------------------

@given(models(), gpus(exact=False), precisions(), st.sampled_from(TP_DEGREES[1:]), steps())
def test_tensor_parallel_step_is_never_faster_than_single_gpu_over_n(model, gpu, precision, tp, step):
    """Per GPU each operator does >= 1/n of the work and communication only adds."""
    assume(model.num_heads >= tp)
    single = System(model, gpu, precision, tp=1).step_seconds(step)
    sharded = System(model, gpu, precision, tp=tp).step_seconds(step)
    assert sharded >= single / tp * (1 - REL)


@given(models(), gpus(exact=True), precisions(), st.sampled_from(TP_DEGREES[1:]), steps())
def test_tensor_parallel_all_reduce_costs_the_ring_formula(model, gpu, precision, tp, step):
    """2 all-reduces per layer (1 with parallel attention) of tokens x H activations:
    2 (n - 1) / n * bytes / link bandwidth each (efficiency 1, no latency)."""
    assume(model.num_heads >= tp)
    system = System(model, gpu, precision, tp=tp)
    link = sum(c.seconds for c in system.step_cost(step).operators if c.kind == "allreduce")
    per_layer = 1 if model.parallel_attention else 2
    message = step.tokens * model.hidden_size * precision.activation_bytes_per_element
    expected = model.num_layers * per_layer * 2 * (tp - 1) / tp * message / gpu.link_bandwidth_bytes_per_second
    assert link == pytest.approx(expected, rel=REL)


def test_hand_worked_anchor_llama2_7b_o_proj_batch_1():
    """One operator worked by hand, so the laws above rest on a known number.

    LLaMA-2-7B o_proj at batch 1: 2 * 4096 * 4096 FLOPs on 2 * 4096 * 4096 + 2 * (4096 + 4096)
    bytes per layer (fp16 weights, one input and one output row), 32 layers, at 2.039e12 B/s:
    32 * 33_570_816 / 2.039e12 s, memory-bound (intensity ~1 FLOP/byte, ridge 153).
    """
    gpu = GPUSpec(
        name="a100-like", peak_flops={"fp32": 19.5e12, "fp16": 312e12}, hbm_bytes=80 * 2**30,
        hbm_bandwidth_bytes_per_second=2.039e12, sram_bytes_per_sm=167936, link_bandwidth_bytes_per_second=300e9,
        efficiency=EXACT,
    )
    system = System(load_model("llama2-7b"), gpu, Precision(), fusion="none")
    o_proj = next(op for op in system.operators if op.name == "o_proj")
    cost = operator_cost(o_proj, Step.decode(1, 100), gpu)
    assert 2 * 4096 * 4096 + 2 * (4096 + 4096) == 33_570_816
    assert cost.flops == 32 * 2 * 4096 * 4096
    assert cost.seconds == pytest.approx(32 * 33_570_816 / 2.039e12, rel=1e-12)
    assert cost.bound == "memory"
