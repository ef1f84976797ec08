"""Sliding windows bound the KV cache a layer keeps and the keys it reads (Mistral-7B-v0.1, gpt-oss)."""

from pathlib import Path

import pytest

from simulator.cost.memory import plan_memory
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.layers import build_operators
from simulator.model.operators import Attention, windowed_step
from simulator.model.precision import Precision
from simulator.model.step import Step

FIXTURES = Path(__file__).parent / "data" / "hf-configs"
MISTRAL = load_model(str(FIXTURES / "Mistral-7B-v0.1.json"))  # sliding_window 4096 on all 32 layers
NO_WINDOW = MISTRAL.model_copy(update={"sliding_window": None})
KV_PER_LAYER_TOKEN = 2 * 8 * 128 * 2  # K and V, 8 KV heads x 128, fp16: 4,096 bytes


def attention(model) -> Attention:
    op = next(o for o in build_operators(model, Precision(), load_gpu("h100")) if o.name == "attention")
    assert isinstance(op, Attention)
    return op


def test_mistral_at_32k_reads_at_most_4096_tokens_of_kv_per_layer_per_decode_token():
    windowed = attention(MISTRAL).work(Step.decode(1, 32768))
    full = attention(NO_WINDOW).work(Step.decode(1, 32768))
    assert windowed.kv_read_bytes == 4096 * KV_PER_LAYER_TOKEN == 16_777_216
    assert full.kv_read_bytes == 32768 * KV_PER_LAYER_TOKEN == 134_217_728
    # Within the window nothing changes.
    assert attention(MISTRAL).work(Step.decode(1, 4000)).kv_read_bytes == 4000 * KV_PER_LAYER_TOKEN


def test_the_window_makes_long_context_decode_cheaper_end_to_end():
    gpu = load_gpu("h100")
    step = Step.decode(8, 32768)
    assert System(MISTRAL, gpu, Precision()).step_seconds(step) < System(NO_WINDOW, gpu, Precision()).step_seconds(step)


def test_the_memory_plan_keeps_only_the_window():
    gpu = load_gpu("h100")
    ops = build_operators(MISTRAL, Precision(), gpu)
    plan = plan_memory(MISTRAL, Precision(), gpu, 1, 1, 32768, ops)
    # 32 layers x 4096 tokens x 4,096 bytes = 536,870,912 (not 32768 tokens: 4,294,967,296)
    assert plan.kv_bytes == 32 * 4096 * KV_PER_LAYER_TOKEN == 536_870_912
    assert plan.kv_bytes_per_gpu == plan.kv_bytes


def test_windowed_prefill_pairs_by_hand():
    # 8192 prompt tokens, window 4096: each query attends at most 4096 keys -> 8192 x 4096 pairs
    # (the exact count, 4096*4097/2 + 4096*4096 = 25,175,040, is below this bound).
    step = windowed_step(Step.prefill(1, 8192), 4096)
    assert step.attention_pairs == 8192 * 4096 == 33_554_432
    assert step.context_tokens == 8192  # every key is still read once
    assert windowed_step(Step.prefill(1, 1000), 4096).attention_pairs == 1000 * 1001 / 2


def test_gpt_oss_splits_full_and_windowed_layers():
    gpt_oss = load_model(str(FIXTURES / "gpt-oss-120b.json"))
    ops = {o.name: o for o in build_operators(gpt_oss, Precision(), load_gpu("h100"))}
    assert ops["attention"].count == 18 and ops["attention"].window is None
    assert ops["attention_local"].count == 18 and ops["attention_local"].window == 128
    local = ops["attention_local"].work(Step.decode(1, 10_000))
    # 128 keys x 2 x 8 KV heads x 64 x 2 bytes = 262,144 bytes per layer.
    assert local.kv_read_bytes == 128 * 2 * 8 * 64 * 2 == 262_144
    assert ops["attention"].params == 64  # one sink logit per head


def test_equal_contexts_in_a_batch_are_exact():
    step = windowed_step(Step.decode(16, 10_000), 4096)
    assert step.context_tokens == pytest.approx(16 * 4096)
    assert step.attention_pairs == pytest.approx(16 * 4096)
