"""Memory fit and the automatic tensor-parallel choice."""

import pytest

from simulator.cost.memory import GIB, RUNTIME_RESERVED_BYTES_PER_GPU
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment

LLAMA2_70B_PARAMS = 68_976_648_192


def test_weights_bytes_are_parameters_times_bytes_per_element():
    plan = plan_deployment(load_model("llama2-70b"), load_gpu("a100"), Precision(), batch=1, context_tokens=128, tp=8).memory
    assert plan.weights_bytes == LLAMA2_70B_PARAMS * 2
    # Sharded across 8 GPUs, except the norms (2 per layer + final, 8192 each) which every GPU keeps.
    norms = (2 * 80 + 1) * 8192
    assert plan.weights_bytes_per_gpu == pytest.approx((LLAMA2_70B_PARAMS - norms) * 2 / 8 + norms * 2)


def test_int4_weights_carry_scales_and_keep_embeddings_fp16():
    model = load_model("llama2-7b")
    plan = plan_deployment(model, load_gpu("a100"), Precision(weights="int4"), batch=1, context_tokens=128).memory
    H, F, L, V = 4096, 11008, 32, 32000
    linear = L * (4 * H * H + 3 * H * F)
    norms = (2 * L + 1) * H
    expected = linear * (0.5 + 2 / 128) + 2 * V * H * 2 + norms * 2
    assert plan.weights_bytes == pytest.approx(expected)


def test_card_command_picks_tp_4_for_llama2_70b_on_a100():
    deployment = plan_deployment(load_model("llama2-70b"), load_gpu("a100"), Precision(), batch=64, context_tokens=4096)
    weights = LLAMA2_70B_PARAMS * 2
    kv = 64 * 4096 * 327_680
    assert kv == 80 * GIB
    # tp=2 cannot fit: half the weights and half the KV cache alone exceed 80 GiB.
    assert weights / 2 + kv / 2 > 80 * GIB
    assert deployment.system.tp == 4
    assert deployment.auto_tp and "--tp 4" in deployment.note
    plan = deployment.memory
    assert plan.kv_bytes == kv and plan.kv_bytes_per_gpu == kv / 4
    assert plan.capacity_bytes == 4 * 80 * GIB
    assert plan.reserved_bytes_per_gpu == RUNTIME_RESERVED_BYTES_PER_GPU
    assert plan.fits


def test_explicit_tp_that_does_not_fit_names_the_numbers():
    with pytest.raises(InputError, match=r"needs 10\d\.\d GiB per GPU .* each GPU has 80\.0 GiB"):
        plan_deployment(load_model("llama2-70b"), load_gpu("a100"), Precision(), batch=64, context_tokens=4096, tp=2)


def test_nothing_fits_gives_an_error():
    with pytest.raises(InputError, match="does not fit on V100-SXM2-32GB at any tensor-parallel degree"):
        plan_deployment(load_model("gpt3-175b"), load_gpu("v100"), Precision(), batch=256, context_tokens=2048)


def test_context_beyond_model_maximum_is_an_error():
    with pytest.raises(InputError, match="exceeds the maximum context of llama2-7b \\(4096 tokens\\)"):
        plan_deployment(load_model("llama2-7b"), load_gpu("a100"), Precision(), batch=1, context_tokens=4097)


@pytest.mark.parametrize("batch,ctx", [(0, 10), (-1, 10), (1, 0)])
def test_non_positive_batch_or_context_is_an_error(batch, ctx):
    with pytest.raises(InputError, match="must be >= 1"):
        plan_deployment(load_model("llama2-7b"), load_gpu("a100"), Precision(), batch=batch, context_tokens=ctx)
