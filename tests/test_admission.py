"""Admission from the cache: only the weights and one max-length sequence must fit; the rest queues."""

import numpy as np
import pytest

from simulator.engine.engine import simulate
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment
from simulator.plan.engine_run import fit_error, prepare
from simulator.plan.placement import queued_counts
from simulator.plan.run import simulate_settings


def test_a_closed_batch_larger_than_the_cache_runs_with_queueing_and_a_note():
    # llama2-13b KV: 2 x 40 layers x 40 heads x 128 x 2 B = 819,200 B/token; 256 x 4096 tokens = 800 GiB,
    # ten times one A100's 80 GiB: the old check refused it. Weights 24.2 GiB fit, so it must run.
    run = simulate_settings({"model": "llama2-13b", "gpu": "a100", "batch": 256, "ctx": 4096, "gen": 2048,
                             "engine": "ideal"})
    assert run.deployment.system.tp == 1
    assert run.deployment.memory.kv_bytes == 256 * 4096 * 819_200 and not run.deployment.memory.fits
    assert run.metrics.completed == 256
    # The cache holds under 0.9 x 80 GiB / 819,200 B = 94,371 tokens, fewer than the 256 x 2048 = 524,288
    # prompt tokens, so at least 256 - 94,371 // 2048 = 210 requests cannot even start at t = 0.
    assert run.capacity.tokens < 94_371
    queued, for_kv = queued_counts(run.result)
    assert for_kv >= 210 and queued >= for_kv
    assert any("waited for free KV blocks" in note for note in run.notes)


def test_auto_tp_prefers_the_smallest_that_holds_the_batch_else_one_sequence():
    # llama2-70b fp16 weights: 68,976,648,192 x 2 B = 128.5 GiB. KV 327,680 B/token.
    # Batch 64 x 4096 tokens = 80 GiB of KV. tp 2: 64.2 GiB weights + 40 GiB KV per GPU > 80 GiB;
    # tp 4: 32.1 + 20 GiB fits, so the planned batch runs without queueing at tp 4.
    prep = prepare({"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096})
    assert prep.deployment.system.tp == 4 and prep.deployment.auto_tp
    # Batch 2048 x 4096: the engine (vLLM on an A100: at most 256 sequences) never runs more than 256 of them
    # at once, so 256 are planned: 256 x 4096 x 327,680 B = 320 GiB of KV. tp 4: 32.1 + 80 GiB per GPU > 80 GiB;
    # tp 8: 16.1 + 40 GiB fits, so tp 8 holds every running sequence, and the report names tp 2 as the fewest
    # GPUs that serve it with queueing (tp 1: weights above 0.9 x 80 = 72 GiB; tp 2: 64.2 GiB of weights +
    # ~1.2 GiB workspace + 1 GiB runtime leaves ~5.6 GiB, more than one 4096-token sequence, 0.625 GiB per GPU).
    prep = prepare({"model": "llama2-70b", "gpu": "a100", "batch": 2048, "ctx": 4096})
    assert prep.deployment.system.tp == 8 and prep.deployment.memory.sequences == 256
    assert prep.deployment.fewest_gpus == 2 and "--tp 2" in prep.deployment.note
    # Allowed more sequences at once than any node holds (2048 x 4096 = 2,560 GiB of KV > 8 x 80 GiB), the
    # smallest degree that serves with queueing is chosen.
    prep = prepare({"model": "llama2-70b", "gpu": "a100", "batch": 2048, "ctx": 4096, "max_num_seqs": 2048})
    assert prep.deployment.system.tp == 2 and prep.deployment.fewest_gpus == 0
    assert prep.capacity.tokens >= 4096
    message = fit_error({"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096, "tp": 1})
    assert "does not fit" in message and "less than one 4096-token sequence" in message


def test_nothing_fits_names_every_layout_tried():
    # gpt3-175b fp16 (325 GiB) on one stage of V100-32GB: at tp 8, 40.7 GiB per GPU > 0.9 x 32 GiB.
    with pytest.raises(InputError, match=r"does not fit on V100-SXM2-32GB at any layout tried \(tp 1, tp 2, tp 4, tp 8\)"):
        prepare({"model": "gpt3-175b", "gpu": "v100", "ctx": 2048, "pp": 1})


@pytest.fixture(scope="module")
def system():
    exact = {"compute": 1.0, "memory": 1.0, "link": 1.0, "kernel_launch_seconds": 0.0, "allreduce_latency_seconds": 0.0}
    gpu = load_gpu("a100").with_efficiency(**exact)
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1).system


def _workload(n: int, prompt: int, output: int) -> Workload:
    return Workload(np.zeros(n), np.full(n, prompt), np.full(n, output), "closed", "test")


def test_waiting_for_kv_is_told_apart_from_the_sequence_cap(system):
    # Four requests of 32 + 2 tokens, 16-token blocks: 2 blocks to start, a 3rd for the decode tick.
    # 4 blocks: r0 and r1 start (2 + 2), r2 and r3 are refused for blocks. The decode tick needs 2 more blocks
    # with none free, so r1 (newest) is preempted (queued again for lack of blocks).
    config = SchedulerConfig("continuous", block_size=16)
    result = simulate(system, _workload(4, 32, 2), config, kv_blocks=4)
    assert result.waited_for_kv.tolist() == [False, True, True, True]
    assert queued_counts(result) == (3, 3)
    # Plenty of blocks but at most 2 sequences: r2 and r3 wait for a slot, not for KV.
    capped = simulate(system, _workload(4, 32, 2), SchedulerConfig("continuous", max_num_seqs=2), kv_blocks=1000)
    assert queued_counts(capped) == (2, 0)
