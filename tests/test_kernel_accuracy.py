"""Per-kernel accuracy study (simulator.validation.kernel_accuracy): numbers worked out by hand.

The GPUs here are hand-made with sm_count 0 (only tile quantisation) and shapes that fill whole tiles
(m a multiple of 64, n of 256), so the shape factor is 1 and a GEMM's time is the plain formula
max(2mnk / (P c), (bytes / bw + L) / mu) + (1 - o) min(2mnk / (P c), (bytes / bw + L) / mu) + launch + floor.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost.kernel_tables.table import TableOrigin, gemm_table
from simulator.model.gpu import Efficiency, GPUSpec
from simulator.validation import kernel_accuracy as ka

PEAK = {"bf16": 1.0e15, "fp8": 2.0e15}
BANDWIDTH = 2.0e12


def _gpu(name: str, scale: float = 1.0, l2_bytes: float = 0.0, **efficiency: float) -> GPUSpec:
    """A hand-made GPU: ``scale`` times PEAK and BANDWIDTH, no SM count (tile quantisation only)."""
    return GPUSpec(name=name, peak_flops={d: p * scale for d, p in PEAK.items()}, hbm_bytes=80e9,
                   hbm_bandwidth_bytes_per_second=BANDWIDTH * scale, sram_bytes_per_sm=228 * 1024,
                   link_bandwidth_bytes_per_second=450e9, l2_bytes=l2_bytes, efficiency=Efficiency(**efficiency))


def _table(dtype: str, m, n, k, seconds):
    origin = TableOrigin("hand", "trtllm", "0", "hand-made")
    return gemm_table(origin, dtype, np.array(m), np.array(n), np.array(k), np.array(seconds))


def test_one_row_by_hand():
    # m = 128, n = 256, k = 1024 in bf16 on a 1 PFLOP/s, 2 TB/s GPU with c 0.5, mu 0.8, L 1 us, overlap 0:
    #   FLOPs 2 * 128 * 256 * 1024 = 67,108,864 -> 67.108864 ns at peak, 134.217728 ns at c = 0.5
    #   bytes 256 * 1024 * 2 + 128 * (1024 + 256) * 2 = 524,288 + 327,680 = 851,968 -> 425.984 ns
    #   memory (425.984 ns + 1 us) / 0.8 = 1782.48 ns; overlap 0 adds the shorter, 134.217728 ns; launch 2 us
    gpu = _gpu("hand", compute=0.5, memory=0.8, memory_latency_seconds=1e-6, overlap=0.0, kernel_launch_seconds=2e-6)
    rows = ka.kernel_rows(gpu, _table("bf16", [128], [256], [1024], [5e-6]))
    assert rows.tensor_seconds[0] == pytest.approx(67.108864e-9, rel=1e-12)
    assert rows.real_seconds[0] == pytest.approx(67.108864e-9, rel=1e-12)
    assert rows.stream_seconds[0] == pytest.approx(425.984e-9, rel=1e-12)
    assert rows.predicted_seconds[0] == pytest.approx(1782.48e-9 + 134.217728e-9 + 2e-6, rel=1e-12)
    # ratio 3.916697728 / 5 - 1
    summary = ka.summarise([rows], [rows.predicted_seconds])
    assert summary["all"]["median_abs_error"] == pytest.approx(1 - 3.916697728 / 5, rel=1e-9)
    assert summary["m>256"]["rows"] == 0 and summary["m=17-256"]["rows"] == 1


def test_l2_resident_rows_are_left_out():
    # n * k * 2 bytes = 256 * 256 * 2 = 131,072 bytes: inside a 131,072-byte L2, outside a 131,071-byte one.
    table = _table("bf16", [64, 64], [256, 512], [256, 256], [1e-5, 1e-5])
    assert ka.kernel_rows(_gpu("a", l2_bytes=131_072), table).n.tolist() == [512]
    assert ka.kernel_rows(_gpu("a", l2_bytes=131_071), table).n.tolist() == [256, 512]
    assert ka.kernel_rows(_gpu("a", l2_bytes=131_072), table, keep_l2_resident=True).n.tolist() == [256, 512]


def test_error_summary_by_hand():
    # ratios 1, 2, 3, 4: |errors| 0, 1, 2, 3; median 1.5; p90 (linear) at position 2.7 -> 2.7; median ratio 2.5
    stats = ka.error_summary(np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4))
    assert stats == {"rows": 4, "median_abs_error": 1.5, "p90_abs_error": pytest.approx(2.7), "median_ratio": 2.5}
    assert ka.error_summary(np.zeros(0), np.zeros(0))["median_abs_error"] is None


M = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
N = [256, 1024, 4096, 16384]
K = [256, 1024, 4096, 16384]
TRUE = {"compute": 0.6, "memory": 0.85, "latency": 1.5e-6, "overlap": 0.4, "floor": {"bf16": 0.0, "fp8": 1.2e-5}}


def _hand_seconds(dtype: str, scale: float, m: int, n: int, k: int, launch: float = 2e-6) -> float:
    """The true kernel time of the hand-made world (module docstring), written out here, not taken from the code."""
    compute = 2.0 * m * n * k / (PEAK[dtype] * scale * TRUE["compute"])
    weight_bytes = {"bf16": 2.0, "fp8": 1.0}[dtype]
    moved = n * k * weight_bytes + m * (n + k) * 2.0
    memory = (moved / (BANDWIDTH * scale) + TRUE["latency"]) / TRUE["memory"]
    return max(compute, memory) + (1 - TRUE["overlap"]) * min(compute, memory) + launch + TRUE["floor"][dtype]


def _world(scales: dict[str, float], tamper: dict[str, float] | None = None) -> list[ka.KernelRows]:
    """Rows of hand-made GPUs (name -> peak and bandwidth scale); ``tamper`` multiplies one GPU's measurements."""
    groups = []
    for name, scale in scales.items():
        gpu = _gpu(name, scale)
        for dtype in ("bf16", "fp8"):
            grid = [(m, n, k) for m in M for n in N for k in K]
            seconds = [_hand_seconds(dtype, scale, m, n, k) * (tamper or {}).get(name, 1.0) for m, n, k in grid]
            table = _table(dtype, *zip(*grid), seconds)
            groups.append(ka.kernel_rows(gpu, table))
    return groups


