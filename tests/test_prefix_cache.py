"""Prefix caching: hits, prefill tokens saved, sharing and LRU eviction, worked out by hand."""

import numpy as np
import pytest

from simulator.engine.cluster import simulate_cluster
from simulator.engine.engine import simulate
from simulator.engine.prefix_cache import (
    PrefixAllocator,
    PrefixCache,
    reusable_blocks,
    with_shared_prefix,
)
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import LengthSpec, Workload, closed_batch
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment
from simulator.plan.run import run_from_options, simulate_settings

ON = SchedulerConfig("continuous", block_size=16, prefix_caching=True)


@pytest.fixture(scope="module")
def system():
    exact = {"compute": 1.0, "memory": 1.0, "link": 1.0, "kernel_launch_seconds": 0.0, "allreduce_latency_seconds": 0.0}
    gpu = load_gpu("a100").with_efficiency(**exact)
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1).system


def workload(arrivals, prompts, outputs, prefix_id, prefix_tokens):
    return Workload(np.array(arrivals, dtype=float), np.array(prompts), np.array(outputs), "trace", "test",
                    prefix_id=np.array(prefix_id), prefix_tokens=np.array(prefix_tokens))


def test_only_whole_blocks_of_the_prompt_but_its_last_token_are_reusable():
    # floor(min(prefix, prompt - 1) / 16): 100 -> 6 blocks; a prefix that is the whole 64-token prompt keeps the
    # last token to compute, 63 -> 3 blocks; 15 tokens are less than a block.
    assert reusable_blocks(np.array([120, 64, 40]), np.array([100, 64, 15]), 16).tolist() == [6, 3, 0]


def test_later_requests_hit_the_prefix_and_skip_its_prefill(system):
    # Four requests one second apart (each done long before the next: 120 prompt tokens + 2 output tokens),
    # all starting with the same 100-token prefix: 6 whole blocks = 96 tokens reusable. The first computes and
    # registers it (a miss), the next three hit: 3 of 4 lookups, 3 x 96 = 288 prefill tokens saved.
    load = workload([0, 1, 2, 3], [120] * 4, [2] * 4, [0] * 4, [100] * 4)
    result = simulate(system, load, ON, kv_blocks=100)
    stats = result.extra["prefix_cache"]
    assert (stats.lookups, stats.hits, stats.saved_tokens, stats.evictions) == (4, 3, 288, 0)
    assert stats.hit_rate == 0.75
    prefill = result.log["prefill_tokens"][result.log["prefill_tokens"] > 0].tolist()
    assert prefill == [120, 24, 24, 24]  # 120 - 96 tokens left to compute after a hit
    ttft = result.first_token - load.arrival_seconds
    assert ttft[1] < ttft[0] and ttft[1] == pytest.approx(ttft[3])
    off = simulate(system, load, SchedulerConfig("continuous", block_size=16), kv_blocks=100)
    assert "prefix_cache" not in off.extra and off.log["prefill_tokens"][off.log["prefill_tokens"] > 0].tolist() == [120] * 4


def test_requests_running_together_share_the_prefix_blocks(system):
    # r0 (prefix 100 tokens, prompt 120 = 8 blocks) decodes 300 tokens; r1 arrives after r0's prefill and hits:
    # it needs only 8 - 6 = 2 new blocks, so both together hold at most 8 + 2 + r0's growth (300 tokens:
    # ceil(420 / 16) - 8 = 19 blocks) + r1's growth (ceil(121 / 16) - 8 = 0) = 29 blocks, not 8 + 8 + 19 = 35.
    load = workload([0, 0.5], [120, 120], [300, 2], [0, 0], [100, 100])
    result = simulate(system, load, ON, kv_blocks=100)
    assert result.extra["prefix_cache"].hits == 1
    assert result.kv_high_water_blocks <= 29


def test_an_idle_prefix_is_evicted_when_its_blocks_are_needed(system):
    # 10 blocks. r0 (prefix A) leaves 6 cached blocks free-but-resident. r1 (prefix B) allocates 8: 8 + 6 > 10, so
    # A is evicted. r2 (prefix A again) misses and, allocating 8 next to B's 6 cached blocks, evicts B.
    load = workload([0, 1, 2], [120] * 3, [2] * 3, [0, 1, 0], [100] * 3)
    result = simulate(system, load, ON, kv_blocks=10)
    stats = result.extra["prefix_cache"]
    assert (stats.lookups, stats.hits, stats.evictions) == (3, 0, 2)


def test_the_allocator_evicts_least_recently_released_first():
    cache = PrefixCache()
    alloc = PrefixAllocator(10, cache)
    for prefix in (1, 2):  # two prefixes of 3 blocks, registered, then released: 6 cached, 10 free
        alloc.allocate(3)
        cache.register(prefix, 3)
        cache.drop(prefix, alloc)
    assert (alloc.used, cache.idle_blocks) == (0, 6)
    alloc.allocate(5)  # 5 used + 6 cached > 10: the older prefix (1) goes
    assert list(cache.blocks) == [2] and cache.stats.evictions == 1


def test_shared_prefix_settings_prepend_a_system_prompt():
    base = closed_batch(8, LengthSpec("fixed", 50), LengthSpec("fixed", 10))
    shared = with_shared_prefix(base, 1000, 1.0)
    assert shared.prompt_tokens.tolist() == [1050] * 8 and shared.prefix_tokens.tolist() == [1000] * 8
    assert shared.prefix_id.tolist() == [0] * 8
    half = with_shared_prefix(base, 1000, 0.5, seed=1)
    assert set(half.prefix_id.tolist()) == {0, -1}
    assert (half.prompt_tokens == np.where(half.prefix_id == 0, 1050, 50)).all()
    with pytest.raises(InputError, match="--shared-prefix-ratio"):
        with_shared_prefix(base, 1000, 1.5)


