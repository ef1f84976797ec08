"""The essay's effects as switches: FlashAttention, operator fusion, weight-only quantisation.

Every expected number is worked out by hand below (docs/readme-effects.md has the rules).
"""

import math
from dataclasses import replace

import pytest
from exact import exact_gpu
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_model
from simulator.model.layers import build_operators, flash_query_tile_rows
from simulator.model.precision import Precision
from simulator.model.step import Step

NOT_IN_LAYER = {"embedding", "final_norm", "lm_head"}


def attention_op(gpu, kernel, fusion="elementwise"):
    ops = build_operators(load_model("llama2-7b"), Precision(), gpu, 1, kernel, fusion)
    return next(op for op in ops if op.kind == "attention")


def total_bytes(work):
    return work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes + work.weight_bytes


# --- FlashAttention -------------------------------------------------------------------------
# n = 32 heads, d = 128, T = 4096 prompt tokens, fp16 (llama2-7b is MHA: g = n), one layer.
N_HEADS, HEAD_DIM, T, FP16 = 32, 128, 4096, 2
KV_TOKEN = 2 * N_HEADS * HEAD_DIM * FP16  # K and V of one token
assert KV_TOKEN == 16_384
Q_AND_O = 2 * T * N_HEADS * HEAD_DIM * FP16  # read q, write the output
assert Q_AND_O == 67_108_864
PAIRS = T * (T + 1) // 2  # causal (query, key) pairs
assert PAIRS == 8_390_656


def test_naive_prefill_attention_bytes_by_hand():
    work = attention_op(exact_gpu(), "naive").work(Step.prefill(1, T))
    # S written, S read (softmax), P written, P read (PV): 4 passes over n x T x T fp16 elements.
    scores = 4 * N_HEADS * T * T * FP16
    assert scores == 4_294_967_296
    assert work.activation_bytes == scores + Q_AND_O
    assert work.kv_read_bytes == T * KV_TOKEN == 67_108_864
    assert work.kv_write_bytes == T * KV_TOKEN
    assert total_bytes(work) == 4_294_967_296 + 3 * 67_108_864 == 4_496_293_888
    assert work.launches == 3


def test_flash_prefill_attention_bytes_by_hand_on_a100():
    gpu = exact_gpu()
    # A100: 164 KiB shared memory per SM = 83,968 fp16 elements; B_c = ceil(M / 4d) = 164, B_r = min(164, d) = 128.
    assert gpu.sram_bytes_per_sm == 164 * 1024
    assert math.ceil(164 * 1024 / 2 / (4 * 128)) == 164
    assert flash_query_tile_rows(gpu, HEAD_DIM, FP16) == 128
    work = attention_op(gpu, "flash").work(Step.prefill(1, T))
    # Every key once, plus K/V streamed once per 128-row query tile over the causal pairs.
    streamed_tokens = T + PAIRS / 128
    assert streamed_tokens == 4096 + 65_552
    assert work.kv_read_bytes == 69_648 * KV_TOKEN == 1_141_112_832
    assert work.activation_bytes == Q_AND_O  # no score matrix reaches HBM
    assert total_bytes(work) == 1_141_112_832 + 2 * 67_108_864 == 1_275_330_560
    assert work.launches == 1
    naive = total_bytes(attention_op(gpu, "naive").work(Step.prefill(1, T)))
    assert naive / total_bytes(work) == pytest.approx(4_496_293_888 / 1_275_330_560)  # ~3.5x fewer bytes


def test_flash_bytes_fall_as_sram_grows_until_the_tile_reaches_the_head_dim():
    def kv_read(sram_kib):
        gpu = exact_gpu().model_copy(update={"sram_bytes_per_sm": sram_kib * 1024})
        return attention_op(gpu, "flash").work(Step.prefill(1, T)).kv_read_bytes

    # B_r = ceil(sram / 2 / 512): 32 KiB -> 32 rows, 64 KiB -> 64, 96 KiB -> 96, >= 128 KiB -> capped at d = 128.
    assert kv_read(32) == (T + PAIRS / 32) * KV_TOKEN
    assert kv_read(64) == (T + PAIRS / 64) * KV_TOKEN
    assert kv_read(96) == pytest.approx((T + PAIRS / 96) * KV_TOKEN)
    assert kv_read(32) > kv_read(64) > kv_read(96) > kv_read(128)
    assert kv_read(128) == kv_read(164) == kv_read(228) == (T + PAIRS / 128) * KV_TOKEN


