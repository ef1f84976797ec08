"""The serving engine: every iteration charged by the cost model, scheduler behaviour, latency under load."""

import math
from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest
from exact import exact_gpu
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.analytic import run_batch
from simulator.engine.engine import simulate
from simulator.engine.metrics import DONE, aggregate
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import LengthSpec, Workload, closed_batch, open_loop
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.model.step import Step
from simulator.plan.deployment_planner import plan_deployment

BLOCKS = 5000  # plenty: memory plays no part unless a test says so


@pytest.fixture(scope="module")
def deployment():
    gpu = exact_gpu()
    return plan_deployment(load_model("llama2-7b"), gpu, Precision(), batch=1, context_tokens=1024, tp=1)


@pytest.fixture(scope="module")
def system(deployment):
    return deployment.system


def fixed(n):
    return LengthSpec("fixed", n)


def test_static_closed_batch_is_prefill_then_decode_steps(system):
    batch, prompt, output = 4, 100, 20
    r = simulate(system, closed_batch(batch, fixed(prompt), fixed(output)), SchedulerConfig("static"), BLOCKS)
    prefill = system.step_seconds(Step.prefill(batch, prompt))
    # Decode tick k (1 .. 19) feeds token k back and attends prompt + k keys.
    decode = [system.step_seconds(Step.decode(batch, prompt + k)) for k in range(1, output)]
    assert r.first_token == pytest.approx([prefill] * batch, rel=1e-9)
    assert r.finish == pytest.approx([prefill + sum(decode)] * batch, rel=1e-9)
    assert r.totals.iterations == 1 + 19
    m = aggregate(r, system.tp, system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second)
    assert m.tpot.mean == pytest.approx(sum(decode) / 19, rel=1e-9)
    # Every inter-token gap is one decode step; the median of 19 steps x 4 sequences is step 10.
    assert m.itl.p50 == pytest.approx(decode[9], rel=1e-9)
    assert m.output_tokens_per_second == pytest.approx(4 * 20 / (prefill + sum(decode)), rel=1e-9)


def test_engine_matches_the_analytic_closed_batch(deployment):
    analytic = run_batch(deployment, batch=8, context_tokens=1024, gen_tokens=64)
    r = simulate(deployment.system, closed_batch(8, fixed(1024 - 64), fixed(64)), SchedulerConfig("continuous"), BLOCKS)
    assert r.first_token[0] == pytest.approx(analytic.ttft_seconds, rel=1e-9)
    assert r.finish[0] == pytest.approx(analytic.e2e_seconds, rel=1e-9)


def test_one_request_gives_the_same_result_under_every_scheduler(system):
    w = closed_batch(1, fixed(300), fixed(40))
    static = simulate(system, w, SchedulerConfig("static"), BLOCKS)
    continuous = simulate(system, w, SchedulerConfig("continuous"), BLOCKS)
    chunked = simulate(system, w, SchedulerConfig("chunked", max_num_seqs=1, max_batched_tokens=512), BLOCKS)
    alone = simulate(system, w, SchedulerConfig("prefill-first", max_num_seqs=1, max_batched_tokens=512), BLOCKS)
    for other in (continuous, chunked, alone):
        assert np.array_equal(other.first_token, static.first_token)
        assert np.array_equal(other.finish, static.finish)
        assert other.totals.iterations == static.totals.iterations == 40


def test_chunked_prefill_splits_the_prompt_into_budget_sized_chunks(system):
    w = closed_batch(1, fixed(100), fixed(3))
    r = simulate(system, w, SchedulerConfig("chunked", max_num_seqs=1, max_batched_tokens=64), BLOCKS)
    # 100 prompt tokens in a budget of 64: a chunk of 64 (no token emitted), then 36 on top of 64 cached.
    first = system.step_seconds(Step.prefill(1, 64, emits_token=False))
    second = system.step_seconds(Step.prefill(1, 36, cached_tokens=64))
    assert r.first_token[0] == pytest.approx(first + second, rel=1e-9)
    assert r.log["prefill_tokens"].tolist() == [64, 36, 0, 0]


