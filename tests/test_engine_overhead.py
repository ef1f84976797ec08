"""Engine profiles: host CPU time per iteration, its overlap with the GPU, graph capture; through the engine too."""

import numpy as np
import pytest

from simulator.cost.engine_overhead import (
    exposed_seconds,
    graph_captured,
    iteration_cpu_seconds,
    iteration_overhead_seconds,
)
from simulator.cost.system import System
from simulator.engine.engine import simulate
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import LengthSpec, closed_batch
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import (
    IDEAL,
    list_engine_profiles,
    load_engine_profile,
)
from simulator.model.precision import Precision
from simulator.model.step import Step
from simulator.plan.deployment_planner import deployment_from_options


def test_cpu_time_of_k_sequences_is_fixed_plus_per_sequence_plus_per_token():
    vllm = load_engine_profile("vllm")
    # 0.3 ms + 32 * 20 us + 32 tokens * 20 ns = 300 + 640 + 0.64 us = 940.64 us
    assert iteration_cpu_seconds(vllm, 32, 32) == pytest.approx(940.64e-6, rel=1e-12)
    # A prefill chunk of 2048 tokens for 1 sequence: 300 + 20 + 40.96 us = 360.96 us
    assert iteration_cpu_seconds(vllm, 1, 2048) == pytest.approx(360.96e-6, rel=1e-12)
    assert iteration_cpu_seconds(vllm, 0, 0) == 0.0  # no iteration, no host work
    got = iteration_cpu_seconds(vllm, np.array([0.0, 32.0]), np.array([0.0, 32.0]))
    assert got == pytest.approx([0.0, 940.64e-6], rel=1e-12)


def test_vllm_v0_overhead_is_vidurs_straight_line():
    v0 = load_engine_profile("vllm-v0")
    # Vidur's A100 profile, sum of the four CPU phases: 2.983 ms at batch 8 and 12.558 ms at batch 64.
    assert iteration_cpu_seconds(v0, 8, 8) == pytest.approx(2.983e-3, rel=2e-3)
    assert iteration_cpu_seconds(v0, 64, 64) == pytest.approx(12.558e-3, rel=2e-3)


def test_vllm_0_6_overlaps_output_processing_with_the_next_step():
    v06 = load_engine_profile("vllm-v0.6")
    # Vidur's phases at batch 64: schedule 0.854 + sampler 1.320 + prepare inputs 1.323 = 3.497 ms block the GPU;
    # process model outputs, 9.062 ms, runs while the GPU computes the next step.
    assert iteration_cpu_seconds(v06, 64, 64) == pytest.approx(3.497e-3, rel=2e-3)
    assert iteration_cpu_seconds(v06, 64, 64, v06.async_cpu) == pytest.approx(9.062e-3, rel=2e-3)
    # Under a 20 ms step only the blocking part shows; under a 5 ms step 9.062 - 5 = 4.062 ms more.
    assert iteration_overhead_seconds(v06, 64, 64, 20e-3) == pytest.approx(3.497e-3, rel=2e-3)
    assert iteration_overhead_seconds(v06, 64, 64, 5e-3) == pytest.approx(3.497e-3 + 4.062e-3, rel=2e-3)
    # Both parts together are the V0 straight line (12.558 ms at batch 64).
    v0 = load_engine_profile("vllm-v0")
    both = iteration_cpu_seconds(v06, 64, 64) + iteration_cpu_seconds(v06, 64, 64, v06.async_cpu)
    assert both == pytest.approx(iteration_cpu_seconds(v0, 64, 64), rel=2e-3)
    got = iteration_overhead_seconds(v06, np.array([0.0, 64.0]), np.array([0.0, 64.0]), np.array([1.0, 5e-3]))
    assert got == pytest.approx([0.0, 7.559e-3], rel=2e-3)


