"""Agentic sessions, the KV offload tier and prefix-aware routing (simulator.engine.sessions, kv_offload, prefix_router)."""

import json

import numpy as np
import pytest

from simulator.engine.cluster import simulate_cluster
from simulator.engine.engine import Engine
from simulator.engine.kv_offload import OffloadTier, parse_offload, tier_bytes_per_second
from simulator.engine.metrics import DONE
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.sessions import as_sessions, by_turn, session_workload, with_hash_prefixes
from simulator.engine.traces import read_trace
from simulator.engine.workload import trace_workload
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment
from simulator.plan.run import simulate_settings

CACHED = SchedulerConfig("chunked", block_size=16, prefix_caching=True, max_batched_tokens=2048)
BLOCK_BYTES = 16 * 2 * 32 * 32 * 128 * 2
"""llama2-7b fp16 KV block of 16 tokens: 16 x (2 (K and V) x 32 layers x 32 KV heads x 128 dims x 2 bytes) = 8 MiB."""


@pytest.fixture(scope="module")
def system():
    exact = {"compute": 1.0, "memory": 1.0, "link": 1.0, "kernel_launch_seconds": 0.0, "allreduce_latency_seconds": 0.0}
    gpu = load_gpu("a100").with_efficiency(**exact)
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1).system


def test_each_turn_prompt_is_the_conversation_so_far_plus_new_text():
    # P = 200 new tokens, O = 50 answer tokens: turn k's prompt is P + (k - 1)(P + O) = 200, 450, 700, and its
    # history (what the previous turn's prompt and answer hold) (k - 1)(P + O) = 0, 250, 500. Turn-major order:
    # requests 0-2 are the three sessions' first turns, started think/sessions = 2/3 s apart.
    w = session_workload(3, 3, 2.0, 200, 50)
    assert w.prompt_tokens.tolist() == [200] * 3 + [450] * 3 + [700] * 3
    assert w.prefix_tokens.tolist() == [0] * 3 + [250] * 3 + [500] * 3
    assert w.prefix_id.tolist() == [0, 1, 2] * 3
    assert w.previous.tolist() == [-1, -1, -1, 0, 1, 2, 3, 4, 5]
    assert w.arrival_seconds[:3] == pytest.approx([0, 2 / 3, 4 / 3]) and np.isinf(w.arrival_seconds[3:]).all()


def test_a_turn_is_sent_think_time_after_the_previous_answer(system):
    w = session_workload(2, 3, 1.5, 200, 20)
    result = Engine(system, w, SchedulerConfig("chunked", block_size=16), 500).run()
    assert (result.status == DONE).all()
    sent = result.workload.arrival_seconds
    # Request k + 2 follows request k: sent exactly 1.5 s after the client got k's last token (no client path here).
    for later in range(2, 6):
        assert sent[later] == pytest.approx(result.finish[later - 2] + 1.5, abs=1e-12)
        assert result.first_scheduled[later] >= sent[later]