def test_mixed_iteration_reads_weights_once_for_prefill_and_decode(system):
    prompt = 200
    prefill = system.step_seconds(Step.prefill(1, prompt))
    step = [system.step_seconds(Step.decode(1, prompt + k)) for k in (1, 2, 3)]
    # Request 1 arrives halfway through request 0's third decode tick, so it joins at the fourth:
    # one iteration prefills its 200 tokens and decodes request 0's token 4 (attending 204 keys).
    arrival = prefill + step[0] + step[1] + step[2] / 2
    w = Workload(np.array([0.0, arrival]), np.array([prompt, prompt]), np.array([10, 10]), "trace", "two")
    r = simulate(system, w, SchedulerConfig("chunked"), BLOCKS)
    log = r.log
    mixed = np.flatnonzero((log["prefill_tokens"] == prompt) & (log["decode_seqs"] == 1))
    assert mixed.tolist() == [4]
    expected = system.step_seconds(Step.prefill(1, prompt) + Step.decode(1, prompt + 4))
    assert log["seconds"][4] == pytest.approx(expected, rel=1e-9)
    assert expected < prefill + system.step_seconds(Step.decode(1, prompt + 4))  # the weights are read once


def test_prefill_first_runs_prompt_chunks_alone_while_the_decoders_wait(system):
    budget = 64
    prefill = system.step_seconds(Step.prefill(1, 50))
    step = [system.step_seconds(Step.decode(1, 50 + k)) for k in (1, 2, 3)]
    # Request 0 (50 tokens) prefills in one iteration and decodes; request 1 (200 tokens) arrives halfway
    # through request 0's third decode tick. Its prompt goes in chunks of 64, 64, 64 and 8, each an
    # iteration of its own (SGLang without --enable-mixed-chunk): request 0's next token waits for all
    # four, then both decode together.
    arrival = prefill + step[0] + step[1] + step[2] / 2
    w = Workload(np.array([0.0, arrival]), np.array([50, 200]), np.array([10, 10]), "trace", "two")
    r = simulate(system, w, SchedulerConfig("prefill-first", max_num_seqs=4, max_batched_tokens=budget), BLOCKS)
    log = r.log
    assert log["prefill_tokens"][:9].tolist() == [50, 0, 0, 0, 64, 64, 64, 8, 0]
    assert log["decode_seqs"][:9].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 2]
    chunks = [system.step_seconds(Step.prefill(1, 64, cached_tokens=c, emits_token=False)) for c in (0, 64, 128)]
    last = system.step_seconds(Step.prefill(1, 8, cached_tokens=192))
    assert r.first_token[1] == pytest.approx(prefill + sum(step) + sum(chunks) + last, rel=1e-9)
    # Under chunked (mixed) prefill the same arrival shares every chunk iteration with request 0's decode.
    mixed = simulate(system, w, SchedulerConfig("chunked", max_num_seqs=4, max_batched_tokens=budget), BLOCKS).log
    assert (mixed["decode_seqs"][4:8] == 1).all() and mixed["prefill_tokens"][4:8].tolist() == [63, 63, 63, 11]


def test_chunked_iterations_stay_within_the_token_budget(system):
    w = open_loop(40, 50.0, LengthSpec("uniform", 100, 900), LengthSpec("uniform", 5, 60), seed=2)
    r = simulate(system, w, SchedulerConfig("chunked", max_num_seqs=16, max_batched_tokens=256), BLOCKS)
    log = r.log
    assert (log["prefill_tokens"] + log["decode_seqs"]).max() <= 256
    assert log["running"].max() <= 16
    assert (r.status == DONE).all()


