"""Kernel efficiency by shape and size, FlashAttention's K/V traffic with L2 reuse, launches in and out of graphs."""

import numpy as np
import pytest

from simulator.cost.kernels import (
    WEIGHT_ONLY_TILES,
    gemm_shape_efficiency,
    memory_efficiency,
    memory_half_bytes,
)
from simulator.cost.step_cost import OperatorRates, launch_wait, roofline
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.layers import flash_query_tile_rows
from simulator.model.operators import Work
from simulator.model.precision import Precision
from simulator.model.step import Step


def test_a_gemm_whose_tiles_leave_a_partial_wave():
    # 128 rows x 4096 columns on 108 SMs, no split-K: 64x128 tiles -> 2 * 32 = 64 tiles, one wave of 108
    # slots: 64 / 108 = 0.5926 (128x128 tiles: 32 / 108; 256x128 pads the rows to 256: half of 32 / 108).
    assert gemm_shape_efficiency(128, 4096, 108) == pytest.approx(64 / 108, rel=1e-12)
    # With K = 4096 split-K up to 16 ways is allowed (16 * 256 <= 4096): 64 tiles x 16 = 1024 units in
    # ceil(1024 / 108) = 10 waves of 108: 1024 / 1080 = 0.9481 (the best split).
    assert gemm_shape_efficiency(128, 4096, 108, depth=4096) == pytest.approx(1024 / 1080, rel=1e-12)


def test_tile_quantisation_pads_rows_to_the_smallest_row_tile():
    # 100 rows pad to 128 with any tile of 64 or 128 rows: 100 / 128 = 0.78125 (no wave limit: sm_count 0).
    assert gemm_shape_efficiency(100, 256, 0) == pytest.approx(0.78125, rel=1e-12)
    # One token: 1 / 64 of a 64-row tile.
    assert gemm_shape_efficiency(1, 256, 0) == pytest.approx(1 / 64, rel=1e-12)
    got = gemm_shape_efficiency(np.array([100.0, 1.0, 100.0]), 256, 0)
    assert got == pytest.approx([0.78125, 1 / 64, 0.78125], rel=1e-12)


def test_weight_only_gemms_pad_one_row_to_16_not_64():
    # Llama-2-7B's qkv_proj at batch 1 on an A100 (108 SMs): n = 12,288, k = 4,096. A dense kernel pads the
    # row to 64; its best wave is 96 tiles of 64 x 128 split 12 ways (12 * 256 <= 4,096): 1,152 units in
    # ceil(1152 / 108) = 11 waves of 108 slots, 1152 / 1188 = 32/33, so 1/64 * 32/33 = 1/66. Marlin-style
    # weight-only tiles of 16 x 128 give the same 96 tiles: 1/16 * 32/33 = 2/33, four times as much.
    assert gemm_shape_efficiency(1, 12288, 108, 4096) == pytest.approx(1 / 66, rel=1e-12)
    assert gemm_shape_efficiency(1, 12288, 108, 4096, WEIGHT_ONLY_TILES) == pytest.approx(2 / 33, rel=1e-12)


def test_int4_decode_at_batch_1_is_bandwidth_bound_and_reads_a_quarter_of_the_weights():
    # Llama-2-7B on an A100 at batch 1: with rows padded to 16 and the dequantisation hidden under the loads
    # (Marlin's pipeline), every int4 projection is memory-bound. Its weight bytes are 0.5 + 2/128 (fp16 scale
    # per group of 128) = 0.515625 per weight against 2, so the projections' share of the step shrinks ~3.9x;
    # attention, norms, launches and the engine's host time do not, so TPOT falls to 0.25-0.45 of fp16's.
    system = {w: System(load_model("llama2-7b"), load_gpu("a100"), Precision(weights=w, kv="fp16"), 1,
                        engine=load_engine_profile("vllm"), kernel_efficiency="shape") for w in ("fp16", "int4")}
    step = Step.decode(1, 512)
    costs = {w: {op.name: op for op in s.step_cost(step).operators} for w, s in system.items()}
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        assert costs["int4"][name].memory_seconds >= costs["int4"][name].compute_seconds
        assert costs["int4"][name].weight_bytes == pytest.approx(costs["fp16"][name].weight_bytes * 0.515625 / 2)
    ratio = float(system["int4"].step_totals(step).seconds / system["fp16"].step_totals(step).seconds)
    assert 0.25 <= ratio <= 0.45