def test_multi_step_scheduling_shares_the_host_work_of_decode_iterations():
    v06 = load_engine_profile("vllm-v0.6").with_scheduler_steps(10)
    # Batch 64, a 5 ms GPU step: blocking 3.497 ms and overlapped 9.062 ms per pass; a decode-only iteration pays
    # a tenth of each, 0.3497 ms + max(0, 0.9062 - 5) = 0.3497 ms; an iteration with prefill pays them whole,
    # 3.497 + (9.062 - 5) = 7.559 ms.
    assert iteration_overhead_seconds(v06, 64, 64, 5e-3, decode_only=True) == pytest.approx(0.3497e-3, rel=2e-3)
    assert iteration_overhead_seconds(v06, 64, 64, 5e-3, decode_only=False) == pytest.approx(7.559e-3, rel=2e-3)
    got = iteration_overhead_seconds(v06, np.array([64.0, 64.0]), np.array([64.0, 64.0]), np.array([5e-3, 5e-3]),
                                     decode_only=np.array([True, False]))
    assert got == pytest.approx([0.3497e-3, 7.559e-3], rel=2e-3)
    # One step per pass is the plain profile.
    assert load_engine_profile("vllm-v0.6").with_scheduler_steps(1).scheduler_steps == 1


def test_vllm_0_2_sends_inputs_to_each_tensor_parallel_worker():
    v02 = load_engine_profile("vllm-v0.2")
    # PR #2221's replay: 2.0 ms + 29.6 us per sequence for each worker. At TP 8 and batch 16 the driver's loop
    # is 1.615 ms + 16 * 171 us = 4.351 ms, plus 8 * (2.0 ms + 16 * 29.6 us) = 8 * 2.4736 = 19.789 ms: 24.140 ms.
    assert iteration_cpu_seconds(v02.for_workers(8), 16, 16) == pytest.approx(24.140e-3, rel=1e-4)
    # One GPU runs in the driver's process: no remote call.
    assert iteration_cpu_seconds(v02.for_workers(1), 16, 16) == pytest.approx(4.351e-3, rel=1e-4)
    # Engines that broadcast inputs over NCCL (vLLM 0.2.7 on) have no per-worker term.
    assert load_engine_profile("vllm-v0").for_workers(8) == load_engine_profile("vllm-v0")
    # A System applies it for its own tensor-parallel degree.
    model, gpu = load_model("llama2-70b"), load_gpu("a100")
    step = Step.decode(16, 512)
    tp8 = System(model, gpu, Precision(), tp=8, engine=v02)
    assert tp8.step_cost(step).overhead_seconds == pytest.approx(24.140e-3, rel=1e-4)


def test_an_overlapping_engine_hides_cpu_work_under_the_gpu_step():
    sglang = load_engine_profile("sglang")
    cpu = iteration_cpu_seconds(sglang, 16, 16)  # 300 + 160 + 0.32 us = 460.32 us
    assert cpu == pytest.approx(460.32e-6, rel=1e-12)
    assert exposed_seconds(sglang, cpu, gpu_seconds=10e-3) == 0.0  # hidden under a 10 ms step
    # a 0.2 ms step leaves 460.32 - 200 = 260.32 us exposed
    assert exposed_seconds(sglang, cpu, gpu_seconds=200e-6) == pytest.approx(260.32e-6, rel=1e-12)
    # vLLM V1 overlaps nothing: all of it
    vllm = load_engine_profile("vllm")
    assert iteration_overhead_seconds(vllm, 16, 16, 10e-3) == pytest.approx(300e-6 + 16 * 20e-6 + 16 * 20e-9, rel=1e-12)


def test_graphs_capture_decode_up_to_the_engines_size():
    vllm, sglang = load_engine_profile("vllm"), load_engine_profile("sglang")
    assert graph_captured(vllm, Step.decode(512, 100))
    assert not graph_captured(vllm, Step.decode(513, 100))
    assert graph_captured(vllm, Step.prefill(1, 256))  # V1 piecewise graphs take mixed steps too
    assert not graph_captured(sglang, Step.prefill(1, 256))  # SGLang captures decode only
    assert not graph_captured(vllm.eager(), Step.decode(1, 100))
    got = graph_captured(sglang, Step.decode(np.array([8.0, 200.0]), 100.0))
    assert got.tolist() == [True, False]  # 160 is SGLang's cuda_graph_max_bs


def test_shipped_profiles_load_and_ideal_is_the_built_in_one():
    names = {p.name for p in list_engine_profiles()}
    assert {"vllm", "vllm-v0", "sglang", "trtllm", "ideal"} <= names
    assert load_engine_profile("ideal") == IDEAL
    assert load_engine_profile("TensorRT-LLM").name == "trtllm"
    with pytest.raises(InputError, match="--engine: unknown engine 'vlm'.*did you mean"):
        load_engine_profile("vlm")


