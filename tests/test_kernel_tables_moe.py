"""Measured MoE expert blocks: the table, its lookup and edges, charging the block once, and the roofline fallback.

Table rows quoted here were read with pyarrow (not through memwall's reader) from NVIDIA AIConfigurator's
database as the installed ``aiconfigurator-core`` ships it:
``systems/data/h100_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet`` (latency in milliseconds), rows with
moe_dtype bfloat16, distribution balanced, hidden_size 2048, inter_size 768, num_experts 128, topk 8
(Qwen3-30B-A3B's experts):

    moe_tp 1, moe_ep 1:  num_tokens 64 -> 0.428928, 80 -> 0.429072, 12288 -> 2.069547, 16384 -> 2.691611
                         (1 .. 16384 tokens, 27 counts, each no slower than the one before)
    moe_tp 2, moe_ep 4:  num_tokens 2 -> 0.025051, 4 -> 0.517269, 8 -> 0.045947
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from measured import measured_tables_hidden

from simulator.cost.kernel_tables import aiconfigurator
from simulator.cost.kernel_tables.moe import (
    BLOCK_OPERATORS,
    MoeBlock,
    MoeShareCurve,
    block_key,
    moe_table,
    read_moe_table,
)
from simulator.cost.kernel_tables.table import TableOrigin
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.operators import Elementwise, ExpertGemm
from simulator.model.precision import parse_precision
from simulator.model.step import Step

ORIGIN = TableOrigin("test GPU", "trtllm", "1.0", "hand-made")
QWEN_KEY = ("bf16", 2048, 768, 128, 8, 1, 1, "balanced", True)
QWEN_LAYERS = 48


def _h100_table():
    root = aiconfigurator.data_root()
    assert root is not None, "the measured extra (aiconfigurator-core) is part of the test install"
    path = root / "h100_sxm" / "moe" / "trtllm" / "1.3.0rc20" / "moe_perf.parquet"
    return read_moe_table(str(path), "H100 SXM", "trtllm", "1.3.0rc20")


def _system(kernels: str, routing_skew: float = 0.0, weights: str = "fp16") -> System:
    return System(load_model("qwen3-30b-a3b"), load_gpu("h100"), parse_precision(weights, "fp16"), 1,
                  engine=load_engine_profile("trtllm"), kernels=kernels, kernel_efficiency="shape",
                  routing_skew=routing_skew)


def _step(tokens: float) -> Step:
    return Step(tokens=tokens, prefill_tokens=0.0, sequences=tokens, logit_tokens=tokens, attention_pairs=tokens * 2048,
                prefill_attention_pairs=0.0, score_elements=0.0, context_tokens=tokens * 2048)


def _block(system: System) -> MoeBlock:
    names = [op.name for op in system.operators]
    rates = system.rates[names.index("experts_gate_up")]
    assert rates is not None and isinstance(rates.measured, MoeShareCurve)
    return rates.measured.block


def _block_seconds(system: System, tokens: float) -> float:
    return sum(op.seconds for op in system.step_cost(_step(tokens)).operators if op.name in BLOCK_OPERATORS)


def _streaming_op(name: str, bytes_per_token: int) -> Elementwise:
    """An unfused elementwise kernel moving ``bytes_per_token`` bytes (half read, half written, 2-byte elements)."""
    elements = bytes_per_token // 4
    return Elementwise(name=name, count=1, read_elements_per_token=elements, write_elements_per_token=elements,
                       flops_per_token=0.0, weight_elements=0, params=0, resident_bytes=0.0,
                       activation_bytes_per_element=2.0, compute_dtype="fp16", fused=False)


# --- the table -------------------------------------------------------------------------------------------------


def test_duplicates_average_and_fewer_tokens_never_take_longer():
    # 1 token measured twice (10 and 14 us: 12 us); 2 tokens at 20 us, 4 at 15 us: 2 tokens cut to 15 us, a 25% cut.
    key = ("bf16", 64, 32, 8, 2, 1, 1, "balanced", True)
    table = moe_table(ORIGIN, [key] * 4, np.array([1, 1, 2, 4]), np.array([10e-6, 14e-6, 20e-6, 15e-6]))
    tokens, seconds, cut = table.rows(key)
    assert tokens.tolist() == [1, 2, 4]
    assert seconds == pytest.approx([12e-6, 15e-6, 15e-6])
    assert cut == pytest.approx(0.25)
    assert table.rows(("fp8",) + key[1:]) is None


def test_measured_rows_come_back_in_seconds_and_an_outlier_is_cut():
    table = _h100_table()
    tokens, seconds, cut = table.rows(QWEN_KEY)
    assert seconds[list(tokens).index(64)] == pytest.approx(0.428928e-3, rel=1e-5)
    assert seconds[list(tokens).index(16384)] == pytest.approx(2.691611e-3, rel=1e-5)
    assert cut == 0.0  # this key's 27 rows rise with the tokens as measured
    # tp 2 / ep 4: 4 tokens measured 0.517269 ms between 0.025051 (2) and 0.045947 (8): cut to 0.045947 ms,
    # 1 - 0.045947 / 0.517269 = 91.1% of that row (a spike; the rows around it are 11x faster).
    tokens, seconds, cut = table.rows(("bf16", 2048, 768, 128, 8, 2, 4, "balanced", True))
    assert seconds[list(tokens).index(4)] == pytest.approx(0.045947e-3, rel=1e-5)
    assert cut == pytest.approx(1 - 0.045947 / 0.517269, rel=1e-4)


def test_a_file_of_formats_memwall_does_not_read_is_an_empty_table(tmp_path):
    # B200's TensorRT-LLM 1.3.0rc23 MoE file holds only w4a8_mxfp4_mxfp8 rows: no key, so no curve (the roofline
    # times the block), not an IndexError.
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = {"moe_dtype": ["w4a8_mxfp4_mxfp8"] * 2, "num_tokens": [1, 2], "hidden_size": [2048] * 2,
            "inter_size": [768] * 2, "topk": [8] * 2, "num_experts": [128] * 2, "moe_tp_size": [1] * 2,
            "moe_ep_size": [1] * 2, "distribution": ["balanced"] * 2, "latency": [0.1, 0.2],
            "kernel_source": ["moe_torch_flow"] * 2}
    path = tmp_path / "moe_perf.parquet"
    pq.write_table(pa.table(rows), path)
    table = read_moe_table(str(path), "test GPU", "trtllm", "1.0")
    assert table.keys == () and len(table.tokens) == 0
    assert table.rows(("bf16",) + QWEN_KEY[1:]) is None


def test_the_key_of_qwen3s_experts_is_read_from_its_operators():
    system = _system("roofline")
    ops = {op.name: op for op in system.operators}
    # down is 768 x 2048 per expert at tp 1; its params count 128 experts of 768 x 2048 (no bias): F = 768, moe_tp 1;
    # the GPU holds all 128 experts: moe_ep 1; gate_up writes 2 x 768 columns: gated.
    assert block_key(ops["experts_gate_up"], ops["experts_down"]) == QWEN_KEY
    skewed = replace(ops["experts_down"], probabilities=(0.1,) * 127 + (0.2,))
    assert block_key(ops["experts_gate_up"], skewed) is None


# --- the lookup and its edges ----------------------------------------------------------------------------------


def test_between_rows_the_block_is_interpolated_in_log_tokens_and_log_seconds():
    block = _block(_system("measured"))
    # 14,000 tokens between 12,288 (2.069547 ms) and 16,384 (2.691611 ms):
    # w = ln(14000 / 12288) / ln(16384 / 12288) = 0.130434 / 0.287682 = 0.453397;
    # exp(ln 2.069547 + w * ln(2.691611 / 2.069547)) = 2.069547 * 1.300580^0.453397 = 2.069547 * 1.126547 ms.
    w = math.log(14000 / 12288) / math.log(16384 / 12288)
    assert w == pytest.approx(0.453397, rel=1e-5)
    assert block.block_seconds(14000.0) == pytest.approx(2.069547e-3 * (2.691611 / 2.069547) ** w, rel=1e-5)
    assert block.block_seconds(14000.0) == pytest.approx(2.069547e-3 * 1.126547, rel=1e-5)
    assert block.block_seconds(64.0) == pytest.approx(0.428928e-3, rel=1e-5)
    assert block.block_seconds(0.0) == 0.0


def test_beyond_the_table_the_blocks_speed_of_light_is_scaled_to_the_edge():
    # One streaming kernel of 1,000 bytes per token at 1e12 B/s, no launch cost: speed of light 1e-9 s per token.
    # Measured 10 us at 1 token and 100 us at 100: 400 tokens take 100 us x 400 / 100 = 400 us, and
    # half a token 10 us x 0.5 / 1 = 5 us.
    block = MoeBlock((_streaming_op("moe_topk", 1000),), np.log([1.0, 100.0]), np.log([10e-6, 100e-6]), (1e12,),
                     1e12, 0.0)
    assert block.block_seconds(400.0) == pytest.approx(400e-6)
    assert block.block_seconds(0.5) == pytest.approx(5e-6)
    assert block.block_seconds(np.array([0.0, 100.0, 400.0])) == pytest.approx([0.0, 100e-6, 400e-6])


def test_the_block_time_is_shared_by_the_operators_speed_of_light():
    # 1,000 and 3,000 bytes per token: a quarter and three quarters of the measured 100 us at 100 tokens.
    block = MoeBlock((_streaming_op("moe_topk", 1000), _streaming_op("experts_combine", 3000)),
                     np.log([1.0, 100.0]), np.log([10e-6, 100e-6]), (1e12, 1e12), 1e12, 0.0)
    assert MoeShareCurve(block, 0).seconds(100.0) == pytest.approx(25e-6)
    assert MoeShareCurve(block, 1).seconds(100.0) == pytest.approx(75e-6)


# --- in a run -------------------------------------------------------------------------------------------------------


def test_the_measured_block_is_charged_once_over_its_six_operators():
    system = _system("measured")
    costs = {op.name: op for op in system.step_cost(_step(64.0)).operators}
    block = [costs[name] for name in ("moe_topk", "moe_align", "experts_gate_up", "experts_activation", "experts_down",
                                      "experts_combine")]
    # 64 tokens: 0.428928 ms per layer, 48 layers = 20.588544 ms over the six, their launches inside it.
    assert sum(op.seconds for op in block) == pytest.approx(QWEN_LAYERS * 0.428928e-3, rel=1e-5)
    assert all(op.measured and op.launch_seconds == 0.0 for op in block)
    # The router's logits are the collector's input, not its work: the GEMM table times the router on its own.
    assert costs["router"].measured
    assert costs["experts_gate_up"].seconds > costs["experts_down"].seconds > costs["moe_topk"].seconds


def test_a_layout_or_routing_no_table_measures_keeps_the_roofline():
    # Skewed routing (the collector's power law is another distribution) and weight-only int8 experts (no int8
    # MoE table) are timed by the roofline, exactly as under --kernels roofline.
    for skew, weights in ((1.0, "fp16"), (0.0, "int8")):
        measured = {op.name: op for op in _system("measured", skew, weights).step_cost(_step(64.0)).operators}
        roofline = {op.name: op for op in _system("roofline", skew, weights).step_cost(_step(64.0)).operators}
        for name in ("moe_topk", "experts_gate_up", "experts_down", "experts_combine"):
            assert not measured[name].measured
            assert measured[name].seconds == roofline[name].seconds


@settings(max_examples=25, deadline=None)
@given(small=st.integers(1, 20000), extra=st.integers(1, 20000))
def test_the_measured_block_never_gets_faster_with_more_tokens(small, extra):
    # No tolerance: the table is made non-decreasing in tokens on reading (a latency above that of a larger count is
    # cut to it: 0% for this key, up to 91% for an outlier row of another, see the test above), and beyond 16,384
    # tokens the block's speed of light grows with the tokens.
    system = _system("measured")
    assert _block_seconds(system, float(small + extra)) >= _block_seconds(system, float(small))


def test_without_the_tables_an_moe_run_is_the_roofline_run(monkeypatch):
    from simulator.plan.result import engine_run_dict
    from simulator.plan.run import simulate_settings

    options = {"model": "qwen3-30b-a3b", "gpu": "h100", "batch": 4, "ctx": 256, "gen": 8, "engine": "trtllm"}
    roofline = engine_run_dict(simulate_settings({**options, "kernels": "roofline"}))
    with measured_tables_hidden(monkeypatch):
        auto = engine_run_dict(simulate_settings({**options, "kernels": "auto"}))
    assert "no measured kernel tables installed" in auto["kernels"]["note"]
    assert auto["latency"] == roofline["latency"] and auto["operators"] == roofline["operators"]


def test_expert_gemms_alone_get_no_curve_from_the_per_operator_lookup():
    # The block is looked up over the operator list (system_rates); one expert GEMM on its own is not timed by
    # the MoE table, so a caller costing one operator gets the roofline, never half a block twice.
    system = _system("measured")
    down = next(op for op in system.operators if op.name == "experts_down")
    assert isinstance(down, ExpertGemm)
    assert system.time_model.kernels.curve(down, system.gpu) is None
