"""DeepSeek-V4's compressed attention (window, CSA with the lightning indexer, HCA) and hyper-connections, counted by
hand from the real config.json files in tests/data/hf_configs (DeepSeek-V4-Flash: hidden 4096, 43 layers, 64 heads
of 512, q_lora_rank 1024, o_groups 8 x o_lora_rank 1024, window 128, indexer 64 x 128 top-512, hc_mult 4)."""

import json

import pytest
from click.testing import CliRunner
from hf_fixtures import DATA, config, load, named

from simulator.cli import main
from simulator.cost.memory import (
    compressed_attention_state_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    tensor_parallel_candidates,
)
from simulator.cost.pipeline import stage_model
from simulator.errors import InputError
from simulator.model.architecture import load_model_file, with_attention
from simulator.model.compressed_attention_operators import (
    CompressedAttention,
    HyperConnection,
    KVCompressor,
    compressed_entry_bytes,
)
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.layers import build_operators
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision
from simulator.model.sparse_linear_operators import Indexer
from simulator.model.step import Step

FLASH_STEM = "deepseek-ai--DeepSeek-V4-Flash"
CONTEXT = 128 * 1024  # 131,072 tokens
BF16 = Precision(weights="bf16", kv="bf16")

FLASH = config(FLASH_STEM)


def flash_ops(tp: int = 1, precision: Precision = BF16):
    return build_operators(load(FLASH_STEM), precision, load_gpu("h200"), tp=tp)


def test_fields_are_read_from_the_config():
    m = load(FLASH_STEM)
    # 44 ratios: the 43 layers' and the multi-token-prediction layer's (dropped, as vLLM's DeepseekV4Attention does).
    assert len(FLASH["compress_ratios"]) == 44 and m.compress_ratios == FLASH["compress_ratios"][:43]
    # [0, 0, 4, 128, 4, ..., 128, 4]: 2 window-only layers, 21 CSA (layers 2, 4, ..., 42), 20 HCA (3, 5, ..., 41).
    assert [m.compress_ratio_layers(r) for r in (0, 4, 128)] == [2, 21, 20] and m.index_layers == 21
    assert (m.compress_window, m.head_dim, m.num_kv_heads, m.q_lora_rank, m.qk_rope_head_dim) == (128, 512, 1, 1024, 64)
    assert (m.o_groups, m.o_lora_rank, m.hc_mult, m.hc_sinkhorn_iters) == (8, 1024, 4, 20)
    assert (m.index_topk, m.index_heads, m.index_head_dim) == (512, 64, 128)
    assert m.sliding_window is None and not m.is_mla
    assert "CSA 1/4 top-512" in m.describe_architecture() and "hyper-connections x4" in m.describe_architecture()
    pro = load("deepseek-ai--DeepSeek-V4-Pro")
    assert [pro.compress_ratio_layers(r) for r in (0, 4, 128)] == [0, 30, 31]


def test_checkpoint_formats_fp8_blocks_with_mxfp4_nvfp4_or_fp8_experts():
    # expert_dtype fp4: MXFP4 routed experts (DeepSeek's reference; vLLM's Mxfp4MoEMethod), the rest FP8 128 x 128.
    flash = load(FLASH_STEM)
    assert flash.default_weights == "bf16,attention=fp8,mlp=fp8,experts=mxfp4,fp8_block=128"
    assert flash.shared_expert_module == "mlp"
    # NVIDIA's copy: ModelOpt NVFP4 on layers.N.ffn.experts, attention and shared experts left FP8.
    assert load("nvidia--DeepSeek-V4-Flash-NVFP4").default_weights == "bf16,attention=fp8,mlp=fp8,experts=fp4,fp8_block=128"
    # SGLang's FP8 copy (model_type deepseek_ref, no expert_dtype): FP8 everywhere.
    sgl = load("sgl-project--DeepSeek-V4-Flash-FP8")
    assert sgl.default_weights == "bf16,attention=fp8,mlp=fp8,fp8_block=128" and sgl.shared_expert_module == "experts"


