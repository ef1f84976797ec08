"""DeciLM's NAS-pruned layers (Llama-3.3-Nemotron-Super-49B-v1's block_configs), counted by hand from its config.json."""

import json
from collections import Counter
from pathlib import Path

import pytest

from simulator.cost.memory import kv_bytes_per_token, tensor_parallel_candidates
from simulator.cost.pipeline import stage_model
from simulator.errors import InputError
from simulator.model.architecture import load_model_file
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.hf_layouts import decilm_ffn_width
from simulator.model.layers import build_operators
from simulator.model.operators import Attention, Gemm
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision
from simulator.model.step import Step

PATH = Path(__file__).parent / "data" / "hf_configs" / "nvidia--Llama-3_3-Nemotron-Super-49B-v1_config.json"
CONFIG = json.loads(PATH.read_text())
BLOCKS = CONFIG["block_configs"]
H, V = 8192, 128256


def test_ffn_mult_widths_by_hand():
    # int(2 x ffn_mult x 8192 / 3), rounded up to a multiple of 256.
    assert decilm_ffn_width(5.25, H) == 2 * 5.25 * 8192 / 3 == 28_672
    assert decilm_ffn_width(3.28125, H) == 17_920
    assert decilm_ffn_width(1.0, H) == 5_632  # 5,461 -> 22 x 256
    assert decilm_ffn_width(0.5, H) == 2_816  # 2,730 -> 11 x 256


def test_layers_read_from_block_configs():
    m = load_model_file(PATH)
    mults = Counter(block["ffn"]["ffn_mult"] for block in BLOCKS)
    assert mults == {5.25: 49, 1.3125: 10, 1.0: 8, 2.625: 6, 0.5: 6, 3.28125: 1}
    assert m.dense_mlp_widths == {28_672: 49, 17_920: 1, 14_336: 6, 7_168: 10, 5_632: 8, 2_816: 6}
    no_op = [i for i, block in enumerate(BLOCKS) if block["attention"]["no_op"]]
    assert len(no_op) == 31 and m.attention_layers == 80 - 31 == 49
    assert [i for i, kind in enumerate(m.layer_types) if kind == "none"] == no_op
    # n_heads_in_group 8: 64 / 8 = 8 KV heads in every attention layer.
    assert m.num_kv_heads == 8 and m.ffn_size == 28_672 and m.warnings == []


def test_parameters_and_kv_bytes_by_hand():
    m = load_model_file(PATH)
    # An attention layer: q and o 64 x 128 x 8192 each, k and v 8 x 128 x 8192 each, its input norm 8192.
    attention = 2 * 64 * 128 * H + 2 * 8 * 128 * H + H
    # An MLP of width F: gate, up and down 8192 x F, its norm 8192. Widths x layers from the test above.
    widths = {28_672: 49, 17_920: 1, 14_336: 6, 7_168: 10, 5_632: 8, 2_816: 6}
    mlps = sum(layers * (3 * H * F + H) for F, layers in widths.items())
    total = 49 * attention + mlps + 2 * V * H + H  # untied embedding and LM head, the final norm
    assert total == 49_867_145_216  # the model card's count
    assert model_parameters(m).total == total
    # KV: only the 49 attention layers, 2 x 8 KV heads x 128 x 2 bytes each.
    assert kv_bytes_per_token(m, Precision(kv="bf16")) == 2 * 49 * 8 * 128 * 2 == 200_704


def test_no_op_layers_charge_nothing_and_each_width_its_own_mlp():
    m = load_model_file(PATH)
    ops = build_operators(m, Precision(weights="bf16", kv="bf16"), load_gpu("h100"))
    attention = [op for op in ops if isinstance(op, Attention)]
    assert len(attention) == 1 and attention[0].count == 49
    norms = {op.name: op.count for op in ops if op.name in ("attn_norm", "mlp_norm")}
    assert norms == {"attn_norm": 49, "mlp_norm": 80}  # no input_layernorm where attention is a no-op
    # One decode token through the MLPs: 2 x 3 x 8192 x F FLOPs per layer of width F.
    step = Step.decode(1, 4096)
    mlp_flops = sum(op.count * op.work(step).flops for op in ops
                    if isinstance(op, Gemm) and op.name.startswith("mlp") and op.name.endswith("_proj"))
    by_hand = 2 * 3 * H * (49 * 28_672 + 17_920 + 6 * 14_336 + 10 * 7_168 + 8 * 5_632 + 6 * 2_816)
    assert by_hand == 2 * 3 * H * 1_642_496 == 80_731_963_392
    assert mlp_flops == by_hand
    # Its KV read at 4,096 tokens: 49 layers x 4,096 x 2 x 8 x 128 x 2 bytes.
    assert attention[0].count * attention[0].work(step).kv_read_bytes == 49 * 4096 * 4096 == 822_083_584


def test_every_width_divides_by_8_and_a_stage_keeps_its_own_layers():
    m = load_model_file(PATH)
    assert tensor_parallel_candidates(m, load_gpu("h200")) == [1, 2, 4, 8]
    stage = stage_model(m, 2)
    # Layers 40..79: attention at 40, 41, 52 and 71..79 = 12; its widest MLP 28,672.
    assert stage.num_layers == 40 and stage.attention_layers == 2 + 1 + 9 == 12
    assert stage.ffn_sizes == m.ffn_sizes[40:] and stage.ffn_size == 28_672


def test_block_options_not_modelled_are_refused_in_one_line():
    replaced = json.loads(PATH.read_text())
    replaced["block_configs"][6]["attention"] = {**replaced["block_configs"][6]["attention"], "no_op": False,
                                                 "replace_with_linear": True}
    with pytest.raises(InputError, match=r"block_configs\[6\]\.attention\.replace_with_linear = True: not modelled"):
        from_hf_config(replaced, "nas")
    mixed = json.loads(PATH.read_text())
    mixed["block_configs"][0]["attention"]["n_heads_in_group"] = 4
    with pytest.raises(InputError, match="attention layers with 8, 16 KV heads"):
        from_hf_config(mixed, "nas")
    short = {**CONFIG, "block_configs": BLOCKS[:79]}
    with pytest.raises(InputError, match="79 blocks for 80 layers"):
        from_hf_config(short, "nas")