def test_tiles_shrink_when_the_head_dim_grows():
    gpu = exact_gpu()  # 83,968 fp16 elements of SRAM
    assert flash_query_tile_rows(gpu, 64, FP16) == 64  # min(ceil(83968 / 256) = 328, 64)
    assert flash_query_tile_rows(gpu, 256, FP16) == 82  # min(ceil(83968 / 1024) = 82, 256)


def test_decode_reads_the_kv_cache_once_with_either_kernel():
    step = Step.decode(4, 1000)
    for kernel in ("flash", "naive"):
        work = attention_op(exact_gpu(), kernel).work(step)
        assert work.kv_read_bytes == 4 * 1000 * KV_TOKEN == 65_536_000


# --- Per-head decode (TensorRT-LLM's masked MHA before XQA) ------------------------------------
# llama2-70b at TP1: n = 64 query heads in groups of 8 on g = 8 K/V heads, d = 128, fp16 KV, one layer.
GQA_KV_TOKEN = 2 * 8 * 128 * FP16  # K and V of one token
assert GQA_KV_TOKEN == 4096
DECODE = Step.decode(4, 1000)  # 4 sequences, 1,000 keys each: 4,000 decode keys


def gqa_attention(kernel, l2_bytes=0.0):
    ops = build_operators(load_model("llama2-70b"), Precision(), exact_gpu(), 1, kernel, "elementwise")
    return replace(next(op for op in ops if op.kind == "attention"), l2_bytes=l2_bytes)


def test_per_head_decode_repeats_the_groups_kv_work_once_per_query_head():
    flash, per_head = (gqa_attention(k).work(DECODE) for k in ("flash", "per-head"))
    assert flash.kv_read_bytes == 4000 * GQA_KV_TOKEN == 16_384_000
    # each of the 8 query heads of a group works through the group's K/V itself, whatever the L2 holds
    assert per_head.kv_read_bytes == 8 * 4000 * GQA_KV_TOKEN == 131_072_000
    assert gqa_attention("per-head", l2_bytes=50 * 2**20).work(DECODE).kv_read_bytes == 131_072_000
    assert (per_head.flops, per_head.kv_write_bytes, per_head.activation_bytes, per_head.launches) == (
        flash.flops, flash.kv_write_bytes, flash.activation_bytes, flash.launches)


def test_per_head_prefills_as_flash_and_equals_flash_for_mha():
    prefill = Step.prefill(2, 512, 256)
    assert gqa_attention("per-head").work(prefill) == gqa_attention("flash").work(prefill)
    # the same kernel, the same ceiling: FlashAttention's (efficiency.attention_compute under the shape model)
    systems = [System(load_model("llama2-70b"), exact_gpu("h100", attention_compute=0.5), Precision(), tp=4,
                      attention_kernel=k, kernel_efficiency="shape") for k in ("flash", "per-head")]
    flash, per_head = (s.step_seconds(prefill) for s in systems)
    assert per_head == flash
    assert systems[1].step_seconds(DECODE) > systems[0].step_seconds(DECODE)
    # llama2-7b is MHA (one query head per K/V head): nothing to read again
    assert attention_op(exact_gpu(), "per-head").work(DECODE).kv_read_bytes == 4000 * KV_TOKEN == 65_536_000


# --- Operator fusion -------------------------------------------------------------------------
def layer_activation_bytes(fusion, step, kernel="flash"):
    ops = build_operators(load_model("llama2-7b"), Precision(), exact_gpu(), 1, kernel, fusion)
    works = [op.work(step) for op in ops if op.name not in NOT_IN_LAYER]
    return sum(w.activation_bytes for w in works), sum(w.launches for w in works)