def test_hit_rate_and_recomputed_tokens_by_hand(system):
    # 4 sessions x 3 turns, P = 200, O = 50, block 16, a cache big enough for all. A finished turn computed the
    # KV of prompt + output - 1 tokens; its whole blocks stay cached under the session:
    #   turn 1: 200 + 50 - 1 = 249 tokens -> 15 blocks = 240 tokens; turn 2 wants floor(min(250, 449) / 16) = 15
    #           blocks: 240 of its 450 tokens cached, 250 - 240 = 10 history tokens recomputed, per session.
    #   turn 2: 450 + 50 - 1 = 499 -> 31 blocks = 496; turn 3 wants floor(500 / 16) = 31: 496 cached, 4 recomputed.
    w = session_workload(4, 3, 2.0, 200, 50)
    engine = Engine(system, w, CACHED, 500)
    rows = by_turn(engine.run())
    assert [(r.turn, r.cached_tokens, r.recomputed_tokens) for r in rows] == [(1, 0, 0), (2, 4 * 240, 4 * 10),
                                                                             (3, 4 * 496, 4 * 4)]
    assert rows[1].hit_rate == pytest.approx(960 / (4 * 450)) and rows[2].hit_rate == pytest.approx(1984 / (4 * 700))
    assert engine.alloc.used == 0 and all(count == 0 for count in engine.prefixes.refs.values())
    # Without the cache every history token is recomputed: 4 x 250 and 4 x 500.
    off = by_turn(Engine(system, w, SchedulerConfig("chunked", block_size=16), 500).run())
    assert [r.recomputed_tokens for r in off] == [0, 1000, 2000]
    assert rows[2].ttft_mean_seconds < off[2].ttft_mean_seconds


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked", "prefill-first"])
def test_blocks_balance_when_sessions_outgrow_the_cache(system, scheduler):
    # 6 sessions of 5 turns reach 5 x 300 + 4 x 60 = 1740 tokens each, 6 x 1740 > 120 blocks x 16 = 1920 tokens:
    # prefixes are evicted and requests preempted, yet every turn finishes and no block is left in use.
    w = session_workload(6, 5, 0.2, 300, 60)
    engine = Engine(system, w, SchedulerConfig(scheduler, block_size=16, prefix_caching=True), 120)
    result = engine.run()
    assert (result.status == DONE).all()
    assert engine.alloc.used == 0 and engine.prefixes.idle_blocks <= engine.alloc.total
    assert all(count == 0 for count in engine.prefixes.refs.values())
    assert result.extra["prefix_cache"].evictions > 0


def test_offload_tier_load_time_is_bytes_over_bandwidth():
    # 31 blocks of 8 MiB over PCIe Gen4 x16 (32 GB/s): 31 x 8,388,608 / 32e9 = 8.126464 ms.
    tier = OffloadTier("cpu", capacity_blocks=40, bytes_per_block_per_gpu=BLOCK_BYTES, bandwidth_bytes_per_second=32e9)
    tier.store(7, 31)
    assert tier.load(7, 100) == (31, pytest.approx(31 * 8_388_608 / 32e9))
    assert tier.load(8, 10) == (0, 0.0)
    tier.store(9, 20)  # 31 + 20 > 40: the least recently used (7) goes
    assert list(tier.held) == [9] and tier.stats.evictions == 1
    # PCIe Gen4 x16: 16 GT/s x 16 lanes / 8 bits ~ 32 GB/s; Gen5 doubles it; NVLink-C2C 900 GB/s both ways / 2.
    assert tier_bytes_per_second(load_gpu("a100"), "cpu") == 16e9 * 16 / 8
    assert tier_bytes_per_second(load_gpu("h100"), "cpu") == 32e9 * 16 / 8
    assert tier_bytes_per_second(load_gpu("gb200"), "cpu") == 900e9 / 2
    assert tier_bytes_per_second(load_gpu("v100"), "cpu") == 8e9 * 16 / 8  # PCIe Gen3, not Gen4 as by name before
    assert tier_bytes_per_second(load_gpu("h100"), "nvme") == 7e9
    assert parse_offload("cpu:64").capacity_bytes == 64 * 2**30 and parse_offload("nvme:1:3").bandwidth_bytes_per_second == 3e9