def test_memory_efficiency_is_half_the_ceiling_at_the_bandwidth_latency_product():
    # H100: 3.35e12 B/s * 0.5 us = 1,675,000 bytes
    half = memory_half_bytes(3.35e12, 5e-7)
    assert half == pytest.approx(1_675_000, rel=1e-12)
    assert memory_efficiency(half, 0.8, half) == pytest.approx(0.4, rel=1e-12)
    assert memory_efficiency(99 * half, 0.8, half) == pytest.approx(0.8 * 0.99, rel=1e-12)


def test_roofline_charges_the_shape_the_ramp_and_the_launch():
    # A GEMM of 128 rows x 4096 columns x 4096 deep: 2 * 128 * 4096 * 4096 = 4,294,967,296 FLOPs.
    flops = 2.0 * 128 * 4096 * 4096
    moved = 33_554_432.0  # 4096 * 4096 * 2 bytes of weights
    work = Work(flops=flops, weight_bytes=moved, launches=1.0)
    rates = OperatorRates(flops_per_second=1e15, dequant_ops_per_second=None, bytes_per_second=2e12,
                          launch_seconds=2e-6, memory_half_bytes=1e6, gemm_columns=4096, gemm_depth=4096,
                          sm_count=108)
    compute, memory, seconds, launch, host = roofline(work, rates, count=2, rows=128.0)
    # compute: 4,294,967,296 / (1e15 * 1024 / 1080) = 4.5298 us per instance
    assert compute == pytest.approx(2 * flops / (1e15 * 1024 / 1080), rel=1e-12)
    # memory: (33,554,432 + 1,000,000) / 2e12 = 17.277 us per instance
    assert memory == pytest.approx(2 * (moved + 1e6) / 2e12, rel=1e-12)
    assert seconds == pytest.approx(2 * ((moved + 1e6) / 2e12 + 2e-6), rel=1e-12)
    assert launch == pytest.approx(2 * 2e-6, rel=1e-12)
    assert host == 0.0  # in a CUDA graph the host launches nothing kernel by kernel


def test_without_overlap_the_real_rows_mmas_add_to_the_loads_and_padding_does_not():
    # The GEMM above at 128 rows: memory (33,554,432 + 1,000,000) / 2e12 = 17.277 us; real MMAs
    # 4,294,967,296 / 1e15 = 4.295 us (no shape factor), shape-charged 4.530 us (the max hides it).
    flops = 2.0 * 128 * 4096 * 4096
    moved = 33_554_432.0
    work = Work(flops=flops, weight_bytes=moved, launches=1.0)

    def rates(overlap: float) -> OperatorRates:
        return OperatorRates(1e15, None, 2e12, 2e-6, memory_half_bytes=1e6, gemm_columns=4096, gemm_depth=4096,
                             sm_count=108, overlap=overlap)

    memory, real = (moved + 1e6) / 2e12, flops / 1e15
    assert roofline(work, rates(1.0), 1, rows=128.0)[2] == pytest.approx(memory + 2e-6, rel=1e-12)
    assert roofline(work, rates(0.0), 1, rows=128.0)[2] == pytest.approx(memory + real + 2e-6, rel=1e-12)
    assert roofline(work, rates(0.5), 1, rows=128.0)[2] == pytest.approx(memory + 0.5 * real + 2e-6, rel=1e-12)
    # One row: the tile pads it to 64 (shape-charged 4,294,967,296 / 128 * 64 / 1e15 = 2.147 us, under
    # the loads), but only the one real row's 33,554,432 FLOPs run in series: 0.0336 us.
    one = Work(flops=flops / 128, weight_bytes=moved, launches=1.0)
    assert roofline(one, rates(0.0), 1, rows=1.0)[2] == pytest.approx(memory + flops / 128 / 1e15 + 2e-6, rel=1e-12)
    # Compute-bound (1e12 FLOP/s): the shape-charged MMAs lead and the loads are added whole.
    slow = OperatorRates(1e12, None, 2e12, 0.0, memory_half_bytes=1e6, gemm_columns=4096, gemm_depth=4096,
                         sm_count=108, overlap=0.0)
    compute = flops / (1e12 * 1024 / 1080)
    assert roofline(work, slow, 1, rows=128.0)[2] == pytest.approx(compute + memory, rel=1e-12)


