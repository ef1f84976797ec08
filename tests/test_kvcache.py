"""The paged KV cache: capacity in blocks, block counts, the allocator, and admission limits in the engine."""

import pytest
from exact import exact_gpu

from simulator.engine.engine import simulate
from simulator.engine.kvcache import BlockAllocator, blocks_for, kv_capacity
from simulator.engine.metrics import DONE, REJECTED
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import LengthSpec, closed_batch
from simulator.errors import InputError
from simulator.model import load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment

GIB = 2**30


@pytest.fixture(scope="module")
def deployment():
    gpu = exact_gpu()
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1)


def test_blocks_for_rounds_up():
    assert [blocks_for(t, 16) for t in (1, 15, 16, 17, 32, 33)] == [1, 1, 1, 2, 2, 3]


def test_capacity_is_what_is_left_after_weights_workspace_and_runtime(deployment):
    cap = kv_capacity(deployment, block_size=16, gpu_memory_utilization=0.9, max_num_seqs=256)
    weights = 6_738_415_616 * 2  # LLaMA-2-7B parameters, fp16
    # Workspace for an 8192-token step: 8192 * (4 * 4096 + 3 * 11008) fp16 activations + fp32 logits of 256 sequences.
    workspace = 8192 * (4 * 4096 + 3 * 11008) * 2 + 256 * 32000 * 4
    assert workspace == 842_268_672
    budget = 0.9 * 80 * GIB - weights - workspace - 1 * GIB
    per_block = 16 * (2 * 32 * 32 * 128 * 2)  # 16 tokens x 524,288 bytes per token
    assert per_block == 8_388_608
    assert cap.workspace_bytes_per_gpu == workspace
    # 77,309,411,328 - 13,476,831,232 - 842,268,672 - 1,073,741,824 = 61,916,569,600 bytes; / 8,388,608 = 7381.1
    assert budget == 61_916_569_600
    assert cap.blocks == 7381
    assert cap.tokens == 7381 * 16


def test_capacity_scales_with_utilisation_and_tp():
    gpu = exact_gpu()
    model = load_model("llama2-13b")
    one = kv_capacity(plan_deployment(model, gpu, Precision(), 1, 1024, tp=1))
    two = kv_capacity(plan_deployment(model, gpu, Precision(), 1, 1024, tp=2))
    # Two GPUs hold half the weights and half of every block each: more than twice the blocks.
    assert two.blocks > 2 * one.blocks
    assert two.bytes_per_block_per_gpu == one.bytes_per_block_per_gpu / 2


def test_no_room_for_the_kv_cache_is_an_input_error(deployment):
    # 0.15 x 80 GiB = 12 GiB is less than the 12.55 GiB of weights.
    with pytest.raises(InputError, match="no memory left for the KV cache"):
        kv_capacity(deployment, gpu_memory_utilization=0.15)
    with pytest.raises(InputError, match="--gpu-memory-utilization"):
        kv_capacity(deployment, gpu_memory_utilization=1.5)
    with pytest.raises(InputError, match="--block-size"):
        kv_capacity(deployment, block_size=0)


def test_allocator_counts_and_refuses_over_allocation():
    alloc = BlockAllocator(10)
    alloc.allocate(7)
    alloc.release(3)
    alloc.allocate(5)
    assert (alloc.used, alloc.free, alloc.high_water) == (9, 1, 9)
    with pytest.raises(RuntimeError):
        alloc.allocate(2)


def test_single_sequence_grows_one_block_per_16_tokens(deployment):
    # Prompt 32 tokens (2 blocks); decode tick k caches token 32 + k: 3 blocks for k = 1..16, 4 for k = 17..32.
    w = closed_batch(1, LengthSpec("fixed", 32), LengthSpec("fixed", 33))
    r = simulate(deployment.system, w, SchedulerConfig("continuous"), kv_blocks=100)
    assert r.log["blocks_used"].tolist() == [2] + [3] * 16 + [4] * 16
    assert r.kv_high_water_blocks == 4


@pytest.mark.parametrize("blocks", [4, 7, 8, 12, 15, 16, 20])
def test_preemption_happens_exactly_when_demand_exceeds_capacity(deployment, blocks):
    # 4 requests of prompt 32 + output 33 each reach 32 + 32 = 64 cached tokens = 4 blocks: demand 16 blocks.
    w = closed_batch(4, LengthSpec("fixed", 32), LengthSpec("fixed", 33))
    r = simulate(deployment.system, w, SchedulerConfig("continuous"), kv_blocks=blocks)
    assert r.log["blocks_used"].max() <= blocks
    assert (r.total_preemptions > 0) == (blocks < 4 * 4)
    assert (r.status == DONE).all()


def test_the_newest_request_is_preempted(deployment):
    # 15 blocks: all four run with 3 blocks (12) until each needs its 4th at the same tick; 3 are free, so
    # the newest (request 3) is preempted, freeing 3, and the other three get theirs.
    w = closed_batch(4, LengthSpec("fixed", 32), LengthSpec("fixed", 33))
    r = simulate(deployment.system, w, SchedulerConfig("continuous"), kv_blocks=15)
    assert r.preemptions.tolist() == [0, 0, 0, 1]
    assert r.kv_high_water_blocks == 12
    # Request 3 is recomputed only after the others finish, so it finishes last.
    assert r.finish[3] > max(r.finish[:3])


def test_static_reserves_whole_requests_and_never_preempts(deployment):
    # 15 blocks hold three whole requests (3 x 4 = 12); the fourth runs in a second batch.
    w = closed_batch(4, LengthSpec("fixed", 32), LengthSpec("fixed", 33))
    r = simulate(deployment.system, w, SchedulerConfig("static"), kv_blocks=15)
    assert r.total_preemptions == 0
    assert r.kv_high_water_blocks == 12
    assert r.first_token[3] >= r.finish[:3].max()


def test_request_larger_than_the_cache_is_rejected_and_the_rest_run(deployment):
    # 4 blocks = 64 tokens; a prompt of 100 tokens can never fit.
    w = closed_batch(3, LengthSpec("fixed", 20), LengthSpec("fixed", 10))
    w.prompt_tokens[1] = 100
    r = simulate(deployment.system, w, SchedulerConfig("continuous"), kv_blocks=4)
    assert r.status.tolist() == [DONE, REJECTED, DONE]
    assert r.reject_reason.tolist() == [0, 2, 0]
