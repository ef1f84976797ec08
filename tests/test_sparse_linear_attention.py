"""Sparse attention (DSA: DeepSeek-V3.2, GLM-5) and linear attention (Gated DeltaNet: Qwen3.5), counted by hand
from the real config.json files in tests/data/hf_configs."""

import pytest
from hf_fixtures import DATA, config, load, named

from simulator.cost.memory import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    linear_state_bytes_per_sequence,
    plan_memory,
)
from simulator.cost.pipeline import stage_model
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.gpu import load_gpu
from simulator.model.layers import build_operators
from simulator.model.operators import LatentAttention
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision
from simulator.model.sparse_linear_operators import GatedDeltaNet, Indexer, topk_step
from simulator.model.step import Step

CONTEXT = 128 * 1024  # 131,072 tokens


V32 = config("deepseek-ai--DeepSeek-V3.2")


def test_dsa_fields_are_read_from_the_config():
    m = load("deepseek-ai--DeepSeek-V3.2")
    assert (m.index_topk, m.index_heads, m.index_head_dim) == (V32["index_topk"], V32["index_n_heads"],
                                                                V32["index_head_dim"]) == (2048, 64, 128)
    assert m.index_layers == m.num_layers == 61
    assert "DSA top-2048" in m.describe_architecture()


def test_dsa_indexer_flops_and_key_reads_at_128k_by_hand():
    m = load("deepseek-ai--DeepSeek-V3.2")
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h100"))
    indexer = named(ops, "indexer")
    assert isinstance(indexer, Indexer)
    n_i, d_i, k = V32["index_n_heads"], V32["index_head_dim"], V32["index_topk"]
    work = indexer.work(Step.decode(1, CONTEXT))
    # One query scores all 131,072 keys: n_i dot products of d_i (2 n_i d_i) and the weighted sum over heads
    # (2 n_i) per key: 2 * 64 * 129 * 131,072 = 2,164,260,864 FLOPs (~2 n_i d_i T = 2.15 GFLOP).
    assert work.flops == 2 * n_i * (d_i + 1) * CONTEXT == 2_164_260_864
    # Its keys are FP8 with one fp32 scale per 128: 132 bytes a token, all read; the new token's written.
    assert work.kv_read_bytes == (d_i + 4) * CONTEXT == 17_301_504
    assert work.kv_write_bytes == d_i + 4
    # fp32 logits written and read back by the top-k, the FP8 query and fp32 head weights, 2,048 int32 positions.
    assert work.activation_bytes == 2 * 4 * CONTEXT + n_i * d_i + 4 * n_i + 4 * k
    assert indexer.compute_dtype == "fp8"


def test_dsa_latent_attention_reads_topk_keys_not_the_context():
    m = load("deepseek-ai--DeepSeek-V3.2")
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h100"))
    sparse = named(ops, "attention")
    assert isinstance(sparse, LatentAttention) and sparse.topk == 2048
    dense = LatentAttention(**{**sparse.__dict__, "topk": 0})
    r, d_r, n = V32["kv_lora_rank"], V32["qk_rope_head_dim"], V32["num_attention_heads"]
    k = V32["index_topk"]
    step = Step.decode(1, CONTEXT)
    # The latent of the 2,048 selected keys, (512 + 64) bf16 values each: 2,359,296 bytes, not 150,994,944.
    assert sparse.work(step).kv_read_bytes == (r + d_r) * 2 * k == 2_359_296
    assert dense.work(step).kv_read_bytes == (r + d_r) * 2 * CONTEXT == 150_994_944
    # Scores and weighted sums over the selected keys only: 2 n (2 r + d_r) per key and head.
    pairs = sparse.work(step).flops - dense.work(step).flops
    assert pairs == pytest.approx(-(CONTEXT - k) * (2 * n * (2 * r + d_r) + 5 * n))
    # A context shorter than k attends all of it, as dense.
    short = Step.decode(4, 1000)
    assert sparse.work(short) == dense.work(short)


def test_topk_step_caps_pairs_and_keys():
    step = Step.decode(8, CONTEXT) + Step.prefill(1, 4096, cached_tokens=CONTEXT)
    capped = topk_step(step, 2048)
    assert capped.attention_pairs == 8 * 2048 + 4096 * 2048
    assert capped.prefill_attention_pairs == 4096 * 2048
    # decode reads its selected keys; the prefill chunk at most its own CONTEXT + 4096 keys
    assert capped.context_tokens == 8 * 2048 + min(CONTEXT + 4096, 4096 * 2048)


def test_dsa_decode_at_128k_is_much_faster_than_dense_mla():
    m = load("deepseek-ai--DeepSeek-V3.2")
    dense = m.model_copy(update={"index_topk": 0, "index_heads": 0, "index_head_dim": 0})
    gpu, precision = load_gpu("h200"), Precision(weights="fp8", kv="bf16")
    step = Step.decode(32, CONTEXT)
    sparse_seconds = System(m, gpu, precision, tp=8).step_seconds(step)
    dense_seconds = System(dense, gpu, precision, tp=8).step_seconds(step)
    # 32 sequences x 61 layers x 131,072 x 576 x 2 bytes = 295 GB of latents per step dense; 2,048 keys read instead,
    # plus the indexer's 132-byte keys, cut the step several-fold.
    assert sparse_seconds < dense_seconds / 3


