"""Multi-head latent attention (DeepSeek-V2-Lite): KV cache, absorbed decode, decompressed prefill, by hand."""

from pathlib import Path

import pytest

from simulator.cost.memory import kv_bytes_per_token, kv_bytes_per_token_per_gpu
from simulator.model import load_gpu, load_model
from simulator.model.layers import build_operators
from simulator.model.operators import LatentAttention
from simulator.model.precision import Precision
from simulator.model.step import Step

FIXTURES = Path(__file__).parent / "data" / "hf-configs"
LITE = load_model(str(FIXTURES / "DeepSeek-V2-Lite.json"))
# n = 16 heads, kv_lora_rank r = 512, rope d_r = 64, nope d_n = 128, v d_v = 128, no q_lora


def attention(model=LITE, tp=1, precision=None) -> LatentAttention:
    ops = build_operators(model, precision or Precision(weights="bf16", kv="bf16"), load_gpu("h100"), tp)
    op = next(o for o in ops if o.name == "attention")
    assert isinstance(op, LatentAttention)
    return op


def test_latent_kv_cache_per_token():
    assert kv_bytes_per_token(LITE, Precision(kv="bf16")) == (512 + 64) * 27 * 2 == 31_104
    assert kv_bytes_per_token(LITE, Precision(kv="fp8")) == (512 + 64) * 27 * 1 == 15_552
    # Heads are split under tensor parallelism, the latent is not: every GPU holds it whole.
    assert kv_bytes_per_token_per_gpu(LITE, Precision(kv="bf16"), 8) == 31_104


def test_absorbed_decode_flops_and_bytes_by_hand():
    op = attention()
    T = 1024
    work = op.work(Step.decode(1, T))
    # Per (query, key) pair and head: scores over r + d_r = 576, weighted sum over r = 512:
    # 2 * 16 * (576 + 512) = 34,816 FLOPs; x 1024 keys = 35,651,584.
    # W_UK and W_UV absorbed into the query and output: 2 * 16 * 512 * (128 + 128) = 4,194,304.
    # Softmax: 5 FLOPs per score: 5 * 16 * 1024 = 81,920.
    assert work.flops == 1024 * 2 * 16 * (2 * 512 + 64) + 2 * 16 * 512 * 256 + 5 * 16 * 1024 == 39_927_808
    # The latent of every key read once for all heads: 576 x 2 bytes x 1024 = 1,179,648.
    assert work.kv_read_bytes == 576 * 2 * T == 1_179_648
    assert work.kv_write_bytes == 576 * 2
    # kv_b_proj (512 -> 16 x 256) read once per step: 2,097,152 weights x 2 bytes.
    assert work.weight_bytes == 512 * 16 * 256 * 2 == 4_194_304
    # q in (16 x 192) and output out (16 x 128): 5,120 elements x 2 bytes.
    assert work.activation_bytes == 16 * (192 + 128) * 2 == 10_240


def test_decompressed_prefill_flops_by_hand():
    op = attention()
    P = 512
    pairs = P * (P + 1) // 2  # 131,328 causal pairs
    work = op.work(Step.prefill(1, P))
    # kv_b_proj expands every key: 2 * 512 * 16 * 256 FLOPs per key; attention with q/k dim 192
    # and v dim 128: 2 * 16 * (192 + 128) per pair; softmax 5 * 16 per pair.
    expected = P * 2 * 512 * 16 * 256 + pairs * 2 * 16 * 320 + pairs * 5 * 16
    assert expected == 2_147_483_648 + 1_344_798_720 + 10_506_240 == 3_502_788_608
    assert work.flops == expected
    assert work.kv_read_bytes == 576 * 2 * P


def test_a_speculative_verification_step_decodes_in_the_absorbed_form_without_prefill_keys():
    op = attention()
    # 4 sequences at 1,023 cached tokens each verify k = 3 drafted tokens: q = 4 queries each
    # (simulator.cost.speculation.verification_step): 16 tokens, all decoding, pairs 4 x (4 x 1,023 + 4 x 5 / 2)
    # = 16,408, keys read 4 x (1,023 + 4) = 4,108. No sequence prefills, so no key is decompressed: the step's
    # pairs are 4 times its keys, and "keys less the decoders' pairs" would be -12,300 keys of prefill.
    cached, q, seqs = 1023, 4, 4
    pairs = seqs * (q * cached + q * (q + 1) // 2)
    keys = seqs * (cached + q)
    assert (pairs, keys) == (16_408, 4_108)
    step = Step(tokens=seqs * q, prefill_tokens=0, sequences=seqs, logit_tokens=seqs * q, attention_pairs=pairs,
                prefill_attention_pairs=0, score_elements=pairs, context_tokens=keys)
    work = op.work(step)
    # Absorbed: 2 * 16 * (2 * 512 + 64) per pair, 2 * 16 * 512 * 256 per query token, softmax 5 * 16 per pair.
    assert work.flops == pairs * 2 * 16 * (2 * 512 + 64) + 16 * 2 * 16 * 512 * 256 + 5 * 16 * pairs
    assert work.flops == 571_260_928 + 67_108_864 + 1_312_640 == 639_682_432
    assert work.kv_read_bytes == 576 * 2 * keys
    # Against the plain decode of the same sequences: more queries, more work, never less.
    assert work.flops > op.work(Step.decode(seqs, cached + 1)).flops


def test_deepseek_v3_projections_are_replicated_or_split_as_vllm_does():
    v3 = load_model(str(FIXTURES / "DeepSeek-V3.json"))
    ops = {o.name: o for o in build_operators(v3, Precision(), load_gpu("h200"), tp=8, ep=8)}
    assert (ops["q_a_proj"].in_features, ops["q_a_proj"].out_features) == (7168, 1536)  # replicated
    assert (ops["kv_a_proj"].in_features, ops["kv_a_proj"].out_features) == (7168, 576)  # replicated
    assert ops["q_b_proj"].out_features == 128 // 8 * 192  # split by heads
    assert ops["o_proj"].in_features == 128 // 8 * 128
    assert ops["attention"].q_heads == 16


def test_fp8_kv_halves_the_latent_reads():
    bf16 = attention().work(Step.decode(4, 2048))
    fp8 = attention(precision=Precision(weights="bf16", kv="fp8")).work(Step.decode(4, 2048))
    assert fp8.kv_read_bytes == bf16.kv_read_bytes / 2 == 576 * 4 * 2048
    assert fp8.flops == pytest.approx(bf16.flops)


def test_mla_has_no_gqa_variant():
    from simulator.errors import InputError
    from simulator.model import with_attention

    with pytest.raises(InputError, match="latent"):
        with_attention(LITE, "gqa:4")
