"""The roofline cost model against numbers worked out by hand (DESIGN.md 'Exact counts')."""

import pytest
from exact import exact_gpu

from simulator.cost.system import System
from simulator.model import load_gpu, load_model, with_attention
from simulator.model.precision import Precision
from simulator.model.step import Step


def op(system: System, step: Step, name: str):
    return next(c for c in system.step_cost(step).operators if c.name == name)


def test_kv_cache_per_token_llama2_70b_fp16():
    from simulator.cost.memory import kv_bytes_per_token

    assert kv_bytes_per_token(load_model("llama2-70b"), Precision()) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_essay_mha_kv_cache_read_10_7_gb_at_4096_takes_5_4_ms_at_2_tb_s():
    L, H, T = 80, 8192, 4096
    kv_bytes = 4 * L * T * H  # keys and values, fp16, MHA (the essay's form)
    assert kv_bytes == 10_737_418_240
    mha = with_attention(load_model("llama2-70b"), "mha")
    gpu = exact_gpu().model_copy(update={"hbm_bandwidth_bytes_per_second": 2e12})
    attention = op(System(mha, gpu, Precision()), Step.decode(1, T), "attention")
    assert attention.kv_read_bytes == kv_bytes
    assert attention.kv_read_bytes / 2e12 == pytest.approx(5.37e-3, rel=1e-3)
    # The real model is GQA-8: 8x fewer KV bytes (1.34 GB per sequence).
    gqa = op(System(load_model("llama2-70b"), gpu, Precision()), Step.decode(1, T), "attention")
    assert gqa.kv_read_bytes == kv_bytes / 8 == 1_342_177_280


def test_batch_1_fp16_projection_intensity_is_about_1_flop_per_byte():
    H = 4096
    o_proj = op(System(load_model("llama2-7b"), exact_gpu(), Precision()), Step.decode(1, 512), "o_proj")
    per_layer_flops = 2 * H * H
    per_layer_bytes = 2 * H * H + 2 * (H + H)  # fp16 weights + one input and one output row
    assert o_proj.flops == 32 * per_layer_flops
    assert o_proj.bytes == 32 * per_layer_bytes
    assert o_proj.intensity == pytest.approx(per_layer_flops / per_layer_bytes)
    assert 0.99 < o_proj.intensity < 1.0
    assert o_proj.bound == "memory"


def test_prefill_gemm_of_1024_tokens_at_h_4096_is_compute_bound_on_a100():
    H, N = 4096, 1024
    o_proj = op(System(load_model("llama2-7b"), exact_gpu(), Precision()), Step.prefill(1, N), "o_proj")
    intensity = (2 * N * H * H) / (2 * H * H + 2 * N * (H + H))
    assert intensity == pytest.approx(682.67, abs=0.01)  # DESIGN.md: ~683 FLOP/byte
    assert o_proj.intensity == pytest.approx(intensity)
    assert intensity > 312e12 / 2.039e12
    assert o_proj.bound == "compute"
    assert o_proj.seconds == pytest.approx(32 * 2 * N * H * H / 312e12)


def test_a_gpu_holding_a_lower_clock_under_gemm_load_computes_slower_and_streams_as_fast():
    # MI300X: 1,207 of 2,100 MHz under dense GEMMs (AMD, ROCm blogs); here a round half of the boost clock.
    H, N = 4096, 1024
    model, half = load_model("llama2-7b"), exact_gpu().with_efficiency(sustained_clock=0.5)
    prefill = op(System(model, half, Precision()), Step.prefill(1, N), "o_proj")
    assert prefill.bound == "compute"
    assert prefill.seconds == pytest.approx(32 * 2 * N * H * H / (312e12 * 0.5))  # twice the 0.0142 s at boost
    decode = op(System(model, half, Precision()), Step.decode(1, 512), "o_proj")
    assert decode.bound == "memory"
    assert decode.seconds == pytest.approx(32 * (2 * H * H + 2 * (H + H)) / 2.039e12)  # bandwidth keeps its clock
    # A measured overlay's ceilings were measured at the clock the GPU held: the base's drop does not apply again.
    from simulator.calibrate.overlay import global_efficiency

    measurements = {"peaks": {"hbm_bandwidth_bytes_per_second": 1e12, "flops": {"fp16": 1e14}}, "dtype": "fp16",
                    "launch_seconds": 1e-6, "bandwidth": [], "gemm": [], "attention": [], "elementwise": []}
    assert global_efficiency(measurements)["sustained_clock"] == 1.0


