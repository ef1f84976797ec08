"""Properties of bytes: KV cache, weights by dtype, tensor-parallel sharding (hypothesis).

Every expected value is the formula from DESIGN.md 'Exact counts', written out here.
"""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import (
    KV_DTYPES,
    TP_DEGREES,
    batches,
    contexts,
    gpus,
    models,
    precisions,
)

from simulator.cost.memory import (
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    plan_memory,
    weight_bytes,
)
from simulator.cost.system import System
from simulator.model import Precision, with_attention
from simulator.model.layers import build_operators
from simulator.model.precision import DTYPE_BYTES
from simulator.model.step import Step

DECODER_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "up_proj", "down_proj")


def decoder_matrix_elements_per_layer(model) -> int:
    """Weights of the quantisable GEMMs of one layer: QKV, output, MLP (no embedding, no LM head)."""
    H, n, g, d, F = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.ffn_size
    mlp = (3 if model.gated_mlp else 2) * H * F
    return H * (n + 2 * g) * d + n * d * H + mlp


# --- KV cache -----------------------------------------------------------------------------

@given(models(), st.sampled_from(KV_DTYPES))
def test_kv_bytes_per_token_is_2_L_g_d_bytes(model, kv):
    expected = 2 * model.num_layers * model.num_kv_heads * model.head_dim * DTYPE_BYTES[kv]
    assert kv_bytes_per_token(model, Precision(kv=kv)) == expected


@given(models(), gpus(), precisions(), batches, contexts, st.integers(2, 4))
def test_kv_cache_is_exactly_linear_in_context_and_batch(model, gpu, precision, batch, ctx, k):
    ops = build_operators(model, precision, gpu)
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * precision.kv_bytes_per_element

    def kv(b: int, t: int) -> float:
        return plan_memory(model, precision, gpu, 1, b, t, ops).kv_bytes

    assert kv(batch, ctx) == per_token * batch * ctx
    assert kv(batch, k * ctx) == k * kv(batch, ctx)
    assert kv(k * batch, ctx) == k * kv(batch, ctx)


@given(models(), gpus(), precisions(), batches, contexts)
def test_decode_reads_the_whole_kv_cache_once_linear_in_batch_and_context(model, gpu, precision, batch, ctx):
    """Attention in decode reads 2 g d b_kv bytes per layer for every cached key of every sequence."""
    system = System(model, gpu, precision)
    attention = next(c for c in system.step_cost(Step.decode(batch, ctx)).operators if c.name == "attention")
    L, g, d, b_kv = model.num_layers, model.num_kv_heads, model.head_dim, precision.kv_bytes_per_element
    assert attention.kv_read_bytes == L * 2 * g * d * b_kv * batch * ctx
    assert attention.kv_write_bytes == L * 2 * g * d * b_kv * batch


@given(models(num_kv_heads=0), st.sampled_from(KV_DTYPES), st.data())
def test_kv_bytes_mha_over_gqa_is_n_over_g_and_gqa_over_mqa_is_g(model, kv, data):
    """MHA >= GQA >= MQA, with ratios n/g and g (KV bytes are proportional to KV heads)."""
    n = model.num_heads
    g = data.draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0]))
    precision = Precision(kv=kv)
    mha = kv_bytes_per_token(with_attention(model, "mha"), precision)
    gqa = kv_bytes_per_token(with_attention(model, f"gqa:{g}"), precision)
    mqa = kv_bytes_per_token(with_attention(model, "mqa"), precision)
    assert mha >= gqa >= mqa
    assert mha == gqa * (n // g)
    assert gqa == mqa * g


# --- weights by dtype ----------------------------------------------------------------------

@given(models(), gpus(), st.sampled_from(["int8", "int4"]), st.sampled_from([32, 64, 128]))
def test_weight_only_quantisation_scales_decoder_gemms_by_bytes_per_element_plus_scales(model, gpu, weights, group):
    """fp16 -> int8 halves, -> int4 quarters the decoder GEMM weights, plus one fp16 scale per group.

    Embedding, LM head, norms and biases stay in fp16 (simulator/model/precision.py).
    """
    fp16 = weight_bytes(build_operators(model, Precision(weights="fp16"), gpu))
    quant = weight_bytes(build_operators(model, Precision(weights=weights, group_size=group), gpu))
    matrix = model.num_layers * decoder_matrix_elements_per_layer(model)
    per_weight = {"int8": 1.0, "int4": 0.5}[weights] + 2.0 / group
    assert quant - fp16 == pytest.approx(matrix * (per_weight - 2.0), rel=1e-12, abs=1e-12 * fp16)


@given(models(), gpus(), st.sampled_from(["int8", "int4", "fp8"]))
def test_each_decoder_gemm_shrinks_by_its_bytes_ratio_and_the_rest_stays_fp16(model, gpu, weights):
    group = 128
    scale = 0.0 if weights == "fp8" else 2.0 / group
    b_q = DTYPE_BYTES[weights]
    fp16_ops = {op.name: op for op in build_operators(model, Precision(weights="fp16"), gpu)}
    for op in build_operators(model, Precision(weights=weights, group_size=group), gpu):
        base = fp16_ops[op.name]
        if op.name in DECODER_GEMMS:
            matrix = op.in_features * op.out_features
            bias = op.bias_elements * 2.0  # biases stay in the fp16 activation dtype
            assert op.resident_bytes == matrix * (b_q + scale) + bias
            assert base.resident_bytes == matrix * 2.0 + bias
        else:
            assert op.resident_bytes == base.resident_bytes, op.name


@given(models(), gpus())
def test_fp32_weights_are_exactly_twice_fp16_everywhere(model, gpu):
    """fp32 doubles every weight, the embedding, LM head and norms too (activations are fp32 then)."""
    fp16 = weight_bytes(build_operators(model, Precision(weights="fp16"), gpu))
    fp32 = weight_bytes(build_operators(model, Precision(weights="fp32"), gpu))
    assert fp32 == 2 * fp16


# --- tensor parallelism ---------------------------------------------------------------------

@given(models(bias=False), gpus(), precisions(), st.sampled_from(TP_DEGREES[1:]))
def test_sharded_weights_per_gpu_are_total_over_n(model, gpu, precision, tp):
    """Every GEMM (and the vocab-split embedding) holds 1/n of its weights per GPU; norms are replicated.

    Holds exactly when each GPU has its own KV heads (g >= n); the strategy's vocab is a
    multiple of 64, so the vocabulary splits evenly.
    """
    assume(model.num_kv_heads >= tp)
    one = {op.name: op for op in build_operators(model, precision, gpu, tp=1)}
    for op in build_operators(model, precision, gpu, tp=tp):
        if op.kind in ("gemm", "embedding"):
            assert op.resident_bytes * tp == one[op.name].resident_bytes, op.name
        elif op.kind == "elementwise":
            assert op.resident_bytes == one[op.name].resident_bytes, op.name
    assert kv_bytes_per_token_per_gpu(model, precision, tp) * tp == kv_bytes_per_token(model, precision)


@given(models(), gpus(), precisions(), st.sampled_from(TP_DEGREES[1:]))
def test_per_gpu_weights_never_below_total_over_n(model, gpu, precision, tp):
    """Replicated norms, biases and KV heads (g < n) only add: per-GPU weights >= total / n."""
    assume(model.num_heads >= tp)
    total = weight_bytes(build_operators(model, precision, gpu, tp=1))
    per_gpu = weight_bytes(build_operators(model, precision, gpu, tp=tp))
    assert per_gpu * tp >= total * (1 - 1e-12)
    assert per_gpu <= total
