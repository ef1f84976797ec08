"""Traced cost functions (simulator.cost.tracing) equal the cost model they were traced from, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from test_step_totals import _systems

from simulator.cost.pipeline import PipelineSystem
from simulator.cost.system import System
from simulator.cost.tracing import scalar_call, trace_scalar
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.precision import Precision
from simulator.model.step import Step


def _decode(batch: float):
    return lambda keys: Step(tokens=batch, prefill_tokens=0.0, sequences=batch, logit_tokens=batch,
                             attention_pairs=keys, prefill_attention_pairs=0.0, score_elements=keys, context_tokens=keys)


def _realistic() -> list:
    vllm, sglang = load_engine_profile("vllm"), load_engine_profile("sglang")
    a100, h100 = load_gpu("a100"), load_gpu("h100")
    stage = System(load_model("llama2-13b"), a100, Precision(), tp=2, engine=vllm, collectives="auto",
                   kernel_efficiency="shape")
    return [
        System(load_model("llama3-8b"), h100, Precision(), engine=vllm, collectives="auto", kernel_efficiency="shape"),
        System(load_model("llama2-70b"), h100, Precision(weights="fp8"), tp=4, engine=sglang, collectives="auto",
               kernel_efficiency="shape"),  # overlapped host time: max(0, f cpu - gpu) depends on the keys
        System(load_model("mistral-7b"), a100, Precision(), engine=vllm.eager(), kernel_efficiency="shape"),
        PipelineSystem(stage, load_model("llama2-13b"), 2),
    ]


@pytest.mark.parametrize("system", _systems() + _realistic(), ids=lambda s: s.describe())
def test_a_traced_decode_tick_equals_step_totals_bit_for_bit(system):
    rng = np.random.default_rng(5)
    for batch in (1.0, 7.0, 64.0, 300.0):
        step = _decode(batch)
        traced = trace_scalar(lambda keys, step=step: system.step_totals(step(keys)), (batch, 1e3 * batch))
        assert traced is not None
        # Keys from one per sequence to 32k per sequence: both sides of every max() in the roofline.
        for keys in batch * np.exp(rng.uniform(0.0, np.log(32768.0), 200)).round():
            assert traced(float(keys)) == tuple(float(v) for v in system.step_totals(step(float(keys))))


def _measured() -> list:
    h100, h200 = load_gpu("h100"), load_gpu("h200")
    return [
        # Measured GEMMs and GQA attention (TensorRT-LLM's tables on H100), and MLA (on H200).
        System(load_model("llama3-8b"), h100, Precision(), engine=load_engine_profile("trtllm"), kernels="measured",
               kernel_efficiency="shape"),
        System(load_model("deepseek-v3"), h200, Precision(weights="fp8", kv="fp8"), tp=8,
               engine=load_engine_profile("trtllm"), kernels="measured", kernel_efficiency="shape"),
    ]


@pytest.mark.parametrize("system", _measured(), ids=lambda s: s.describe())
def test_a_decode_tick_on_measured_kernels_traces_and_equals_step_totals_bit_for_bit(system):
    assert system.time_model.kernels.measured
    rng = np.random.default_rng(7)
    for batch in (1.0, 16.0, 200.0):
        step = _decode(batch)
        traced = trace_scalar(lambda keys, step=step: system.step_totals(step(keys)), (batch, 1e3 * batch))
        # The table lookups join the trace as calls (scalar_call): a measured tick is traced, not costed one by one.
        assert traced is not None
        for keys in batch * np.exp(rng.uniform(0.0, np.log(131072.0), 100)).round():
            assert traced(float(keys)) == tuple(float(v) for v in system.step_totals(step(float(keys))))


def test_a_scalar_call_is_one_recorded_call_of_plain_numbers():
    seen = []

    def lookup(a: float, b: float) -> float:
        seen.append((type(a), type(b)))
        return float(np.log(a) + b)  # nothing the tracer could follow: a ufunc it has no form for

    traced = trace_scalar(lambda x: (scalar_call(lookup, 2.0 * x, 3.0) + 1.0,), (1.0, 5.0))
    assert traced is not None
    # log(2 x) + 3 + 1: at x = 1, log 2 + 4 = 4.693147...; at x = 4, log 8 + 4 = 6.079441...
    assert traced(1.0) == (float(np.log(2.0)) + 3.0 + 1.0,)
    assert traced(4.0) == pytest.approx((np.log(8.0) + 4.0,), abs=1e-15)
    # The compiled function hands the call plain floats, as the untraced path does.
    assert seen[-1] == (float, float)
    assert scalar_call(lookup, 2.0, 3.0) == float(np.log(2.0)) + 3.0  # untraced: just the call


def test_what_cannot_be_traced_gives_none():
    assert trace_scalar(lambda x: (x if x > 1.0 else 2.0,), (1.0,)) is None  # a branch on the value
    assert trace_scalar(lambda x: (float(x) * 2.0,), (1.0,)) is None  # a conversion to a Python number
    assert trace_scalar(lambda x: (np.sum(np.stack([x, x])),), (1.0,)) is None  # a reduction
    assert trace_scalar(lambda x: (np.exp(x),), (1.0,)) is None  # a ufunc without a one-to-one Python form


def test_a_trace_follows_max_where_and_comparisons():
    traced = trace_scalar(lambda x: (np.maximum(2.0 * x, 3.0), np.where(x >= 1.5, x / 4.0, 0.0), 7.0), (1.0, 2.0))
    assert traced is not None
    # 2*1 = 2 < 3 -> 3; 1 < 1.5 -> 0.0.  2*2 = 4 > 3 -> 4; 2 >= 1.5 -> 2/4 = 0.5.  The constant output stays 7.0.
    assert traced(1.0) == (3.0, 0.0, 7.0)
    assert traced(2.0) == (4.0, 0.5, 7.0)


def test_a_trace_that_disagrees_with_its_function_on_a_sample_is_refused():
    calls = []

    def drifting(x):
        calls.append(x)
        return (x * 2.0 if len(calls) == 1 else x * 3.0,)  # traced as 2x, then the function answers 3x

    assert trace_scalar(drifting, (1.0,)) is None


def test_traces_of_one_form_with_other_constants_each_give_their_own_answers():
    """Both record the same lines (v0 = c0 * x; v1 = max(v0, c1)), so they share compiled code; the constants are
    each trace's own: max(2 * 1, 3) = 3 and max(5 * 1, 1) = 5; max(2 * 4, 3) = 8 and max(5 * 4, 1) = 20."""
    first = trace_scalar(lambda x: (np.maximum(2.0 * x, 3.0),), (1.0,))
    second = trace_scalar(lambda x: (np.maximum(5.0 * x, 1.0),), (1.0,))
    assert first is not None and second is not None
    assert first.__code__ is second.__code__
    assert (first(1.0), second(1.0), first(4.0), second(4.0)) == ((3.0,), (5.0,), (8.0,), (20.0,))
