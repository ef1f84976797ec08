"""Attention layers shaped by their kind (Gemma 4, MiMo-V2-Flash) and block-sparse attention (MiniMax-M3), counted by
hand from the real config.json files in tests/data/hf_configs."""

import pytest
from hf_fixtures import config, load, named

from simulator.cost.memory import kv_bytes_per_sequence, kv_bytes_per_token, kv_bytes_per_token_per_gpu
from simulator.cost.pipeline import stage_model
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec, with_attention, with_full_attention
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.layers import build_operators
from simulator.model.operators import Attention
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision
from simulator.model.sparse_linear_operators import BlockIndexer
from simulator.model.step import Step

BF16 = Precision(weights="bf16", kv="bf16")


GEMMA = "google--gemma-4-26B-A4B"
MIMO = "XiaomiMiMo--MiMo-V2-Flash"
MINIMAX = "MiniMaxAI--MiniMax-M3"


# Gemma 4 -----------------------------------------------------------------------------------------------------------

def test_gemma4_reads_its_global_layers_apart_from_its_sliding_ones():
    m = load(GEMMA)
    # Global (full) layers: 512-wide heads, 2 KV heads, no v_proj; the 25 sliding layers: 256-wide, 8 KV heads.
    assert (m.head_dim, m.num_kv_heads, m.full_layers_k_eq_v) == (512, 2, True)
    assert (m.sliding_head_dim, m.sliding_kv_heads, m.sliding_window, m.sliding_layers) == (256, 8, 1024, 25)
    assert m.v_norm and m.qk_norm and m.norms_per_layer == 4 and m.tied_embeddings
    assert (m.moe_experts, m.moe_top_k, m.expert_ffn_size, m.ffn_size, m.moe_parallel_mlp) == (128, 8, 704, 2112, True)
    assert m.dense_mlp_layers == m.moe_layers == 30
    assert m.warnings == ["the vision encoder (vision_config) is not modelled: text decoder only"]


def test_gemma4_26b_parameters_by_hand():
    H, V = 2816, 262144
    total = (30 * 4 * H  # input, post-attention, pre- and post-FFN norms
             + 25 * 2 * 256 + 5 * 2 * 512  # q_norm and k_norm, one head width each (v_norm has no weight)
             + 25 * (H * (16 + 2 * 8) * 256 + 16 * 256 * H)  # sliding layers: q, k, v, o
             + 5 * (H * (16 + 2) * 512 + 16 * 512 * H)  # global layers: q, k (no v_proj), o
             + 30 * 3 * H * 2112  # the dense MLP of every layer
             + 30 * 128 * 3 * H * 704  # 128 experts of 704
             + 30 * (H * 128 + 3 * H + H + 128)  # router, the MoE branch's 3 norms, router scale, per-expert scale
             + H + V * H)  # final norm, the embedding (tied to the LM head)
    assert total == 25_233_141_760  # the card's 25.2B
    counts = model_parameters(load(GEMMA))
    assert counts.total == total
    # Active: 8 of the 128 experts; the LM head (the embedding table, tied) multiplies every token.
    assert counts.active == total - 30 * 120 * 3 * H * 704 == 3_822_530_560  # the card's 3.8B


def test_gemma4_kv_cache_per_gpu_and_per_sequence_by_hand():
    m = load(GEMMA)
    # tp 8: one of the 8 sliding KV heads per GPU, and one of the 2 global ones (each held by 4 GPUs).
    per_gpu = 25 * 1 * (256 + 256) * 2 + 5 * 1 * (512 + 512) * 2
    assert kv_bytes_per_token_per_gpu(m, BF16, 8) == per_gpu == 35_840
    # A 4,096-token sequence: the global layers hold every token, the sliding ones their 1,024-token window.
    held = 5 * 2 * 2 * 512 * 2 * 4096 + 25 * 2 * 8 * 256 * 2 * 1024
    assert kv_bytes_per_sequence(m, BF16, 4096) == held == 293_601_280
    # An engine that ignores the window keeps the sliding layers' own widths, and every token in them.
    full = with_full_attention(m)
    assert full.attention_shape("sliding")[:2] == (8, 256)
    assert kv_bytes_per_sequence(full, BF16, 4096) == kv_bytes_per_token(m, BF16) * 4096


