"""Config round trips: a model or GPU written to YAML reads back equal; HF config.json == our YAML."""

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from strategies import gpus, models

from simulator.model import list_gpus, list_models, load_gpu, load_model

DATA = Path(__file__).parent / "data"


def write_yaml(path: Path, spec) -> Path:
    path.write_text(yaml.safe_dump(spec.model_dump(), sort_keys=False), encoding="utf-8")
    return path


@given(models())
def test_a_random_model_round_trips_through_yaml(tmp_path_factory, model):
    path = write_yaml(tmp_path_factory.mktemp("model") / "model.yaml", model)
    assert load_model(str(path)) == model


@given(gpus(exact=False))
def test_a_random_gpu_round_trips_through_yaml(tmp_path_factory, gpu):
    path = write_yaml(tmp_path_factory.mktemp("gpu") / "gpu.yaml", gpu)
    assert load_gpu(str(path)) == gpu


@pytest.mark.parametrize("model", list_models(), ids=lambda m: m.name)
def test_every_shipped_model_round_trips_through_yaml(tmp_path, model):
    assert load_model(str(write_yaml(tmp_path / "model.yaml", model))) == model


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_every_shipped_gpu_round_trips_through_yaml(tmp_path, gpu):
    assert load_gpu(str(write_yaml(tmp_path / "gpu.yaml", gpu))) == gpu


def test_llama_2_70b_hf_config_json_gives_the_same_spec_as_our_yaml():
    """tests/data/llama-2-70b-hf-config.json holds the published fields of meta-llama/Llama-2-70b-hf."""
    from_hf = load_model(str(DATA / "llama-2-70b-hf-config.json"))
    ours = load_model("llama2-70b")
    ignore = {"name", "aliases", "hf_id"}  # a config.json does not name the repository it came from
    assert from_hf.model_dump(exclude=ignore) == ours.model_dump(exclude=ignore)
    # The fields that matter, spelled out from the published config.json:
    assert (from_hf.num_layers, from_hf.hidden_size, from_hf.num_heads, from_hf.num_kv_heads) == (80, 8192, 64, 8)
    assert (from_hf.head_dim, from_hf.ffn_size, from_hf.vocab_size, from_hf.max_context) == (8192 // 64, 28672, 32000, 4096)
    assert from_hf.gated_mlp and not from_hf.tied_embeddings and from_hf.norm == "rmsnorm"