def test_an_evicted_turn_is_loaded_from_the_tier_and_overlapped_with_compute(system):
    # 2 sessions x 2 turns, P = 480, O = 17, think 1 s, 64 blocks. Each first turn leaves 480 + 17 - 1 = 496 tokens
    # = 31 blocks cached. Session 0's turn 2 (977 tokens = 62 blocks) takes its 31 back and needs 31 more, evicting
    # session 1's 31 blocks to the CPU tier; session 1's turn 2 then loads those 31 blocks:
    # 31 x 8 MiB / 32 GB/s = 8.126 ms, under the ~20 ms of its 481-token prefill, so hidden by the overlap.
    w = session_workload(2, 2, 1.0, 480, 17)

    def run(bandwidth):
        tier = None if bandwidth is None else (lambda: OffloadTier("cpu", 1000, BLOCK_BYTES, bandwidth))
        result = Engine(system, w, CACHED, 64, offload=tier).run()
        return result, result.first_token - result.workload.arrival_seconds

    fast, fast_ttft = run(32e9)
    tier = fast.extra["offload"]
    assert (tier.hits, tier.loaded_blocks) == (1, 31)
    assert tier.load_seconds == pytest.approx(31 * 8_388_608 / 32e9) and tier.exposed_seconds == 0.0
    assert by_turn(fast)[1].cached_tokens == 2 * 496
    none, none_ttft = run(None)
    slow, slow_ttft = run(1e9)  # 31 x 8 MiB / 1 GB/s = 260.05 ms: the iteration lasts the load, not the compute
    assert slow_ttft[3] == pytest.approx(31 * 8_388_608 / 1e9)
    # Physics: a fast load beats recomputing 977 tokens, which beats a load slower than the recompute.
    assert fast_ttft[3] < none_ttft[3] < slow_ttft[3]


def test_prefix_router_beats_least_outstanding_on_sessions(system):
    # 6 sessions on 4 replicas: least-outstanding sends a session's next turn wherever load is lowest, so most
    # turns land on a replica without their conversation and recompute it; the prefix router keeps each session
    # on the replica that holds it: every one of the 6 x 3 later turns hits.
    w = session_workload(6, 4, 0.5, 800, 50)
    least = simulate_cluster(system, w, CACHED, 2000, 4, "least_outstanding")
    prefix = simulate_cluster(system, w, CACHED, 2000, 4, "prefix")
    assert prefix.extra["prefix_cache"].hits == 18 > least.extra["prefix_cache"].hits
    ttft = {name: (run.first_token - run.workload.arrival_seconds)[w.turn > 1].mean()
            for name, run in (("least", least), ("prefix", prefix))}
    assert ttft["prefix"] < 0.7 * ttft["least"]
    # A view older than the run (refreshed once, at the first arrival, when every cache was empty) sees no prefix.
    stale = simulate_cluster(system, w, CACHED, 2000, 4, "prefix", router_staleness=100.0)
    assert stale.extra["prefix_cache"].hits < prefix.extra["prefix_cache"].hits


def test_mooncake_trace_conversations(tmp_path):
    # Row 2 starts with all of row 1's hashes (a later turn): conversation 0, 2 x 512 = 1024 history tokens.
    # Row 3 shares only hash 1 with them (a common first block): a conversation of its own. Times are milliseconds.
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 1600, "output_length": 20, "hash_ids": [1, 2, 3, 4]},
            {"timestamp": 2500, "input_length": 700, "output_length": 5, "hash_ids": [1, 9]}]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trace = with_hash_prefixes(read_trace(path))
    assert trace.format == "Mooncake" and trace.arrival_seconds.tolist() == [0.0, 1.5, 2.5]
    assert trace.prefix_id.tolist() == [0, 0, 1] and trace.prefix_tokens.tolist() == [0, 1024, 0]
    sessions = as_sessions(trace_workload(trace, 1.0, None, None, 0, 10**6, 0.0, None))
    assert sessions.turn.tolist() == [1, 2, 1] and (sessions.previous == -1).all()


def test_session_settings_run_end_to_end_and_refuse_clashes():
    base = {"model": "llama2-7b", "gpu": "a100", "sessions": 4, "turns": 3, "think_time": 1.0, "turn_tokens": 300,
            "output_tokens": "40", "prefix_caching": True}
    run = simulate_settings(base)
    assert run.metrics.completed == 12 and len(by_turn(run.result)) == 3
    with pytest.raises(InputError, match="sessions"):
        simulate_settings({**base, "qps": 2})
    with pytest.raises(InputError, match="kv_offload|kv-offload"):
        simulate_settings({**base, "prefix_caching": False, "kv_offload": "cpu:8"})
    with pytest.raises(InputError, match="cannot read"):
        parse_offload("gpu:8")