FLOOR_OVERLAP = next(form for form in ka.FORMS if form.floors and form.overlap)


def test_fit_recovers_known_parameters_from_two_gpus():
    # Two GPUs 3x apart in peak and bandwidth share the same fractions: the pooled fit must find them.
    groups = _world({"small": 1.0, "big": 3.0})
    fitted = ka.fit(groups, FLOOR_OVERLAP)
    assert fitted.compute == pytest.approx(0.6, rel=1e-3)
    assert fitted.memory == pytest.approx(0.85, rel=1e-3)
    assert fitted.latency_seconds == pytest.approx(1.5e-6, rel=1e-2)
    assert fitted.overlap == pytest.approx(0.4, rel=1e-2)
    assert fitted.floor("fp8") == pytest.approx(1.2e-5, rel=1e-2)
    assert fitted.floor("bf16") < 1e-8  # the true bf16 floor is 0: the fit sits at its lower bound
    for g in groups:  # and then every row is predicted exactly
        assert np.allclose(ka.path_seconds(g, fitted), g.measured_seconds, rtol=1e-2)


def test_fit_without_floor_cannot_explain_fp8_floor():
    # The current form has no fixed time: a 12 us fp8 floor must leave errors the floor form does not.
    groups = _world({"small": 1.0})
    plain = ka.fit(groups, ka.FORMS[0])
    floored = ka.fit(groups, FLOOR_OVERLAP)

    def worst(params):
        return max(float(np.max(np.abs(ka.path_seconds(g, params) / g.measured_seconds - 1))) for g in groups)

    assert worst(floored) < 0.01 < 0.1 < worst(plain)


def test_held_out_fit_does_not_see_the_left_out_gpu():
    scales = {"a": 1.0, "b": 2.0, "c": 4.0}
    clean = ka.held_out(_world(scales), FLOOR_OVERLAP)
    tampered = ka.held_out(_world(scales, tamper={"a": 3.0}), FLOOR_OVERLAP)
    # a's parameters come from b and c only: tripling a's measurements changes nothing...
    assert tampered["a"] == clean["a"]
    # ...while the fits that do include a's rows move (so the comparison above can fail).
    assert tampered["b"] != clean["b"] and tampered["c"] != clean["c"]
    assert clean["a"].compute == pytest.approx(0.6, rel=1e-2)


def test_study_scores_before_and_held_out_after():
    groups = _world({"a": 1.0, "b": 2.0})
    result = ka.study(groups, forms=(FLOOR_OVERLAP,))
    # Before: the defaults (c 0.7, mu 0.8, L 0.5 us, overlap 0, no floor) on the hand-made world; after: the true
    # parameters recovered from the other GPU, so the held-out error is ~0 while before is not.
    assert result["before"]["a"]["all"]["median_abs_error"] > 0.05
    assert result["after"][FLOOR_OVERLAP.name]["a"]["all"]["p90_abs_error"] < 0.01
    assert result["after"][FLOOR_OVERLAP.name]["b"]["fp8"]["rows"] == len(M) * len(N) * len(K)


def test_predictions_are_the_simulators_operator_cost_on_a_real_table():
    # The roofline path's seconds of a row are what step_cost.operator_cost charges the same GEMM in a captured
    # step (one launch), under the shape model a System uses.
    from simulator.cost.step_cost import TimeModel, operator_cost
    from simulator.model import load_gpu
    from simulator.model.step import Step

    found = ka.measured_tables("H100-SXM5-80GB")
    if found is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    gpu = load_gpu("H100-SXM5-80GB")
    rows = ka.kernel_rows(gpu, found[1]["fp8"], every=7)
    assert len(rows.m) > 100
    for i in range(0, len(rows.m), 97):
        op = ka._gemm(int(rows.n[i]), int(rows.k[i]), "fp8")
        step = Step(tokens=float(rows.m[i]), prefill_tokens=float(rows.m[i]), sequences=1.0, logit_tokens=1.0,
                    attention_pairs=0.0, prefill_attention_pairs=0.0, score_elements=0.0, context_tokens=0.0)
        cost = operator_cost(op, step, gpu, model=TimeModel(shape=True))
        assert rows.predicted_seconds[i] == pytest.approx(cost.seconds, rel=1e-12)