def test_a_system_adds_the_exposed_host_time_to_the_step():
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    ideal = System(model, gpu, Precision())
    vllm = System(model, gpu, Precision(), engine=load_engine_profile("vllm"))
    step = Step.decode(16, 1024)
    # Both capture the step in a graph, so only the host time differs: 300 + 16 * 20 + 16 * 0.02 us = 620.32 us
    assert vllm.step_cost(step).overhead_seconds == pytest.approx(620.32e-6, rel=1e-12)
    assert vllm.step_seconds(step) - ideal.step_seconds(step) == pytest.approx(620.32e-6, rel=1e-9)
    assert vllm.step_totals(step).overhead_seconds == pytest.approx(620.32e-6, rel=1e-9)


def test_the_engine_adds_the_overhead_to_every_iteration():
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    workload = closed_batch(4, LengthSpec("fixed", 32), LengthSpec("fixed", 40))
    config = SchedulerConfig()
    ideal = simulate(System(model, gpu, Precision()), workload, config, kv_blocks=10_000)
    vllm = simulate(System(model, gpu, Precision(), engine=load_engine_profile("vllm")), workload, config,
                    kv_blocks=10_000)
    # One prefill iteration (4 sequences, 128 tokens) then 39 decode iterations of 4 sequences: each longer by
    # 300 + 4 * 20 us plus 20 ns per token: 380.08 us per decode, 300 + 80 + 2.56 = 382.56 us for the prefill.
    assert ideal.totals.iterations == vllm.totals.iterations == 40
    extra = vllm.totals.busy_seconds - ideal.totals.busy_seconds
    assert extra == pytest.approx(39 * 380.08e-6 + 382.56e-6, rel=1e-9)
    decode_gap = np.diff(vllm.log["end"])[1:] - np.diff(ideal.log["end"])[1:]
    assert decode_gap == pytest.approx(380.08e-6, rel=1e-6)


def test_options_default_to_vllm_and_accept_the_new_keys():
    base = {"model": "llama3-8b", "gpu": "h100"}
    system = deployment_from_options(base, 1, 1024).system
    assert (system.engine.name, system.collectives, system.kernel_efficiency) == ("vllm", "auto", "shape")
    eager = deployment_from_options({**base, "engine": "sglang", "enforce_eager": True, "collectives": "off",
                                     "kernel_efficiency": "flat"}, 1, 1024).system
    assert eager.engine.name == "sglang" and eager.engine.enforce_eager
    assert (eager.collectives, eager.kernel_efficiency) == ("off", "flat")
    with pytest.raises(InputError, match="--kernel-efficiency: unknown 'wavy'"):
        deployment_from_options({**base, "kernel_efficiency": "wavy"}, 1, 1024)


SYSTEMS = [
    {"model": "llama2-70b", "gpu": "h100", "tp": 4, "engine": "vllm"},
    {"model": "llama3-8b", "gpu": "a100", "tp": 1, "engine": "sglang"},
    {"model": "llama2-13b", "gpu": "l40s", "tp": 2, "engine": "vllm-v0", "enforce_eager": True},
    {"model": "mistral-7b", "gpu": "mi300x", "tp": 2, "engine": "trtllm"},
]


@pytest.mark.parametrize("options", SYSTEMS, ids=lambda o: f"{o['model']}-{o['gpu']}-{o['engine']}")
def test_step_totals_equal_step_cost_under_the_full_time_model(options):
    system = deployment_from_options(options, 1, 2048, require_fit=False).system
    rng = np.random.default_rng(11)
    steps = []
    for size in (None, None, None, 30):
        def draw(low, high, size=size):
            values = rng.integers(low, high, size).astype(float)
            return values if size is not None else float(values)

        steps.append(Step.prefill(draw(0, 3), draw(1, 3000), draw(0, 2000)) + Step.decode(draw(0, 600), draw(1, 4000)))
    steps.append(Step.decode(64.0, np.array([1.0, 100.0, 5000.0])))
    steps.append(Step.decode(np.array([8.0, 300.0, 600.0]), 2000.0))
    for step in steps:
        cost, totals = system.step_cost(step), system.step_totals(step)
        expected = (cost.seconds, cost.flops, cost.bytes, cost.compute_bound_seconds, cost.memory_bound_seconds,
                    cost.communication_seconds)
        for name, got, want in zip(totals._fields, totals, expected):
            assert np.allclose(got, want, rtol=1e-12, atol=0.0), name
        assert np.allclose(totals.overhead_seconds, cost.overhead_seconds, rtol=1e-9, atol=1e-15)


