"""Measured MLA: the generation, context and batched-matmul lookups, their edges, the fallback, the scaling.

Rows quoted here were read from NVIDIA AIConfigurator's database as the ``aiconfigurator-core`` package ships
it, with pyarrow in the test (not through memwall's reader), latency in milliseconds, all from
``h200_sxm/.../trtllm/1.3.0rc20`` at 16 heads on the GPU (DeepSeek-V3 at tp 8):

- ``mla/generation_mla_perf.parquet``, bf16 KV cache: ``step`` cached tokens, so ``step + 1`` keys per sequence;
- ``mla/context_mla_perf.parquet``, bf16 KV cache: ``isl`` prompt tokens per sequence;
- ``mla_bmm/mla_bmm_perf.parquet``, fp8: ``mla_gen_pre`` (W_UK) and ``mla_gen_post`` (W_UV) by ``num_tokens``;
- ``gemm/gemm_perf.parquet``, fp8, n = 16 x (128 + 128) = 4,096, k = 512: DeepSeek-V3's kv_b_proj at tp 8.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.kernel_tables import aiconfigurator, source
from simulator.cost.kernel_tables.mla import MlaCurve, measured_mla, read_mla_table
from simulator.cost.kernel_tables.source import ROOFLINE
from simulator.cost.step_cost import operator_cost
from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.operators import LatentAttention
from simulator.model.precision import parse_precision
from simulator.model.step import Step

pq = pytest.importorskip("pyarrow.parquet")

H200_PEAK_BF16 = 989e12
H200_PEAK_FP8 = 1979e12
H200_BANDWIDTH = 4.8e12
MS = 1e-3
HEADS = 16

# The quoted rows (ms), checked against the files by test_the_quoted_rows_are_the_files.
GEN_64_4095 = 0.09087999661763509
GEN_64_8191 = 0.15638400117556253
GEN_128_4095 = 0.15438933173815408
GEN_1024_1023 = 0.3266773422559102  # the largest batch measured
GEN_64_131071 = 2.13755734761556  # b = 64's longest measured
CTX_4_2048 = 0.21065066258112589
CTX_8_2048 = 0.38097600142161053
CTX_8_3072 = 0.757584015528361
CTX_64_1024 = 0.9390453497568766  # b = 64's longest measured
PRE_64, POST_64 = 0.008560000360012055, 0.00944959968328476
PRE_80, POST_80 = 0.008774399757385254, 0.010070399940013885
PRE_128 = 0.009033600240945816  # below the 96-token row (0.0091104): smoothing gives 96 tokens this latency
POST_96 = 0.010447999835014344
PRE_2048, POST_2048 = 0.044377601146698, 0.05704640150070191
KVB_16384, KVB_32768 = 0.0967306693394979, 0.1781962712605794
KVB_8192 = 0.056301867961883544


def _root():
    root = aiconfigurator.data_root()
    assert root is not None, "the measured extra (aiconfigurator-core) is part of the test install"
    return root


@functools.lru_cache(maxsize=8)
def _rows(relative: str, filters: tuple) -> tuple:
    return tuple(pq.read_table(str(_root() / "h200_sxm" / relative), filters=list(filters)).to_pylist())


def _latency(relative: str, filters: tuple, **where) -> float:
    hits = [r["latency"] for r in _rows(relative, filters) if all(r[k] == v for k, v in where.items())]
    assert len(hits) == 1
    return hits[0]


MLA_BF16 = (("num_heads", "=", HEADS), ("kv_cache_dtype", "=", "bfloat16"))
BMM_FP8 = (("num_heads", "=", HEADS), ("bmm_dtype", "=", "fp8"))
KV_B_FP8 = (("gemm_dtype", "=", "fp8"), ("n", "=", 4096), ("k", "=", 512))


@functools.lru_cache(maxsize=4)
def _system(engine: str = "trtllm", gpu: str = "h200", kv: str = "fp16") -> System:
    return System(load_model("deepseek-v3"), load_gpu(gpu), parse_precision("fp8", kv), 8,
                  engine=load_engine_profile(engine), kernels="measured", kernel_efficiency="shape")


def _op(system: System) -> LatentAttention:
    return next(op for op in system.operators if isinstance(op, LatentAttention))


def _curve() -> MlaCurve:
    system = _system()
    curve = system.time_model.kernels.curve(_op(system), system.gpu)
    assert isinstance(curve, MlaCurve)
    return curve


def _log_between(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """y at x on the straight line through (ln x0, ln y0) and (ln x1, ln y1)."""
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


# --- the lookup against hand-picked rows ---------------------------------------------------------------------


def test_the_quoted_rows_are_the_files():
    gen, ctx = "mla/trtllm/1.3.0rc20/generation_mla_perf.parquet", "mla/trtllm/1.3.0rc20/context_mla_perf.parquet"
    bmm, gemm = "mla_bmm/trtllm/1.3.0rc20/mla_bmm_perf.parquet", "gemm/trtllm/1.3.0rc20/gemm_perf.parquet"
    assert _latency(gen, MLA_BF16, batch_size=64, step=4095) == pytest.approx(0.09088, rel=1e-4)
    assert _latency(gen, MLA_BF16, batch_size=64, step=8191) == pytest.approx(0.156384, rel=1e-5)
    assert _latency(gen, MLA_BF16, batch_size=128, step=4095) == pytest.approx(0.1543893, rel=1e-6)
    assert _latency(gen, MLA_BF16, batch_size=1024, step=1023) == pytest.approx(0.3266773, rel=1e-6)
    assert _latency(gen, MLA_BF16, batch_size=64, step=131071) == pytest.approx(2.1375573, rel=1e-6)
    assert max(r["batch_size"] for r in _rows(gen, MLA_BF16)) == 1024
    assert max(r["step"] for r in _rows(gen, MLA_BF16) if r["batch_size"] == 64) == 131071
    assert _latency(ctx, MLA_BF16, batch_size=4, isl=2048) == pytest.approx(0.2106507, rel=1e-6)
    assert _latency(ctx, MLA_BF16, batch_size=8, isl=2048) == pytest.approx(0.380976, rel=1e-6)
    assert _latency(ctx, MLA_BF16, batch_size=8, isl=3072) == pytest.approx(0.757584, rel=1e-6)
    assert _latency(ctx, MLA_BF16, batch_size=64, isl=1024) == pytest.approx(0.9390453, rel=1e-6)
    assert max(r["isl"] for r in _rows(ctx, MLA_BF16) if r["batch_size"] == 64) == 1024
    for op, tokens, value in (("mla_gen_pre", 64, 0.00856), ("mla_gen_post", 64, 0.0094496),
                              ("mla_gen_pre", 80, 0.0087744), ("mla_gen_post", 80, 0.0100704),
                              ("mla_gen_pre", 96, 0.0091104), ("mla_gen_pre", 128, 0.0090336),
                              ("mla_gen_post", 96, 0.010448), ("mla_gen_pre", 2048, 0.0443776),
                              ("mla_gen_post", 2048, 0.0570464)):
        assert _latency(bmm, BMM_FP8, op_name=op, num_tokens=tokens) == pytest.approx(value, rel=1e-5)
    for m, value in ((8192, 0.0563019), (16384, 0.0967307), (32768, 0.1781963)):
        assert _latency(gemm, KV_B_FP8, m=m) == pytest.approx(value, rel=1e-6)
    assert max(r["m"] for r in _rows(gemm, KV_B_FP8)) == 32768


def test_a_decode_step_is_the_latent_kernel_plus_both_absorbed_matmuls():
    curve = _curve()
    # Step.decode(b, k): k keys per sequence, the table's step k - 1; no larger shape is faster than these rows.
    assert curve.step_seconds(Step.decode(64, 4096)) == pytest.approx((GEN_64_4095 + PRE_64 + POST_64) * MS, rel=1e-7)
    # Halfway between 4,096 and 8,192 keys in log space: the geometric mean of the two kernel latencies.
    assert curve.step_seconds(Step.decode(64, 4096 * math.sqrt(2))) == pytest.approx(
        (math.sqrt(GEN_64_4095 * GEN_64_8191) + PRE_64 + POST_64) * MS, rel=1e-7)


def test_between_measured_batches_every_part_is_log_log_in_the_sequences():
    curve = _curve()
    b = 64 * math.sqrt(2)  # 90.5 sequences: between 64 and 128 for the kernel, between 80 and 96 tokens for the bmms
    pre = _log_between(b, 80, 96, PRE_80, PRE_128)  # 96 tokens carry the smoothed (128-token) latency
    post = _log_between(b, 80, 96, POST_80, POST_96)
    assert curve.step_seconds(Step.decode(b, 4096)) == pytest.approx(
        (math.sqrt(GEN_64_4095 * GEN_128_4095) + pre + post) * MS, rel=1e-7)


def test_a_prefill_step_is_the_context_kernel_plus_the_kv_b_gemm_over_its_keys():
    curve = _curve()
    # 8 x 2,048 prompt tokens: 16,384 keys through kv_b_proj, a measured GEMM row.
    assert curve.step_seconds(Step.prefill(8, 2048)) == pytest.approx((CTX_8_2048 + KVB_16384) * MS, rel=1e-7)
    # 2,048 sqrt(1.5) = 2,508 tokens: halfway (log) between the 2,048 and 3,072 rows; 20,067 keys for the GEMM.
    p = 2048 * math.sqrt(1.5)
    expected = math.sqrt(CTX_8_2048 * CTX_8_3072) + _log_between(8 * p, 16384, 32768, KVB_16384, KVB_32768)
    assert curve.step_seconds(Step.prefill(8, p)) == pytest.approx(expected * MS, rel=1e-7)


def test_a_mixed_step_is_charged_both_parts():
    curve = _curve()
    decode, prefill = Step.decode(64, 4096), Step.prefill(8, 2048)
    assert curve.step_seconds(decode + prefill) == pytest.approx(
        (GEN_64_4095 + PRE_64 + POST_64 + CTX_8_2048 + KVB_16384) * MS, rel=1e-7)
    assert curve.step_seconds(Step.decode(0, 0)) == 0.0


def test_a_prefill_chunk_on_cached_tokens_scales_the_kernel_by_the_roofline_and_decompresses_every_key():
    curve = _curve()
    # 4 chunks of 2,048 tokens on 2,048 cached each. Kernel: 2 x 16 x 320 FLOPs per causal pair, compute-bound on
    # H200 both ways (e.g. cached: 10,240 x 6,293,504 pairs / 989e12 = 65 us against 16 x 320 x 2 B x (4,096 +
    # 2,048) + 576 x 2 B x 2,048 = 65 MB / 4.8e12 = 14 us), so the pairs' ratio. kv_b_proj decompresses all
    # 4 x 4,096 = 16,384 keys, cached ones too: the measured 16,384-row GEMM.
    ratio = (2048 * 2048 + 2048 * 2049 / 2) / (2048 * 2049 / 2)
    assert curve.step_seconds(Step.prefill(4, 2048, cached_tokens=2048)) == pytest.approx(
        (CTX_4_2048 * ratio + KVB_16384) * MS, rel=1e-7)


# --- the edges: the roofline scaled to agree with the table -----------------------------------------------------


def test_beyond_the_measured_context_the_latent_kernel_is_scaled_by_the_roofline():
    curve = _curve()
    # b = 64 is measured up to 131,072 keys. Per sequence the latent kernel reads every key's latent,
    # (512 + 64) x 2 B, and writes the new one, and reads q and writes o, 16 x (2 x 512 + 64) x 2 B = 34,816 B,
    # doing 2 x 16 x (2 x 512 + 64) = 34,816 FLOPs a key: 30 FLOP/byte, memory-bound (H200 ridge 206).
    ratio = (1152 * (262144 + 1) + 34816) / (1152 * (131072 + 1) + 34816)
    assert curve.step_seconds(Step.decode(64, 262144)) == pytest.approx(
        (GEN_64_131071 * ratio + PRE_64 + POST_64) * MS, rel=1e-7)


def test_beyond_the_measured_batches_the_edge_batch_is_scaled_and_the_bmms_are_read_at_their_tokens():
    curve = _curve()
    # 1,024 sequences is the largest batch measured: 2,048 move twice the bytes, twice the kernel's time; the
    # batched matmuls are measured at 2,048 tokens.
    assert curve.step_seconds(Step.decode(2048, 1024)) == pytest.approx(
        (2 * GEN_1024_1023 + PRE_2048 + POST_2048) * MS, rel=1e-7)


def test_beyond_the_measured_prompt_and_gemm_rows_both_prefill_parts_are_scaled_by_their_rooflines():
    curve = _curve()
    # b = 64 is measured up to 1,024 prompt tokens. 2,048: 2 x 16 x 320 x 2,098,176 pairs / 989e12 = 21.7 us
    # against 16 x 320 x 2 B x 4,096 + 576 x 2 B x 2,048 = 44.3 MB / 4.8e12 = 9.2 us: compute-bound, as at 1,024
    # (5.4 us against 4.6 us), so the pairs' ratio.
    kernel = CTX_64_1024 * (2048 * 2049 / 2) / (1024 * 1025 / 2)
    # kv_b_proj over 131,072 keys, beyond the GEMM's 32,768 rows: max(2 m n k / fp8 peak, (n k + 2 B x m (k + n))
    # / bandwidth) at both m, n = 4,096, k = 512.
    def gemm(m: float) -> float:
        return max(2 * m * 4096 * 512 / H200_PEAK_FP8, (4096 * 512 + 2 * m * (512 + 4096)) / H200_BANDWIDTH)

    kv_b = KVB_32768 * gemm(131072) / gemm(32768)
    assert curve.step_seconds(Step.prefill(64, 2048)) == pytest.approx((kernel + kv_b) * MS, rel=1e-7)


def test_an_array_step_equals_its_entries_costed_alone_bit_for_bit():
    # The engine's decode stretches cost many ticks in one array step and compare them with single ticks.
    curve = _curve()
    batch = np.array([1.0, 1.0, 7.0, 64.0, 64.0, 64 * math.sqrt(2), 100.0, 3000.0, 5000.0, 40.0, 39.0, 39.0])
    context = np.array([2.0, 100.0, 4096.0, 777.0, 4096.0, 4096.0, 65536.0, 200.0, 70000.0, 1920.0, 1921.0, 300000.0])
    many = curve.step_seconds(Step.decode(batch, context))
    assert many.tolist() == [curve.step_seconds(Step.decode(b, c)) for b, c in zip(batch.tolist(), context.tolist())]
    steps = [Step.decode(16, 3000) + Step.prefill(2, 512, cached_tokens=1000), Step.prefill(8, 2048),
             Step.prefill(1, 40000), Step.prefill(3, 700, cached_tokens=300), Step.decode(5, 9000),
             Step.decode(0, 0), Step.decode(200, 1e6) + Step.prefill(1, 1920), Step.prefill(64, 100)]
    fields = ("tokens", "prefill_tokens", "sequences", "logit_tokens", "attention_pairs",
              "prefill_attention_pairs", "score_elements", "context_tokens")
    stacked = Step(*(np.array([float(getattr(one, name)) for one in steps]) for name in fields))
    assert curve.step_seconds(stacked).tolist() == [curve.step_seconds(one) for one in steps]


# --- what the tables do not measure: the roofline, and runs without MLA tables ------------------------------


def test_a_shape_or_format_no_table_measures_is_timed_by_the_plain_roofline():
    system = _system()
    op, kernels = _op(system), system.time_model.kernels
    assert kernels.curve(op, system.gpu) is not None
    step = Step.decode(64, 4096) + Step.prefill(2, 1000)
    for unmeasured in (replace(op, q_heads=7),  # no 7-head rows
                       replace(op, kv_lora_rank=256),  # not DeepSeek-V3's geometry, the only one measured
                       replace(op, topk=2048),  # DSA's sparse MLA
                       replace(op, weight_bytes_per_element=0.5),  # FP4 absorbed weights
                       replace(op, kv_bytes_per_element=4.0)):  # an fp32 cache
        assert kernels.curve(unmeasured, system.gpu) is None
        a = operator_cost(unmeasured, step, system.gpu, model=system.time_model)
        b = operator_cost(unmeasured, step, system.gpu, model=system.time_model._replace(kernels=ROOFLINE))
        assert not a.measured and a == b


def test_a_run_without_mla_tables_is_unchanged():
    system = _system()
    op = _op(system)
    without = replace(system.time_model.kernels, mla=None, _curves={})
    step = Step.decode(32, 2048) + Step.prefill(2, 1000)
    a = operator_cost(op, step, system.gpu, model=system.time_model._replace(kernels=without))
    b = operator_cost(op, step, system.gpu, model=system.time_model._replace(kernels=ROOFLINE))
    assert not a.measured and a == b
    measured = operator_cost(op, step, system.gpu, model=system.time_model)
    # The table's latencies are CUDA-graph replays, launches included: 61 layers of the curve, no launch term.
    assert measured.measured and measured.launch_seconds == 0.0
    assert measured.seconds == pytest.approx(61 * _curve().step_seconds(step), rel=1e-12)


def test_sglang_hopper_context_rows_run_absorbed_so_its_mla_is_the_roofline():
    # SGLang 0.5.14's Hopper context rows (FA3) time prefill over the latent, a kernel memwall's prefill does not
    # model; its Blackwell rows (trtllm_mla) run the decompressed form, as TensorRT-LLM's do.
    hopper = _root() / "h200_sxm" / "mla" / "sglang" / "0.5.14" / "context_mla_perf.parquet"
    assert {r["kernel_source"] for r in pq.read_table(str(hopper), columns=["kernel_source"]).to_pylist()} == {
        "flash_attention"}
    assert read_mla_table(str(hopper), "context", "H200 SXM", "sglang", "0.5.14").rows == {}
    h200 = _system("sglang")
    assert h200.time_model.kernels.mla is not None and h200.time_model.kernels.curve(_op(h200), h200.gpu) is None
    b200 = _system("sglang", "b200")
    assert isinstance(b200.time_model.kernels.curve(_op(b200), b200.gpu), MlaCurve)


def test_a_measured_system_picks_the_mla_tables_of_its_engine_and_release():
    kernels = source.kernel_source(load_gpu("h200"), load_engine_profile("trtllm"), "auto")
    assert kernels.mla is not None and kernels.mla.generation.origin.version == "1.3.0rc20"
    assert kernels.mla.bmm.origin.engine == "trtllm" and "mla" not in kernels.note.lower()
    # L40S has MLA tables of TensorRT-LLM 1.0.0 only and batched matmuls of 1.0.0 and 1.3.0rc20: each nearest the
    # GEMMs' release.
    tables, label = measured_mla(_root(), "l40s", "L40S", "trtllm", "1.3.0rc20")
    assert tables is not None and label == "1.0.0 (batched matmuls 1.3.0rc20)"
    assert measured_mla(_root(), "h200_sxm", "H200 SXM", "vllm", "0.24.0") == (None, "")  # module tables only


def test_the_smoothing_is_bounded_and_stated():
    # The largest cuts are single outlier cells (e.g. 2.2226 ms at 32 sequences, step 3, where its neighbours
    # measure 0.015 ms): the suffix minimum removes them, and ``smoothing`` says by how much.
    tables = _system().time_model.kernels.mla
    assert tables is not None
    assert 0.0 < tables.generation.smoothing < 0.999
    assert 0.0 < tables.context.smoothing < 0.999
    assert 0.0 < tables.bmm.cut < 0.999
    assert tables.smoothing == max(tables.generation.smoothing, tables.context.smoothing, tables.bmm.cut)


# --- scaling on the measured path --------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(batch=st.floats(1, 3000), more=st.floats(0, 3000), keys=st.floats(1, 300000), longer=st.floats(0, 300000),
       kv=st.sampled_from(["fp16", "fp8"]))
def test_a_decode_step_never_gets_faster_with_more_sequences_or_context(batch, more, keys, longer, kv):
    # Every table is smoothed so that no shape is faster than a smaller one (the cut is stated in ``smoothing``);
    # the log-log lookups and the roofline-scaled edges keep that order, so only floating-point rounding (1e-12
    # relative) is allowed here.
    system = _system(kv=kv)
    curve = system.time_model.kernels.curve(_op(system), system.gpu)
    assert isinstance(curve, MlaCurve)
    base = curve.step_seconds(Step.decode(batch, keys))
    assert curve.step_seconds(Step.decode(batch + more, keys)) >= base * (1 - 1e-12)
    assert curve.step_seconds(Step.decode(batch, keys + longer)) >= base * (1 - 1e-12)