def test_dsa_kv_per_token_adds_the_index_keys_whole_on_every_gpu():
    m = load("deepseek-ai--DeepSeek-V3.2")
    L = V32["num_hidden_layers"]
    latent = (V32["kv_lora_rank"] + V32["qk_rope_head_dim"]) * L * 2
    index_keys = L * (V32["index_head_dim"] + 4)
    assert kv_bytes_per_token(m, Precision(kv="bf16")) == latent + index_keys == 70_272 + 8_052
    assert kv_bytes_per_token_per_gpu(m, Precision(kv="bf16"), 8) == latent + index_keys
    # An fp8 KV cache halves the latent; the index keys are FP8 already.
    assert kv_bytes_per_token(m, Precision(kv="fp8")) == latent // 2 + index_keys


def test_dsa_parameters_within_2_percent_of_published():
    # DeepSeek-V3 README: 671B total, 37B activated (685B with the MTP module); V3.2 keeps that model and adds
    # the indexer: 61 x (1536 x 64 x 128 + 7168 x 128 + 2 x 128 + 7168 x 64) = 851,524,864 parameters.
    counts = model_parameters(load("deepseek-ai--DeepSeek-V3.2"))
    v3 = model_parameters(load("deepseek-ai--DeepSeek-V3"))
    assert counts.total - v3.total == 61 * (1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64) == 851_524_864
    assert abs(counts.total - 671e9) < 0.02 * 671e9
    assert abs(counts.active - 37e9) < 0.02 * 37e9 + 0.5e9  # 37.5B: "37B" rounds to its last printed digit
    # GLM-5 release blog (Z.ai): 744B total, 40B active.
    glm = model_parameters(load("zai-org--GLM-5"))
    assert abs(glm.total - 744e9) < 0.02 * 744e9 and abs(glm.active - 40e9) < 0.02 * 40e9 + 0.5e9


QWEN = config("Qwen--Qwen3.5-27B")["text_config"]


def test_gated_deltanet_state_bytes_of_qwen35_27b_by_hand():
    m = load("Qwen--Qwen3.5-27B")
    assert m.linear_layers == 48 and m.attention_layers == 16  # full_attention_interval 4
    n_k, n_v = QWEN["linear_num_key_heads"], QWEN["linear_num_value_heads"]
    d_k, d_v, K = QWEN["linear_key_head_dim"], QWEN["linear_value_head_dim"], QWEN["linear_conv_kernel_dim"]
    assert QWEN["mamba_ssm_dtype"] == "float32" and m.linear_state_dtype == "fp32"
    # Per layer: 48 value heads x 128 x 128 fp32 state = 3,145,728 bytes, and the convolution window,
    # (4 - 1) x (2 x 16 x 128 + 48 x 128) = 30,720 bf16 values = 61,440 bytes.
    state = n_v * d_k * d_v * 4
    conv = (K - 1) * (2 * n_k * d_k + n_v * d_v) * 2
    assert (state, conv) == (3_145_728, 61_440)
    per_sequence = 48 * (state + conv)
    assert linear_state_bytes_per_sequence(m, Precision()) == per_sequence == 153_944_064
    # Split by heads over 4 GPUs.
    assert linear_state_bytes_per_sequence(m, Precision(), tp=4) == per_sequence / 4
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h100"))
    delta = named(ops, "linear_attention")
    assert isinstance(delta, GatedDeltaNet) and delta.count == 48
    assert delta.state_bytes == state + conv
    # A decode step reads and writes every sequence's state once, at any context.
    for context in (100, CONTEXT):
        work = delta.work(Step.decode(8, context))
        assert work.kv_read_bytes == work.kv_write_bytes == 8 * (state + conv)
    # Recurrent decode: 7 d_k d_v FLOPs per value head, plus the convolution (2 K per channel).
    assert delta.work(Step.decode(1, CONTEXT)).flops == 7 * n_v * d_k * d_v + 2 * K * (2 * n_k * d_k + n_v * d_v)


def test_hybrid_memory_plan_kv_for_full_layers_state_per_sequence():
    m = load("Qwen--Qwen3.5-27B")
    precision = Precision(weights="bf16", kv="bf16")
    # KV: only the 16 full-attention layers, 2 x 4 KV heads x 256 x 2 bytes each.
    per_token = 16 * 2 * QWEN["num_key_value_heads"] * QWEN["head_dim"] * 2
    assert kv_bytes_per_token(m, precision) == per_token == 65_536
    state = linear_state_bytes_per_sequence(m, precision)
    assert kv_bytes_per_sequence(m, precision, 4096) == 4096 * per_token + state
    gpu = load_gpu("h100")
    plan = plan_memory(m, precision, gpu, tp=1, batch=8, context_tokens=4096,
                       operators=build_operators(m, precision, gpu))
    assert plan.kv_bytes_per_token == per_token and plan.state_bytes_per_sequence == state
    assert plan.kv_bytes == 8 * (4096 * per_token + state)


