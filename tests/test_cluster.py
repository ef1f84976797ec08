"""Replicas behind a router: policies on hand-worked workloads, exactness of the co-simulation, scaling."""

import numpy as np
import pytest

from simulator.engine.cluster import simulate_cluster
from simulator.engine.metrics import DONE
from simulator.engine.router import ReplicaLoad, Router, round_robin_split
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment
from simulator.plan.run import simulate_settings

BLOCKS = 5000


@pytest.fixture(scope="module")
def system():
    return plan_deployment(load_model("llama2-7b"), load_gpu("a100"), Precision(), batch=1, context_tokens=1024, tp=1).system


def workload(arrivals, prompts, outputs):
    return Workload(np.array(arrivals, dtype=float), np.array(prompts), np.array(outputs), "trace", "test")


def test_round_robin_split_skips_rejected_requests():
    admitted = np.array([True, False, True, True, True])
    assert round_robin_split(admitted, 2).tolist() == [0, -1, 1, 0, 1]


def test_ties_rotate_so_idle_replicas_share_the_load():
    router = Router("least_outstanding", 3)
    idle = [ReplicaLoad(0, 0, 0, 10)] * 3
    assert [router.choose(idle) for _ in range(4)] == [0, 1, 2, 0]
    busy_first = [ReplicaLoad(2, 0, 0, 10), ReplicaLoad(1, 0, 0, 10), ReplicaLoad(1, 0, 0, 10)]
    assert router.choose(busy_first) == 1  # 1 and 2 tie at one request; the search starts after the last choice (0)


def test_kv_load_counts_blocks_in_use_and_blocks_the_queue_needs():
    assert ReplicaLoad(outstanding=3, kv_blocks_used=30, kv_blocks_queued=10, kv_blocks=100).kv_load == 0.4


# A decode tick of llama2-7b on an A100 reads at least its 13.5 GB of fp16 weights: >= 13.5e9 / 2.04e12 s = 6.6 ms,
# so a 2000-token output keeps its replica busy for more than 13 s; a 2-token request of 10 prompt tokens is done
# after one prefill and one decode tick, well within 1 s.
LONG, SHORT = 2000, 2


@pytest.mark.parametrize("router,third", [("round_robin", 0), ("least_outstanding", 1), ("least_kv", 1)])
def test_the_third_request_goes_to_the_busy_replica_only_under_round_robin(system, router, third):
    # r0 (long) -> replica 0, r1 (short) -> replica 1 under every policy (replica 0 holds r0); at t = 2 s r1 is done
    # and r0 is not: round-robin sends r2 to replica 0 anyway, the state-aware policies to the idle replica 1.
    load = workload([0.0, 0.001, 2.0], [10, 10, 10], [LONG, SHORT, SHORT])
    result = simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=2, router=router)
    assert result.extra["replica"].tolist() == [0, 1, third]
    assert (result.status == DONE).all()


def test_least_kv_and_least_outstanding_part_on_a_long_context(system):
    # r0: 2000-token prompt -> replica 0 (125 blocks of 16); r1: 16-token prompt -> replica 1 (1 block).
    # At r2 both replicas hold one request: least_outstanding takes the tie at the rotating start (replica 0),
    # least_kv the replica with 1 block in use rather than 125 (replica 1).
    load = workload([0.0, 0.001, 0.002], [2000, 16, 16], [LONG, LONG, LONG])
    fewest = simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=2, router="least_outstanding")
    emptiest = simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=2, router="least_kv")
    assert fewest.extra["replica"].tolist() == [0, 1, 0]
    assert emptiest.extra["replica"].tolist() == [0, 1, 1]


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked", "prefill-first"])
@pytest.mark.parametrize("blocks", [60, 400])  # 60 blocks of 16 force preemptions under continuous and chunked
def test_cosimulated_round_robin_equals_the_upfront_split(system, scheduler, blocks):
    # Round-robin ignores state, so running every replica in one simpy environment with the router must give
    # what running each share alone gives: a check that replicas see their arrivals when a lone engine would.
    rng = np.random.default_rng(3)
    n = 120
    load = workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(20, 600, n), rng.integers(2, 200, n))
    config = SchedulerConfig(scheduler)
    split = simulate_cluster(system, load, config, blocks, replicas=3)
    together = simulate_cluster(system, load, config, blocks, replicas=3, cosimulate=True)
    assert together.extra["replica"].tolist() == split.extra["replica"].tolist()
    for name in ("first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(together, name), getattr(split, name), rtol=1e-12, atol=1e-12)
    assert together.preemptions.tolist() == split.preemptions.tolist()
    assert together.totals.iterations == split.totals.iterations


def test_requests_no_replica_can_hold_are_rejected_at_the_router(system):
    load = workload([0.0, 0.0, 0.0], [10, 5000, 10], [5, 5, 5])  # 5005 tokens exceed llama2-7b's 4096
    result = simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=2, router="least_kv")
    assert result.extra["replica"].tolist() == [0, -1, 1]
    assert result.reject_reason.tolist() == [0, 1, 0]


