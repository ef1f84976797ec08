"""Attention data parallelism (--dp-attention): all heads on 1/tp of the sequences, the KV cache split, experts EP."""

import pytest

from simulator.cost.engine_overhead import graph_captured
from simulator.cost.memory import kv_bytes_per_token_per_gpu
from simulator.cost.step_cost import rank_share
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.layers import build_operators
from simulator.model.operators import LatentAttention
from simulator.model.precision import parse_precision
from simulator.model.step import Step
from simulator.plan.run import simulate_settings


def test_an_mla_latent_is_replicated_under_tensor_parallelism_and_split_under_attention_data_parallelism():
    ds = load_model("deepseek-v3")
    fp8 = parse_precision("fp8", "fp8")
    # 61 layers x (512 latent + 64 rope) x 1 byte = 35,136 bytes per token
    assert kv_bytes_per_token_per_gpu(ds, fp8, 8) == 35_136
    assert kv_bytes_per_token_per_gpu(ds, fp8, 8, dp_attention=True) == 35_136 / 8  # 4,392
    # GQA: Mixtral's 8 KV heads split 8 ways either way: 2 x 32 layers x 8 x 128 x 2 bytes / 8 = 16,384
    mixtral, fp16 = load_model("mixtral-8x7b"), parse_precision("fp16", "fp16")
    assert kv_bytes_per_token_per_gpu(mixtral, fp16, 8) == kv_bytes_per_token_per_gpu(mixtral, fp16, 8, True) == 16_384