def test_paged_cache_sets_aside_a_state_pool():
    from simulator.cost.deployment import Deployment
    from simulator.engine.kvcache import kv_capacity

    m = load("Qwen--Qwen3.5-27B")
    precision, gpu = Precision(weights="bf16", kv="bf16"), load_gpu("h200")
    system = System(m, gpu, precision, tp=2)
    plan = plan_memory(m, precision, gpu, 2, 1, 4096, system.operators)
    deployment = Deployment(system, plan, auto_tp=False)
    few = kv_capacity(deployment, max_num_seqs=8)
    many = kv_capacity(deployment, max_num_seqs=4096)
    state = linear_state_bytes_per_sequence(m, precision, tp=2)  # 77 MB per GPU
    assert few.state_sequences == 8 and few.state_bytes_per_gpu == 8 * state
    # 4,096 states would not fit: the pool takes at most half of what is left for the cache.
    budget = many.budget_bytes_per_gpu + many.state_bytes_per_gpu
    assert many.state_sequences == int(budget / 2 // state) < 4096
    assert many.state_bytes_per_gpu <= budget / 2 and many.blocks > 0 and many.blocks < few.blocks


def test_qwen35_attention_layers_carry_the_output_gate_and_parameters_match():
    m = load("Qwen--Qwen3.5-27B")
    assert m.attention_output_gate and m.qk_norm
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h100"))
    qkv = named(ops, "qkv_proj")
    n, g, d = QWEN["num_attention_heads"], QWEN["num_key_value_heads"], QWEN["head_dim"]
    assert qkv.count == 16 and qkv.out_features == (2 * n + 2 * g) * d  # queries and their gate, keys, values
    # Qwen3.5-35B-A3B card: 35B total, 3B activated (rounded); 397B-A17B: 397B, 17B.
    small = model_parameters(load("Qwen--Qwen3.5-35B-A3B"))
    assert abs(small.total - 35e9) < 0.02 * 35e9 and abs(small.active_with_embedding - 3e9) < 0.5e9
    large = model_parameters(load("Qwen--Qwen3.5-397B-A17B"))
    assert abs(large.total - 397e9) < 0.02 * 397e9 and abs(large.active_with_embedding - 17e9) < 0.02 * 17e9 + 0.5e9


def test_hybrid_decode_step_grows_only_with_the_full_layers():
    m = load("Qwen--Qwen3.5-27B")
    system = System(m, load_gpu("h100"), Precision(weights="bf16", kv="bf16"), tp=2)
    short, long = (float(system.step_totals(Step.decode(16, t)).bytes) for t in (1024, CONTEXT))
    # 16 sequences x (131,072 - 1,024) tokens x the 16 full layers' 65,536 bytes, halved over 2 GPUs.
    assert long - short == pytest.approx(16 * (CONTEXT - 1024) * 65_536 / 2, rel=1e-9)


def test_pipeline_stage_keeps_the_linear_layers():
    m = load("Qwen--Qwen3.5-27B")
    stage = stage_model(m, 4)
    assert stage.num_layers == 16 and stage.linear_layers == 12 and stage.attention_layers == 4


def test_linear_layers_need_their_widths_and_an_indivisible_tp_is_refused():
    m = load("Qwen--Qwen3.5-27B")
    with pytest.raises(ValueError, match="'linear' layers need"):
        ModelSpec.model_validate({**m.model_dump(), "linear_conv_kernel": 0})
    with pytest.raises(InputError, match="does not divide the 16 linear-attention key heads"):
        build_operators(m.model_copy(update={"num_heads": 96, "num_kv_heads": 32}), Precision(), load_gpu("h100"),
                        tp=32)


def test_glm52_shared_indexers_and_kimi_delta_attention_stay_refused():
    with pytest.raises(InputError, match="indexers shared between layers"):
        load("zai-org--GLM-5.2")
    with pytest.raises(InputError, match="Kimi Delta Attention"):
        load("moonshotai--Kimi-K3")


def test_engine_runs_no_more_sequences_than_the_state_pool_holds():
    from simulator.plan.engine_run import prepare

    path = str(DATA / "Qwen--Qwen3.5-27B_config.json")
    prep = prepare({"model": path, "gpu": "h200", "tp": 2, "batch": 8, "ctx": 4096, "max_num_seqs": 4096})
    state = linear_state_bytes_per_sequence(prep.deployment.system.model, prep.deployment.system.precision, tp=2)
    # 4,096 states of 77 MB would take 315 GB per GPU: the pool holds what half the budget allows, and the
    # scheduler runs no more sequences than that.
    budget = prep.capacity.budget_bytes_per_gpu + prep.capacity.state_bytes_per_gpu
    assert prep.capacity.state_sequences == int(budget / 2 // state) < 4096
    assert prep.config.max_num_seqs == prep.capacity.state_sequences
    small = prepare({"model": path, "gpu": "h200", "tp": 2, "batch": 8, "ctx": 4096, "max_num_seqs": 8})
    assert small.config.max_num_seqs == small.capacity.state_sequences == 8
