"""Real HuggingFace config.json files (tests/data/hf-configs, verbatim; sources in its README.md).

Each fixture's parameter counts against the published figures, its KV bytes per token against
a count by hand, and the keys that used to be ignored (MoE, MLA, windows, GeGLU, tying,
text_config, quantization_config) against what the loader now makes of them.
"""

import json
from pathlib import Path

import pytest

from simulator.cost.memory import kv_bytes_per_sequence, kv_bytes_per_token
from simulator.errors import InputError
from simulator.model import load_model
from simulator.model.architecture import load_model_file
from simulator.model.hf_config import from_hf_config
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision, parse_precision

FIXTURES = Path(__file__).parent / "data" / "hf-configs"


def fixture(name: str):
    return load_model(str(FIXTURES / f"{name}.json"))


def near_published(ours: float, published: float, last_digit: float) -> bool:
    """Within 2% of the published figure, widened by half a unit of its last printed digit (its own rounding)."""
    return abs(ours - published) <= 0.02 * published + last_digit / 2


# (fixture, published total, published active, last printed digit, active convention).
# "compute": the publisher counts the weights a token multiplies with, not the input embedding
# table (DeepSeek-V2/V3 papers, the gpt-oss model card); "with embedding": the table too
# (Mistral's 12.9B for Mixtral, Qwen's 3.3B for Qwen3-30B-A3B). Dense models: total only.
PUBLISHED = [
    ("DeepSeek-V3", 671e9, 37e9, 1e9, "compute"),
    ("DeepSeek-V2-Lite", 15.7e9, 2.4e9, 0.1e9, "compute"),
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9, 0.1e9, "with embedding"),
    ("gpt-oss-120b", 116.8e9, 5.1e9, 0.1e9, "compute"),
    ("Mixtral-8x7B-v0.1", 46.7e9, 12.9e9, 0.1e9, "with embedding"),
    ("Mistral-7B-v0.1", 7.24e9, None, 0.01e9, None),
    ("Llama-3.1-405B", 405.9e9, None, 0.1e9, None),
    ("Llama-3.1-8B", 8.03e9, None, 0.01e9, None),
    ("Qwen2.5-72B", 72.7e9, None, 0.1e9, None),
    ("Yi-34B", 34.4e9, None, 0.1e9, None),
    ("falcon-40b", 41.3e9, None, 0.1e9, None),
    ("opt-13b", 12.85e9, None, 0.01e9, None),
    ("gemma-2-9b-it.pre-fix-revision", 9.24e9, None, 0.01e9, None),
]


@pytest.mark.parametrize("name,total,active,digit,convention", PUBLISHED)
def test_parameter_counts_match_the_published_figures(name, total, active, digit, convention):
    counts = model_parameters(fixture(name))
    assert near_published(counts.total, total, digit), counts
    if active is None:
        return
    ours = counts.active if convention == "compute" else counts.active_with_embedding
    assert near_published(ours, active, digit), counts


def test_deepseek_v3_counts_by_hand():
    counts = model_parameters(fixture("DeepSeek-V3"))
    H = 7168
    # MLA per layer: q_a 7168*1536 + q_a_norm 1536 + q_b 1536*128*192 + kv_a 7168*576 + kv_a_norm 512
    #   + kv_b 512*128*256 + o 128*128*7168 = 187,107,328
    mla = H * 1536 + 1536 + 1536 * 128 * 192 + H * 576 + 512 + 512 * 128 * 256 + 128 * 128 * H
    assert mla == 187_107_328
    expert = 3 * H * 2048  # 44,040,192
    dense = mla + 2 * H + 3 * H * 18432
    moe = mla + 2 * H + 256 * H + 257 * expert  # router 256 x 7168, 256 routed + 1 shared
    embeddings = 2 * 129280 * H
    # 3 x 583,483,392 + 58 x 11,507,286,016 + 1,853,358,080 + 7,168 (final norm)
    assert counts.total == 3 * dense + 58 * moe + embeddings + H == 671_026_404_352
    # Active: 8 routed + 1 shared of 257, and the LM head but not the embedding table.
    active_moe = mla + 2 * H + 256 * H + 9 * expert
    assert counts.active == 3 * dense + 58 * active_moe + 129280 * H + H == 36_625_603_584


