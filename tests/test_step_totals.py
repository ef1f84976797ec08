"""The engine's fast path (System.step_totals) equals StepCost's properties (to rounding), on many random steps."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost.step_cost import step_totals
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.gpu import OpEfficiency
from simulator.model.precision import Precision
from simulator.model.step import Step

# Deliberately not the shipped defaults (and not 1.0 either, so a factor left out shows).
EFFICIENCY = dict(compute=0.61, memory=0.73, link=0.55, kernel_launch_seconds=4e-6, allreduce_latency_seconds=9e-6)
OVERLAY = [
    OpEfficiency(op_class="gemm", max_tokens=64, compute=0.3, memory=0.6),
    OpEfficiency(op_class="gemm", min_tokens=65, compute=0.8),
    OpEfficiency(op_class="attention", memory=0.25),
]


def _gpu(overlay: bool):
    gpu = load_gpu("a100").with_efficiency(**EFFICIENCY)
    return gpu.model_copy(update={"efficiency_by_op": OVERLAY}) if overlay else gpu


def _systems() -> list[System]:
    moe = load_model("mistral-7b").model_copy(update={"moe_experts": 8, "moe_top_k": 2})
    return [
        System(load_model("llama3-8b"), _gpu(False), Precision()),
        System(load_model("llama2-13b"), _gpu(False), Precision(weights="int4"), tp=2),
        System(load_model("llama2-7b"), _gpu(True), Precision(weights="int8"), attention_kernel="naive", fusion="none"),
        System(load_model("falcon-7b"), _gpu(False), Precision(), fusion="full"),
        System(moe, _gpu(True), Precision(), tp=4),
        # Outside CUDA graphs, with a host slow enough per launch that small steps wait for it.
        System(load_model("llama2-7b"), _gpu(False), Precision(), tp=2,
               engine=load_engine_profile("vllm-v0.2").model_copy(update={"graphs": load_engine_profile(
                   "vllm-v0.2").graphs.model_copy(update={"eager_launch_seconds": 4e-5})})),
    ]


def _random_step(rng: np.random.Generator, size: int | None) -> Step:
    """A mixed step: prefill chunks on top of cached tokens plus decoders (arrays of ``size`` steps, or scalars)."""
    def draw(low: int, high: int):
        values = rng.integers(low, high, size).astype(float)
        return values if size is not None else float(values)

    prefill = Step.prefill(draw(0, 4), draw(1, 3000), draw(0, 2000), emits_token=bool(rng.integers(0, 2)))
    return prefill + Step.decode(draw(0, 300), draw(1, 8000))


@pytest.mark.parametrize("system", _systems(), ids=lambda s: s.describe())
def test_step_totals_equal_step_cost_properties(system):
    rng = np.random.default_rng(7)
    steps = [_random_step(rng, None) for _ in range(40)] + [_random_step(rng, 50) for _ in range(3)]
    steps.append(Step.decode(64.0, np.array([1.0, 100.0, 5000.0])))  # scalar batch, array context (a stretch)
    steps.append(Step.decode(0.0, 0.0))  # an empty step costs nothing
    for step in steps:
        cost = system.step_cost(step)
        totals = system.step_totals(step)
        expected = (cost.seconds, cost.flops, cost.bytes, cost.compute_bound_seconds, cost.memory_bound_seconds,
                    cost.communication_seconds, cost.launch_wait_seconds)
        for name, got, want in zip(totals._fields, totals, expected):
            assert np.allclose(got, want, rtol=1e-12, atol=0.0), name
        assert np.allclose(system.step_seconds(step), cost.seconds, rtol=1e-12, atol=0.0)


def test_the_fast_path_charges_time_by_bound_and_communication():
    """A tp=2 decode step has all-reduce time, and memory-bound time dominates at batch 1."""
    system = _systems()[1]
    totals = system.step_totals(Step.decode(1.0, 1000.0))
    assert totals.communication_seconds > 0
    assert totals.memory_bound_seconds > totals.compute_bound_seconds
    assert totals.seconds == pytest.approx(
        totals.compute_bound_seconds + totals.memory_bound_seconds + totals.communication_seconds, rel=1e-12)


def test_the_empty_step_totals_are_zero():
    totals = _systems()[0].step_totals(Step.decode(0.0, 0.0))
    assert tuple(totals) == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("system", _systems()[1:3], ids=lambda s: s.describe())
def test_operators_marked_works_from_tokens_read_only_their_token_count(system):
    """The memo in step_totals is keyed by tokens(step): steps with the same token counts but other
    contexts, pairs and sequences must give such operators the same work."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        batch, prompt = float(rng.integers(1, 200)), float(rng.integers(1, 500))
        a = Step.prefill(1.0, prompt, float(rng.integers(0, 4000))) + Step.decode(batch, float(rng.integers(1, 8000)))
        b = Step.prefill(1.0, prompt, float(rng.integers(0, 4000))) + Step.decode(batch, float(rng.integers(1, 8000)))
        assert a.tokens == b.tokens and a.logit_tokens == b.logit_tokens
        for op in system.operators:
            if op.works_from_tokens:
                assert op.work(a) == op.work(b), op.name