def test_the_shape_model_takes_the_gpus_overlap_and_the_flat_model_keeps_the_max():
    gpu = load_gpu("h100")
    assert gpu.efficiency.overlap == 0.0
    model, step = load_model("llama2-7b"), Step.prefill(1, 128)
    shape = System(model, gpu, Precision(), kernel_efficiency="shape")
    flat = System(model, gpu, Precision())
    assert all(r is None or r.overlap == 0.0 for r in shape.rates)
    assert all(r is None or r.overlap == 1.0 for r in flat.rates)
    hidden = System(model, gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"overlap": 1.0})}),
                    Precision(), kernel_efficiency="shape")
    assert shape.step_cost(step).seconds > hidden.step_cost(step).seconds


def test_outside_a_graph_the_host_launch_is_counted_apart_from_the_kernel():
    work = Work(flops=0.0, activation_bytes=2e6, launches=1.0)
    rates = OperatorRates(1e15, None, 2e12, 2e-6, eager_launch_seconds=5e-6)
    # kernel: 2e6 / 2e12 = 1 us + 2 us launch = 3 us, in or out of a graph; the host needs 5 us to launch it.
    *_, captured, _, captured_host = roofline(work, rates, 1, captured=True)
    *_, eager, launch, eager_host = roofline(work, rates, 1, captured=False)
    assert captured == pytest.approx(3e-6, rel=1e-12) and eager == pytest.approx(3e-6, rel=1e-12)
    assert launch == pytest.approx(2e-6, rel=1e-12)
    assert (captured_host, eager_host) == (0.0, pytest.approx(5e-6, rel=1e-12))
    both = roofline(work, rates, 1, captured=np.array([True, False]))[4]
    assert both == pytest.approx([0.0, 5e-6], rel=1e-12)


def test_the_gpu_waits_for_the_host_only_where_the_kernels_together_are_shorter():
    # Host and GPU as a two-stage pipeline: the host queues kernels ahead of the GPU.
    # Ten 3-us kernels launched at 5 us each: the GPU waits 50 - 30 = 20 us.
    assert launch_wait(30e-6, 50e-6) == pytest.approx(20e-6, rel=1e-12)
    # One 200-us GEMM among them: the host runs ahead while it computes, no wait
    # (the sum of each kernel's max(kernel, launch) would have been 9 * 5 + 200 = 245 us, not 227).
    assert launch_wait(9 * 3e-6 + 200e-6, 10 * 5e-6) == 0.0
    assert launch_wait(np.array([30e-6, 227e-6]), 50e-6) == pytest.approx([20e-6, 0.0], rel=1e-12, abs=1e-18)


def _attention(system: System, step: Step):
    return next(c for c in system.step_cost(step).operators if c.name == "attention")


def test_flash_prefill_reads_each_key_once_when_the_heads_at_work_fit_in_l2():
    model, gpu = load_model("llama2-7b"), load_gpu("h100")
    # B_r on H100: 233,472 / 2 = 116,736 elements of SRAM, B_c = ceil(116,736 / (4 * 128)) = 228, B_r = min(228, 128)
    assert flash_query_tile_rows(gpu, 128, 2) == 128
    step = Step.prefill(1, 4095)
    # pairs 4095 * 4096 / 2 = 8,386,560. Heads at work: 132 SMs * 128 rows / 4095 = 4.126, each streaming
    # ~4095.5 keys * 2 * 128 * 2 bytes = 2.1 MB: 8.65 MB of K/V, under the 50 MiB L2: every key read once.
    # Per layer K/V read: 4095 keys * 2 * 32 heads * 128 * 2 bytes = 67,092,480 bytes; 32 layers.
    shape = System(model, gpu, Precision(), kernel_efficiency="shape")
    assert _attention(shape, step).kv_read_bytes == pytest.approx(32 * 67_092_480, rel=1e-12)
    # The paper's count without L2 (the flat model): 4095 + 8,386,560 / 128 = 69,615 key reads per layer.
    flat = System(model, gpu, Precision())
    assert _attention(flat, step).kv_read_bytes == pytest.approx(32 * 69_615 * 16_384, rel=1e-12)
    # Compute-bound once the re-reads are gone.
    assert _attention(shape, step).bound == "compute"