# KV bytes per token at a 2-byte KV dtype, by hand: 2 L g d 2, or (kv_lora_rank + rope) L 2 for MLA.
KV_BY_HAND = [
    ("DeepSeek-V2-Lite", (512 + 64) * 27 * 2, 31_104),
    ("DeepSeek-V3", (512 + 64) * 61 * 2, 70_272),
    ("Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2, 98_304),
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2, 73_728),
    ("Mixtral-8x7B-v0.1", 2 * 32 * 8 * 128 * 2, 131_072),
    ("Mistral-7B-v0.1", 2 * 32 * 8 * 128 * 2, 131_072),
    ("Llama-3.1-405B", 2 * 126 * 8 * 128 * 2, 516_096),
    ("Llama-3.1-8B", 2 * 32 * 8 * 128 * 2, 131_072),
    ("Qwen2.5-72B", 2 * 80 * 8 * 128 * 2, 327_680),
    ("Yi-34B", 2 * 60 * 8 * 128 * 2, 245_760),
    ("falcon-40b", 2 * 60 * 8 * 64 * 2, 122_880),
    ("opt-13b", 2 * 40 * 40 * 128 * 2, 819_200),
    ("gemma-2-9b-it.pre-fix-revision", 2 * 42 * 8 * 256 * 2, 344_064),
]


@pytest.mark.parametrize("name,by_hand,value", KV_BY_HAND)
def test_kv_bytes_per_token_by_hand(name, by_hand, value):
    assert by_hand == value
    assert kv_bytes_per_token(fixture(name), Precision(kv="bf16")) == value


def test_gpt_oss_sequence_holds_only_128_tokens_in_its_sliding_layers():
    model = fixture("gpt-oss-120b")
    # 18 full layers x 32768 tokens + 18 sliding layers x 128 tokens, 2*8*64*2 = 2048 bytes per layer-token
    assert kv_bytes_per_sequence(model, Precision(kv="bf16"), 32768) == 2048 * 18 * (32768 + 128) == 1_212_678_144


def test_deepseek_v2_lite_is_mla_plus_moe_with_a_dense_first_layer():
    m = fixture("DeepSeek-V2-Lite")
    assert m.attention_kind == "MLA" and m.head_dim == 128 + 64
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_rope_head_dim, m.v_head_dim) == (512, 0, 64, 128)
    assert (m.moe_experts, m.moe_top_k, m.moe_ffn_size, m.moe_shared_experts) == (64, 6, 1408, 2)
    assert m.moe_first_dense_layers == 1 and m.moe_layers == 26 and m.ffn_size == 10944


def test_qwen3_moe_reads_num_experts_and_ignores_an_inert_sliding_window():
    m = fixture("Qwen3-30B-A3B")
    assert (m.moe_experts, m.moe_top_k, m.moe_ffn_size, m.moe_layers) == (128, 8, 768, 48)
    assert m.sliding_window is None and m.qk_norm and m.head_dim == 128
    assert fixture("Qwen2.5-72B").sliding_window is None  # use_sliding_window: false


def test_gemma2_is_gated_tied_with_four_norms_and_alternating_windows():
    m = fixture("gemma-2-9b-it.pre-fix-revision")
    assert m.gated_mlp and m.activation == "gelu" and m.tied_embeddings and m.norms_per_layer == 4
    assert m.head_dim == 256 and m.query_pre_attn_scalar == 224
    # Gemma2DecoderLayer: even layers slide, odd layers are global.
    assert [m.layer_window(i) for i in range(4)] == [4096, None, 4096, None]
    assert m.sliding_layers == 21