def test_cosimulated_replicas_carry_the_prefixes(system):
    load = workload([0, 1, 2, 3], [120] * 4, [2] * 4, [0] * 4, [100] * 4)
    result = simulate_cluster(system, load, ON, 100, replicas=2, router="least_outstanding")
    # Each replica computes the prefix once: 4 lookups, 2 hits (one per replica after its first request).
    assert result.extra["prefix_cache"].lookups == 4 and result.extra["prefix_cache"].hits == 2


def test_a_shared_system_prompt_cuts_ttft_when_caching_is_on():
    base = {"model": "llama3-8b", "gpu": "h100", "qps": 4, "requests": 200, "prompt_tokens": "200", "output_tokens": "100",
                "shared_prefix_tokens": 1000}
    off = simulate_settings(base)
    on = simulate_settings({**base, "prefix_caching": True})
    # 1000 of each 1200-token prompt are cached (62 whole blocks = 992 tokens) for all but the first request.
    stats = on.result.extra["prefix_cache"]
    assert stats.hits == 199 and stats.saved_tokens == 199 * 992
    assert on.metrics.ttft.p50 < 0.5 * off.metrics.ttft.p50


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked", "prefill-first"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_balance_under_sharing_preemption_and_eviction(system, scheduler, seed):
    # Random prefixes over a cache too small for the load: every request finishes, and when all are done no
    # block is in use; cached prefixes fit in what is free.
    from simulator.engine.engine import Engine
    from simulator.engine.metrics import DONE

    rng = np.random.default_rng(seed)
    n = 60
    prefix_tokens = rng.integers(0, 300, n)
    load = workload(np.cumsum(rng.exponential(0.02, n)), prefix_tokens + rng.integers(1, 200, n),
                    rng.integers(1, 120, n), rng.integers(-1, 4, n), prefix_tokens)
    engine = Engine(system, load, SchedulerConfig(scheduler, block_size=16, prefix_caching=True), 60)
    result = engine.run()
    assert (result.status == DONE).all()
    assert engine.alloc.used == 0 and engine.prefixes.idle_blocks <= engine.alloc.total
    assert all(count == 0 for count in engine.prefixes.refs.values())


def test_trace_prefix_columns_reach_the_engine(tmp_path):
    # Three requests of our format sharing prefix 7 (64 tokens = 4 blocks of 16, all reusable: prompt 100 > 64),
    # one without: the 2nd and 3rd hit, saving 2 x 64 = 128 prefill tokens.
    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
                    "0,100,2,7,64\n1,100,2,7,64\n2,100,2,,\n3,100,2,7,64\n")
    run = simulate_settings({"model": "llama2-7b", "gpu": "a100", "trace": str(path), "prefix_caching": True,
                             "block_size": 16})
    assert run.workload.prefix_id.tolist() == [7, 7, -1, 7]
    stats = run.result.extra["prefix_cache"]
    assert (stats.lookups, stats.hits, stats.saved_tokens) == (3, 2, 128)
    data = run_from_options({"model": "llama2-7b", "gpu": "a100", "trace": str(path), "prefix_caching": True})
    assert data["prefix_cache"]["hits"] == 2 and data["prefix_cache"]["requests_with_prefix"] == 3


@pytest.mark.parametrize("rows,message", [
    ("0,100,2,7,101\n", "t.csv:2: prefix_tokens 101 exceeds the prompt's 100 tokens"),
    ("0,100,2,x,10\n", "t.csv:2: prefix_id 'x' is not a whole number >= -1"),
])
def test_bad_trace_prefix_cells_name_the_line(tmp_path, rows, message):
    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n" + rows)
    with pytest.raises(InputError, match=message):
        simulate_settings({"model": "llama2-7b", "gpu": "a100", "trace": str(path), "prefix_caching": True})


def test_a_warm_cache_starts_with_every_prefix_resident(tmp_path):
    # Four requests, each its own whole prompt as prefix (65 tokens): a hit reuses floor(min(65, 65 - 1) / 16) = 4
    # blocks = 64 tokens (the last token is always computed). Cold: nobody repeats a prefix, 0 hits.
    # Warm (the prompts were served before): 4 hits, 4 x 64 = 256 prefill tokens saved, nothing evicted.
    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
                    + "".join(f"{i},65,8,{i},65\n" for i in range(4)))
    base = {"model": "llama2-7b", "gpu": "a100", "trace": str(path), "prefix_caching": True, "block_size": 16}
    cold = simulate_settings(base).result.extra["prefix_cache"]
    warm_run = simulate_settings({**base, "prefix_cache_warm": True})
    warm = warm_run.result.extra["prefix_cache"]
    assert (cold.lookups, cold.hits, cold.saved_tokens) == (4, 0, 0)
    assert (warm.lookups, warm.hits, warm.saved_tokens, warm.evictions) == (4, 4, 256, 0)
    with pytest.raises(InputError, match="prefix_cache_warm"):
        simulate_settings({**base, "prefix_caching": False, "prefix_cache_warm": True})


def test_warming_stops_at_the_cache_capacity():
    cache = PrefixCache()
    # prefixes of 3, 4 and 2 blocks into 6 blocks of room, in id order: 3 fits, 3 + 4 does not, 3 + 2 = 5 does
    assert cache.warm({0: 3, 1: 4, 2: 2}, 6) == 5
    assert sorted(cache.blocks) == [0, 2] and cache.idle_blocks == 5
