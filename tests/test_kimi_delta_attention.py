"""Kimi-K3: Kimi Delta Attention beside MLA, its latent MoE and Attention Residuals, counted by hand from its config.json
(tests/data/hf_configs/moonshotai--Kimi-K3_config.json)."""

import json
from pathlib import Path

import pytest

from simulator.cost.memory import kv_bytes_per_token, linear_state_bytes_per_sequence
from simulator.cost.pipeline import stage_model
from simulator.errors import InputError
from simulator.model.architecture import load_model_file
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.layers import attention_residual_candidates, build_operators
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision, parse_precision
from simulator.model.sparse_linear_operators import GatedDeltaNet
from simulator.model.step import Step

PATH = Path(__file__).parent / "data" / "hf_configs" / "moonshotai--Kimi-K3_config.json"
RAW = json.loads(PATH.read_text())
TEXT = RAW["text_config"]
KDA = TEXT["linear_attn_config"]
H = 7168


def named(ops, name):
    return next(op for op in ops if op.name == name)


def test_kda_and_mla_layers_read_from_linear_attn_config():
    m = load_model_file(PATH)
    # kda_layers and full_attn_layers count from 1: 69 KDA layers (1, 2, 3, 5, ...) and 24 MLA ones (4, 8, ..., 92, 93).
    assert len(KDA["kda_layers"]) == 69 and KDA["full_attn_layers"] == [*range(4, 93, 4), 93]
    assert m.linear_layers == 69 and m.attention_layers == 24 and m.layer_kind(0) == "linear"
    assert [i for i in range(93) if m.layer_kind(i) == "full"] == [*range(3, 92, 4), 92]
    assert (m.linear_kind, m.linear_key_heads, m.linear_value_heads, m.linear_key_head_dim, m.linear_conv_kernel) \
        == ("kda", 96, 96, 128, 4)
    assert m.linear_state_dtype == "fp32" and m.linear_gate_rank == 0  # use_full_rank_gate
    assert m.is_mla and m.attention_output_gate and m.position_embedding == "none"  # NoPE MLA with g_proj
    assert (m.moe_experts, m.moe_top_k, m.moe_shared_experts, m.moe_latent_size, m.moe_latent_norm) \
        == (896, 16, 2, 3584, True)
    assert m.attention_residual_block == 12 and m.activation == "situ"
    # Only the vision encoder is named as not modelled; no field is read as another family's or left unread.
    assert m.warnings == ["the vision encoder (vision_config) is not modelled: text decoder only"]


def test_kda_state_per_sequence_and_kv_per_token_by_hand():
    m = load_model_file(PATH)
    # Per KDA layer: 96 heads x 128 x 128 fp32 state = 6,291,456 bytes (vLLM's kda_state_dtype: float32), and the
    # q, k and v convolution windows, (4 - 1) x 3 x 96 x 128 bf16 values = 221,184 bytes.
    state, conv = 96 * 128 * 128 * 4, (4 - 1) * 3 * 96 * 128 * 2
    assert (state, conv) == (6_291_456, 221_184)
    per_sequence = 69 * (state + conv)
    assert linear_state_bytes_per_sequence(m, Precision()) == per_sequence == 449_372_160
    assert linear_state_bytes_per_sequence(m, Precision(), tp=8) == per_sequence / 8  # 12 heads per GPU
    # KV: the 24 MLA layers' latent and (unrotated) key part, 512 + 64 bf16 values each.
    assert kv_bytes_per_token(m, Precision(kv="bf16")) == 24 * (512 + 64) * 2 == 27_648