def test_decode_gemm_intensity_is_about_2b_over_bw():
    B, H = 16, 4096
    fp16 = op(System(load_model("llama2-7b"), exact_gpu(), Precision()), Step.decode(B, 512), "o_proj")
    assert fp16.intensity == pytest.approx(2 * B * H * H / (2 * H * H + 2 * B * (H + H)))
    assert 0.99 * B < fp16.intensity < B  # ~ 2B / b_w with b_w = 2
    int8 = op(System(load_model("llama2-7b"), exact_gpu(), Precision(weights="int8")), Step.decode(B, 512), "o_proj")
    # int8 weights (1 byte) + an fp16 scale per 128 weights; dequantisation (2 ops per weight
    # per 16-token row tile) is CUDA-core work kept out of the FLOPs (simulator/cost/step_cost.py).
    weight_bytes = H * H * (1 + 2 / 128)
    flops = 2 * B * H * H
    assert int8.dequant_ops == 32 * 2 * H * H
    assert int8.intensity == pytest.approx(flops / (weight_bytes + 2 * B * (H + H)))
    assert 0.9 * 2 * B < int8.intensity < 1.1 * 2 * B  # ~ 2B / b_w with b_w = 1


def test_roofline_time_is_max_of_compute_and_memory_time_with_exact_efficiency():
    gpu = exact_gpu()
    system = System(load_model("llama2-13b"), gpu, Precision())
    for step in (Step.decode(8, 1000), Step.prefill(2, 700)):
        for cost in system.step_cost(step).operators:
            peak = gpu.peak("fp16")
            assert cost.seconds == pytest.approx(max(cost.flops / peak, cost.bytes / 2.039e12), rel=1e-12, abs=1e-15)


def test_efficiency_factors_and_launch_overhead_are_charged():
    gpu = load_gpu("a100").with_efficiency(compute=0.5, memory=0.8, kernel_launch_seconds=3e-6)
    system = System(load_model("llama2-7b"), gpu, Precision())
    qkv = op(system, Step.decode(1, 128), "qkv_proj")
    H = 4096
    per_layer_bytes = 2 * H * 3 * H + 2 * (H + 3 * H)
    assert qkv.seconds == pytest.approx(32 * (per_layer_bytes / (2.039e12 * 0.8) + 3e-6))


def test_tensor_parallel_all_reduce_is_a_ring():
    gpu = load_gpu("a100").with_efficiency(link=0.5, allreduce_latency_seconds=10e-6)
    system = System(load_model("llama2-70b"), gpu, Precision(), tp=4)
    allreduce = op(system, Step.decode(32, 1024), "attn_allreduce")
    message = 32 * 8192 * 2  # tokens x hidden x fp16 bytes, per GPU
    per_layer = 2 * 3 / 4 * message / (300e9 * 0.5) + 10e-6
    assert allreduce.seconds == pytest.approx(80 * per_layer)
    assert allreduce.bound == "communication"


def test_tensor_parallel_splits_weight_reads():
    gpu = exact_gpu()
    one = op(System(load_model("llama2-70b"), gpu, Precision(), tp=1), Step.decode(1, 64), "gate_up_proj")
    four = op(System(load_model("llama2-70b"), gpu, Precision(), tp=4), Step.decode(1, 64), "gate_up_proj")
    assert one.weight_bytes == 80 * 2 * 8192 * 28672 * 2
    assert four.weight_bytes == one.weight_bytes / 4


def test_lm_head_runs_once_per_sequence_in_prefill():
    H, V = 4096, 32000
    lm_head = op(System(load_model("llama2-7b"), exact_gpu(), Precision()), Step.prefill(3, 1000), "lm_head")
    assert lm_head.flops == 3 * 2 * H * V


def test_vectorised_steps_equal_one_at_a_time():
    import numpy as np

    system = System(load_model("llama3-8b"), load_gpu("h100"), Precision())
    batches = np.array([1.0, 8.0, 64.0])
    contexts = np.array([100.0, 2000.0, 8000.0])
    many = system.step_cost(Step.decode(batches, contexts)).seconds
    for i in range(3):
        assert many[i] == pytest.approx(system.step_cost(Step.decode(batches[i], contexts[i])).seconds, rel=1e-12)


def test_decode_step_grows_by_the_kv_bytes_of_the_extra_context():
    system = System(load_model("llama2-7b"), exact_gpu(), Precision())
    short, long = system.step_seconds(Step.decode(1, 1000)), system.step_seconds(Step.decode(1, 1126))
    kv_per_token = 2 * 32 * 32 * 128 * 2  # 524,288 bytes
    assert long - short == pytest.approx(126 * kv_per_token / 2.039e12, rel=1e-9)


def test_fp8_on_v100_is_a_clear_error():
    from simulator.errors import InputError

    with pytest.raises(InputError, match="V100-SXM2-32GB has no fp8 peak"):
        System(load_model("llama2-7b"), load_gpu("v100"), Precision(weights="fp8"))


def test_tp_must_divide_heads():
    from simulator.errors import InputError

    with pytest.raises(InputError, match="3 does not divide the 32 attention heads"):
        System(load_model("llama2-7b"), load_gpu("a100"), Precision(), tp=3)