def test_bad_router_and_replicas_are_input_errors(system):
    load = workload([0.0], [10], [5])
    with pytest.raises(InputError, match="--router: unknown 'random'"):
        simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=2, router="random")
    with pytest.raises(InputError, match="--replicas: must be >= 1"):
        simulate_cluster(system, load, SchedulerConfig(), BLOCKS, replicas=0)


def test_four_replicas_at_four_times_the_rate_give_four_times_the_throughput():
    # Evenly spaced arrivals (gamma shape 1000): one tp-2 replica gets 100 requests at 4/s over T = 25 s, four get
    # 400 at 16/s over the same 25 s. Output tokens/s = tokens / (T + the last request's latency e), so the ratio is
    # 4 (T + e1) / (T + e4); with e1, e4 under 3 s (a lightly loaded replica) it lies in [4 x 25/28, 4 x 28/25].
    base = {"model": "llama2-13b", "gpu": "a100", "tp": 2, "prompt_tokens": "512", "output_tokens": "uniform:64:192",
                "arrival": "gamma", "burstiness": 1000}
    one = simulate_settings({**base, "qps": 4, "requests": 100})
    four = simulate_settings({**base, "qps": 16, "requests": 400, "replicas": 4, "router": "least_outstanding"})
    assert one.metrics.e2e.p99 < 3 and four.metrics.e2e.p99 < 3
    ratio = four.metrics.output_tokens_per_second / one.metrics.output_tokens_per_second
    assert 4 * 25 / 28 <= ratio <= 4 * 28 / 25
    # Each replica sees the same load as the lone one, so latency stays put (within 25%).
    assert four.metrics.ttft.p50 == pytest.approx(one.metrics.ttft.p50, rel=0.25)
    assert four.metrics.tpot.p50 == pytest.approx(one.metrics.tpot.p50, rel=0.25)
    assert len(four.replica_metrics) == 4 and sum(m.completed for m in four.replica_metrics) == 400


def test_min_replicas_search_steps_down_or_doubles_then_bisects():
    from simulator.sweep.sweep import bisect_min_int

    tried = []

    def at_least_7(replicas):
        tried.append(replicas)
        return replicas >= 7

    assert bisect_min_int(at_least_7, 2, 1024) == 7
    assert tried == [2, 4, 8, 6, 7]  # 2 and 4 fail, 8 passes, then bisection between 4 and 8
    tried.clear()
    assert bisect_min_int(at_least_7, 9, 1024) == 7 and tried == [9, 8, 7, 6]
    assert bisect_min_int(lambda r: False, 3, 16) is None


def test_the_kv_high_water_of_replicas_is_read_against_all_their_blocks():
    """Two replicas: kv_cache.blocks is one replica's cache, the high water the two together, against twice it."""
    from simulator.plan.result import engine_run_dict
    from simulator.plan.run import simulate_settings

    run = engine_run_dict(simulate_settings({"model": "llama3-8b", "gpu": "h100", "qps": 10, "requests": 200,
                                             "replicas": 2, "seed": 1}))
    cache = run["kv_cache"]
    assert cache["high_water_of_blocks"] == 2 * cache["blocks"]
    assert cache["high_water_fraction"] == pytest.approx(cache["high_water_blocks"] / (2 * cache["blocks"]))