def test_fusion_none_vs_elementwise_activation_bytes_per_layer_by_hand():
    H, n, g, d, F = 4096, 32, 32, 128, 11008
    tokens = 1000
    step = Step.prefill(1, tokens)
    none, none_kernels = layer_activation_bytes("none", step)
    fused, fused_kernels = layer_activation_bytes("elementwise", step)
    # Removed with fusion, per token (elements): two norms 2 x (H in + H out); rotary on q and k
    # 2 (n + g) d; two residual adds 2 x (2H in + H out); SiLU(gate) * up 2F in + F out; and
    # gate_up writes F instead of 2F. Kept: each fused add still reads the H-wide residual.
    removed = 2 * 2 * H + 2 * (n + g) * d + 2 * 3 * H + 3 * F + F - 2 * H
    assert removed == 8 * H + 2 * (n + g) * d + 4 * F == 93_184
    assert none - fused == tokens * removed * 2 == 186_368_000
    # Kernels per layer: none = 2 norms, qkv, rotary, the K/V cache write, attention, o_proj, 2 adds, gate_up,
    # activation, down.
    assert none_kernels == 12
    assert fused_kernels == 5  # qkv (rotary and the cache write in its epilogue), attention, o_proj, gate_up, down


def test_engine_kernels_fusion_by_hand():
    # vLLM / SGLang / TGI: norms, rotary and SiLU-and-mul are kernels of their own; each residual add runs
    # inside the next norm kernel, which reads the residual and writes the updated one.
    H, n, g, d, F = 4096, 32, 32, 128, 11008
    tokens = 1000
    step = Step.prefill(1, tokens)
    none, none_kernels = layer_activation_bytes("none", step)
    engine, engine_kernels = layer_activation_bytes("kernels", step)
    # Against none, per token (elements): each of the two adds is no longer 2H in + H out but 2H inside
    # the norm kernel: 2 x (3H - 2H) = 2H less; everything else is the same.
    assert none - engine == tokens * 2 * H * 2 == 16_384_000
    # Kernels per layer: 2 norms, qkv, rotary, the K/V cache write, attention, o_proj, gate_up, activation, down.
    assert none_kernels - engine_kernels == 2 and engine_kernels == 10
    fused, _ = layer_activation_bytes("elementwise", step)
    # Against elementwise: the norms' 2 x 2H, rotary's 2 (n + g) d, the activation's 2F + F, gate_up's other F,
    # and 2 x H more per add (the residual write): 4H + 2(n + g)d + 4F + 2H.
    assert engine - fused == tokens * (6 * H + 2 * (n + g) * d + 4 * F) * 2 == tokens * 84_992 * 2
    assert 6 * H + 2 * (n + g) * d + 4 * F == 84_992


def test_full_fusion_keeps_q_and_the_attention_output_on_chip():
    H, n, g, d = 4096, 32, 32, 128
    step = Step.decode(8, 512)
    elementwise, _ = layer_activation_bytes("elementwise", step)
    full, kernels = layer_activation_bytes("full", step)
    # Gone per token: the QKV output (n + 2g) d, attention's q read n d and output write n d, o_proj's input read n d.
    assert elementwise - full == 8 * ((n + 2 * g) * d + 3 * n * d) * 2 == 8 * 24_576 * 2
    assert kernels == 3  # the attention block, gate_up, down
    assert H == n * d


def test_naive_attention_cannot_be_fully_fused():
    with pytest.raises(InputError, match="--fusion full"):
        build_operators(load_model("llama2-7b"), Precision(), exact_gpu(), 1, "naive", "full")
    with pytest.raises(InputError, match="got per-head.*use --fusion elementwise with per-head attention"):
        build_operators(load_model("llama2-7b"), Precision(), exact_gpu(), 1, "per-head", "full")


@pytest.mark.parametrize("kernel", ["naive", "per-head"])
def test_latent_attention_refuses_a_kernel_it_would_not_run(kernel):
    # MLA's operators are its own; a kernel choice would be reported but never simulated
    with pytest.raises(InputError, match=f"--attention-kernel {kernel}: deepseek-v3 uses multi-head latent attention"):
        build_operators(load_model("deepseek-v3"), Precision(), exact_gpu("h200"), 8, kernel, "elementwise")


