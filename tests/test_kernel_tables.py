"""Measured kernel tables: the internal format, the GEMM lookup and its edges, and the ``--kernels`` choice.

Table rows quoted here were read from NVIDIA AIConfigurator's database as the ``aiconfigurator-core``
0.12.0 package ships it (``systems/data/h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet``, latency in
milliseconds), with pyarrow, not through memwall's reader.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from measured import measured_tables_hidden

from simulator.cost.kernel_tables import aiconfigurator
from simulator.cost.kernel_tables.gemm import GemmShape, gemm_curve
from simulator.cost.kernel_tables.table import TableOrigin, gemm_table
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.precision import parse_precision
from simulator.model.step import Step

H100_PEAK_BF16 = 989e12
H100_BANDWIDTH = 3.35e12
ORIGIN = TableOrigin("test GPU", "trtllm", "1.0", "hand-made")


def _h100_tables() -> dict:
    root = aiconfigurator.data_root()
    assert root is not None, "the measured extra (aiconfigurator-core) is part of the test install"
    path = root / "h100_sxm" / "gemm" / "trtllm" / "1.3.0rc20" / "gemm_perf.parquet"
    return aiconfigurator.read_gemm_tables(str(path), "H100 SXM", "trtllm", "1.3.0rc20")


def _bf16_shape(n: int, k: int) -> GemmShape:
    return GemmShape(n, k, 2.0, 2.0, H100_PEAK_BF16, H100_BANDWIDTH)


def _curve(n: int, k: int, dtype: str = "bf16"):
    curve = gemm_curve(_h100_tables()[dtype], _bf16_shape(n, k))
    assert curve is not None
    return curve


# --- the internal format, on a hand-made table ------------------------------------------------------------


def test_duplicates_average_and_a_smaller_shape_never_takes_longer_than_a_larger_one():
    # m = 1 measured twice (10 and 14 us: 12 us); m = 2 at 20 us, m = 4 at 15 us: m = 2 is cut to 15 us,
    # a 25% cut, since two rows can run as the four-row kernel.
    m = [1, 1, 2, 4]
    table = gemm_table(ORIGIN, "bf16", m, [1024] * 4, [1024] * 4, [10e-6, 14e-6, 20e-6, 15e-6])
    assert table.seconds[:, 0, 0] == pytest.approx([12e-6, 15e-6, 15e-6])
    assert table.smoothing == pytest.approx(0.25)


def test_interpolation_is_log_log_between_rows_and_bilinear_in_log_n_and_log_k():
    # 2 x 2 shapes at two row counts; the query (m, n, k) = (2, 2048, 2048) sits at the middle of each log axis.
    rows = [(m, n, k) for m in (1, 4) for n in (1024, 4096) for k in (1024, 4096)]
    latency = {(1, 1024, 1024): 10e-6, (1, 1024, 4096): 20e-6, (1, 4096, 1024): 30e-6, (1, 4096, 4096): 40e-6,
               (4, 1024, 1024): 40e-6, (4, 1024, 4096): 50e-6, (4, 4096, 1024): 60e-6, (4, 4096, 4096): 80e-6}
    table = gemm_table(ORIGIN, "bf16", *zip(*rows), [latency[r] for r in rows])
    curve = gemm_curve(table, _bf16_shape(2048, 2048))
    # At m = 1 the four corners' geometric mean, at m = 4 too; m = 2 is their geometric mean.
    at_1 = (10e-6 * 20e-6 * 30e-6 * 40e-6) ** 0.25
    at_4 = (40e-6 * 50e-6 * 60e-6 * 80e-6) ** 0.25
    assert curve.seconds(1) == pytest.approx(at_1, rel=1e-12)
    assert curve.seconds(4) == pytest.approx(at_4, rel=1e-12)
    assert curve.seconds(2) == pytest.approx(math.sqrt(at_1 * at_4), rel=1e-12)
    assert curve.seconds(0) == 0.0
    assert np.allclose(curve.seconds(np.array([1.0, 2.0, 4.0])), [at_1, math.sqrt(at_1 * at_4), at_4], rtol=1e-12)


def test_a_table_with_a_bad_row_is_refused():
    with pytest.raises(InputError, match="finite latencies > 0"):
        gemm_table(ORIGIN, "bf16", [1], [1024], [1024], [0.0])
    with pytest.raises(InputError, match="not one of"):
        gemm_table(ORIGIN, "fp7", [1], [1024], [1024], [1e-5])


# --- the lookup on NVIDIA's H100 table -----------------------------------------------------------------------


def test_a_measured_row_comes_back_as_measured():
    # bf16, n = k = 8192: 16 rows 0.049829 ms; 2048 rows 0.346309 ms; 8192 rows 1.404784 ms.
    curve = _curve(8192, 8192)
    assert curve.seconds(16) == pytest.approx(0.04982933e-3, rel=1e-6)
    assert curve.seconds(2048) == pytest.approx(0.346309e-3, rel=1e-6)
    assert curve.seconds(8192) == pytest.approx(1.404784e-3, rel=1e-6)


def test_between_rows_the_latency_is_interpolated_in_log_space():
    # 1,537 rows: 0.275803 ms, 1,792 rows: 0.297419 ms (bf16, n = k = 8192); 1,650 rows lie between.
    w = (math.log(1650) - math.log(1537)) / (math.log(1792) - math.log(1537))
    expected = math.exp(math.log(0.275803e-3) + w * (math.log(0.297419e-3) - math.log(0.275803e-3)))
    assert _curve(8192, 8192).seconds(1650) == pytest.approx(expected, rel=1e-5)


def test_a_row_slower_than_a_larger_one_is_cut_to_it():
    # 1,024 rows measured at 0.190693 ms, 1,025 rows at 0.176539 ms: 1,024 rows take 0.176539 ms; one row
    # (0.049184 ms) takes the two rows' 0.048848 ms.
    curve = _curve(8192, 8192)
    assert curve.seconds(1024) == pytest.approx(0.17653867e-3, rel=1e-6)
    assert curve.seconds(1) == pytest.approx(0.048848e-3, rel=1e-6)


def test_beyond_the_largest_row_count_the_roofline_is_scaled_to_the_table():
    # 32,768 rows: 5.595638 ms. At 65,536 rows the GEMM is compute-bound both ways (2mnk / 989 TFLOP/s
    # = 8.9 ms > (2nk + 2m(n + k)) bytes / 3.35 TB/s = 0.68 ms), so the roofline doubles: 11.191276 ms.
    assert _curve(8192, 8192).seconds(65536) == pytest.approx(2 * 5.595638e-3, rel=1e-6)


def test_a_shape_wider_than_the_table_is_the_edge_scaled_by_the_roofline():
    # Llama-3's LM head at tp 1: n = 128,256 > the table's 65,536. n = 65,536, k = 4,096 takes 0.194149 ms
    # at one row, 0.192811 ms at two (so one row takes 0.192811). Both are memory-bound at one row: bytes
    # 2nk + 2(k + n).
    n, k = 128256, 4096
    ratio = (2 * n * k + 2 * (k + n)) / (2 * 65536 * k + 2 * (k + 65536))
    curve = _curve(n, k)
    assert curve.seconds(1) == pytest.approx(0.192811e-3 * ratio, rel=1e-5)
    assert "outside the table" in curve.edge_note


def test_small_fp8_gemms_have_the_measured_floor_not_the_bandwidth_time():
    # fp8, n = 1024, k = 8192 (8 MiB of weights, 2.5 us at 3.35 TB/s): measured 0.017090 ms at one row,
    # 0.018161 ms at 32 (the dynamic activation quantisation and the kernel's fixed cost).
    curve = _curve(1024, 8192, "fp8")
    assert curve.seconds(1) == pytest.approx(0.01709013e-3, rel=1e-6)
    assert curve.seconds(32) == pytest.approx(0.01816107e-3, rel=1e-6)
    assert curve.seconds(1) > 6 * (1024 * 8192) / H100_BANDWIDTH


def test_the_h100_tables_smoothing_is_bounded():
    # The largest cut (a slow tactic at an odd shape: n = 32, k = 65,536) is under 45%; most cuts are a few %.
    tables = _h100_tables()
    assert tables["bf16"].smoothing < 0.45
    assert tables["fp8"].smoothing < 0.40


# --- the choice of tables and a System that uses them -------------------------------------------------------


def _system(kernels: str, gpu: str = "h100", engine: str = "trtllm", model: str = "llama3-70b", tp: int = 8,
            weights: str = "fp16") -> System:
    return System(load_model(model), load_gpu(gpu), parse_precision(weights, "fp16"), tp, engine=load_engine_profile(engine),
                  kernels=kernels, kernel_efficiency="shape")


def test_a_measured_system_times_its_gemms_from_the_table():
    # Llama-3-70B at tp 8: gate_up_proj is 8192 x 2 * 28672 / 8 = 8192 x 7168; 2,048 rows measured 0.319013 ms,
    # 2,049 rows 0.304869 ms, so 2,048 take 0.304869 ms per layer, 80 layers; the table's latency includes
    # the kernel's launch inside the graph.
    system = _system("measured")
    step = Step(tokens=2048.0, prefill_tokens=2048.0, sequences=1.0, logit_tokens=1.0, attention_pairs=2048 * 2049 / 2,
                prefill_attention_pairs=2048 * 2049 / 2, score_elements=0.0, context_tokens=0.0)
    costs = {op.name: op for op in system.step_cost(step).operators}
    assert costs["gate_up_proj"].measured
    assert costs["gate_up_proj"].seconds == pytest.approx(80 * 0.30486933e-3, rel=1e-6)
    assert costs["gate_up_proj"].launch_seconds == 0.0
    # Attention is timed by its own tables now (tests/test_kernel_tables_attention.py); embedding by the roofline.
    assert costs["attention"].measured and not costs["embedding"].measured
    roofline = {op.name: op for op in _system("roofline").step_cost(step).operators}
    assert roofline["embedding"].seconds == costs["embedding"].seconds


def test_auto_takes_the_roofline_where_no_table_exists_and_says_why():
    assert not _system("auto", gpu="l4", model="llama3-8b", tp=1).time_model.kernels.measured
    assert "no measured tables for L4" in _system("auto", gpu="l4", model="llama3-8b", tp=1).time_model.kernels.note
    assert not _system("auto", engine="tgi-v2").time_model.kernels.measured
    with pytest.raises(InputError, match="--kernels measured: no measured tables for L4"):
        _system("measured", gpu="l4", model="llama3-8b", tp=1)


def test_the_release_nearest_the_profile_is_chosen_and_named():
    assert aiconfigurator.nearest_release(["0.14.0", "0.24.0"], (0, 8)) == "0.14.0"
    assert aiconfigurator.nearest_release(["1.0.0", "1.3.0rc20"], (1, 0)) == "1.0.0"
    assert aiconfigurator.nearest_release(["1.3.0rc20"], (1, 0)) == "1.3.0rc20"
    # 1.4.6 and 1.6.4 are equally far from 1.5.5 in every component (and their components sum alike): the newer
    assert aiconfigurator.nearest_release(["1.4.6", "1.6.4"], (1, 5, 5)) == "1.6.4"
    assert aiconfigurator.nearest_release(["0.10.0", "0.12.0"], (0, 11)) == "0.12.0"
    kernels = _system("auto", engine="vllm").time_model.kernels
    assert kernels.origin.version == "0.24.0" and "nearest measured one, vllm 0.24.0" in kernels.note


def test_without_the_extra_a_run_is_the_roofline_run(monkeypatch):
    from simulator.plan.result import engine_run_dict
    from simulator.plan.run import simulate_settings

    options = {"model": "llama2-7b", "gpu": "h100", "batch": 4, "ctx": 512, "gen": 16, "engine": "trtllm"}
    roofline = engine_run_dict(simulate_settings({**options, "kernels": "roofline"}))
    with measured_tables_hidden(monkeypatch):
        auto = engine_run_dict(simulate_settings({**options, "kernels": "auto"}))
        with pytest.raises(InputError, match="no measured kernel tables installed"):
            simulate_settings({**options, "kernels": "measured"})
    assert "no measured kernel tables installed" in auto["kernels"]["note"]
    assert auto["latency"] == roofline["latency"] and auto["throughput"] == roofline["throughput"]
    assert auto["operators"] == roofline["operators"]


@settings(max_examples=25, deadline=None)
@given(small=st.integers(1, 600), extra=st.integers(1, 600), context=st.integers(16, 16384))
def test_a_measured_decode_step_never_gets_faster_with_more_sequences(small, extra, context):
    system = _system("measured", engine="trtllm", model="llama3-8b", tp=1)

    def seconds(batch: int) -> float:
        step = Step(tokens=float(batch), prefill_tokens=0.0, sequences=float(batch), logit_tokens=float(batch),
                    attention_pairs=float(batch * context), prefill_attention_pairs=0.0, score_elements=0.0,
                    context_tokens=float(batch * context))
        return float(system.step_totals(step).seconds)

    assert seconds(small + extra) >= seconds(small)


def test_gqa_is_never_slower_than_mha_on_the_measured_path():
    gqa = _system("measured", model="llama3-8b", tp=1)
    mha_model = load_model("llama3-8b").model_copy(update={"num_kv_heads": 32, "name": "llama3-8b-mha"})
    mha = System(mha_model, load_gpu("h100"), parse_precision("fp16", "fp16"), 1, engine=load_engine_profile("trtllm"),
                 kernels="measured", kernel_efficiency="shape")
    for batch in (1, 8, 64, 256):
        step = Step(tokens=float(batch), prefill_tokens=0.0, sequences=float(batch), logit_tokens=float(batch),
                    attention_pairs=batch * 4096.0, prefill_attention_pairs=0.0, score_elements=0.0,
                    context_tokens=batch * 4096.0)
        assert gqa.step_totals(step).seconds <= mha.step_totals(step).seconds


# --- the all-reduce lookup -----------------------------------------------------------------------------------


def test_an_all_reduce_is_timed_by_the_engines_measured_kernel():
    # Llama-3-70B at tp 8, a decode of 64 sequences: each all-reduce carries 64 x 8,192 bf16 elements = 1 MiB per
    # GPU, i.e. 524,288 elements: TensorRT-LLM 1.3.0rc20's all-reduce on 8 H100s is measured at 0.025965 ms there
    # (no larger message is faster). Two per layer, 80 layers.
    system = _system("measured")
    costs = {op.name: op for op in system.step_cost(Step.decode(64, 2048)).operators}
    assert costs["attn_allreduce"].measured and costs["mlp_allreduce"].measured
    assert costs["attn_allreduce"].seconds == pytest.approx(80 * 0.0259648e-3, rel=1e-5)


def test_an_all_reduce_curve_holds_the_latency_below_and_the_bandwidth_above_its_sizes():
    from simulator.cost.kernel_tables.collective import message_curve

    # 1 KiB: 4 us, 1 MiB: 20 us, 4 MiB: 16 us measured (cut to 16 us at 1 MiB, as the larger one runs faster).
    curve = message_curve(8, np.array([1024.0, 2**20, 2**22]), np.array([4e-6, 20e-6, 16e-6]))
    assert curve.seconds(100.0) == pytest.approx(4e-6)  # below the smallest: its latency
    assert curve.seconds(2**20) == pytest.approx(16e-6)
    assert curve.seconds(2**23) == pytest.approx(32e-6)  # twice the largest: twice its time
    w = (math.log(2**15) - math.log(1024)) / (math.log(2**20) - math.log(1024))
    assert curve.seconds(2**15) == pytest.approx(math.exp(math.log(4e-6) + w * (math.log(16e-6) - math.log(4e-6))))
    assert curve.seconds(0.0) == 0.0


def _dp_system(kernels: str, tp: int = 8) -> System:
    return System(load_model("qwen3-30b-a3b"), load_gpu("h100"), parse_precision("fp16", "fp16"), tp,
                  engine=load_engine_profile("vllm"), kernels=kernels, kernel_efficiency="shape", dp_attention=True)


def test_attention_dp_gathers_are_timed_by_the_measured_nccl_collectives():
    # Qwen3-30B-A3B (48 layers, hidden 2,048) with attention DP over 8 H100s: a decode of 128 sequences gathers
    # 128 x 2,048 = 262,144 bf16 elements per layer for the MoE block and reduce-scatters as many after it.
    # NCCL 2.29.2 on 8 H100s (systems/data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet, half): all_gather at
    # 262,144 elements 0.01539 ms, reduce_scatter 0.01233 ms (every larger message is slower, so no smoothing).
    source = _dp_system("measured").time_model.kernels
    assert "NCCL 2.29.2" in source.note
    costs = {op.name: op for op in _dp_system("measured").step_cost(Step.decode(128, 2048)).operators}
    assert costs["dp_gather"].measured and costs["dp_reduce_scatter"].measured
    assert costs["dp_gather"].seconds == pytest.approx(48 * 0.01539e-3, rel=1e-9)
    assert costs["dp_reduce_scatter"].seconds == pytest.approx(48 * 0.01233e-3, rel=1e-9)
    # 96 sequences: 196,608 elements, between the rows of 131,072 (all_gather 0.0136 ms) and 262,144, linear in
    # (log bytes, log seconds).
    w = (math.log(196608) - math.log(131072)) / (math.log(262144) - math.log(131072))
    expected = math.exp(math.log(0.0136e-3) + w * (math.log(0.01539e-3) - math.log(0.0136e-3)))
    costs = {op.name: op for op in _dp_system("measured").step_cost(Step.decode(96, 2048)).operators}
    assert costs["dp_gather"].seconds == pytest.approx(48 * expected, rel=1e-9)
    roofline = {op.name: op for op in _dp_system("roofline").step_cost(Step.decode(128, 2048)).operators}
    assert not roofline["dp_gather"].measured


def test_a_group_or_dtype_no_table_measures_keeps_the_roofline():
    # 16 GPUs: the tables measure 2, 4 and 8 (one node).
    system = _system("measured", tp=16, model="llama3.1-405b")
    costs = {op.name: op for op in system.step_cost(Step.decode(8, 2048)).operators}
    assert not costs["attn_allreduce"].measured and costs["qkv_proj"].measured


def test_numeric_columns_are_read_as_stored():
    # The values buffer is read as is (an offset into a sliced chunk respected); a column with nulls goes through
    # pyarrow's own conversion (NaN for a null).
    pa = pytest.importorskip("pyarrow")
    from simulator.cost.kernel_tables.parquet import numbers

    chunked = pa.chunked_array([pa.array([1, 2, 3, 4], type=pa.int64()).slice(1), pa.array([7], type=pa.int64())])
    assert numbers(chunked).tolist() == [2, 3, 4, 7]
    assert numbers(pa.array([0.5, 0.25], type=pa.float64())).tolist() == [0.5, 0.25]
    with_null = numbers(pa.array([1.0, None, 3.0]))
    assert with_null[0] == 1.0 and math.isnan(with_null[1]) and with_null[2] == 3.0
