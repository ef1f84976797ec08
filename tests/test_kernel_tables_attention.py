"""Measured attention: the context/generation table lookup, its edges, the fallback, and the measured path's scaling.

Rows quoted here were read from NVIDIA AIConfigurator's database as the ``aiconfigurator-core`` package ships
it, with pyarrow in the test (not through memwall's reader), latency in milliseconds:

- ``h100_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf.parquet``, 8 heads, 1 KV head, head dim 128
  (Llama-3-70B at tp 8), bf16 KV cache, no window: ``step`` cached tokens, so ``step + 1`` keys per sequence;
- ``h100_sxm/attention/vllm/0.24.0/context_attention_perf.parquet``, 32 heads, 8 KV heads, head dim 128
  (Llama-3-8B at tp 1), bf16, no window: ``isl`` prompt tokens per sequence.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.kernel_tables import aiconfigurator, source
from simulator.cost.kernel_tables.attention import AttentionShape, AttentionTables, measured_attention
from simulator.cost.kernel_tables.source import ROOFLINE
from simulator.cost.step_cost import TimeModel, operator_cost
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.operators import Attention
from simulator.model.precision import parse_precision
from simulator.model.step import Step

pq = pytest.importorskip("pyarrow.parquet")

H100_PEAK_BF16 = 989e12
H100_BANDWIDTH = 3.35e12
MS = 1e-3


def _tables(engine: str, version: str) -> AttentionTables:
    root = aiconfigurator.data_root()
    assert root is not None, "the measured extra (aiconfigurator-core) is part of the test install"
    tables, chosen = measured_attention(root, "h100_sxm", "H100 SXM", engine, version)
    assert tables is not None and chosen == version
    return tables


@functools.lru_cache(maxsize=4)
def _shape_rows(engine: str, version: str, phase: str, heads: int, kv: int) -> tuple:
    root = aiconfigurator.data_root()
    path = root / "h100_sxm" / "attention" / engine / version / f"{phase}_attention_perf.parquet"
    filters = [("num_heads", "=", heads), ("num_key_value_heads", "=", kv), ("head_dim", "=", 128),
               ("attn_dtype", "=", "bfloat16"), ("kv_cache_dtype", "=", "bfloat16"), ("window_size", "=", 0)]
    return tuple(pq.read_table(str(path), filters=filters).to_pylist())


def _row(engine: str, version: str, phase: str, heads: int, kv: int, batch: int, column: str, value: int) -> float:
    """One latency (ms) read straight from the parquet file: bf16 attention and KV cache, head dim 128, no window."""
    hits = [r["latency"] for r in _shape_rows(engine, version, phase, heads, kv)
            if r["batch_size"] == batch and r[column] == value]
    assert len(hits) == 1
    return hits[0]


def _shape(heads: int, kv: int) -> AttentionShape:
    return AttentionShape(heads, kv, 128, 2.0, 2.0, H100_PEAK_BF16, H100_BANDWIDTH)


def _trtllm_70b():
    curve = _tables("trtllm", "1.3.0rc20").curve(_shape(8, 1), "fp16")
    assert curve is not None
    return curve


def _vllm_8b():
    curve = _tables("vllm", "0.24.0").curve(_shape(32, 8), "fp16")
    assert curve is not None
    return curve


# --- the lookup against hand-picked rows ---------------------------------------------------------------------


def test_the_quoted_rows_are_the_files():
    gen = ("trtllm", "1.3.0rc20", "generation", 8, 1)
    assert _row(*gen, 64, "step", 4095) == pytest.approx(0.070368, rel=1e-6)
    assert _row(*gen, 64, "step", 8191) == pytest.approx(0.10878933, rel=1e-6)
    assert _row(*gen, 128, "step", 4095) == pytest.approx(0.10715733, rel=1e-6)
    assert _row(*gen, 64, "step", 32767) == pytest.approx(0.36728001, rel=1e-6)  # b = 64's longest measured
    assert _row(*gen, 2048, "step", 63) == pytest.approx(0.08682134, rel=1e-6)  # the largest batch measured
    ctx = ("vllm", "0.24.0", "context", 32, 8)
    assert _row(*ctx, 8, "isl", 1536) == pytest.approx(0.38975465, rel=1e-6)
    assert _row(*ctx, 8, "isl", 2048) == pytest.approx(0.60819201, rel=1e-6)
    assert _row(*ctx, 16, "isl", 2048) == pytest.approx(1.28524264, rel=1e-6)


def test_a_measured_generation_row_comes_back_and_between_rows_it_is_log_log():
    curve = _trtllm_70b()
    # Step.decode(b, k): k keys per sequence, i.e. the table's step k - 1. No larger shape is faster than these
    # three rows, so smoothing leaves them as measured.
    assert curve.step_seconds(Step.decode(64, 4096)) == pytest.approx(0.070368 * MS, rel=1e-7)
    # Halfway between 4,096 and 8,192 keys in log space: the geometric mean of the two latencies.
    assert curve.step_seconds(Step.decode(64, 4096 * math.sqrt(2))) == pytest.approx(
        math.sqrt(0.070368 * 0.10878933) * MS, rel=1e-7)
    # Halfway between 64 and 128 sequences in log space, at 4,096 keys.
    assert curve.step_seconds(Step.decode(64 * math.sqrt(2), 4096)) == pytest.approx(
        math.sqrt(0.070368 * 0.10715733) * MS, rel=1e-7)


def test_a_context_step_is_interpolated_in_the_prompt_length():
    curve = _vllm_8b()
    assert curve.step_seconds(Step.prefill(8, 2048)) == pytest.approx(0.60819201 * MS, rel=1e-7)
    # 1,920 tokens (ctx 2048 less 128 generated): w = ln(1920/1536) / ln(2048/1536) of the way in log latency.
    w = math.log(1920 / 1536) / math.log(2048 / 1536)
    expected = math.exp((1 - w) * math.log(0.38975465) + w * math.log(0.60819201)) * MS
    assert curve.step_seconds(Step.prefill(8, 1920)) == pytest.approx(expected, rel=1e-7)


def test_a_mixed_step_is_charged_the_context_kernel_plus_the_generation_kernel():
    curve = _vllm_8b()
    decode, prefill = Step.decode(16, 3000), Step.prefill(8, 2048)
    alone = curve.step_seconds(decode) + curve.step_seconds(prefill)
    assert curve.step_seconds(decode + prefill) == pytest.approx(alone, rel=1e-12)
    assert curve.step_seconds(prefill) == pytest.approx(0.60819201 * MS, rel=1e-7)
    assert curve.step_seconds(Step.decode(0, 0)) == 0.0


def test_vectorised_steps_equal_scalar_ones():
    curve = _vllm_8b()
    batch = np.array([1.0, 7.0, 64.0, 3000.0])
    context = np.array([100.0, 4096.0, 777.0, 200000.0])
    many = curve.step_seconds(Step.decode(batch, context))
    one = [curve.step_seconds(Step.decode(b, c)) for b, c in zip(batch, context)]
    assert np.allclose(many, one, rtol=1e-12)


def test_an_array_step_equals_its_entries_costed_alone_bit_for_bit():
    # The engine's decode stretches cost many ticks in one array step and compare them with single ticks, so the
    # array lookup must repeat the scalar one's arithmetic exactly: between measured batches and lengths, on them,
    # beyond both edges (the roofline's ratio), and for prefill chunks with and without cached tokens.
    for curve in (_vllm_8b(), _trtllm_70b()):
        batch = np.array([1.0, 1.0, 7.0, 64.0, 64.0, 64 * math.sqrt(2), 100.0, 3000.0, 5000.0, 40.0, 39.0, 39.0])
        context = batch * np.array([2.0, 100.0, 4096.0, 777.0, 4096.0, 4096.0, 65536.0, 200.0, 70000.0, 1920.0,
                                    1921.0, 300000.0])
        many = curve.step_seconds(Step.decode(batch, context))
        assert many.tolist() == [curve.step_seconds(Step.decode(b, c)) for b, c in zip(batch.tolist(), context.tolist())]
        steps = [Step.decode(16, 3000) + Step.prefill(2, 512, cached_tokens=1000), Step.prefill(8, 2048),
                 Step.prefill(1, 40000), Step.prefill(3, 700, cached_tokens=300), Step.decode(5, 9000),
                 Step.decode(0, 0), Step.decode(200, 1e6) + Step.prefill(1, 1920), Step.prefill(64, 100),
                 Step.decode(1, 1), Step.decode(9, 99)]
        fields = ("tokens", "prefill_tokens", "sequences", "logit_tokens", "attention_pairs",
                  "prefill_attention_pairs", "score_elements", "context_tokens")
        stacked = Step(*(np.array([float(getattr(one, name)) for one in steps]) for name in fields))
        assert curve.step_seconds(stacked).tolist() == [curve.step_seconds(one) for one in steps]


# --- the edges: the roofline scaled to agree with the table -----------------------------------------------------


def test_beyond_the_measured_context_the_edge_is_scaled_by_the_roofline():
    curve = _trtllm_70b()
    # b = 64 is measured up to step 32,767 (32,768 keys). Per sequence the roofline moves K and V of every key and
    # of the new token, 2 x 1 x 128 x 2 B x (L + 1), plus q and o, 2 x 8 x 128 x 2 B = 4,096 B, and does
    # 4 x 8 x 128 x L FLOPs: 8 FLOP/byte, memory-bound on an H100 (ridge ~295), so the time is the bytes' ratio.
    ratio = (512 * (65536 + 1) + 4096) / (512 * (32768 + 1) + 4096)
    assert curve.step_seconds(Step.decode(64, 65536)) == pytest.approx(0.36728001 * MS * ratio, rel=1e-7)


def test_beyond_the_measured_batches_the_edge_batch_is_scaled_by_the_roofline():
    curve = _trtllm_70b()
    # 2,048 sequences is the largest batch measured; 4,096 move twice the bytes (memory-bound): twice the time.
    assert curve.step_seconds(Step.decode(4096, 64)) == pytest.approx(2 * 0.08682134 * MS, rel=1e-7)


def test_a_prefill_chunk_on_cached_tokens_is_its_empty_cache_latency_scaled_by_the_roofline():
    curve = _vllm_8b()
    # 8 chunks of 2,048 tokens on 2,048 cached each: pairs per chunk 2048 x 2048 + 2048 x 2049 / 2 against
    # 2048 x 2049 / 2 uncached; compute-bound both (4 x 32 x 128 FLOPs per pair), so the pairs' ratio.
    ratio = (2048 * 2048 + 2048 * 2049 / 2) / (2048 * 2049 / 2)
    shape = _shape(32, 8)
    assert shape.roofline_seconds(8, 2048, 2048) == pytest.approx(
        8 * 4 * 32 * 128 * (2048 * 2048 + 2048 * 2049 / 2) / H100_PEAK_BF16, rel=1e-12)
    assert curve.step_seconds(Step.prefill(8, 2048, cached_tokens=2048)) == pytest.approx(
        0.60819201 * MS * ratio, rel=1e-7)


def test_a_shape_or_kernel_no_table_measures_is_timed_by_the_plain_roofline():
    tables = _tables("trtllm", "1.3.0rc20")
    assert tables.curve(_shape(7, 1), "fp16") is None  # 7 heads: not measured
    assert tables.curve(replace(_shape(8, 1), window=4096), "fp16") is None  # a window not measured
    system = System(load_model("llama3-70b"), load_gpu("h100"), parse_precision("fp16", "fp16"), 8,
                    engine=load_engine_profile("trtllm"), kernels="measured", kernel_efficiency="shape")
    op = next(op for op in system.operators if isinstance(op, Attention))
    kernels = system.time_model.kernels
    assert kernels.curve(op, system.gpu) is not None
    step = Step.decode(64, 4096)
    for unmeasured in (replace(op, q_heads=7), replace(op, kernel="naive"), replace(op, kernel="per-head")):
        assert kernels.curve(unmeasured, system.gpu) is None
        measured_model = system.time_model
        roofline_model = system.time_model._replace(kernels=ROOFLINE)
        a = operator_cost(unmeasured, step, system.gpu, model=measured_model)
        b = operator_cost(unmeasured, step, system.gpu, model=roofline_model)
        assert not a.measured and a.seconds == b.seconds


def test_a_run_without_attention_tables_is_unchanged():
    system = System(load_model("llama3-8b"), load_gpu("h100"), parse_precision("fp16", "fp16"), 1,
                    engine=load_engine_profile("vllm"), kernels="measured", kernel_efficiency="shape")
    op = next(op for op in system.operators if isinstance(op, Attention))
    without = replace(system.time_model.kernels, attention=None, _curves={})
    step = Step.decode(32, 2048) + Step.prefill(2, 1000)
    a = operator_cost(op, step, system.gpu, model=system.time_model._replace(kernels=without))
    b = operator_cost(op, step, system.gpu, model=system.time_model._replace(kernels=ROOFLINE))
    assert not a.measured and a == b
    measured = operator_cost(op, step, system.gpu, model=system.time_model)
    assert measured.measured and measured.launch_seconds == 0.0
    # The measured share of a step counts the attention now: 32 layers of the curve's per-layer time.
    assert measured.seconds == pytest.approx(32 * _vllm_8b().step_seconds(step), rel=1e-12)
    assert TimeModel().kernels is ROOFLINE


def test_the_tables_smoothing_is_bounded_and_stated():
    # The largest cut (a latency above a larger shape's) is a few outlier cells (vLLM's head dim 512 FA4 rows:
    # up to 93%); most cells are not cut at all.
    for engine, version in (("trtllm", "1.3.0rc20"), ("vllm", "0.24.0")):
        tables = _tables(engine, version)
        assert 0.0 < tables.generation.smoothing < 0.95
        assert 0.0 <= tables.context.smoothing < 0.95


def test_a_measured_system_picks_the_attention_tables_of_its_engine():
    kernels = source.kernel_source(load_gpu("h100"), load_engine_profile("sglang"), "auto")
    assert kernels.attention is not None and kernels.attention.generation.origin.engine == "sglang"


# --- scaling on the measured path --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(batch=st.floats(1, 3000), more=st.floats(0, 3000), keys=st.floats(1, 200000), longer=st.floats(0, 200000),
       engine=st.sampled_from(["trtllm", "vllm"]))
def test_generation_attention_never_gets_faster_with_more_sequences_or_context(batch, more, keys, longer, engine):
    # The tables are smoothed so no shape is faster than a smaller one (the cut is stated in ``smoothing``); the
    # lookup then keeps that order exactly, so only floating-point rounding (1e-12 relative) is allowed here.
    curve = _trtllm_70b() if engine == "trtllm" else _vllm_8b()
    base = curve.step_seconds(Step.decode(batch, keys))
    assert curve.step_seconds(Step.decode(batch + more, keys)) >= base * (1 - 1e-12)
    assert curve.step_seconds(Step.decode(batch, keys + longer)) >= base * (1 - 1e-12)


def test_reading_the_tables_does_not_import_pandas():
    # pyarrow's read_table and to_numpy import pandas (0.3 to 0.5 s of every first measured run); the readers avoid
    # both. A fresh interpreter, as this test process may have pandas from elsewhere.
    code = ("import sys; from simulator.cost.kernel_tables import source; "
            "source._measured_source('H100-SXM5-80GB', 'trtllm', '1.3', 'auto'); print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_table_without_a_window_column_reads_as_full_attention():
    # vLLM 0.14.0's A100 tables predate the window_size column: every row is full attention, and the
    # file must load (it raised "No match for FieldRef.Name(window_size)" before).
    root = aiconfigurator.data_root()
    path = root / "a100_sxm" / "attention" / "vllm" / "0.14.0" / "context_attention_perf.parquet"
    if not path.exists():
        pytest.skip("this aiconfigurator-core release has no vLLM 0.14.0 A100 table")
    assert "window_size" not in pq.read_schema(str(path)).names
    tables, chosen = measured_attention(root, "a100_sxm", "A100 SXM", "vllm", "0.14.0")
    assert tables is not None and chosen == "0.14.0"
    curve = tables.curve(AttentionShape(8, 8, 128, 2.0, 2.0, 312e12, 2.039e12), "fp16")  # llama2-7b at tp 4
    assert curve is not None


# --- the traced lookup (length_seconds) is the scalar one -------------------------------------------------

class _Flat:
    """A roofline of one sequence that grows with its keys (only its ratios matter: beyond a row's ends)."""

    def sequence_seconds(self, queries: float, keys_before: float) -> float:
        return 1e-6 * queries * (1.0 + keys_before / 512.0)


def _curve():
    from simulator.cost.kernel_tables.attention import AttentionGrid, phase_curve

    batch = np.array([1.0, 4.0, 16.0, 64.0])
    length = np.array([128.0, 512.0, 2048.0, 8192.0])
    seconds = np.outer(np.sqrt(batch), 1e-5 * (1.0 + length / 1000.0))
    seconds[3, 3] = np.nan  # batch 64 was not measured at 8192 keys: its row has other lengths than batch 16's
    return phase_curve(AttentionGrid(batch, length, seconds), _Flat(), "generation")


@settings(max_examples=300, deadline=None)
@given(batch=st.floats(0.5, 200.0), length=st.floats(1.0, 40_000.0))
def test_the_traced_lookup_is_the_scalar_lookup_bit_for_bit(batch, length):
    # length_seconds inlines one clip, log and search for two rows measured at the same lengths; it must give the
    # floats scalar_seconds gives (the engine checks a traced tick against step_totals exactly), inside the grid,
    # beyond its ends (the roofline's ratio), on one row, on two rows of the same lengths and of different ones.
    curve = _curve()
    assert curve.length_seconds(batch)(length) == curve.scalar_seconds(batch, length)


def test_the_traced_lookup_takes_every_path():
    curve = _curve()
    for batch in (1.0, 2.0, 64.0, 32.0, 500.0):  # one row, two alike, one row, two unlike, clipped batch
        for length in (50.0, 128.0, 700.0, 8192.0, 20_000.0):
            assert curve.length_seconds(batch)(length) == curve.scalar_seconds(batch, length)
    # and the lookup is the table's: batch 4 at 512 keys is the measured cell, 1e-5 x 2 x 1.512
    assert curve.scalar_seconds(4.0, 512.0) == pytest.approx(1e-5 * 2.0 * 1.512, rel=1e-12)
