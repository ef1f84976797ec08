"""KV admission: incremental blocks with preemption (vLLM) vs the whole request reserved (TensorRT-LLM)."""

import math

import pytest

from simulator.engine.scheduler import SchedulerConfig
from simulator.errors import InputError
from simulator.model.engine_profile import load_engine_profile
from simulator.plan.run import simulate_settings

# 6 requests of prompt 32 and output 49 tokens, a cache of 10 blocks of 16 tokens (160 tokens).
BASE = {"model": "llama2-7b", "gpu": "a100", "input_len": 32, "output_len": 49, "num_prompts": 6,
        "request_rate": math.inf, "kv_blocks": 10, "block_size": 16, "engine": "vllm",
        # The bare engine: every request reaches it at t = 0 (no client path spreading the arrivals).
        "client_path": "off"}


def test_reserve_admits_only_whole_requests_and_never_preempts():
    # a whole request holds 32 + 49 - 1 = 80 tokens = 5 blocks: 10 // 5 = 2 run at once
    run = simulate_settings({**BASE, "kv_admission": "reserve"})
    assert run.result.max_running == 2
    assert run.result.total_preemptions == 0
    assert (run.result.status == run.result.status[0]).all() and len(run.result.status) == 6


def test_incremental_admits_on_the_prompt_and_preempts_when_blocks_run_out():
    # a prompt holds 32 tokens = 2 blocks: 10 // 2 = 5 start; by 80 tokens each needs 5 blocks, so some are preempted
    run = simulate_settings({**BASE, "kv_admission": "incremental"})
    assert run.result.max_running == 5
    assert run.result.total_preemptions >= 1


def test_profiles_choose_their_engines_policy_and_unknown_values_are_refused():
    assert load_engine_profile("trtllm").scheduler.kv_admission == "reserve"
    assert load_engine_profile("vllm").scheduler.kv_admission == "incremental"
    assert not SchedulerConfig("chunked", kv_admission="reserve").incremental_blocks
    with pytest.raises(InputError, match="--kv-admission"):
        SchedulerConfig("chunked", kv_admission="sometimes")


def test_an_engine_sizing_its_cache_from_free_memory_gets_a_tenth_of_what_it_holds_more():
    """vLLM: budget = 0.9 * HBM - held; TensorRT-LLM: budget = 0.9 * (HBM - held), i.e. 0.1 * held more,
    where held = weights + workspace + runtime. Blocks = floor(budget / (16 tokens * 524,288 bytes)) for
    Llama-2-7B at fp16 (2 * 32 layers * 32 heads * 128 * 2 bytes = 524,288 bytes per token)."""
    from simulator.engine.kvcache import kv_capacity
    from simulator.model import load_gpu, load_model
    from simulator.model.precision import parse_precision
    from simulator.plan.deployment_planner import plan_deployment

    model, gpu = load_model("llama2-7b"), load_gpu("a100")
    caps = {}
    for engine in ("vllm", "trtllm"):
        deployment = plan_deployment(model, gpu, parse_precision("fp16", "fp16"), 1, 4096, tp=1,
                                     engine=load_engine_profile(engine))
        caps[engine] = kv_capacity(deployment, 16, 0.9)
    vllm, trt = caps["vllm"], caps["trtllm"]
    held = vllm.weights_bytes_per_gpu + vllm.workspace_bytes_per_gpu + vllm.reserved_bytes_per_gpu
    assert not vllm.of_free and trt.of_free
    assert vllm.budget_bytes_per_gpu == pytest.approx(0.9 * gpu.hbm_bytes - held)
    assert trt.budget_bytes_per_gpu == pytest.approx(0.9 * (gpu.hbm_bytes - held))
    assert trt.budget_bytes_per_gpu - vllm.budget_bytes_per_gpu == pytest.approx(0.1 * held)
    assert vllm.blocks == math.floor(vllm.budget_bytes_per_gpu / (16 * 524_288))
    assert trt.blocks == math.floor(trt.budget_bytes_per_gpu / (16 * 524_288))


# --- fit: SGLang's admission for requests that ignore EOS, without a prefix cache -------------------------------

def _exact_system():
    from exact import exact_gpu

    from simulator.model import load_model
    from simulator.model.precision import Precision
    from simulator.plan.deployment_planner import plan_deployment

    return plan_deployment(load_model("llama2-7b"), exact_gpu(), Precision(), batch=1, context_tokens=1024, tp=1).system