def test_continuous_batching_beats_static_on_mixed_output_lengths(system):
    n, seqs, prompt = 128, 8, 32
    w = closed_batch(n, fixed(prompt), LengthSpec("uniform", 16, 512), seed=0)
    outputs = w.output_tokens
    static = simulate(system, w, SchedulerConfig("static", max_num_seqs=seqs), BLOCKS)
    continuous = simulate(system, w, SchedulerConfig("continuous", max_num_seqs=seqs), BLOCKS)
    # Static runs 16 batches of 8 in order, each for as many decode ticks as its longest request needs.
    static_ticks = sum(int(outputs[i:i + seqs].max()) - 1 for i in range(0, n, seqs))
    assert static.totals.decode_iterations == static_ticks
    # Continuous admits before it decodes, so all 8 slots decode while any request waits: at most
    # sum(o - 1) / 8 full ticks, then a tail shorter than the longest request; plus one prefill
    # iteration per request at most.
    continuous_ticks = math.ceil(int((outputs - 1).sum()) / seqs) + int(outputs.max())
    assert continuous.totals.decode_iterations <= continuous_ticks
    # Bound both makespans with the cheapest and dearest iterations of this workload
    # (batch <= 8, at most 32 + 511 keys per sequence).
    fastest = system.step_seconds(Step.decode(1, prompt + 1))
    slowest_decode = system.step_seconds(Step.decode(seqs, prompt + 512))
    slowest_prefill = system.step_seconds(Step.prefill(seqs, prompt))
    margin = static_ticks * fastest / (continuous_ticks * slowest_decode + n * slowest_prefill)
    assert margin > 1.2  # the workload is mixed enough for the check to mean something
    ratio = np.nanmax(static.finish) / np.nanmax(continuous.finish)  # = throughput ratio (same tokens)
    assert ratio >= margin


def test_low_load_ttft_is_the_prefill_of_one_request(system):
    prompt, output = 100, 20
    w = open_loop(60, 0.2, fixed(prompt), fixed(output), seed=4)
    r = simulate(system, w, SchedulerConfig("continuous"), BLOCKS)
    ttft = r.first_token - w.arrival_seconds
    prefill = system.step_seconds(Step.prefill(1, prompt))
    longest_wait = max(prefill, system.step_seconds(Step.decode(1, prompt + output)))
    # Alone, a request's first token is its prefill; at worst it waits for the iteration in flight.
    assert np.median(ttft) == pytest.approx(prefill, rel=1e-9)
    assert ttft.min() >= prefill * (1 - 1e-12)
    assert ttft.max() <= prefill + longest_wait


def test_past_capacity_queueing_grows_without_bound(system):
    prompt, output, seqs = 100, 50, 4
    alone = system.step_seconds(Step.prefill(1, prompt)) + sum(
        system.step_seconds(Step.decode(1, prompt + k)) for k in range(1, output))
    capacity = seqs / alone  # requests/s if 4 ran together at batch-1 speed: an upper bound
    config = SchedulerConfig("continuous", max_num_seqs=seqs)

    def queue_delays(n):
        w = open_loop(n, 3 * capacity, fixed(prompt), fixed(output), seed=5)
        r = simulate(system, w, config, BLOCKS)
        return r.first_scheduled - w.arrival_seconds

    short, long = queue_delays(100), queue_delays(200)
    # Arrivals outpace service, so the wait grows roughly linearly with the request index.
    assert short[75:].mean() > 3 * short[:25].mean()
    assert long[-20:].mean() > 1.6 * short[-20:].mean()


def test_same_seed_same_run_different_seed_different_arrivals():
    from simulator.plan.run import run_from_options

    options = {"model": "llama2-7b", "gpu": "a100", "qps": 20, "requests": 50, "scheduler": "chunked",
               "output_tokens": "uniform:5:50", "ctx": 1024}
    a, b = run_from_options({**options, "seed": 1}), run_from_options({**options, "seed": 1})
    c = run_from_options({**options, "seed": 2})
    assert a == b
    assert a["latency"] != c["latency"]


