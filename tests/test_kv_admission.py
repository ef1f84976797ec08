"""KV admission: incremental blocks with preemption (vLLM) vs the whole request reserved (TensorRT-LLM)."""

import math

import pytest

from simulator.engine.scheduler import SchedulerConfig
from simulator.errors import InputError
from simulator.model.engine_profile import load_engine_profile
from simulator.plan.run import simulate_settings

# 6 requests of prompt 32 and output 49 tokens, a cache of 10 blocks of 16 tokens (160 tokens).
BASE = {"model": "llama2-7b", "gpu": "a100", "input_len": 32, "output_len": 49, "num_prompts": 6,
        "request_rate": math.inf, "kv_blocks": 10, "block_size": 16, "engine": "vllm"}


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
    from simulator.plan.deployment import plan_deployment

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