def test_gemma4_global_qkv_projection_computes_a_v_slot_its_checkpoint_lacks():
    ops = build_operators(load(GEMMA), BF16, load_gpu("h200"))
    H = 2816
    full, local = named(ops, "qkv_proj"), named(ops, "qkv_proj_local")
    # vLLM loads k_proj into the V slot of its fused QKV: 16 q heads + 2 k + 2 v of 512 columns, computed and held;
    # the checkpoint stores q and k only.
    assert (full.count, full.out_features, full.params) == (5, (16 + 2 + 2) * 512, H * (16 + 2) * 512)
    assert full.resident_bytes == H * 20 * 512 * 2
    assert full.work(Step.decode(1, 100)).flops == 2 * H * 20 * 512 == 57_671_680
    assert (local.count, local.out_features, local.params) == (25, (16 + 8 + 8) * 256, H * 32 * 256)
    # q/k norms and the weightless v norm: (16 + 2) heads of 512 plus 2 value heads of 512 per token.
    assert named(ops, "qk_norm").read_elements_per_token == (16 + 2 + 2) * 512
    assert named(ops, "o_proj").in_features == 16 * 512 and named(ops, "o_proj_local").in_features == 16 * 256


def test_gemma4_attention_operators_by_kind_read_their_own_keys():
    ops = build_operators(load(GEMMA), BF16, load_gpu("h200"), tp=8)
    full, local = named(ops, "attention"), named(ops, "attention_local")
    assert (full.count, full.kv_heads, full.head_dim, full.window) == (5, 1, 512, None)
    assert (local.count, local.kv_heads, local.head_dim, local.window) == (25, 1, 256, 1024)
    step = Step.decode(1, 4096)
    # One decode token: a global layer reads 4,096 keys and values of 512; a sliding one its last 1,024 of 256.
    assert full.work(step).kv_read_bytes == 4096 * 1 * (512 + 512) * 2 == 8_388_608
    assert local.work(step).kv_read_bytes == 1024 * 1 * (256 + 256) * 2 == 1_048_576
    # 2 of the 16 heads per GPU: scores and weighted sums 2 n (d + d) per key, 5 n for the softmax.
    assert full.work(step).flops == 4096 * (2 * 2 * (512 + 512) + 5 * 2)


def test_gemma4_moe_layer_runs_the_mlp_beside_the_experts():
    ops = build_operators(load(GEMMA), BF16, load_gpu("h200"))
    H = 2816
    assert named(ops, "gate_up_proj").count == named(ops, "experts_gate_up").count == 30
    for name in ("mlp_post_norm_1", "moe_pre_norm", "moe_post_norm"):
        assert named(ops, name).params == H
    assert named(ops, "router_norm").params == H + 128  # the router's scale and the per-expert output scale
    # The two branches' outputs added: 2 H read, H written, H FLOPs per token.
    add = named(ops, "moe_branch_add")
    assert (add.read_elements_per_token, add.write_elements_per_token, add.flops_per_token) == (2 * H, H, H)


def test_gemma4_nvfp4_checkpoints_quantise_what_they_say():
    # 26B-A4B: ModelOpt excludes every layer's self_attn*, mlp* and router*: only the experts are NVFP4.
    assert load("nvidia--Gemma-4-26B-A4B-NVFP4").default_weights == "bf16,experts=fp4"
    # 31B: dense; self_attn* excluded.
    assert load("nvidia--Gemma-4-31B-IT-NVFP4").default_weights == "bf16,mlp=fp4"


# MiMo-V2-Flash ------------------------------------------------------------------------------------------------------

def test_mimo_v2_flash_reads_its_sliding_layers():
    m = load(MIMO)
    raw = config(MIMO)
    sliding = [i for i, flag in enumerate(raw["hybrid_layer_pattern"]) if flag]
    assert [i for i in range(48) if m.layer_kind(i) == "sliding"] == sliding and len(sliding) == 39
    assert (m.num_kv_heads, m.head_dim, m.v_head_dim) == (4, 192, 128)
    assert (m.sliding_kv_heads, m.sliding_window, m.sliding_attention_sinks, m.attention_sinks) == (8, 128, True, False)
    assert m.warnings == []
    assert m.default_weights == "bf16,attention=fp8,mlp=fp8,fp8_block=128"


def test_mimo_v2_flash_parameters_by_hand():
    H, V = 4096, 152576
    total = (48 * 2 * H  # two norms per layer
             + 9 * (H * 64 * 192 + H * 4 * (192 + 128) + 64 * 128 * H)  # full: q, k (192) and v (128), o
             + 39 * (H * 64 * 192 + H * 8 * (192 + 128) + 64 * 128 * H + 64)  # sliding: 8 KV heads, 64 sinks
             + 3 * H * 16384  # layer 0's dense MLP
             + 47 * (256 * 3 * H * 2048 + H * 256)  # 256 experts of 2,048 and the router
             + H + 2 * V * H)  # final norm, embedding and LM head (untied)
    assert total == 308_778_768_832  # the card's 309B
    counts = model_parameters(load(MIMO))
    assert counts.total == total
    assert counts.active == total - V * H - 47 * 248 * 3 * H * 2048 == 14_820_972_992  # the card's 15B


