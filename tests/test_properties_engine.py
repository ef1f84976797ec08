"""Serving-engine invariants for random workloads, schedulers and cache sizes (hypothesis).

For every run: each admitted request emits exactly the output tokens it asked for; nothing
is scheduled, emits or finishes before it arrives; TTFT <= end-to-end; and output
throughput never beats the roofline bound of the largest batch that ran at once:
an iteration that emits E tokens processes at least E new tokens of E sequences, so it
costs at least a decode step of E sequences at context 1, t(E); hence

    output tokens / duration <= max over E <= max running of E / t(E).
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from strategies import FULL_PRECISION_WEIGHTS, gpus, models, precisions

from simulator.cost.system import System
from simulator.engine.engine import simulate
from simulator.engine.kvcache import blocks_for
from simulator.engine.metrics import DONE, aggregate
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import Workload
from simulator.model.step import Step

BLOCK = 16


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n = draw(st.integers(1, 24))
    closed = draw(st.booleans())
    gaps = draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    arrivals = np.zeros(n) if closed else np.cumsum(np.array(gaps))
    prompts = np.array(draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), dtype=np.int64)
    outputs = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), dtype=np.int64)
    return Workload(arrivals, prompts, outputs, kind="closed" if closed else "trace", description="random")


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    scheduler = draw(st.sampled_from(["static", "continuous", "chunked", "prefill-first"]))
    seqs = draw(st.integers(1, 16))
    budget = draw(st.integers(seqs, 512)) if scheduler in ("chunked", "prefill-first") else None
    admission = draw(st.sampled_from(["incremental", "fit"])) if scheduler != "static" else "incremental"
    return SchedulerConfig(scheduler=scheduler, max_num_seqs=seqs, max_batched_tokens=budget, block_size=BLOCK,
                           kv_admission=admission)


def run(model, gpu, precision, workload, config, spare_blocks):
    """A cache just big enough for the largest request, plus ``spare_blocks`` (small: preemption happens)."""
    largest = int(np.max(workload.prompt_tokens + workload.output_tokens))
    system = System(model, gpu, precision)
    result = simulate(system, workload, config, blocks_for(largest, BLOCK) + spare_blocks)
    return system, result


@given(models(), gpus(exact=False), precisions(FULL_PRECISION_WEIGHTS), workloads(), configs(), st.integers(0, 40))
def test_every_request_emits_exactly_its_output_tokens(model, gpu, precision, workload, config, spare):
    system, result = run(model, gpu, precision, workload, config, spare)
    assert np.all(result.status == DONE)
    stats = aggregate(result, 1, system.peak_flops, gpu.hbm_bandwidth_bytes_per_second)
    assert stats.output_tokens == int(workload.output_tokens.sum())
    assert stats.completed == len(workload)
    if result.total_preemptions == 0:
        # Each request's prefill emits its first token; every decode tick emits one per decoding sequence.
        decode_tokens = int(result.log["decode_seqs"].sum())
        assert decode_tokens + len(workload) == int(workload.output_tokens.sum())


@given(models(), gpus(exact=False), precisions(FULL_PRECISION_WEIGHTS), workloads(), configs(), st.integers(0, 40))
def test_no_request_is_served_before_it_arrives_and_ttft_is_at_most_e2e(model, gpu, precision, workload, config, spare):
    _, result = run(model, gpu, precision, workload, config, spare)
    arrival = workload.arrival_seconds
    assert np.all(result.first_scheduled >= arrival)
    assert np.all(result.first_token > arrival)  # a prefill takes time
    assert np.all(result.finish >= result.first_token)  # TTFT <= e2e
    single = workload.output_tokens == 1
    assert np.all(result.finish[single] == result.first_token[single])


@given(models(), gpus(exact=False), precisions(FULL_PRECISION_WEIGHTS), workloads(), configs(), st.integers(0, 40))
def test_output_throughput_never_beats_the_roofline_bound_of_the_largest_batch(
    model, gpu, precision, workload, config, spare
):
    system, result = run(model, gpu, precision, workload, config, spare)
    stats = aggregate(result, 1, system.peak_flops, gpu.hbm_bandwidth_bytes_per_second)
    assert 1 <= result.max_running <= config.max_num_seqs
    emitted = np.arange(1.0, result.max_running + 1.0)
    fastest = system.step_cost(Step.decode(emitted, 1.0)).seconds  # t(E), E = 1 .. max running
    bound = float(np.max(emitted / fastest))
    assert stats.output_tokens_per_second <= bound * (1 + 1e-9)
    assert result.totals.busy_seconds <= stats.duration_seconds * (1 + 1e-9) + 1e-12