def test_gpt_oss_layer_types_sinks_and_mxfp4_experts():
    m = fixture("gpt-oss-120b")
    assert m.sliding_window == 128 and m.sliding_layers == 18 and m.attention_sinks
    assert (m.moe_experts, m.moe_top_k) == (128, 4) and m.linear_bias
    # modules_to_not_convert: self_attn, router, embed_tokens, lm_head -> only the experts are MXFP4.
    precision = parse_precision(m.default_weights, "bf16")
    assert precision.module_weights("experts") == "mxfp4"
    assert precision.module_weights("attention") == "bf16"
    assert precision.module_weights("lm_head") == "bf16"


def test_deepseek_v3_fp8_block_checkpoint_and_its_mtp_warning():
    m = fixture("DeepSeek-V3")
    assert m.default_weights == "bf16,attention=fp8,mlp=fp8,fp8_block=128"
    precision = parse_precision(m.default_weights, "bf16")
    assert precision.module_weights("experts") == "fp8" and precision.module_weights("router") == "bf16"
    assert precision.scale_bytes_per_weight == 0.0  # the bf16 default
    assert precision.for_module("experts").scale_bytes_per_weight == 4 / (128 * 128)
    assert any("num_nextn_predict_layers" in w for w in m.warnings)


def test_meta_fp8_quantises_only_the_mlp():
    # Meta's Llama-3.1-405B-FP8: fbgemm_fp8 with every layer's self_attn and the LM head left in bf16.
    config = json.loads((FIXTURES / "Llama-3.1-405B.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
        "modules_to_not_convert": [f"model.layers.{i}.self_attn.{p}" for i in range(126)
                                   for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + ["lm_head"],
    }
    spec = from_hf_config(config, "405b-fp8")
    assert spec["default_weights"] == "bf16,mlp=fp8"
    assert "warnings" not in spec


def test_awq_int4_sets_group_size_and_an_unknown_method_warns():
    config = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64}
    assert from_hf_config(config, "awq")["default_weights"] == "bf16,attention=int4,mlp=int4,group_size=64"
    config["quantization_config"] = {"quant_method": "hqq"}
    assert "hqq" in from_hf_config(config, "hqq")["warnings"][0]


def test_nested_text_config_is_read_with_a_warning_for_the_vision_tower(tmp_path):
    text = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    path = tmp_path / "multimodal.json"
    path.write_text(json.dumps({"model_type": "mllama-like", "text_config": text, "vision_config": {"hidden_size": 8}}))
    m = load_model(str(path))
    assert m.num_layers == 32 and m.hidden_size == 4096
    assert any("vision" in w for w in m.warnings)


def test_a_model_folder_reads_its_config_json(tmp_path):
    folder = tmp_path / "my-mixtral"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / "Mixtral-8x7B-v0.1.json").read_text())
    m = load_model(str(folder))
    assert m.name == "my-mixtral" and m.moe_experts == 8
    with pytest.raises(InputError, match="no config.json"):
        load_model_file(tmp_path)


def test_unknown_family_and_missing_tying_are_warnings_not_silence():
    config = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    config["model_type"] = "brand_new"
    del config["tie_word_embeddings"]
    spec = from_hf_config(config, "new")
    assert spec["tied_embeddings"] is True  # transformers' PretrainedConfig default
    assert len(spec["warnings"]) == 2


def test_tying_defaults_follow_the_family():
    config = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    del config["tie_word_embeddings"]
    assert from_hf_config(config, "llama")["tied_embeddings"] is False  # LlamaConfig default
    config["model_type"] = "gemma"
    assert from_hf_config(config, "gemma")["tied_embeddings"] is True  # GemmaConfig default


def test_layers_that_cannot_be_costed_are_refused():
    config = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    config["mamba_d_state"] = 16
    with pytest.raises(InputError, match="state-space"):
        from_hf_config(config, "hybrid")


