"""Per-module weight formats and FP4 (NVFP4 / MXFP4): bytes with their scales, which peak each GEMM runs at."""

from pathlib import Path

import pytest

from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision, parse_precision

FIXTURES = Path(__file__).parent / "data" / "hf-configs"


def test_fp4_formats_count_their_block_scales():
    # NVFP4: 16 values share one fp8 scale -> 0.5 + 1/16 = 0.5625 bytes per weight.
    nvfp4 = Precision(weights="fp4")
    assert nvfp4.weight_bytes_per_element + nvfp4.scale_bytes_per_weight == 0.5 + 1 / 16 == 0.5625
    # MXFP4: 32 values share one 8-bit E8M0 scale -> 0.5 + 1/32 = 0.53125.
    mxfp4 = Precision(weights="mxfp4")
    assert mxfp4.weight_bytes_per_element + mxfp4.scale_bytes_per_weight == 0.5 + 1 / 32 == 0.53125
    # fp8 with 128 x 128 blocks: one fp32 scale per 16,384 weights.
    assert Precision(weights="fp8", fp8_block=128).scale_bytes_per_weight == 4 / 16384


def test_fp4_runs_on_fp4_tensor_cores_only_where_the_gpu_has_them():
    model = load_model("llama3-8b")
    on_b200 = System(model, load_gpu("b200"), Precision(weights="fp4")).precision
    assert on_b200.compute_dtype == "fp4" and on_b200.dequant_ops_per_weight == 0.0
    on_h100 = System(model, load_gpu("h100"), Precision(weights="fp4")).precision
    # Hopper: weight-only, dequantised to the activation dtype (4 vector operations per weight).
    assert on_h100.compute_dtype == "fp16" and on_h100.weight_only_quant and on_h100.dequant_ops_per_weight == 4.0


def test_fp4_mlp_weights_on_b200_by_hand():
    model = load_model("llama3-8b")
    system = System(model, load_gpu("b200"), Precision(weights="fp4"))
    gate_up = next(op for op in system.operators if op.name == "gate_up_proj")
    # 4096 x 2*14336 weights x 0.5625 bytes = 66,060,288 bytes per layer.
    assert gate_up.resident_bytes == 4096 * 2 * 14336 * 0.5625 == 66_060_288
    assert gate_up.compute_dtype == "fp4"


def test_per_module_weights_text():
    p = parse_precision("bf16,mlp=fp8", "fp16")
    assert p.module_weights("mlp") == "fp8" and p.module_weights("experts") == "fp8"  # experts follow mlp
    assert p.module_weights("attention") == "bf16" and p.activation_dtype == "bf16"
    assert p.for_module("mlp").compute_dtype == "fp8" and p.for_module("attention").compute_dtype == "bf16"
    # No bare default: modules not named take bf16 when an entry is bf16.
    q = parse_precision("mlp=fp8,attention=bf16", "fp16")
    assert q.weights == "bf16" and q.text() == "bf16,mlp=fp8,attention=bf16"
    assert parse_precision(q.text(), "fp16") == q


@pytest.mark.parametrize("text,message", [
    ("bf16,ffn=fp8", "unknown module 'ffn'"),
    ("bf16,mlp=fp9", "unknown dtype 'fp9' for module 'mlp'"),
    ("bf16,fp8", "two default formats"),
    ("bf16,mlp=fp8,mlp=int4", "given twice"),
    ("bf16,fp8_block=x", "fp8_block needs a positive integer"),
])
def test_bad_weights_text_is_one_clear_line(text, message):
    with pytest.raises(InputError, match=message):
        parse_precision(text, "fp16")


def test_meta_style_fp8_mlp_reads_fewer_mlp_bytes_only():
    model = load_model("llama3-8b")
    gpu = load_gpu("h100")
    mixed = {op.name: op for op in System(model, gpu, parse_precision("bf16,mlp=fp8", "bf16")).operators}
    plain = {op.name: op for op in System(model, gpu, Precision(weights="bf16", kv="bf16")).operators}
    assert mixed["gate_up_proj"].resident_bytes == plain["gate_up_proj"].resident_bytes / 2
    assert mixed["qkv_proj"].resident_bytes == plain["qkv_proj"].resident_bytes
    assert mixed["lm_head"].compute_dtype == "bf16" and mixed["down_proj"].compute_dtype == "fp8"


def test_gpt_oss_default_is_its_mxfp4_checkpoint():
    from simulator.plan.deployment_planner import deployment_from_options

    dep = deployment_from_options({"model": str(FIXTURES / "gpt-oss-120b.json"), "gpu": "h200", "tp": 2}, 1, 4096)
    experts = next(op for op in dep.system.operators if op.name == "experts_gate_up")
    qkv = next(op for op in dep.system.operators if op.name == "qkv_proj")
    assert experts.weight_bytes_per_element + experts.scale_bytes_per_weight == 0.53125
    assert qkv.weight_bytes_per_element == 2.0  # attention left in bf16 (modules_to_not_convert)