def test_each_gpu_attends_its_share_of_the_sequences_with_every_head():
    ds, h200, fp8 = load_model("deepseek-v3"), load_gpu("h200"), parse_precision("fp8", "fp8")
    tp_ops = build_operators(ds, fp8, h200, 8, ep=8)
    dp_ops = build_operators(ds, fp8, h200, 8, ep=8, dp_attention=True)
    tp_attn = next(op for op in tp_ops if isinstance(op, LatentAttention))
    dp_attn = next(op for op in dp_ops if isinstance(op, LatentAttention))
    assert (tp_attn.q_heads, dp_attn.q_heads) == (128 // 8, 128)
    # decode of 8 sequences at 1,024 keys: 8,192 keys x 576 bytes = 4,718,592 latent bytes read per layer under TP
    # (every GPU reads every sequence's latent); under DP each GPU reads its 1 sequence: 589,824
    step = Step.decode(8, 1024)
    assert tp_attn.work(step).kv_read_bytes == 8 * 1024 * 576
    assert dp_attn.work(step).kv_read_bytes == pytest.approx(8 * 1024 * 576 / 8)
    # o_proj holds the whole matrix (128 heads x 128 x 7,168) and runs 1/8 of the 8 tokens
    tp_o = next(op for op in tp_ops if op.name == "o_proj")
    dp_o = next(op for op in dp_ops if op.name == "o_proj")
    assert (tp_o.in_features, dp_o.in_features) == (16 * 128, 128 * 128)
    assert dp_o.tokens(step) == 1.0 and tp_o.tokens(step) == 8
    # the routed experts are the same under both
    assert [op for op in tp_ops if op.name.startswith("experts")] == [op for op in dp_ops if op.name.startswith("experts")]


def test_more_cache_per_gpu_lets_more_sequences_run():
    base = {"model": "deepseek-v3", "gpu": "h200", "tp": 8, "ep": 8, "weights": "fp8", "kv": "fp8", "engine": "sglang",
            "input_len": 1024, "output_len": 512, "num_prompts": 1500, "request_rate": float("inf")}
    tp = simulate_settings(base)
    dp = simulate_settings({**base, "dp_attention": True})
    # the cache holds about 8x the tokens (each GPU 1/8 of each latent, less the attention weights it now holds)
    assert dp.capacity.tokens > 5 * tp.capacity.tokens
    # 1,500 x 1,536 tokens = 2.3 M: the tensor-parallel cache cannot hold them all at once, the data-parallel one can
    assert tp.capacity.tokens < 1500 * 1536 < dp.capacity.tokens
    assert dp.result.max_running == 1500 > tp.result.max_running
    assert isinstance(dp.deployment.system, System) and dp.deployment.system.dp_attention


def test_attention_data_parallelism_needs_an_moe_model_on_several_gpus():
    with pytest.raises(InputError, match="--dp-attention: llama3-70b has no routed experts"):
        simulate_settings({"model": "llama3-70b", "gpu": "h100", "tp": 4, "dp_attention": True, "batch": 1})
    with pytest.raises(InputError, match="--dp-attention: needs --tp N with N >= 2"):
        simulate_settings({"model": "mixtral-8x7b", "gpu": "h100", "tp": 1, "dp_attention": True, "batch": 1})


def test_without_tp_attention_data_parallelism_takes_the_smallest_degree_of_two_or_more():
    # Qwen3-30B-A3B's 61 GB of bf16 weights fit one H200: a plain run takes 1 GPU, --dp-attention 2.
    plain = simulate_settings({"model": "qwen3-30b-a3b", "gpu": "h200", "batch": 1})
    split = simulate_settings({"model": "qwen3-30b-a3b", "gpu": "h200", "batch": 1, "dp_attention": True})
    assert plain.deployment.system.tp == 1 and split.deployment.system.tp == 2
    assert "--dp-attention splits the sequences" in split.deployment.note


def test_an_ep_that_cannot_be_the_tensor_parallel_degree_is_named_as_ep():
    # With --ep and no --tp the degree is ep's: Mixtral's 32 heads cannot be split 3 ways, and --ep is what was given.
    with pytest.raises(InputError, match=r"^--ep 3 \(with no --tp the tensor-parallel degree is the expert-parallel "
                                         r"one\): 3 does not divide the 32 attention heads"):
        simulate_settings({"model": "mixtral-8x7b", "gpu": "h100", "ep": 3, "batch": 1})


def test_each_rank_runs_the_host_loop_and_captures_graphs_for_its_own_sequences():
    ds, h200, fp8 = load_model("deepseek-v3"), load_gpu("h200"), parse_precision("fp8", "fp8")
    vllm = load_engine_profile("vllm")  # V1: 300 us + 20 us per sequence + 20 ns per token, nothing overlapped
    tp = System(ds, h200, fp8, tp=8, ep=8, engine=vllm)
    dp = System(ds, h200, fp8, tp=8, ep=8, engine=vllm, dp_attention=True)
    # 1,000 decoding sequences: one loop over all of them, 300 + 1,000 x 20 + 1,000 x 0.02 = 20,320 us;
    # under attention DP each of the 8 ranks loops over its own 125: 300 + 125 x 20 + 125 x 0.02 = 2,802.5 us
    step = Step.decode(1000, 2048)
    assert tp.step_cost(step).overhead_seconds == pytest.approx(20_320e-6, rel=1e-12)
    assert dp.step_cost(step).overhead_seconds == pytest.approx(2_802.5e-6, rel=1e-12)
    # 1,001 sequences: the busiest rank has ceil(1,001 / 8) = 126, 300 + 126 x 20 + 126 x 0.02 = 2,822.52 us
    assert dp.step_cost(Step.decode(1001, 2048)).overhead_seconds == pytest.approx(2_822.52e-6, rel=1e-12)
    assert dp.step_totals(step).overhead_seconds == pytest.approx(2_802.5e-6, rel=1e-9)
    # vLLM captures decode steps of up to 512 sequences: a rank's 125 are replayed from a graph, one loop's 1,000 not
    share = rank_share(step, 8)
    assert (share.sequences, share.tokens, share.prefill_tokens) == (125, 125, 0)
    assert graph_captured(vllm, share) and not graph_captured(vllm, step)
    prefill = rank_share(Step.prefill(3, 100), 2)  # 3 prompts of 100 tokens over 2 ranks: the busier has 2 and 150
    assert (prefill.sequences, prefill.tokens, prefill.prefill_tokens) == (2, 150, 150)