def test_a_short_chunk_on_a_long_cache_overflows_l2_and_rereads_part_of_it():
    model, gpu = load_model("llama2-7b"), load_gpu("a100")
    # A100: L2 40 MiB = 41,943,040 bytes, 108 SMs, B_r = min(ceil(83,968 / 512), 128) = 128.
    step = Step.prefill(1, 512, cached_tokens=3584)
    pairs = 512 * 3584 + 512 * 513 / 2  # 1,966,336
    keys = pairs / 512 + 256  # 4,096.5 keys per chunk
    heads = 108 * 128 / 512  # 27 (sequence, head) pairs at work
    working_set = heads * keys * 2 * 128 * 2  # 27 * 2,097,408 = 56,630,016 bytes > L2
    reuse = 41_943_040 / working_set  # 0.7407
    reads = 4096 + pairs / 128 * (1 - reuse)  # one read of every key + the re-reads that miss L2
    shape = System(model, gpu, Precision(), kernel_efficiency="shape")
    assert _attention(shape, step).kv_read_bytes == pytest.approx(32 * reads * 16_384, rel=1e-12)


def test_flash_attention_prefill_runs_at_its_own_ceiling_under_the_shape_model():
    model, gpu = load_model("llama2-7b"), load_gpu("h100")
    cost = _attention(System(model, gpu, Precision(), kernel_efficiency="shape"), Step.prefill(1, 4095))
    # 4 * 32 * 128 * 8,386,560 + 5 * 32 * 8,386,560 FLOPs per layer, at 989e12 * 0.70
    flops = 32 * (4 * 32 * 128 * 8_386_560 + 5 * 32 * 8_386_560)
    assert cost.compute_seconds == pytest.approx(flops / (989e12 * 0.70), rel=1e-12)


def test_eager_mode_launches_from_the_host_and_graphs_stop_at_the_capture_size():
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    vllm = load_engine_profile("vllm")
    graphs = System(model, gpu, Precision(), engine=vllm)
    eager = System(model, gpu, Precision(), engine=vllm.eager())
    step = Step.decode(8, 512)
    in_graph, outside = graphs.step_cost(step), eager.step_cost(step)
    # Every kernel costs the host 5 us outside a graph, nothing inside one.
    assert outside.host_seconds == pytest.approx(5e-6 * float(outside.launches), rel=1e-12)
    assert in_graph.host_seconds == 0.0 and in_graph.launch_wait_seconds == 0.0
    # The step waits for the host only by what its launches take beyond its kernels.
    wait = max(0.0, float(outside.host_seconds - outside.gpu_seconds))
    assert outside.launch_wait_seconds == pytest.approx(wait, rel=1e-12, abs=1e-15)
    assert outside.seconds == pytest.approx(outside.gpu_seconds + wait + outside.overhead_seconds, rel=1e-12)
    # Past vLLM's 512-token capture limit the step is launched eagerly even with graphs on.
    big = graphs.step_cost(Step.decode(513, 512))
    assert big.host_seconds == pytest.approx(5e-6 * float(big.launches), rel=1e-12)


def test_kernel_overlap_option_is_the_gpu_field_and_warns_under_the_flat_model(tmp_path):
    from simulator import simulate

    overlay = tmp_path / "h100-max.yaml"
    overlay.write_text("base: h100\nefficiency:\n  overlap: 1.0\n", encoding="utf-8")
    common = dict(model="llama2-7b", batch=1, ctx=160, gen=32)
    by_option = simulate(gpu="h100", kernel_overlap=1.0, **common).to_dict()
    by_file = simulate(gpu=str(overlay), **common).to_dict()
    default = simulate(gpu="h100", **common).to_dict()
    assert by_option["latency"] == by_file["latency"]
    assert by_option["time_model"]["overlap"] == 1.0 and default["time_model"]["overlap"] == 0.0
    # In series the 128-token prefill adds its MMAs to its weight reads: a later first token.
    assert default["latency"]["ttft_seconds"]["mean"] > by_option["latency"]["ttft_seconds"]["mean"]
    flat = simulate(gpu="h100", kernel_overlap=0.5, kernel_efficiency="flat", **common).to_dict()
    assert "--kernel-overlap has no effect under --kernel-efficiency flat (the roofline's max)" in flat["warnings"]
    assert flat["time_model"]["overlap"] == 1.0
