"""The closed-batch run: TTFT, TPOT and e2e from prefill and decode steps."""

import pytest
from exact import exact_gpu

from simulator.cost.analytic import run_batch
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.model.step import Step
from simulator.plan.deployment_planner import plan_deployment


def test_latency_is_prefill_plus_decode_steps_at_growing_context():
    gpu = exact_gpu()
    deployment = plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1)
    run = run_batch(deployment, batch=1, context_tokens=1024, gen_tokens=128)
    system = deployment.system
    prompt = 1024 - 128
    assert run.ttft_seconds == system.step_seconds(Step.prefill(1, prompt))
    # 127 decode steps; step k attends prompt + k keys. At batch 1 everything is memory-bound,
    # so the steps grow linearly: the mean step is the step at the mean context.
    first, last = system.step_seconds(Step.decode(1, prompt + 1)), system.step_seconds(Step.decode(1, prompt + 127))
    kv_per_token = 2 * 32 * 32 * 128 * 2
    assert last - first == pytest.approx(126 * kv_per_token / 2.039e12, rel=1e-9)
    assert run.e2e_seconds == pytest.approx(run.ttft_seconds + 127 * (first + last) / 2, rel=1e-9)
    assert run.tpot_seconds == pytest.approx((first + last) / 2, rel=1e-9)
    assert run.output_tokens_per_second == pytest.approx(128 / run.e2e_seconds)
    assert run.total_tokens_per_second == pytest.approx(1024 / run.e2e_seconds)


def test_batch_1_decode_is_bounded_by_reading_the_weights():
    gpu = exact_gpu()
    deployment = plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=256)
    run = run_batch(deployment, batch=1, context_tokens=256, gen_tokens=8)
    weights = 6_738_415_616 * 2
    # Every weight except the embedding table is read once per step; the embedding reads one row.
    read = weights - 32000 * 4096 * 2
    assert run.decode_first.seconds > read / 2.039e12
    assert run.decode_first.seconds < 1.02 * weights / 2.039e12


def test_gen_must_leave_a_prompt():
    from simulator.errors import InputError

    deployment = plan_deployment(load_model("llama2-7b"), load_gpu("a100"), Precision(), batch=1, context_tokens=128)
    with pytest.raises(InputError, match="--gen must be < --ctx"):
        run_batch(deployment, 1, 128, 128)
