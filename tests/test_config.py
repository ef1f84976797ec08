"""Configs: shipped files validate, names resolve, bad files give one clear error."""

import pytest

from simulator.errors import InputError
from simulator.model import load_gpu, load_model, with_attention
from simulator.model.layers import build_operators
from simulator.model.parameters import parameter_count
from simulator.model.precision import Precision


def params(name: str) -> int:
    return parameter_count(build_operators(load_model(name), Precision(), load_gpu("a100")))


def test_llama2_7b_parameters_match_published_6_74b():
    H, F, L, V = 4096, 11008, 32, 32000
    per_layer = 3 * H * H + H * H + 3 * H * F + 2 * H  # QKV, O, SwiGLU MLP, two RMSNorms
    total = V * H + L * per_layer + H + V * H  # embedding, layers, final norm, untied LM head
    assert total == 6_738_415_616
    assert params("llama2-7b") == total


def test_llama2_70b_parameters_match_published_68_98b():
    H, F, L, V, g, d = 8192, 28672, 80, 32000, 8, 128
    per_layer = H * (H + 2 * g * d) + H * H + 3 * H * F + 2 * H
    assert H * (H + 2 * g * d) + H * H + 3 * H * F == 855_638_016  # the reference's hand check
    total = 2 * V * H + L * per_layer + H
    assert total == 68_976_648_192
    assert params("llama2-70b") == total


def test_falcon_7b_mqa_parallel_attention_tied_parameters():
    H, F, L, V, n, d = 4544, 18176, 32, 65024, 71, 64
    per_layer = H * (n * d + 2 * 1 * d) + H * H + 2 * H * F + 2 * H  # one LayerNorm (weight + bias)
    total = V * H + L * per_layer + 2 * H  # tied embeddings, final LayerNorm
    assert params("falcon-7b") == total
    assert load_model("falcon-7b").attention_kind == "MQA"


def test_gpt3_175b_biases_and_learned_positions():
    H, L, V, P = 12288, 96, 50257, 2048
    per_layer = 12 * H * H + (3 * H + H + 4 * H + H) + 4 * H  # weights, biases, two LayerNorms
    total = V * H + P * H + L * per_layer + 2 * H
    assert params("gpt3-175b") == total
    assert abs(total - 174.6e9) < 0.1e9


def test_aliases_resolve_case_insensitively():
    assert load_gpu("a100").name == "A100-SXM4-80GB"
    assert load_gpu("H100").name == "H100-SXM5-80GB"
    assert load_gpu("v100").name == "V100-SXM2-32GB"
    assert load_model("Llama2-70B").name == "llama2-70b"


def test_ridge_points_match_data_sheets():
    assert load_gpu("v100").ridge_point("fp16") == pytest.approx(125e12 / 900e9)  # ~139
    assert load_gpu("a100").ridge_point("fp16") == pytest.approx(312e12 / 2.039e12)  # ~153
    assert 138 < load_gpu("v100").ridge_point() < 140
    assert 152 < load_gpu("a100").ridge_point() < 154


def test_unknown_names_suggest_nearest():
    with pytest.raises(InputError, match="did you mean 'llama2-70b'"):
        load_model("llama2-70")
    with pytest.raises(InputError, match="unknown GPU 'a1000'"):
        load_gpu("a1000")


def test_hf_config_json_gives_the_same_spec_as_our_yaml(tmp_path):
    from pathlib import Path

    hf = load_model(str(Path(__file__).parent / "data" / "llama-2-7b-hf-config.json"))
    ours = load_model("llama2-7b")
    fields = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size",
              "gated_mlp", "vocab_size", "max_context", "tied_embeddings", "norm", "linear_bias")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(ours, f) for f in fields}


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nnum_layers: [1, 2\nhidden_size: 3\n")
    with pytest.raises(InputError, match=r"bad\.yaml:\d+: malformed YAML"):
        load_model(str(path))


def test_field_out_of_range_is_named(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: tiny\nnum_layers: 0\nhidden_size: 64\nnum_heads: 4\nffn_size: 128\nvocab_size: 100\nmax_context: 64\n"
    )
    with pytest.raises(InputError, match="field 'num_layers': Input should be greater than or equal to 1"):
        load_model(str(path))


def test_attention_override_variants():
    model = load_model("llama2-70b")
    assert with_attention(model, "mha").num_kv_heads == 64
    assert with_attention(model, "mqa").num_kv_heads == 1
    assert with_attention(model, "gqa:16").num_kv_heads == 16
    with pytest.raises(InputError, match="5 KV heads must divide the 64 heads"):
        with_attention(model, "gqa:5")
    with pytest.raises(InputError, match="allowed: mha, mqa, gqa:N"):
        with_attention(model, "mla")