def test_run_from_options_rejects_unknown_keys_and_bad_values():
    from simulator.plan.engine_run import fit_error
    from simulator.plan.run import run_from_options

    with pytest.raises(InputError, match="unknown setting"):
        run_from_options({"model": "llama2-7b", "gpu": "a100", "qsp": 3})
    with pytest.raises(InputError, match="scheduler: must be .static., .continuous., .chunked. or .prefill-first."):
        run_from_options({"model": "llama2-7b", "gpu": "a100", "scheduler": "fifo"})
    with pytest.raises(InputError, match="--max-batched-tokens 64 is below the vllm profile's default --max-num-seqs 256"):
        run_from_options({"model": "llama2-7b", "gpu": "a100", "scheduler": "chunked", "max_batched_tokens": 64})
    with pytest.raises(InputError, match="--max-batched-tokens 64 is below --max-num-seqs 128"):
        run_from_options({"model": "llama2-7b", "gpu": "a100", "scheduler": "chunked", "max_batched_tokens": 64,
                          "max_num_seqs": 128})
    # 0.15 x 80 GiB = 12 GiB per GPU is below the 12.6 GiB of fp16 weights (6.74e9 x 2 bytes) at tp 1.
    message = fit_error({"model": "llama2-7b", "gpu": "a100", "tp": 1, "gpu_memory_utilization": 0.15})
    assert "does not fit" in message and "less than one 2048-token sequence" in message
    assert fit_error({"model": "llama2-7b", "gpu": "a100"}) is None
    # The default request (1920 + 128 tokens) caches at most 2047 tokens = 128 blocks of 16: 127 blocks are too few.
    assert "does not fit" in fit_error({"model": "llama2-7b", "gpu": "a100", "kv_blocks": 127})
    assert fit_error({"model": "llama2-7b", "gpu": "a100", "kv_blocks": 128}) is None


@pytest.mark.parametrize("scheduler,blocks", [("static", BLOCKS), ("continuous", BLOCKS), ("continuous", 60),
                                              ("chunked", BLOCKS), ("chunked", 60),
                                              ("prefill-first", BLOCKS), ("prefill-first", 60)])
def test_stretches_equal_stepping_one_iteration_at_a_time(system, monkeypatch, scheduler, blocks):
    """Costing decode stretches in one vectorised call changes nothing but speed."""
    import simulator.engine.engine as engine_module

    w = open_loop(40, 30.0, LengthSpec("uniform", 10, 200), LengthSpec("uniform", 2, 80), seed=6)
    config = SchedulerConfig(scheduler, max_num_seqs=12) if scheduler not in ("chunked", "prefill-first") else \
        SchedulerConfig(scheduler, max_num_seqs=12, max_batched_tokens=128)
    fast = simulate(system, w, config, blocks)
    monkeypatch.setattr(engine_module, "STRETCH_MAX", 1)
    slow = simulate(system, w, config, blocks)
    assert fast.totals.iterations == slow.totals.iterations
    assert len(np.unique(np.diff(fast.log["end"][fast.log["prefill_tokens"] == 0]))) > 1  # ticks do vary
    assert np.array_equal(fast.preemptions, slow.preemptions)
    assert (blocks == BLOCKS) == (slow.total_preemptions == 0)
    for name in ("prefill_tokens", "decode_seqs", "blocks_used", "running"):
        assert np.array_equal(fast.log[name], slow.log[name]), name
    for name in ("first_scheduled", "first_token", "finish"):
        assert getattr(fast, name) == pytest.approx(getattr(slow, name), rel=1e-12), name
    for a, b in ((fast, slow),):
        assert np.sum(a.itl["seconds"] * a.itl["weight"]) == pytest.approx(np.sum(b.itl["seconds"] * b.itl["weight"]))
        assert a.itl["weight"].sum() == b.itl["weight"].sum()
    # One inter-token gap per output token after the first, preempted requests included.
    assert fast.itl["weight"].sum() == int((w.output_tokens - 1).sum())
    assert (fast.status == DONE).all()
    assert fast.totals.flops == pytest.approx(slow.totals.flops, rel=1e-12)