# Shipped configs whose source config.json is a fixture: the YAML must say what the config.json says.
SHIPPED_FROM_FIXTURE = [
    ("deepseek-v3", "DeepSeek-V3"),
    ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
    ("gpt-oss-120b", "gpt-oss-120b"),
    ("mixtral-8x7b", "Mixtral-8x7B-v0.1"),
    ("llama3.1-8b", "Llama-3.1-8B"),
    ("llama3.1-405b", "Llama-3.1-405B"),
    ("qwen2.5-72b", "Qwen2.5-72B"),
    ("gemma-2-9b", "gemma-2-9b-it.pre-fix-revision"),
]
IGNORED = {"name", "aliases", "hf_id", "warnings", "quantization", "query_pre_attn_scalar", "layer_types",
           "sliding_window_pattern"}


@pytest.mark.parametrize("shipped,source", SHIPPED_FROM_FIXTURE)
def test_shipped_config_matches_its_config_json(shipped, source):
    ours, theirs = load_model(shipped), fixture(source)
    differ = {k for k in type(ours).model_fields if k not in IGNORED and getattr(ours, k) != getattr(theirs, k)}
    assert not differ, {k: (getattr(ours, k), getattr(theirs, k)) for k in differ}
    # Window layouts may be written as a pattern or a list: compare the layers they give.
    assert [ours.layer_window(i) for i in range(ours.num_layers)] == \
        [theirs.layer_window(i) for i in range(theirs.num_layers)]


# Shipped configs without a fixture, against their publishers' figures (total, active, last digit, convention).
SHIPPED_PUBLISHED = [
    ("qwen3-235b-a22b", 235e9, 22e9, 1e9, "with embedding"),
    ("gpt-oss-20b", 20.9e9, 3.6e9, 0.1e9, "compute"),
    # Meta's 109 B includes the vision encoder, which is not modelled (the decoder alone is 107.8 B).
    ("llama4-scout", 109e9, 17e9, 1e9, "with embedding"),
    ("llama3.1-70b", 70.6e9, None, 0.1e9, None),
]


@pytest.mark.parametrize("name,total,active,digit,convention", SHIPPED_PUBLISHED)
def test_shipped_configs_match_published_parameter_counts(name, total, active, digit, convention):
    counts = model_parameters(load_model(name))
    assert near_published(counts.total, total, digit), counts
    if active is not None:
        ours = counts.active if convention == "compute" else counts.active_with_embedding
        assert near_published(ours, active, digit), counts


def _edited_llama(tmp_path: Path, text_edit=None, **fields) -> Path:
    config = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    config.update(fields)
    text = json.dumps(config)
    path = tmp_path / "config.json"
    path.write_text(text_edit(text) if text_edit else text)
    return path


def test_config_values_that_cannot_be_sizes_are_refused_by_name(tmp_path):
    # A flag where a count belongs would be read as 1 layer; 0 key-value heads as MHA (32 heads).
    with pytest.raises(InputError, match="field 'num_layers': expected a whole number, not a true/false flag"):
        load_model_file(_edited_llama(tmp_path, num_hidden_layers=True))
    with pytest.raises(InputError, match=r"key-value heads .* are 0; allowed: a whole number >= 1 that divides "
                                         r"num_attention_heads \(32\)"):
        load_model_file(_edited_llama(tmp_path, num_key_value_heads=0))
    # NaN is read as missing (Python writes non-finite floats so); the refusal says which value it was
    nan = _edited_llama(tmp_path, text_edit=lambda text: text.replace('"hidden_size": 4096', '"hidden_size": NaN'))
    with pytest.raises(InputError, match=r"lacks hidden_size .*\(hidden_size in the file: NaN or Infinity"):
        load_model_file(nan)
    assert load_model_file(_edited_llama(tmp_path)).num_kv_heads == 8


def test_an_unmodelled_quantisation_warns_with_the_format_the_run_takes(tmp_path):
    model = load_model_file(_edited_llama(tmp_path, quantization_config={"quant_method": "weird", "bits": 4}))
    (warning,) = [w for w in model.warnings if "quant_method 'weird' is not modelled" in w]
    assert "weights taken as fp16" in warning and model.default_weights is None  # so the run's default, fp16