def test_tgi_1_decodes_at_the_pace_of_its_python_shard_where_the_kernels_are_shorter():
    # TGI 1.x launches every kernel from Python at 51.7 us (TGI issue #1315; derivations/tgi_host_launch.py).
    tgi = load_engine_profile("tgi-v1")
    assert tgi.graphs.eager_launch_seconds == pytest.approx(51.7e-6, rel=1e-12)
    model, step = load_model("codellama-34b"), Step.decode(1, 200)
    # Two H100s read 31.4 GiB of weights per GPU in about 10 ms at full bandwidth; the host needs longer.
    sharded = System(model, load_gpu("h100"), Precision(), tp=2, engine=tgi).step_cost(step)
    host = 51.7e-6 * float(sharded.launches)
    assert sharded.host_seconds == pytest.approx(host, rel=1e-12)
    assert sharded.launch_wait_seconds == pytest.approx(host - float(sharded.gpu_seconds), rel=1e-12)
    # The iteration: the shard's launches, then (not overlapped) 1.615 ms + 171 us for the one sequence,
    # plus the one kernel that writes its new token into its history: 51.7 us.
    assert sharded.seconds == pytest.approx(host + 1.615e-3 + 171e-6 + 51.7e-6, rel=1e-12)
    # One A100 reads 62.9 GiB at 2.0 TB/s x 0.74: about 45 ms, longer than the launches; it waits for nothing.
    single = System(model, load_gpu("a100-80gb"), Precision(), engine=tgi).step_cost(step)
    assert single.launch_wait_seconds == 0.0 and single.gpu_seconds > single.host_seconds


def test_tgi_samples_each_sampling_request_on_its_own_at_five_launches_a_sequence():
    tgi = load_engine_profile("tgi-v1")
    # Greedy: 1.615 ms + 32 x (171 us + 1 launch x 51.7 us) = 1.615 + 7.1264 ms = 8.7414 ms.
    assert iteration_cpu_seconds(tgi, 32, 32) == pytest.approx(8.7414e-3, rel=1e-12)
    # Sampling: softmax, exponential_, div_, argmax and the copy, per sequence: 1.615 + 32 x (171 + 6 x 51.7) us.
    sampled = tgi.with_sampling(True)
    assert iteration_cpu_seconds(sampled, 32, 32) == pytest.approx(1.615e-3 + 32 * 481.2e-6, rel=1e-12)
    # Engines that sample the whole batch at once have nothing per sampled sequence.
    vllm = load_engine_profile("vllm")
    assert iteration_cpu_seconds(vllm.with_sampling(True), 32, 32) == iteration_cpu_seconds(vllm, 32, 32)
    # The setting reaches the profile from a run's options.
    options = {"model": "llama2-7b", "gpu": "a10g", "engine": "tgi-v1"}
    assert deployment_from_options({**options, "sampling": True}, 1, 128).system.engine.sampling
    assert not deployment_from_options(options, 1, 128).system.engine.sampling


def test_sglang_launches_its_prefill_from_python_at_27_us_a_kernel_and_replays_its_decode():
    # SGLang captures decode batches of up to 160 sequences; a prefill runs eagerly, each kernel launched from
    # Python at 27.1 us (SGLang PR #1401's decode steps with and without --disable-cuda-graph;
    # validation/derivations/sglang_host_launch.py).
    sglang = load_engine_profile("sglang")
    assert sglang.graphs.eager_launch_seconds == pytest.approx(27.1e-6, rel=1e-12)
    for gpu in ("h100", "b200"):
        system = System(load_model("llama3-8b"), load_gpu(gpu), Precision(), engine=sglang)
        prefill = system.step_cost(Step.prefill(1, 16))
        host = 27.1e-6 * float(prefill.launches)
        assert prefill.host_seconds == pytest.approx(host, rel=1e-12)
        # The GPU waits max(0, host - kernels): 16 GB of weights take longer to read on an H100 (3.35 TB/s)
        # than the launches, and less long on a B200 (8 TB/s), where the step is the launches.
        assert prefill.launch_wait_seconds == pytest.approx(max(0.0, host - float(prefill.gpu_seconds)), abs=1e-15)
        assert (prefill.launch_wait_seconds > 0) == (gpu == "b200")
        decode = system.step_cost(Step.decode(1, 200))
        assert decode.host_seconds == 0.0 and decode.launch_wait_seconds == 0.0