def test_memoised_shares_give_the_same_totals_as_a_fresh_system():
    """Decode steps with one batch and many contexts: the second onwards reuse the memo."""
    system, fresh = _systems()[1], _systems()[1]
    for context in (100.0, 2000.0, 7000.0, 2000.0):
        step = Step.decode(32.0, context)
        memoised = system.step_totals(step)
        fresh.totals_memo.clear()
        assert memoised == fresh.step_totals(step)
        assert memoised.seconds == pytest.approx(system.step_cost(step).seconds, rel=1e-12)
    # One share per token-only operator (keyed by its index), plus their sum for the batch and the field check.
    per_operator = [key for key in system.totals_memo if isinstance(key, tuple) and isinstance(key[0], int)]
    assert len(per_operator) == sum(op.works_from_tokens for op in system.operators)
    assert ("fixed", 32.0, 32.0, True) in system.totals_memo


def test_steps_of_one_token_count_and_other_logit_tokens_each_get_their_own_lm_head():
    """Mixed steps of 512 tokens whose chunks emit 1, 8 and again 1 logits: the operators before the LM head are
    summed once for the 512 tokens, the LM head's share added to that sum, each equal to the shares summed without a
    memo, bit for bit. llama3-8b's LM head is 4096 x 128,256 (2 x 4096 x 128,256 = 1,050,673,152 FLOPs per logit token), so 7
    more logit tokens are 7,354,712,064 more FLOPs."""
    system = System(load_model("llama3-8b"), _gpu(False), Precision())
    steps = [Step(tokens=512.0, prefill_tokens=500.0, sequences=13.0, logit_tokens=logits, attention_pairs=9e5,
                  prefill_attention_pairs=8e5, score_elements=9e5, context_tokens=7000.0) for logits in (1.0, 8.0, 1.0)]
    totals = [system.step_totals(step) for step in steps]
    for step, memoised in zip(steps, totals):  # the same as every share summed afresh, from 0, in operator order
        assert memoised == step_totals(system.operators, step, system.gpu, system.rates, None, system.time_model)
    assert ("tokens", 512.0, True) in system.totals_memo
    assert totals[1].flops - totals[0].flops == 7 * 2 * 4096 * 128_256 == 7_354_712_064
    assert totals[2] == totals[0]


@pytest.mark.parametrize("system", _systems(), ids=lambda s: s.describe())
def test_an_array_step_equals_its_entries_costed_alone_bit_for_bit(system):
    """The engine's decode stretches rely on it: one order of summation for scalar and array steps."""
    rng = np.random.default_rng(11)
    shrinking = Step.decode(np.repeat([40.0, 37.0, 30.0], [3, 4, 5]), rng.integers(1, 9000, 12).astype(float))
    constant = Step.decode(64.0, rng.integers(1, 9000, 12).astype(float))
    # 12 distinct token counts are looked up run by run; 40 are costed on the arrays themselves.
    for step in (_random_step(rng, 12), _random_step(rng, 40), shrinking, constant):
        size = len(np.asarray(step.context_tokens))
        together = system.step_totals(step)
        for i in range(size):
            alone = system.step_totals(Step(*(float(np.broadcast_to(value, (size,))[i]) for value in vars(step).values())))
            assert [float(np.broadcast_to(part, (size,))[i]) for part in together] == list(alone), i