def test_mimo_v2_flash_attention_with_narrow_values_by_hand():
    ops = build_operators(load(MIMO), BF16, load_gpu("h200"), tp=8)
    full, local = named(ops, "attention"), named(ops, "attention_local")
    assert isinstance(full, Attention) and (full.head_dim, full.value_head_dim, full.kv_heads) == (192, 128, 1)
    assert (local.kv_heads, local.window, local.params) == (1, 128, 64)  # 8 KV heads over 8 GPUs; 64 sink logits
    step = Step.decode(1, 4096)
    # 8 heads per GPU: q . k over 192 and the weighted sum over 128, 2 x 8 x (192 + 128) FLOPs per key, 5 x 8 for
    # the softmax; one KV head's key (192) and value (128), 640 bytes a key.
    work = full.work(step)
    assert work.flops == 4096 * (2 * 8 * (192 + 128) + 5 * 8) == 21_135_360
    assert work.kv_read_bytes == 4096 * (192 + 128) * 2 == 2_621_440
    assert work.kv_write_bytes == (192 + 128) * 2
    assert work.activation_bytes == 8 * (192 + 128) * 2  # q read (192 per head), output written (128 per head)
    assert local.work(step).kv_read_bytes == 128 * (192 + 128) * 2
    # q (64 x 192), k (8 x 192) and v (8 x 128) of a sliding layer, split over 8 GPUs; o_proj reads 64 x 128.
    assert named(ops, "qkv_proj_local").out_features == (64 * 192 + 8 * 192 + 8 * 128) // 8
    assert named(ops, "o_proj").in_features == 64 * 128 // 8


# MiniMax-M3 ---------------------------------------------------------------------------------------------------------

def test_minimax_m3_reads_its_block_sparse_layers():
    m = load(MINIMAX)
    sac = config(MINIMAX)["sparse_attention_config"]
    assert [m.layer_kind(i) for i in range(60)] == ["sparse" if f else "full" for f in sac["sparse_attention_freq"]]
    assert m.block_sparse_layers == 57 and m.block_sparse_keys == 16 * 128 == 2048
    assert (m.index_heads, m.index_head_dim) == (4, 128) and m.index_layers == 0  # no DSA indexer
    assert (m.ffn_size, m.expert_ffn_size, m.shared_expert_ffn_size, m.moe_layers) == (12288, 3072, 3072, 57)
    # The NVFP4 checkpoint's text_config holds the same decoder.
    nvfp4 = load("nvidia--MiniMax-M3-NVFP4")
    fields = ("layer_types", "ffn_size", "moe_ffn_size", "moe_shared_ffn_size", "index_heads", "index_head_dim",
              "block_sparse_topk_blocks", "block_sparse_block_size")
    assert {k: getattr(nvfp4, k) for k in fields} == {k: getattr(m, k) for k in fields}


def test_minimax_m3_parameters_by_hand():
    H, V = 6144, 200064
    total = (60 * 2 * H + 60 * 2 * 128  # two norms per layer, per-head q and k norms
             + 60 * (H * (64 + 2 * 4) * 128 + 64 * 128 * H)  # q, k, v, o
             + 57 * (H * (4 + 1) * 128 + 2 * 128)  # index q (4 heads) and k (one), their norms
             + 3 * 3 * H * 12288  # three leading dense MLPs
             + 57 * (128 * 3 * H * 3072 + 3 * H * 3072 + H * 128)  # 128 experts, the shared one, the router
             + H + 2 * V * H)  # final norm, embedding and LM head (untied)
    assert total == 426_174_565_632  # the release's 428B counts the vision encoder and MTP modules too
    counts = model_parameters(load(MINIMAX))
    assert counts.total == total
    # Over the decoder layers (MiniMax's convention), 4 of 128 experts: 23.5B (the release's 23B).
    layers = counts.active - V * H
    assert layers == total - 2 * V * H - 57 * 124 * 3 * H * 3072 == 23_504_080_128