def test_an_engine_whose_default_kernel_is_naive_still_runs_mla():
    # llama.cpp's profile attends with the naive kernel; its default is for head attention, not MLA's operators
    from simulator.plan.run import simulate_settings

    result = simulate_settings({"model": "deepseek-v3", "gpu": "h200", "tp": 8, "engine": "llamacpp", "batch": 1,
                                "ctx": 1024})
    assert result.deployment.system.attention_kernel == "flash"


@pytest.mark.parametrize("model_name,gpu_name,tp", [("llama2-7b", "a100", 1), ("deepseek-v3", "h200", 8)])
def test_the_cache_write_is_a_kernel_of_its_own_unless_fused_into_the_qkv_epilogue(model_name, gpu_name, tp):
    # vLLM's reshape_and_cache / concat_and_cache_mla, TGI's reshape_and_cache, SGLang's set_kv_buffer: one launch
    # per attention layer before attention reads the cache; TensorRT-LLM does it in its QKV preprocessing
    step = Step.decode(4, 1000)
    launches = {}
    for fusion in ("kernels", "elementwise"):
        ops = build_operators(load_model(model_name), Precision(), exact_gpu(gpu_name), tp, "flash", fusion)
        launches[fusion] = next(op for op in ops if op.kind == "attention").work(step).launches
    assert launches["kernels"] - launches["elementwise"] == 1
    assert launches["elementwise"] == (1 if model_name == "llama2-7b" else 3)  # MLA: W_UK bmm, attention, W_UV bmm


def test_fusion_none_pays_a_launch_per_kernel():
    gpu = exact_gpu(kernel_launch_seconds=5e-6)
    step = Step.decode(1, 128)
    none = System(load_model("llama2-7b"), gpu, Precision(), fusion="none").step_cost(step)
    fused = System(load_model("llama2-7b"), gpu, Precision(), fusion="elementwise").step_cost(step)
    # 7 more kernels per layer (2 norms, rotary, the cache write, 2 adds, the activation) x 32 layers, plus the
    # final norm.
    assert none.launches - fused.launches == 7 * 32 + 1
    assert none.seconds > fused.seconds + (7 * 32 + 1) * 5e-6


# --- Weight-only quantisation ----------------------------------------------------------------
# llama2-7b per layer: qkv 4096 x 12288, o 4096 x 4096, gate_up 4096 x 22016, down 11008 x 4096.
LAYER_WEIGHTS = 4096 * 12288 + 4096 * 4096 + 4096 * 22016 + 11008 * 4096
assert LAYER_WEIGHTS == 202_375_168


def layer_gemm_seconds(cost):
    return sum(op.seconds for op in cost.operators if op.kind == "gemm" and op.name != "lm_head")


def test_int4_at_batch_1_is_between_a_quarter_and_six_tenths_of_fp16_on_a100():
    gpu = exact_gpu(compute=0.7, memory=0.8, kernel_launch_seconds=2e-6)
    model = load_model("llama2-7b")
    step = Step.decode(1, 1024)
    fp16 = System(model, gpu, Precision()).step_cost(step)
    int4 = System(model, gpu, Precision(weights="int4")).step_cost(step)
    # Weight bytes fall 2 / (0.5 + 2/128) = 3.88x: int4 plus one fp16 scale per 128 weights.
    o16 = next(op for op in fp16.operators if op.name == "o_proj")
    o4 = next(op for op in int4.operators if op.name == "o_proj")
    assert o16.weight_bytes / o4.weight_bytes == pytest.approx(2 / (0.5 + 2 / 128)) == pytest.approx(3.879, abs=1e-3)
    # At batch 1 the int4 GEMM is still memory-bound: 4 dequant ops per weight at 19.5e12 x 0.7 ops/s
    # (0.293 ps per weight) hide under the 0.5156-byte read at 2.039e12 x 0.8 B/s (0.316 ps per weight).
    assert 4 / (19.5e12 * 0.7) < (0.5 + 2 / 128) / (2.039e12 * 0.8)
    H = 4096
    assert o4.seconds == pytest.approx(32 * ((H * H * (0.5 + 2 / 128) + 2 * (H + H)) / (2.039e12 * 0.8) + 2e-6))
    ratio = int4.seconds / fp16.seconds
    assert 0.25 < ratio < 0.6  # launches, attention and the fp16 LM head keep it above 1 / 3.88