def test_kda_layer_cost_by_hand():
    m = load_model_file(PATH)
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h200"))
    kda = named(ops, "linear_attention")
    assert isinstance(kda, GatedDeltaNet) and kda.count == 69 and kda.decay_channels == 128
    n, d, c = 96, 128, 3 * 96 * 128  # heads, head width, convolution channels (q, k, v)
    work = kda.work(Step.decode(8, 4096))
    # Recurrent decode: 7 d_k d_v per head (decay, prediction, correction, read-out) and 2 K per channel.
    assert work.flops == 8 * (7 * n * d * d + 2 * 4 * c) == 8 * 11_304_960
    # Each of the 8 sequences reads and writes its state once, whatever its context.
    assert work.kv_read_bytes == work.kv_write_bytes == 8 * 6_512_640
    # Per token: q, k, v through the convolution and the recurrence (3 c), the decay per key channel and beta
    # (n (d + 1): Gated DeltaNet's scalar decay would be n), the output, its gate and the normed result (4 n d).
    assert work.activation_bytes == 8 * (3 * c + n * (d + 1) + 4 * n * d) * 2 == 8 * 172_128 * 2
    # The projections of one KDA layer: q, k, v (7168 x 36,864), the full-rank output gate and o_proj
    # (7168 x 12,288 each), the decay's f_a (7168 x 128) and f_b (128 x 12,288), beta (7168 x 96); the operator
    # holds the convolution filters (36,864 x 4), A_log (96), dt_bias per channel (12,288) and the norm (128).
    weights = {"linear_in_proj_qkv": H * c, "linear_gate_proj": H * n * d, "linear_decay_a_proj": H * d,
               "linear_decay_b_proj": d * n * d, "linear_beta_proj": H * n, "linear_out_proj": n * d * H}
    assert {name: named(ops, name).params for name in weights} == weights
    assert kda.params == c * 4 + n + n * d + d == 159_968
    assert sum(weights.values()) + kda.params == 443_740_384