def test_minimax_m3_block_selection_and_sparse_attention_by_hand():
    ops = build_operators(load(MINIMAX), BF16, load_gpu("h200"), tp=8)
    indexer, sparse, dense = named(ops, "block_indexer"), named(ops, "attention_sparse"), named(ops, "attention")
    assert isinstance(indexer, BlockIndexer) and (indexer.count, sparse.count, dense.count) == (57, 57, 3)
    T = 65536
    step = Step.decode(1, T)
    # 4 index heads over 8 GPUs: one per GPU (with its KV head). Each of the 65,536 keys: a 128-wide dot product
    # and a comparison for its block's maximum.
    work = indexer.work(step)
    assert work.flops == (2 * 128 + 1) * T == 16_842_752
    assert work.kv_read_bytes == 128 * 2 * T == 16_777_216  # bf16 index keys
    assert work.kv_write_bytes == 128 * 2
    # fp32 block scores (512 blocks) written and read back, the bf16 index query, 16 int32 block ids.
    assert work.activation_bytes == 2 * 4 * (T // 128) + 128 * 2 + 16 * 4
    # The KV head attends its 16 selected blocks of 128 keys: 2,048 keys, not 65,536.
    attended = sparse.work(step)
    assert attended.kv_read_bytes == 2048 * (128 + 128) * 2 == 1_048_576
    assert attended.flops == 2048 * (2 * 8 * 256 + 5 * 8)
    assert dense.work(step).kv_read_bytes == T * 256 * 2
    # Up to 2,048 keys block-sparse attention is dense.
    short = Step.decode(2, 2000)
    assert sparse.work(short) == dense.work(short)


def test_minimax_m3_kv_cache_holds_every_token_and_its_index_key():
    m = load(MINIMAX)
    # Per GPU at tp 8: one of the 4 KV heads (each held by 2 GPUs), and the one index key whole on every GPU.
    assert kv_bytes_per_token_per_gpu(m, BF16, 8) == 60 * 1 * 256 * 2 + 57 * 128 * 2 == 45_312
    assert kv_bytes_per_sequence(m, BF16, 100_000) == (2 * 60 * 4 * 128 * 2 + 57 * 128 * 2) * 100_000


def test_minimax_m3_decode_at_long_context_is_faster_than_dense():
    m = load(MINIMAX)
    dense = m.model_copy(update={"layer_types": [], "block_sparse_topk_blocks": 0, "block_sparse_block_size": 0,
                                 "index_heads": 0, "index_head_dim": 0})
    gpu, precision = load_gpu("h200"), Precision(weights="fp8", kv="bf16")
    step = Step.decode(32, 256 * 1024)
    # Per GPU at tp 8, over the 57 sparse layers: dense reads 32 x 262,144 keys and values of one KV head (512 bytes),
    # 245 GB; block-sparse reads 2,048 of them and every 256-byte index key, 2 + 122 GB. The index scan, whole on
    # every GPU, is what is left (the ~81 experts a layer touches, 1/8 of each per GPU, are ~33 GB in both).
    sparse_seconds = System(m, gpu, precision, tp=8).step_seconds(step)
    assert sparse_seconds < System(dense, gpu, precision, tp=8).step_seconds(step) * 2 / 3


def test_a_pipeline_stage_keeps_its_sparse_layers():
    stage = stage_model(load(MINIMAX), 2)
    assert stage.num_layers == 30 and stage.block_sparse_layers == 30


# Refusals and variants -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem,change,reason", [
    (GEMMA, {"text_config": {**config(GEMMA)["text_config"], "num_kv_shared_layers": 20}},
     r"reuse an earlier layer's KV cache.*num_kv_shared_layers = 20; allowed: 0"),
    (GEMMA, {"text_config": {**config(GEMMA)["text_config"], "hidden_size_per_layer_input": 256}},
     r"per-layer input embeddings.*hidden_size_per_layer_input = 256"),
    (MIMO, {"swa_num_attention_heads": 32}, r"own num_attention_heads.*swa_num_attention_heads = 32"),
    (MIMO, {"swa_v_head_dim": 192}, r"own v_head_dim.*swa_v_head_dim = 192"),
    (MINIMAX, {"sparse_attention_config": {**config(MINIMAX)["sparse_attention_config"], "sparse_score_type": "mean"}},
     r"scored by 'mean'.*allowed: max"),
    (MINIMAX, {"sparse_attention_config": {**config(MINIMAX)["sparse_attention_config"],
                                           "sparse_disable_index_value": [0] * 60}}, r"index value branch"),
])
def test_layouts_not_modelled_are_one_line_refusals(stem, change, reason):
    with pytest.raises(InputError, match=reason) as info:
        from_hf_config({**config(stem), **change}, stem)
    assert "\n" not in str(info.value)


def test_an_attention_variant_gives_every_layer_its_kv_heads():
    m = with_attention(load(MIMO), "gqa:8")
    assert m.attention_shape("full").kv_heads == m.attention_shape("sliding").kv_heads == 8
    # A block-sparse model's variant keeps one index head per KV head.
    mqa = with_attention(load(MINIMAX), "mqa")
    assert (mqa.num_kv_heads, mqa.index_heads) == (1, 1)
    assert kv_bytes_per_token(mqa, BF16) == 2 * 60 * 1 * 128 * 2 + 57 * 128 * 2


def test_sliding_widths_need_a_window():
    with pytest.raises(ValueError, match="give sliding_window"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, ffn_size=128, vocab_size=10, max_context=16,
                  sliding_kv_heads=2)