def test_measured_ticks_take_the_plain_python_path_and_give_the_same_run(monkeypatch):
    """Where measured kernel tables time the decode ticks, every stretch is costed tick by tick (traced and
    remembered) instead of in one array call: the same run, bit for bit, as the vectorised path gives."""
    import simulator.engine.engine as engine_module
    from simulator.cost.system import System
    from simulator.model.engine_profile import load_engine_profile

    system = System(load_model("llama3-8b"), load_gpu("h100"), Precision(), tp=1, engine=load_engine_profile("vllm"),
                    kernels="measured", kernel_efficiency="shape")
    # Long decodes at a low rate: stretches far longer than SCALAR_TICKS.
    w = open_loop(30, 2.0, LengthSpec("uniform", 10, 300), LengthSpec("uniform", 200, 600), seed=3)
    config = SchedulerConfig("continuous", max_num_seqs=16)
    vectorised_calls = []
    original = engine_module.Engine._stretch_costs
    monkeypatch.setattr(engine_module.Engine, "_stretch_costs",
                        lambda self, *args: vectorised_calls.append(1) or original(self, *args))
    engine = engine_module.Engine(system, w, config, BLOCKS)
    assert engine.measured_ticks
    by_tick = engine.run()
    assert not vectorised_calls
    engine = engine_module.Engine(system, w, config, BLOCKS)
    engine.measured_ticks = False  # as a roofline system: long stretches in one array call
    by_array = engine.run()
    assert vectorised_calls
    _same_run(by_tick, by_array)
    assert (by_tick.status == DONE).all()


def _realistic_system():
    """A time model with every term the tracer must follow: vLLM host time and graphs, tp=2 all-reduce, GEMM shapes."""
    from simulator.cost.system import System
    from simulator.model.engine_profile import load_engine_profile

    return System(load_model("llama2-7b"), load_gpu("a100"), Precision(), tp=2, engine=load_engine_profile("vllm"),
                  collectives="auto", kernel_efficiency="shape")


def _same_run(a, b):
    """Every per-request time, every iteration and every inter-token gap equal, bit for bit."""
    for name in ("status", "preemptions", "first_scheduled", "first_token", "finish"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=name != "status"), name
    for name in ("end", "seconds", "prefill_tokens", "decode_seqs", "blocks_used", "running"):
        assert np.array_equal(a.log[name], b.log[name]), name
    for name in ("seconds", "weight"):
        assert np.array_equal(a.itl[name], b.itl[name]), name
    assert replace(a.totals, cost_calls=0) == replace(b.totals, cost_calls=0)


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked", "prefill-first"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_short_stretch_path_and_traced_costs_change_nothing(system, monkeypatch, scheduler, seed):
    """Short stretches run in plain Python with traced tick costs, remembered by batch and keys attended; long ones
    vectorised: the same run, bit for bit, whichever path each stretch takes and however much of the memo is kept
    (random lengths, a tight cache with preemptions, a realistic time model)."""
    import simulator.engine.engine as engine_module
    import simulator.engine.stretch as stretch_module

    rng = np.random.default_rng(seed)
    w = open_loop(60, float(rng.uniform(5.0, 60.0)), LengthSpec("uniform", 10, 300), LengthSpec("uniform", 1, 150),
                  seed=seed)
    blocks = int(rng.integers(40, 120))
    config = SchedulerConfig(scheduler, max_num_seqs=int(rng.integers(4, 16)),
                             max_batched_tokens=256 if scheduler in ("chunked", "prefill-first") else None)
    for costed_by in (system, _realistic_system()):
        default = simulate(costed_by, w, config, blocks)
        with monkeypatch.context() as patch:
            patch.setattr(engine_module, "SCALAR_TICKS", 0)  # every stretch vectorised
            vectorised = simulate(costed_by, w, config, blocks)
        with monkeypatch.context() as patch:
            patch.setattr(engine_module, "SCALAR_TICKS", 10**9)  # every stretch in plain Python ...
            patch.setattr(engine_module, "trace_scalar", lambda *args: None)  # ... costed by the cost model itself
            patch.setattr(engine_module, "_TICK_COSTS", OrderedDict())  # (no traces kept from the runs above)
            untraced = simulate(costed_by, w, config, blocks)
        with monkeypatch.context() as patch:
            patch.setattr(stretch_module, "TICK_MEMO_MAX", 3)  # ticks remembered, then forgotten every few ...
            patch.setattr(engine_module, "_TICK_COSTS", OrderedDict())  # ... from an empty memo
            patch.setattr(engine_module, "_TICK_MEMO_ENTRIES", [0])
            forgetful = simulate(costed_by, w, config, blocks)
            # One count for every kept system's memo, and it holds the bound.
            kept = sum(len(ticks) for _, _, memo in engine_module._TICK_COSTS.values() for ticks in memo.values())
            assert kept == engine_module._TICK_MEMO_ENTRIES[0] <= 3
        _same_run(default, vectorised)
        _same_run(default, untraced)
        _same_run(default, forgetful)
        assert (default.status == DONE).all()
    assert scheduler == "static" or default.total_preemptions > 0 or blocks > 100