def test_flash_parameters_by_hand():
    # Per layer: wq_a + wkv 4096 x (1024 + 512), their norms 1024 + 512, wq_b 1024 x 64 x 512, wo_a 64 x 512 x 1024,
    # wo_b 8 x 1024 x 4096, 64 sinks; router 256 x 4096; 256 + 1 experts of 3 x 4096 x 2048; 2 norms of 4096; two
    # hyper-connections of a 24 x 16,384 matrix, 24 biases and 3 scales.
    attention = 4096 * 1536 + 1536 + 1024 * 32768 + 32768 * 1024 + 8192 * 4096 + 64
    assert attention == 106_956_352
    moe = 256 * 4096 + 257 * 3 * 4096 * 2048
    hyper = 2 * (24 * 16384 + 24 + 3)
    layer = attention + moe + 2 * 4096 + hyper
    # CSA layers: compressor wkv + wgate 4096 x 2 x 2 x 512, its position bias 4 x 1024 and norm 512; the indexer's
    # wq_b 1024 x 64 x 128, weights_proj 4096 x 64, its compressor 4096 x 2 x 2 x 128 + 4 x 256 + 128.
    csa = 4096 * 2048 + 4 * 1024 + 512 + 1024 * 8192 + 4096 * 64 + 4096 * 512 + 4 * 256 + 128
    assert csa == 19_142_272
    hca = 4096 * 1024 + 128 * 512 + 512  # wkv + wgate 4096 x 2 x 512, bias 128 x 512, norm 512
    embeddings = 2 * 129280 * 4096
    head = 4 * 16384 + 4 + 1 + 4096  # the final collapse's matrix, biases, scale; the final norm
    total = 43 * layer + 21 * csa + 20 * hca + embeddings + head
    assert total == 284_332_230_231  # the card's 284B
    counts = model_parameters(load(FLASH_STEM))
    assert counts.total == total
    # Active, DeepSeek's convention (no input embedding): 6 + 1 experts instead of 257.
    active = total - embeddings // 2 - 43 * 250 * 3 * 4096 * 2048
    assert counts.active == active == 13_270_091_351  # the card's 13B


