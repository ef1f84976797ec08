"""Mixture of experts: distinct experts touched, FLOPs of k + s experts, padding, expert parallelism."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.memory import tensor_parallel_candidates
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.layers import build_operators
from simulator.model.operators import AllToAll, ExpertGemm
from simulator.model.precision import Precision
from simulator.model.routing import (
    busiest_share,
    expected_touched,
    expert_probabilities,
    remote_gpus_per_token,
    row_tiles,
)
from simulator.model.step import Step

FIXTURES = Path(__file__).parent / "data" / "hf-configs"


def fixture(name: str):
    return load_model(str(FIXTURES / f"{name}.json"))


def ops_by_name(model, tp=1, ep=1, skew=0.0, precision=None):
    ops = build_operators(model, precision or Precision(), load_gpu("h100"), tp, ep=ep, routing_skew=skew)
    return {op.name: op for op in ops}


def test_expected_experts_touched_by_hand():
    # E = 8, k = 2, t = 3 tokens: 8 * (1 - (1 - 2/8)^3) = 8 * (1 - 27/64) = 8 * 37/64 = 4.625
    assert expected_touched(expert_probabilities(8, 2), 3) == pytest.approx(4.625, rel=1e-12)
    # One token touches exactly k experts.
    assert expected_touched(expert_probabilities(8, 2), 1) == pytest.approx(2.0, rel=1e-12)


def test_mixtral_expert_weight_bytes_for_three_tokens_by_hand():
    gate_up = ops_by_name(fixture("Mixtral-8x7B-v0.1"))["experts_gate_up"]
    assert isinstance(gate_up, ExpertGemm)
    work = gate_up.work(Step.decode(3, 100))
    # 4.625 experts x (4096 x 2*14336) weights x 2 bytes = 4.625 x 234,881,024 = 1,086,324,736 bytes
    assert work.weight_bytes == pytest.approx(4.625 * 4096 * 2 * 14336 * 2, rel=1e-12)
    assert 4.625 * 4096 * 2 * 14336 * 2 == 1_086_324_736
    # FLOPs: 3 tokens x 2 experts x 2 x 4096 x 28672
    assert work.flops == 3 * 2 * 2 * 4096 * 2 * 14336 == 1_409_286_144


def test_the_expert_fraction_slows_the_expert_gemms_only():
    from simulator.cost.system import System

    model = fixture("Mixtral-8x7B-v0.1")
    gpu = load_gpu("h100").with_efficiency(compute=0.5, memory=0.8)
    dense_rate, half = System(model, gpu, Precision()), System(model, gpu.with_efficiency(expert=0.5), Precision())
    step = Step.decode(3, 100)
    before = {op.name: c for op, c in zip(dense_rate.operators, dense_rate.step_cost(step).operators)}
    after = {op.name: c for op, c in zip(half.operators, half.step_cost(step).operators)}
    # experts_gate_up moves its bytes per layer (1,086,324,736 of weights, the test above, and its activations),
    # 32 layers, at 3.35e12 B/s x 0.8; with the expert fraction 0.5, at half that rate: twice the time
    work = next(op for op in dense_rate.operators if op.name == "experts_gate_up").work(step)
    moved = work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
    assert 1_086_324_736 < moved < 1.001 * 1_086_324_736
    assert before["experts_gate_up"].memory_seconds == pytest.approx(32 * moved / (3.35e12 * 0.8), rel=1e-9)
    assert after["experts_gate_up"].memory_seconds == pytest.approx(32 * moved / (3.35e12 * 0.8 * 0.5), rel=1e-9)
    assert after["experts_gate_up"].compute_seconds == pytest.approx(2 * before["experts_gate_up"].compute_seconds)
    # attention and the dense projections keep their rates
    for name in ("qkv_proj", "o_proj"):
        assert after[name].seconds == before[name].seconds


@settings(max_examples=60, deadline=None)
@given(experts=st.integers(2, 256), k=st.integers(1, 8), tokens=st.integers(1, 5000),
       more=st.integers(0, 5000), skew=st.floats(0.0, 2.0))
def test_experts_touched_grows_with_tokens_and_never_exceeds_all_experts(experts, k, tokens, more, skew):
    k = min(k, experts)
    q = expert_probabilities(experts, k, skew)
    fewer, many = expected_touched(q, tokens), expected_touched(q, tokens + more)
    assert fewer <= many + 1e-9
    assert many <= experts + 1e-9
    assert fewer <= tokens * k + 1e-9  # no more experts than (token, expert) pairs
    # Skewed routing concentrates tokens: never more distinct experts than uniform routing.
    assert fewer <= expected_touched(expert_probabilities(experts, k), tokens) + 1e-9


def test_zipf_probabilities_sum_to_k_and_stay_below_one():
    q = expert_probabilities(64, 6, skew=1.2)
    assert q.sum() == pytest.approx(6.0)
    assert q.max() <= 1.0 and np.all(np.diff(q) <= 1e-15)
    assert np.allclose(expert_probabilities(64, 6, 0.0), 6 / 64)


def test_grouped_gemm_padding_by_hand():
    # E = 8, k = 2, t = 3: 3 <= 8 tokens, so the row tile is 16 (vLLM fused_moe default config).
    # A touched expert expects 3 * 0.25 / (37/64) = 1.30 rows -> one tile of 16 rows each:
    # 4.625 touched x 16 = 74 padded rows for 6 real ones.
    q = expert_probabilities(8, 2)
    assert row_tiles(q, 3, 16) == pytest.approx(4.625)
    gate_up = ops_by_name(fixture("Mixtral-8x7B-v0.1"))["experts_gate_up"]
    work = gate_up.work(Step.decode(3, 100))
    assert work.padding_flops == pytest.approx(2 * (74 - 6) * 4096 * 2 * 14336)


def test_routing_and_weighted_sum_kernels_by_hand():
    # Mixtral-8x7B (E = 8, k = 2, H = 4096, bf16), tp 1, a decode step of 10 tokens, per MoE layer:
    # top-k softmax reads 8 logits and writes 2 ids + 2 weights per token: 10 x 12 x 2 B = 240 B;
    # the sort of the rows reads and writes k = 2 per token: 10 x 4 x 2 B = 80 B;
    # the weighted sum reads the 2 expert outputs and writes one: 10 x (2 x 4096 + 4096) x 2 B = 245,760 B.
    # None fuses into a GEMM: one launch each, even with elementwise fusion on.
    ops = ops_by_name(fixture("Mixtral-8x7B-v0.1"))
    step = Step.decode(10, 100)
    topk, align, combine = (ops[n].work(step) for n in ("moe_topk", "moe_align", "experts_combine"))
    assert topk.activation_bytes == 10 * (8 + 4) * 2 == 240
    assert align.activation_bytes == 10 * (2 + 2) * 2 == 80
    assert combine.activation_bytes == 10 * (2 * 4096 + 4096) * 2 == 245_760
    assert combine.flops == 10 * 2 * 2 * 4096
    assert topk.launches == align.launches == combine.launches == 1
    assert ops["experts_combine"].count == 32
    # Under expert parallelism (ep 4) a GPU sums only its k / ep = 0.5 rows per token.
    split = ops_by_name(fixture("Mixtral-8x7B-v0.1"), tp=4, ep=4)["experts_combine"].work(step)
    assert split.activation_bytes == pytest.approx(10 * (0.5 * 4096 + 4096) * 2)


def test_deepseek_v2_lite_flops_per_token_are_k_plus_s_experts():
    ops = ops_by_name(fixture("DeepSeek-V2-Lite"))
    step = Step.decode(1, 10)
    routed = sum(ops[n].work(step).flops for n in ("experts_gate_up", "experts_down"))
    shared = sum(ops[n].work(step).flops for n in ("shared_gate_up_proj", "shared_down_proj"))
    # One expert: 3 matrices of 2048 x 1408 -> 2 * 3 * 2048 * 1408 = 17,301,504 FLOPs per token.
    assert routed == 6 * 2 * 3 * 2048 * 1408 == 103_809_024
    assert shared == 2 * 2 * 3 * 2048 * 1408 == 34_603_008
    assert ops["router"].work(step).flops == 2 * 2048 * 64
    assert ops["experts_gate_up"].count == 26 and ops["gate_up_proj"].count == 1  # first_k_dense_replace = 1


def test_expert_parallel_splits_experts_and_counts_the_touched_ones_per_gpu():
    model = fixture("Mixtral-8x7B-v0.1")
    whole = ops_by_name(model, tp=1)["experts_gate_up"]
    split = ops_by_name(model, tp=4, ep=4)["experts_gate_up"]
    assert len(split.probabilities) == 2 and split.out_features == 2 * 14336  # 8 experts / 4, full width
    assert split.resident_bytes == whole.resident_bytes / 4
    # Per GPU, over its 2 experts: 2 * (1 - (3/4)^3) = 1.15625 for 3 tokens.
    assert split.work(Step.decode(3, 100)).weight_bytes == pytest.approx(1.15625 * 4096 * 2 * 14336 * 2)
    # Its FLOPs: 3 tokens x k/ep = 1.5 rows on this GPU.
    assert split.work(Step.decode(3, 100)).flops == pytest.approx(3 * 2 / 4 * 2 * 4096 * 2 * 14336)


def test_all_to_all_bytes_by_hand():
    # Uniform routing, E = 8, k = 2, ep = 4: another GPU holds 2 experts; both picks miss it with
    # probability C(6,2)/C(8,2) = 15/28, so a token reaches 3 * 13/28 = 39/28 other GPUs.
    assert remote_gpus_per_token(8, 2, 4) == pytest.approx(39 / 28)
    assert busiest_share(expert_probabilities(8, 2), 4) == pytest.approx(39 / 28)
    # Skewed: the GPU with the hottest experts receives more than that.
    assert busiest_share(expert_probabilities(8, 2, skew=1.0), 4) > 39 / 28
    dispatch = ops_by_name(fixture("Mixtral-8x7B-v0.1"), tp=4, ep=4)["moe_dispatch"]
    assert isinstance(dispatch, AllToAll)
    # 64 tokens: each GPU dispatches 64 / 4 = 16 of them, 39/28 GPUs each, 4096 x 2 bytes a token.
    assert dispatch.work(Step.decode(64, 100)).link_bytes == pytest.approx(16 * 39 / 28 * 4096 * 2)


def test_skewed_routing_touches_fewer_experts_but_loads_the_hot_gpu_more():
    model = fixture("Mixtral-8x7B-v0.1")
    uniform = ops_by_name(model, tp=4, ep=4)["experts_gate_up"].work(Step.decode(8, 100))
    skewed = ops_by_name(model, tp=4, ep=4, skew=1.0)["experts_gate_up"].work(Step.decode(8, 100))
    assert skewed.flops > uniform.flops  # GPU 0 holds the hottest experts


def test_expert_parallelism_is_checked():
    with pytest.raises(InputError, match="no routed experts"):
        ops_by_name(load_model("llama3-8b"), tp=2, ep=2)
    with pytest.raises(InputError, match="must be 1 or equal --tp"):
        ops_by_name(fixture("Mixtral-8x7B-v0.1"), tp=4, ep=2)
    with pytest.raises(InputError, match="routing-skew"):
        ops_by_name(fixture("Mixtral-8x7B-v0.1"), skew=-1.0)


def test_tp_candidates_with_ep_are_tp_equal_ep():
    assert tensor_parallel_candidates(fixture("Mixtral-8x7B-v0.1"), load_gpu("h100"), ep=4) == [4]
    # 32 heads, 8 KV heads, 8 GPUs a node: 1, 2, 4, 8; attention data parallelism needs two GPUs at least
    assert tensor_parallel_candidates(fixture("Mixtral-8x7B-v0.1"), load_gpu("h100")) == [1, 2, 4, 8]
    assert tensor_parallel_candidates(fixture("Mixtral-8x7B-v0.1"), load_gpu("h100"), dp_attention=True) == [2, 4, 8]


def test_qwen_step_and_dense_layer_keys_pick_the_moe_layers():
    model = fixture("Qwen3-30B-A3B").model_copy(update={"moe_layer_step": 2, "moe_dense_layer_indices": [1]})
    # (i + 1) % 2 == 0 -> layers 1, 3, 5, ... ; layer 1 is forced dense: 23 MoE layers of 48.
    assert model.moe_layers == 23


def test_deepseek_v3_on_8_h200_with_ep_8_runs_and_prices_the_all_to_all():
    from simulator.model.parameters import moe_facts
    from simulator.plan.run import simulate_from_options

    run = simulate_from_options({"model": "deepseek-v3", "gpu": "h200", "tp": 8, "ep": 8, "weights": "fp8",
                                 "batch": 64, "ctx": 4096})
    system = run.deployment.system
    assert run.deployment.memory.fits and system.ep == 8
    cost = system.step_cost(run.result.last_decode_step)
    alltoall = {op.name: op for op in cost.operators if op.kind == "alltoall"}
    assert set(alltoall) == {"moe_dispatch", "moe_combine"}
    assert all(op.count == 58 and op.seconds > 0 for op in alltoall.values())
    facts = moe_facts(system.model, system.operators, 64)
    # 256 / 8 = 32 experts per GPU; 64 tokens touch 32 * (1 - (1 - 8/256)^64) = 27.8 of them.
    assert facts is not None and facts.experts_per_gpu == 32
    assert facts.touched_per_gpu == pytest.approx(32 * (1 - (1 - 8 / 256) ** 64))


def test_the_expert_fraction_on_a_dense_model_warns_that_it_does_nothing():
    from simulator import simulate

    dense = simulate(model="llama3-8b", gpu="h100", batch=2, ctx=256, gen=4, expert_efficiency=0.5).to_dict()
    assert "--expert-efficiency has no effect: llama3-8b has no routed experts" in dense["warnings"]
    moe = simulate(model="mixtral-8x7b", gpu="h100", tp=2, batch=2, ctx=256, gen=4, expert_efficiency=0.5).to_dict()
    assert not any("expert-efficiency" in w for w in moe["warnings"])