@settings(max_examples=15)
@given(
    scheduler=st.sampled_from(["static", "continuous", "chunked", "prefill-first"]),
    n=st.integers(1, 25),
    qps=st.floats(1.0, 200.0),
    spare_blocks=st.integers(0, 40),
    seqs=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_invariants_hold_for_any_small_workload(system, scheduler, n, qps, spare_blocks, seqs, seed):
    w = open_loop(n, qps, LengthSpec("uniform", 1, 120), LengthSpec("uniform", 1, 60), seed=seed)
    largest = int(((w.prompt_tokens + w.output_tokens - 1 + 15) // 16).max())
    blocks = largest + spare_blocks  # every request fits alone, so none is rejected
    budget = max(seqs, 64) if scheduler in ("chunked", "prefill-first") else None
    r = simulate(system, w, SchedulerConfig(scheduler, max_num_seqs=seqs, max_batched_tokens=budget), blocks)
    assert (r.status == DONE).all()
    assert r.log["blocks_used"].max() <= blocks
    assert r.log["running"].max() <= seqs and r.log["decode_seqs"].max() <= seqs
    assert (r.first_scheduled >= w.arrival_seconds).all()
    assert (r.first_token > r.first_scheduled).all() and (r.finish >= r.first_token).all()
    # Every output token after the first comes from a decode tick, except those a recomputation emits
    # (at most one per preemption; none when the victim had not emitted yet or was preempted mid-prefill).
    decoded, after_first = int(r.log["decode_seqs"].sum()), int((w.output_tokens - 1).sum())
    assert after_first - r.total_preemptions <= decoded <= after_first
    if scheduler == "continuous":  # victims are always decoding: each recomputation emits exactly one token
        assert decoded == after_first - r.total_preemptions
    assert int(r.itl["weight"].sum()) == int((w.output_tokens - 1).sum())
    assert int(r.log["prefill_tokens"].sum()) >= int(w.prompt_tokens.sum())
    if budget is not None:
        assert (r.log["prefill_tokens"] + r.log["decode_seqs"]).max() <= budget
    if scheduler == "prefill-first":  # prefill iterations carry no decode
        assert not ((r.log["prefill_tokens"] > 0) & (r.log["decode_seqs"] > 0)).any()
    if scheduler == "static":
        assert r.total_preemptions == 0


def test_a_recomputed_request_is_not_finished_by_its_stale_schedule(system, monkeypatch):
    """Regression: a preempted request readmitted with the same finish tick as before it was preempted."""
    import simulator.engine.engine as engine_module

    w = open_loop(11, 103.39961338613101, LengthSpec("uniform", 1, 150), LengthSpec("uniform", 1, 70), seed=347906)
    config = SchedulerConfig("continuous", max_num_seqs=9)
    fast = simulate(system, w, config, kv_blocks=29)
    monkeypatch.setattr(engine_module, "STRETCH_MAX", 1)
    slow = simulate(system, w, config, kv_blocks=29)
    assert fast.total_preemptions == 3
    assert fast.finish == pytest.approx(slow.finish, rel=1e-12)
    assert int(fast.log["decode_seqs"].sum()) == int((w.output_tokens - 1).sum()) - 3


def test_step_totals_agree_with_step_cost_properties():
    gpu = exact_gpu()
    system = plan_deployment(load_model("llama2-13b"), gpu, Precision(), batch=1, context_tokens=1024, tp=2).system
    for step in (Step.prefill(3, 500) + Step.decode(7, 900), Step.decode(64.0, np.array([100.0, 5000.0]))):
        cost = system.step_cost(step)
        expected = (cost.seconds, cost.flops, cost.bytes, cost.compute_bound_seconds, cost.memory_bound_seconds,
                    cost.communication_seconds)
        assert np.all(np.asarray(cost.communication_seconds) > 0)
        for got, want in zip(system.step_totals(step), expected):
            assert np.allclose(got, want, rtol=1e-12, atol=0.0)


def test_weighted_summary_sorts_once_and_gives_the_inverted_cdf_percentiles():
    from simulator.engine.metrics import summarize_weighted, weighted_percentile

    # Gaps 0.1 s (weight 5), 0.3 s (weight 4), 0.2 s (weight 1): cumulative 5, 6, 10 in sorted order (0.1, 0.2, 0.3);
    # p50 reaches 5 at 0.1, p90 reaches 9 at 0.3, p99 9.9 at 0.3; mean (0.5 + 1.2 + 0.2) / 10 = 0.19.
    summary = summarize_weighted(np.array([0.1, 0.3, 0.2]), np.array([5, 4, 1]))
    assert (summary.p50, summary.p90, summary.p99) == (0.1, 0.3, 0.3)
    assert summary.mean == pytest.approx(0.19, rel=1e-12)
    rng = np.random.default_rng(4)
    values, weights = rng.exponential(size=500), rng.integers(0, 9, 500)
    summary = summarize_weighted(values, weights)
    keep = weights > 0
    assert [summary.p50, summary.p90, summary.p99] == [weighted_percentile(values[keep], weights[keep], q)
                                                       for q in (50, 90, 99)]


def test_summaries_of_stacked_samples_equal_each_summarized_alone():
    from simulator.engine.metrics import summarize, summarize_rows

    rng = np.random.default_rng(8)
    for size in (1, 2, 7, 1000):
        samples = [rng.exponential(size=size) for _ in range(3)]
        assert summarize_rows(*samples) == [summarize(sample) for sample in samples]
    assert summarize_rows(np.zeros(0), np.zeros(0)) == [summarize(np.zeros(0))] * 2


def test_log_columns_take_rows_as_lists_arrays_or_one_value_for_every_row():
    """Three rows appended at once: ends as a list, seconds as an array, 0 prefill tokens and 7 decoders for each."""
    from simulator.engine.metrics import iteration_log

    log = iteration_log()
    log.add(0.5, 0.5, 100, 0, 3, 2)
    log.append(end=[1.0, 1.5, 2.0], seconds=np.array([0.5, 0.5, 0.5]), prefill_tokens=0, decode_seqs=7,
               blocks_used=np.array([4, 4, 5]), running=7)
    assert log["end"].tolist() == [0.5, 1.0, 1.5, 2.0]
    assert log["prefill_tokens"].tolist() == [100, 0, 0, 0] and log["decode_seqs"].tolist() == [0, 7, 7, 7]
    assert log["prefill_tokens"].dtype == np.int64 and log["blocks_used"].tolist() == [3, 4, 4, 5]


def test_a_log_read_is_a_read_only_view_and_rows_added_after_it_leave_it_as_it_was(tmp_path):
    """A read shares the column's memory (a long run's log is not copied to be summarised) and cannot be written;
    rows appended while it is held, one at a time or several, go to a copy of the column that the next read sees."""
    from simulator.engine.metrics import iteration_log

    log = iteration_log()
    log.add(0.5, 0.5, 100, 0, 3, 2)
    held = log["end"]
    assert not held.flags.owndata and not held.flags.writeable
    with pytest.raises(ValueError):
        held[0] = 9.0
    log.add(1.0, 0.5, 0, 2, 3, 2)  # one row: every column grows, the viewed one by way of a copy
    log.append(end=[1.5, 2.0], seconds=np.array([0.5, 0.5]), prefill_tokens=0, decode_seqs=2,
               blocks_used=np.array([4, 4]), running=2)
    also = log["decode_seqs"]
    log.append(end=np.array([2.5]), seconds=[0.5], prefill_tokens=[0], decode_seqs=2, blocks_used=5, running=2)
    assert held.tolist() == [0.5] and also.tolist() == [0, 2, 2, 2]
    assert log["end"].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5] and log["decode_seqs"].tolist() == [0, 2, 2, 2, 2]
    assert log["blocks_used"].tolist() == [3, 3, 4, 4, 5]
    log.spill_to(tmp_path)
    still = log["seconds"]  # a mapped file now; the in-memory columns are emptied, views held or not
    log.spill()
    log.add(3.0, 0.5, 0, 1, 2, 1)
    assert still.tolist() == [0.5] * 5 and log["end"].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


def test_percentiles_interpolate_linearly_and_a_sample_of_one_value_has_it_at_each():
    """[1, 2, 3, 4]: the q-th percentile sits at index q/100 x 3, between its neighbours: p50 at 1.5 is 2.5, p90 at
    2.7 is 3.7, p99 at 2.97 is 3.97. Seven requests of one static batch share their TTFT, 0.1234 s: every percentile
    is 0.1234 exactly (and a queue of zeros is zero), and so is each row of a stack of such samples."""
    from simulator.engine.metrics import summarize, summarize_rows

    ramp = summarize(np.array([1.0, 2.0, 3.0, 4.0]))
    assert (ramp.p50, ramp.p90, ramp.p99) == (2.5, pytest.approx(3.7, abs=1e-12), pytest.approx(3.97, abs=1e-12))
    batch = summarize(np.full(7, 0.1234))
    assert (batch.p50, batch.p90, batch.p99) == (0.1234, 0.1234, 0.1234)
    ttft, queue, mixed = summarize_rows(np.full(7, 0.1234), np.zeros(7), np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.8]))
    assert (ttft.p50, ttft.p99, queue.p50, queue.p99) == (0.1234, 0.1234, 0.0, 0.0)
    # one value apart in seven (sorted: six 0.1 then 0.8): p90 at index 5.4 is 0.1 + 0.4 x 0.7 = 0.38, p99 at 5.94 is
    # 0.1 + 0.94 x 0.7 = 0.758
    assert (mixed.p50, mixed.p90, mixed.p99) == (0.1, pytest.approx(0.38, abs=1e-12), pytest.approx(0.758, abs=1e-12))


def test_the_chunked_weighted_summary_gives_the_same_percentiles(monkeypatch):
    """Large samples (a streamed run's inter-token gaps) are summarised in chunks by a radix selection."""
    import simulator.engine.metrics as metrics

    monkeypatch.setattr(metrics, "CHUNK", 1000)  # several chunks for a small sample
    rng = np.random.default_rng(12)
    for decimals in (3, 12):  # many ties, few ties
        values = np.round(rng.exponential(0.05, 5000), decimals)
        weights = rng.integers(0, 40, 5000)
        whole, chunked = metrics.summarize_weighted(values, weights), metrics._summarize_weighted_chunked(values, weights)
        assert (chunked.p50, chunked.p90, chunked.p99) == (whole.p50, whole.p90, whole.p99)
        assert chunked.mean == pytest.approx(whole.mean, rel=1e-12)
    # By hand: 0.1 s (weight 5), 0.3 s (4), 0.2 s (1): p50 0.1, p90 0.3, p99 0.3 (see the test above).
    summary = metrics._summarize_weighted_chunked(np.array([0.1, 0.3, 0.2]), np.array([5, 4, 1]))
    assert (summary.p50, summary.p90, summary.p99) == (0.1, 0.3, 0.3)