def test_int4_is_slower_than_fp16_at_a_compute_bound_batch():
    gpu = exact_gpu()
    model = load_model("llama2-7b")
    B = 256
    step = Step.decode(B, 128)
    fp16 = System(model, gpu, Precision()).step_cost(step)
    int4 = System(model, gpu, Precision(weights="int4")).step_cost(step)
    int8 = System(model, gpu, Precision(weights="int8")).step_cost(step)
    # fp16 GEMMs at batch 256 are compute-bound (intensity > 153): 2 x 256 FLOPs per weight at 312 TFLOP/s.
    fp16_gemms = 32 * 2 * B * LAYER_WEIGHTS / 312e12
    assert layer_gemm_seconds(fp16) == pytest.approx(fp16_gemms)
    # int4: each weight dequantised once per 16-token row tile, 4 ops on the CUDA cores at 19.5e12 ops/s.
    int4_gemms = 32 * math.ceil(B / 16) * 4 * LAYER_WEIGHTS / 19.5e12
    assert layer_gemm_seconds(int4) == pytest.approx(int4_gemms)
    # Documented overhead (simulator/cost/step_cost.py): max(1, 4/16 x 312 / (2 x 19.5)) = 2.0 on the GEMMs.
    assert int4_gemms / fp16_gemms == pytest.approx(4 / 16 * 312 / (2 * 19.5)) == pytest.approx(2.0)
    # Every other operator is the same, so the int4 step is the fp16 step plus one more fp16 GEMM time.
    assert int4.seconds == pytest.approx(fp16.seconds + (2.0 - 1.0) * fp16_gemms)
    # The GEMMs (10.6 ms) outweigh the KV-cache read (256 x 128 tokens x 512 KiB = 17.2 GB, 8.4 ms at
    # 2.039 TB/s), so the whole int4 step is at least 1.5x the fp16 step.
    assert fp16_gemms == pytest.approx(10.63e-3, rel=1e-3)
    assert 256 * 128 * 2 * 32 * 32 * 128 * 2 / 2.039e12 == pytest.approx(8.42e-3, rel=1e-3)
    assert int4.seconds >= fp16.seconds * (1 + 0.5)
    # int8: 2 ops per weight -> max(1, 2/16 x 312 / 39) = 1.0: no penalty, no gain once compute-bound.
    assert layer_gemm_seconds(int8) == pytest.approx(fp16_gemms)


def test_dequantisation_is_not_counted_as_model_flops():
    gpu = exact_gpu()
    step = Step.decode(32, 128)
    fp16 = System(load_model("llama2-7b"), gpu, Precision()).step_cost(step)
    int4 = System(load_model("llama2-7b"), gpu, Precision(weights="int4")).step_cost(step)
    assert int4.flops == fp16.flops
    dequant = sum(op.dequant_ops for op in int4.operators)
    assert dequant == 32 * LAYER_WEIGHTS * math.ceil(32 / 16) * 4


# --- A bounded property: flash never moves more attention bytes than naive -------------------


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    prompt=st.integers(min_value=1, max_value=8192),
    cached=st.integers(min_value=0, max_value=8192),
    batch=st.integers(min_value=1, max_value=8),
    gpu_name=st.sampled_from(["a100", "h100", "v100", "l4", "mi300x"]),
    model_name=st.sampled_from(["llama2-7b", "llama2-70b", "falcon-7b"]),
)
def test_flash_moves_no_more_attention_bytes_than_naive(prompt, cached, batch, gpu_name, model_name):
    # Flash streams K/V once per B_r-row tile: 2 g d b_kv / B_r per (query, key) pair; naive moves
    # 4 n b_a per pair (S and P, written and read). Flash wins while B_r >= g d / (2 n) (<= 64 here).
    gpu = exact_gpu(gpu_name)
    step = Step.prefill(batch, prompt, cached)
    ops = {k: next(op for op in build_operators(load_model(model_name), Precision(), gpu, 1, k) if op.kind == "attention")
           for k in ("flash", "naive")}
    assert total_bytes(ops["flash"].work(step)) <= total_bytes(ops["naive"].work(step))