def test_mla_layers_gate_their_output_and_rotate_nothing():
    m = load_model_file(PATH)
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h200"), tp=8)
    assert named(ops, "attention").count == named(ops, "q_a_proj").count == 24
    gate = named(ops, "attn_gate_proj")
    assert (gate.count, gate.in_features, gate.out_features, gate.params) == (24, H, 96 * 128 // 8, H * 96 * 128)
    assert named(ops, "attn_output_gate").count == 24
    assert not any(op.name == "rotary" for op in ops)  # mla_use_nope


def test_attention_residual_candidates_and_cost_by_hand():
    # Layer i's mixer mixes ceil(i / 12) snapshots and the running sum (none at layer 0): over i = 1..92,
    # 12 x (1 + ... + 7) + 8 x 8 = 400 snapshots, + 92 sums = 492 candidates. Its FFN mixes floor(i / 12) + 1
    # snapshots and the sum: 12 x (0 + ... + 6) + 9 x 7 = 315, + 2 x 93 = 501. The final norm: ceil(93 / 12) = 8
    # snapshots and the sum, 9. 92 + 93 + 1 = 186 calls, 492 + 501 + 9 = 1,002 candidates, 8 snapshots written.
    assert attention_residual_candidates(0, 93, 12) == (186, 1_002, 8)
    m = load_model_file(PATH)
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h200"))
    res = named(ops, "attention_residuals")
    assert res.count == 186
    work = res.work(Step.decode(1, 4096))
    # 7 H + 5 FLOPs per candidate; each candidate's H elements read, each call's output and each snapshot written.
    assert res.count * work.flops == pytest.approx(1_002 * (7 * H + 5)) == 50_281_362
    assert res.count * work.activation_bytes == pytest.approx((1_002 + 186 + 8) * H * 2)
    # The last of 2 pipeline stages (layers 46..92) counts its block boundaries from layer 0: the mixer of layer i
    # sees ceil(i / 12) snapshots, so layer 46 sees 4.
    stage = stage_model(m, 2)
    assert stage.attention_residual_offset == 46
    assert attention_residual_candidates(46, 47, 12)[0] == 47 + 47 + 1


def test_attention_residual_snapshots_in_the_workspace_and_between_stages():
    from simulator.cost.memory import workspace_bytes_per_gpu
    from simulator.cost.pipeline import PipelineSystem
    from simulator.cost.system import System

    m = load_model_file(PATH)
    plain = m.model_copy(update={"attention_residual_block": 0})
    precision = Precision(weights="bf16", kv="bf16")
    # 8 snapshots of 7,168 bf16 values per token in flight, for a prefill chunk of 8,192 tokens: 939,524,096 bytes.
    extra = workspace_bytes_per_gpu(m, precision, 8, 8192, 1) - workspace_bytes_per_gpu(plain, precision, 8, 8192, 1)
    assert extra == 8192 * 8 * H * 2 == 939_524_096
    # Into the last of 2 stages (layers 46..92) go the hidden states and the ceil(46 / 12) = 4 snapshots before it.
    gpu = load_gpu("h200")
    pipeline = PipelineSystem(System(stage_model(m, 2), gpu, precision, tp=8), m, 2)
    assert pipeline.message_bytes(Step.decode(8, 4096)) == 8 * H * (1 + 4) * 2


def test_parameters_by_hand_match_the_published_counts():
    m = load_model_file(PATH)
    kda = 443_740_384  # test_kda_layer_cost_by_hand
    # MLA: q_a (7168 x 1536) and its norm, q_b (1536 x 96 x 192), kv_a (7168 x 576), kv_a norm (512),
    # kv_b (512 x 96 x 256), o_proj (96 x 128 x 7168) and the output gate (7168 x 12,288).
    mla = H * 1536 + 1536 + 1536 * 96 * 192 + H * 576 + 512 + 512 * 96 * 256 + 96 * 128 * H + H * 96 * 128
    # MoE: router (7168 x 896), latent in and out (7168 x 3584 each) with its norm (3584), 896 experts of
    # 3 x 3584 x 3072 in the latent, and 2 shared experts of 3072 (one MLP of 6144) on the hidden state.
    expert = 3 * 3584 * 3072
    moe_rest = H * 896 + 2 * H * 3584 + 3584 + 3 * H * 6144
    dense = 3 * H * 33792  # layer 0's MLP
    # Embedding and LM head (untied), the final norm, 93 x 2 layer norms, 186 attention-residual calls of 2 H.
    common = 2 * 163840 * H + H + 93 * 2 * H + 186 * 2 * H
    total = common + 69 * kda + 24 * mla + dense + 92 * (moe_rest + 896 * expert)
    active = common - 163840 * H + 69 * kda + 24 * mla + dense + 92 * (moe_rest + 16 * expert)
    assert (total, active) == (2_779_484_379_232, 104_189_515_872)
    counts = model_parameters(m)
    assert (counts.total, counts.active) == (total, active)
    # Kimi K3 report: 2.78T total, 104.2B activated.
    assert abs(total - 2.78e12) < 0.001 * 2.78e12 and abs(active - 104.2e9) < 0.001 * 104.2e9


def test_the_routed_experts_are_mxfp4_the_rest_bf16_and_it_needs_two_nodes_of_h200():
    from simulator.cost.memory import plan_memory

    m = load_model_file(PATH)
    assert m.default_weights == "bf16,experts=mxfp4" and m.shared_expert_module == "mlp"
    # 92 x 896 experts x 33,030,144 weights at 4.25 bits (MXFP4: a 1-byte scale per 32) = 1.45 TB: more than
    # 8 x 141 GB, so 8 H200s hold no copy; two pipeline stages of 8 do.
    assert 92 * 896 * 33_030_144 * 17 // 32 == 1_446_456_066_048 > 8 * 141e9
    precision, gpu = parse_precision(m.default_weights, "bf16"), load_gpu("h200")
    plan = plan_memory(m, precision, gpu, tp=8, batch=8, context_tokens=4096,
                       operators=build_operators(m, precision, gpu, tp=8))
    assert not plan.fits
    stage = stage_model(m, 2)
    staged = plan_memory(stage, precision, gpu, tp=8, batch=8, context_tokens=4096,
                         operators=build_operators(stage, precision, gpu, tp=8))
    assert staged.fits


def test_kda_layer_lists_that_do_not_number_the_layers_are_refused():
    text = {**TEXT, "linear_attn_config": {**KDA, "kda_layers": KDA["kda_layers"][:-1]}}
    with pytest.raises(InputError, match="must number the 93 layers 1 to 93, each once"):
        from_hf_config({**RAW, "text_config": text}, "k3")
    zero_based = {**KDA, "kda_layers": [i - 1 for i in KDA["kda_layers"]],
                  "full_attn_layers": [i - 1 for i in KDA["full_attn_layers"]]}
    with pytest.raises(InputError, match="must number the 93 layers"):
        from_hf_config({**RAW, "text_config": {**TEXT, "linear_attn_config": zero_based}}, "k3")
    # Outside model_type kimi_linear the field is still refused.
    other = {**TEXT, "model_type": "deepseek_v3"}
    with pytest.raises(InputError, match="Kimi Delta Attention layers.*field linear_attn_config"):
        from_hf_config(other, "x")