def test_kv_bytes_per_token_and_a_128k_sequence_by_hand():
    m = load(FLASH_STEM)
    # Per token: a 1,024-byte bf16 entry per 4 tokens on 21 layers and per 128 on 20, a 132-byte index key per 4.
    assert kv_bytes_per_token(m, BF16) == 21 * 1024 / 4 + 20 * 1024 / 128 + 21 * 132 / 4 == 6_229
    # Fixed per sequence: 43 windows of 128 entries; compressor states of 2 coff x ratio tokens of 2 coff d fp32
    # (CSA: coff 2, 8 x 2,048 x 4 = 65,536; HCA: coff 1, 128 x 1,024 x 4 = 524,288; index: 8 x 512 x 4 = 16,384).
    fixed = 43 * 128 * 1024 + 21 * 65_536 + 20 * 524_288 + 21 * 16_384
    assert compressed_attention_state_bytes(m, BF16) == fixed == 17_842_176
    sequence = (43 * 128 * 1024  # windows: 5,636,096
                + 21 * (CONTEXT // 4) * 1024  # CSA entries: 704,643,072
                + 20 * (CONTEXT // 128) * 1024  # HCA entries: 20,971,520
                + 21 * (CONTEXT // 4) * 132  # index keys: 90,832,896
                + 21 * 65_536 + 20 * 524_288 + 21 * 16_384)  # states: 12,206,080
    assert sequence == 834_289_664
    assert kv_bytes_per_sequence(m, BF16, CONTEXT) == sequence
    # One K = V head: whole on every GPU of tp 8, as MLA's latent.
    assert kv_bytes_per_sequence(m, BF16, CONTEXT, tp=8) == sequence
    assert kv_bytes_per_token_per_gpu(m, BF16, 8) == 6_229
    # DeepSeek-V3.2 at 128k: (512 + 64) x 2 + 132 bytes per token and layer, 61 layers: 10.3 GB, 12x Flash's.
    assert 78_324 * CONTEXT / sequence == pytest.approx(12.3, abs=0.05)


def test_fp8_entries_take_vllms_fp8_ds_mla_layout():
    # 448 FP8 non-rotary values, 64 bf16 rotary ones, 448 / 64 = 7 scale bytes and a pad byte (vLLM's head_bytes).
    assert compressed_entry_bytes(512, 64, 1.0) == 448 + 64 * 2 + 7 + 1 == 584
    assert compressed_entry_bytes(512, 64, 2.0) == 1024
    m = load(FLASH_STEM)
    assert kv_bytes_per_token(m, Precision(kv="fp8")) == 21 * 584 / 4 + 20 * 584 / 128 + 21 * 132 / 4


def test_csa_layer_decode_at_128k_by_hand():
    ops = flash_ops()
    csa = named(ops, "attention_csa")
    assert isinstance(csa, CompressedAttention) and (csa.count, csa.compress_ratio, csa.topk) == (21, 4, 512)
    work = csa.work(Step.decode(1, CONTEXT))
    # The query attends its 128 raw keys and the 512 of 32,768 compressed entries the indexer picks: 640 keys, each
    # scored over 512 values and summed over 512 (K = V) by 64 heads, plus the softmax: 640 x 64 x (4 x 512 + 5).
    assert work.flops == 640 * 64 * 2053 == 84_090_880
    assert work.padding_flops == 0  # 64 heads: FlashMLA's own count
    assert work.kv_read_bytes == 640 * 1024 == 655_360  # each key read once for all heads
    assert work.kv_write_bytes == 1024  # the new token's raw key
    assert work.activation_bytes == 2 * 64 * 512 * 2  # q read, output written
    hca = named(ops, "attention_hca").work(Step.decode(1, CONTEXT))
    assert hca.flops == (128 + 1024) * 64 * 2053  # all 131,072 / 128 = 1,024 entries
    window = named(ops, "attention_window").work(Step.decode(1, CONTEXT))
    assert window.kv_read_bytes == 128 * 1024


def test_tensor_parallel_heads_are_padded_to_64_for_flashmla():
    csa = named(flash_ops(tp=8), "attention_csa")
    work = csa.work(Step.decode(1, CONTEXT))
    # 8 heads per GPU run as 64 (vLLM pads the query to FlashMLA's head count): 56 zero heads' work on top.
    assert (csa.q_heads, csa.padded_heads) == (8, 64)
    assert work.flops == 640 * 8 * 2053 and work.padding_flops == 640 * 56 * 2053
    assert work.kv_read_bytes == 640 * 1024  # the cache is whole on every GPU


def test_csa_indexer_scores_compressed_keys_at_128k():
    indexer = named(flash_ops(), "indexer")
    assert isinstance(indexer, Indexer) and indexer.compress_ratio == 4 and indexer.count == 21
    work = indexer.work(Step.decode(1, CONTEXT))
    # 131,072 / 4 = 32,768 compressed keys, each scored by 64 heads of 128 and weighted: 2 x 64 x 129 per key.
    assert work.flops == 2 * 64 * 129 * 32_768 == 541_065_216
    assert work.kv_read_bytes == 32_768 * 132 == 4_325_376
    assert work.kv_write_bytes == 0  # the index-key compressor writes them
    # fp32 logits written and read back, the FP8 query and fp32 head weights, 512 int32 positions.
    assert work.activation_bytes == 2 * 4 * 32_768 + 64 * 128 + 4 * 64 + 4 * 512


def test_compressors_per_decode_token_by_hand():
    ops = flash_ops()
    csa, hca, index = (named(ops, n) for n in ("compressor_csa", "compressor_hca", "indexer_compressor"))
    assert all(isinstance(op, KVCompressor) for op in (csa, hca, index))
    step = Step.decode(1, CONTEXT)
    # CSA (overlapping windows, coff 2): the token's 2 x 512 projections and 2 x 512 scores, fp32, written and later
    # read; a 1,024-byte entry per 4 tokens.
    assert csa.work(step).kv_write_bytes == 4 * 512 * 4 + 1024 / 4 == 8_448
    assert csa.work(step).kv_read_bytes == 4 * 512 * 4
    assert hca.work(step).kv_write_bytes == 2 * 512 * 4 + 1024 / 128  # coff 1, an entry per 128
    assert index.work(step).kv_write_bytes == 4 * 128 * 4 + 132 / 4  # at the index width, FP8 keys
    # Their projections: hidden -> 2 coff d, bf16 weights (stored so in the checkpoint), fp32 out.
    proj = named(flash_ops(precision=Precision(weights="fp8", kv="bf16")), "compressor_csa_proj")
    assert (proj.in_features, proj.out_features, proj.weight_bytes_per_element) == (4096, 2048, 2.0)


def test_hyper_connection_bytes_and_flops_per_token():
    ops = flash_ops()
    site = named(ops, "hc_attn")
    assert isinstance(site, HyperConnection) and site.count == 43 and named(ops, "hc_ffn").count == 43
    assert not any(op.name.endswith("_residual") for op in ops)  # they take the residual adds' place
    work = site.work(Step.decode(1, CONTEXT))
    H, N = 4096, 4
    # Read the block's output and the 4 streams, write the 4 new streams and the next block's input, bf16.
    assert work.activation_bytes == 2 * (N + 1) * H * 2 == 81_920
    # The (2 + 4) x 4 = 24 x 16,384 fp32 matrix, read once a step.
    assert work.weight_bytes == 24 * N * H * 4 == 1_572_864
    # post 4 x 4096 x (2 x 4 + 2); norm 4 x 16,384, projection 2 x 16,384 x 24, collapse 2 x 16,384; Sinkhorn
    # (4 x 20 + 5) x 16.
    assert work.flops == 163_840 + 65_536 + 786_432 + 32_768 + 1_360 == 1_049_936
    head = named(ops, "hc_head").work(Step.decode(1, CONTEXT))
    assert head.activation_bytes == 2 * ((N + 1) * H + H) and head.weight_bytes == N * N * H * 4


def test_published_long_context_savings_over_v32():
    # DeepSeek-V4 card: at 1M tokens V4-Pro needs 27% of DeepSeek-V3.2's single-token inference FLOPs and 10% of its
    # KV cache. Ours, bf16: 26.1% and 11.4%.
    pro, v32 = load("deepseek-ai--DeepSeek-V4-Pro"), load("deepseek-ai--DeepSeek-V3.2")
    step, gpu, tokens = Step.decode(1, 2**20), load_gpu("h200"), 2**20

    def flops(model):
        return sum(op.count * op.work(step).flops for op in build_operators(model, BF16, gpu))

    assert flops(pro) / flops(v32) == pytest.approx(0.27, abs=0.02)
    assert kv_bytes_per_sequence(pro, BF16, tokens) / kv_bytes_per_sequence(v32, BF16, tokens) == pytest.approx(
        0.10, abs=0.02)


def test_tensor_parallel_splits_whole_output_groups():
    m = load(FLASH_STEM)
    assert tensor_parallel_candidates(m, load_gpu("h200")) == [1, 2, 4, 8]
    with pytest.raises(InputError, match=r"--tp: 16 does not divide the 8 output groups \(o_groups\).*allowed: 1, 2, 4, 8"):
        build_operators(m, BF16, load_gpu("h200"), tp=16)


def test_pipeline_stage_keeps_its_layers_ratios():
    stage = stage_model(load(FLASH_STEM), 2)
    # the last 22 layers: 21..42, ratios 128, 4, ..., 128, 4 (odd layers 128, even 4)
    assert stage.num_layers == 22 and stage.compress_ratios == FLASH["compress_ratios"][21:43]
    assert [stage.compress_ratio_layers(r) for r in (0, 4, 128)] == [0, 11, 11]


def test_bad_compress_ratios_are_one_line_errors(tmp_path):
    bad = dict(FLASH, compress_ratios=[0, 8] + FLASH["compress_ratios"][2:])
    with pytest.raises(InputError, match=r"compress_ratios has 8; allowed: 0 \(window only\), 4 .*128"):
        from_hf_config(bad, "v4")
    short = dict(FLASH, compress_ratios=FLASH["compress_ratios"][:10])
    with pytest.raises(InputError, match=r"compress_ratios has 10 entries; allowed: .* one per layer \(43\)"):
        from_hf_config(short, "v4")
    with pytest.raises(InputError, match=r"compress_ratios is a str; allowed: a list"):
        from_hf_config(dict(FLASH, compress_ratios="4"), "v4")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in FLASH.items() if k != "sliding_window"}))
    with pytest.raises(InputError, match=r"config.json: .*needs compress_window \(a config.json's sliding_window\)"):
        load_model_file(path)


def test_attention_variants_and_other_kernels_are_refused():
    m = load(FLASH_STEM)
    with pytest.raises(InputError, match="compressed attention.*no MHA/MQA/GQA variant"):
        with_attention(m, "mha")
    with pytest.raises(InputError, match="--attention-kernel naive.*only flash applies"):
        build_operators(m, BF16, load_gpu("h200"), attention_kernel="naive")


def test_simulate_runs_flash_on_8_h200_at_32k():
    path = DATA / f"{FLASH_STEM}_config.json"
    result = CliRunner().invoke(main, ["--model", str(path), "--gpu", "h200", "--tp", "8", "--batch", "8",
                                       "--ctx", "32768"])
    assert result.exit_code == 0, result.output
    assert "6,229 bytes/token" in result.output  # the default fp16 KV: the bf16 count above
    assert "CSA 1/4 top-512" in result.output