def _two(system, tokens, admission):
    import numpy as np

    from simulator.engine.engine import simulate
    from simulator.engine.workload import Workload

    # Request 0: 10 + 60 tokens, request 1: 10 + 40, both at t = 0; a cache of ``tokens`` blocks of one token.
    w = Workload(np.array([0.0, 0.0]), np.array([10, 10]), np.array([60, 40]), "trace", "two")
    config = SchedulerConfig("prefill-first", max_num_seqs=4, max_batched_tokens=512, block_size=1,
                             kv_admission=admission)
    return simulate(system, w, config, tokens)


def test_fit_admits_a_request_only_when_every_output_still_to_come_fits():
    from simulator.model.step import Step

    system = _exact_system()
    # Request 0 admitted (10 tokens held, 60 left); request 1 would hold 10 and have 40 left. Sorted by tokens
    # left, the first test is free - (next one's left) x 2 >= 0.
    # 100 tokens: free = 100 - 10 - 10 = 80 < 60 x 2; once request 0 decodes (e tokens emitted, 9 + e cached),
    # free = 81 - e, and whichever order, the first test fails (e - 39 while 60 - e >= 40, 1 - e after): it
    # starts when request 0 finishes. Incremental admission starts both at once.
    small = _two(system, 100, "fit")
    assert small.first_scheduled[1] == pytest.approx(small.finish[0], rel=1e-12)
    assert _two(system, 100, "incremental").first_scheduled.tolist() == [0.0, 0.0]
    # 200 tokens: 180 - 60 x 2 = 60 >= 0, then 180 + 10 - 60 x 1 >= 0: both start at t = 0.
    assert _two(system, 200, "fit").first_scheduled.tolist() == [0.0, 0.0]
    # 130 tokens: while request 0 has 60 - e >= 40 left, the first test is 130 - 139 + e >= 0 and the second
    # 130 - 69 >= 0, so request 1 starts when request 0 has emitted 9 tokens: its prefill's one and 8 decode
    # ticks, the test run before every tick while a request waits.
    mid = _two(system, 130, "fit")
    ticks = sum(system.step_seconds(Step.decode(1, 10 + k)) for k in range(1, 9))
    assert mid.first_scheduled[1] == pytest.approx(system.step_seconds(Step.prefill(1, 10)) + ticks, rel=1e-12)


def test_fit_refuses_what_cannot_fit_to_its_last_token_and_reports_itself():
    system = _exact_system()
    # 10 + 60 tokens in a cache of 69 one-token blocks: incremental lets it in (its cache peaks at 69 tokens),
    # fit rejects it (all 70 tokens must fit), so nothing stalls.
    from simulator.engine.metrics import REJECTED

    assert _two(system, 69, "fit").status[0] == REJECTED
    assert _two(system, 69, "incremental").status[0] != REJECTED
    from simulator.report.run_report import engine_run_text

    text = engine_run_text(simulate_settings({**BASE, "kv_admission": "fit", "scheduler": "prefill-first"}))
    assert "a request admitted when every output still to come fits" in text


@pytest.mark.parametrize("scheduler", ["continuous", "prefill-first", "chunked"])
def test_fit_gives_the_same_run_stepping_one_tick_at_a_time(monkeypatch, scheduler):
    import numpy as np

    import simulator.engine.engine as engine_module
    from simulator.engine.engine import simulate
    from simulator.engine.metrics import DONE
    from simulator.engine.workload import LengthSpec, open_loop

    system = _exact_system()
    w = open_loop(60, 30.0, LengthSpec("uniform", 10, 200), LengthSpec("uniform", 2, 80), seed=4)
    config = SchedulerConfig(scheduler, max_num_seqs=12, max_batched_tokens=256 if scheduler != "continuous" else None,
                             kv_admission="fit")
    fast = simulate(system, w, config, 80)
    monkeypatch.setattr(engine_module, "STRETCH_MAX", 1)
    slow = simulate(system, w, config, 80)
    assert (fast.status == DONE).all()
    for name in ("prefill_tokens", "decode_seqs", "blocks_used", "running"):
        assert np.array_equal(fast.log[name], slow.log[name]), name
    for name in ("first_scheduled", "first_token", "finish"):
        assert getattr(fast, name) == pytest.approx(getattr(slow, name), rel=1e-12), name
