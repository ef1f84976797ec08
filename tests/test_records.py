"""Streaming a run's records to disk (simulator.engine.records) changes nothing but where they are kept."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simulator.engine.engine import Engine
from simulator.engine.metrics import DONE, REJECTED, aggregate
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import LengthSpec, Workload, open_loop
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment


@pytest.fixture(scope="module")
def system():
    gpu = load_gpu("a100")
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1).system


def _with_prefixes(workload: Workload, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    prefix_id = rng.integers(-1, 3, len(workload))
    return replace(workload, prefix_id=prefix_id, prefix_tokens=np.minimum(workload.prompt_tokens, 64))


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked", "prefill-first"])
@pytest.mark.parametrize("window", [1, 7, 64])
def test_a_streamed_run_equals_the_run_held_in_memory(system, tmp_path, scheduler, window):
    # 150 requests, some longer than the whole cache (90 blocks of 16 = 1440 tokens: rejected), a cache tight enough
    # to preempt, shared prefixes: windows of 1, 7 and 64 requests are written and dropped as the run goes.
    w = open_loop(150, 40.0, LengthSpec("uniform", 10, 1400), LengthSpec("uniform", 1, 300), seed=window)
    config = SchedulerConfig(scheduler, max_num_seqs=12, max_batched_tokens=256 if scheduler in ("chunked", "prefill-first") else None,
                             prefix_caching=scheduler != "static")
    if scheduler != "static":
        w = _with_prefixes(w, window)
    held = Engine(system, w, config, 90).run()
    engine = Engine(system, w, config, 90, records=tmp_path, window=window)
    streamed = engine.run()
    assert engine.n == 0 and engine.offset == len(w)  # nothing left in memory
    assert (held.status == REJECTED).any() and (held.status == DONE).any()
    assert scheduler == "static" or held.total_preemptions > 0
    for name in ("status", "reject_reason", "first_scheduled", "first_token", "finish", "preemptions", "waited_for_kv"):
        assert isinstance(getattr(streamed, name), np.memmap), name
        assert np.array_equal(getattr(held, name), getattr(streamed, name), equal_nan=name.startswith("f")), name
    for name in ("end", "seconds", "prefill_tokens", "decode_seqs", "blocks_used", "running"):
        assert np.array_equal(held.log[name], streamed.log[name]), name
    for name in ("seconds", "weight"):
        assert np.array_equal(held.itl[name], streamed.itl[name]), name
    assert replace(held.totals, cost_calls=0) == replace(streamed.totals, cost_calls=0)
    assert aggregate(held, 1, 1e15, 2e12) == aggregate(streamed, 1, 1e15, 2e12)


def test_the_record_files_hold_one_row_per_request_in_workload_order(system, tmp_path):
    w = open_loop(20, 5.0, LengthSpec("fixed", 100), LengthSpec("fixed", 10), seed=1)
    result = Engine(system, w, SchedulerConfig("continuous"), 500, records=tmp_path, window=3).run()
    finish = np.fromfile(tmp_path / "requests" / "finish.bin", dtype=np.float64)
    assert len(finish) == 20 and np.array_equal(finish, result.finish)
    assert (finish > w.arrival_seconds).all()  # request k's row is request k's record
