"""The chance of meeting an SLO from an error band (simulator.sweep.confidence), and --confidence in the searches.

The made-up band of every test: signed errors (predicted - measured) / measured of -20% at the 10th percentile
and +25% at the 90th. As ratios r = measured / predicted = 1 / (1 + e):

    e = +0.25 -> r = 0.8   at cumulative probability 1 - 0.9 = 0.1
    e = -0.20 -> r = 1.25  at cumulative probability 1 - 0.1 = 0.9

slope between the knots (0.9 - 0.1) / (1.25 - 0.8) = 0.8 / 0.45 = 16/9 per unit ratio; the tails go on at
that slope: F = 0 at 0.8 - 0.1 / (16/9) = 0.74375 and F = 1 at 1.25 + 0.05625 = 1.30625.
P(meets a limit L with predicted p) = F(L / p).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import main
from simulator.sweep import sweep as sweep_module
from simulator.sweep.confidence import chance_text, chance_within, ratio_knots, slo_chances
from simulator.sweep.sweep import PointTask, meets_slo, min_replicas_columns, p99_seconds

BAND = {"low": -0.2, "high": 0.25, "quantiles": [0.1, 0.9], "rows": 12}


def test_knots_are_ratios_at_the_complementary_quantiles():
    (r1, c1), (r2, c2) = ratio_knots(BAND)  # type: ignore[misc]
    assert (r1, c1) == pytest.approx((0.8, 0.1))
    assert (r2, c2) == pytest.approx((1.25, 0.9))


@pytest.mark.parametrize(
    ("predicted", "limit", "expected"),
    [
        (0.8, 1.0, 0.9),  # L/p = 1.25: the upper knot
        (1.0, 1.0, 0.1 + 0.2 * 16 / 9),  # L/p = 1: 0.1 + (1 - 0.8) * 16/9 = 41/90 = 0.4556
        (1.0 / 0.77, 1.0, (0.77 - 0.74375) * 16 / 9),  # in the lower tail: 0.02625 * 16/9 = 7/150 = 0.0467
        (1.6, 1.0, 0.0),  # L/p = 0.625, below where F reaches 0 (0.74375)
        (0.5, 1.0, 1.0),  # L/p = 2, above where F reaches 1 (1.30625)
        (2.0, 2.5, 0.9),  # only the ratio matters: 2.5 / 2 = 1.25
    ],
)
def test_chance_within_by_hand(predicted, limit, expected):
    assert chance_within(predicted, limit, BAND) == pytest.approx(expected)


def test_predicted_at_the_limit_is_not_a_coin_flip_when_the_band_is_lopsided():
    # The band's median ratio is (0.8 + 1.25) / 2 = 1.025: measured runs 2.5% slower than predicted at the median,
    # so a prediction exactly at the limit meets it with 41/90 < 1/2.
    assert chance_within(1.0, 1.0, BAND) == pytest.approx(41 / 90)
    assert chance_within(1.0, 1.0, BAND) < 0.5  # type: ignore[operator]


def test_zero_width_band_is_a_step_and_missing_band_is_none():
    step = {"low": 0.25, "high": 0.25, "quantiles": [0.1, 0.9]}  # every measurement 0.8 x the prediction
    assert chance_within(1.0, 0.8, step) == 1.0  # measured 0.8 <= 0.8
    assert chance_within(1.0, 0.79, step) == 0.0
    assert chance_within(1.0, 1.0, {"low": None, "high": None, "rows": 2, "reason": "too few rows"}) is None
    assert chance_within(None, 1.0, BAND) is None


def test_joint_chance_is_the_product_and_the_text_reads_as_the_issue_asks():
    result = {"latency": {"ttft_seconds": {"p99": 1.0}, "tpot_seconds": {"p99": 0.08}},
              "error_band": {"ttft": BAND, "tpot": BAND}}
    chances, joint = slo_chances(result, {"ttft": 1.0, "tpot": 0.1}, p99_seconds)
    # ttft: L/p = 1 -> 41/90; tpot: L/p = 0.1 / 0.08 = 1.25 -> 0.9; together 41/90 * 0.9 = 0.41.
    assert chances["ttft"] == pytest.approx(41 / 90)
    assert chances["tpot"] == pytest.approx(0.9)
    assert joint == pytest.approx(0.41)
    assert meets_slo(result, {"ttft": 1.0, "tpot": 0.1}, 0.4) is True
    assert meets_slo(result, {"ttft": 1.0, "tpot": 0.1}, 0.5) is False
    assert meets_slo(result, {"ttft": 1.0, "tpot": 0.1}) is True  # the point estimate: 1.0 <= 1.0 and 0.08 <= 0.1
    assert chance_text("ttft", 1.0, 0.82, 0.91) == "meets TTFT p99 <= 1 s: predicted 0.82 s, 91% likely"


def _fake_cluster(options):
    """A cluster whose p99 TTFT is 4.4 s / replicas (2 GPUs per replica), in the made-up band's class."""
    replicas = options["replicas"]
    result = {"latency": {"ttft_seconds": {"p99": 4.4 / replicas}}, "gpus": 2 * replicas, "gpu": "H100-SXM5-80GB",
              "throughput": {"output_tokens_per_second": 100.0 * replicas}, "error_band": {"ttft": BAND}}
    return result, ""


@pytest.mark.parametrize(
    ("confidence", "replicas"),
    [
        # point estimate: 4.4/4 = 1.1 s > 1 s fails, 4.4/5 = 0.88 s passes -> 5
        (None, 5),
        # 5 replicas: L/p = 1 / 0.88 = 1.1364 -> 0.1 + 0.3364 * 16/9 = 0.698 >= 0.5; 4: L/p = 0.909 -> 0.294 < 0.5
        (0.5, 5),
        # 5 replicas: 0.698 < 0.9 fails; 6: p = 0.7333, L/p = 1.3636 > 1.30625 -> 1.0 passes -> 6
        (0.9, 6),
    ],
)
def test_gpus_for_target_qps_grow_with_the_confidence(monkeypatch, confidence, replicas):
    monkeypatch.setattr(sweep_module, "run_point", _fake_cluster)
    task = PointTask(0, {"replicas": 1, "requests": 100, "qps": 1.0}, {"ttft": 1.0}, confidence=confidence)
    # search starts at ceil(target 10 / max QPS 2 x 1 replica) = 5
    row = min_replicas_columns(task, 10.0, 2.0, {"gpu": "H100-SXM5-80GB"})
    assert row["search.min_gpus_for_qps.replicas"] == replicas
    assert row["search.min_gpus_for_qps.gpus"] == 2 * replicas
    chance = row["search.min_gpus_for_qps.slo_probability"]
    expected = {5: 0.1 + (1 / 0.88 - 0.8) * 16 / 9, 6: 1.0}[replicas]
    assert chance == pytest.approx(expected)
    assert row["search.min_gpus_for_qps.slo_probability.ttft"] == pytest.approx(expected)


def test_bigger_configuration_at_0_9_than_at_0_5(monkeypatch):
    monkeypatch.setattr(sweep_module, "run_point", _fake_cluster)
    gpus = {}
    for confidence in (0.5, 0.9):
        task = PointTask(0, {"replicas": 1, "requests": 100, "qps": 1.0}, {"ttft": 1.0}, confidence=confidence)
        gpus[confidence] = min_replicas_columns(task, 10.0, 2.0, {"gpu": "x"})["search.min_gpus_for_qps.gpus"]
    assert (gpus[0.5], gpus[0.9]) == (10, 12)


SCENARIO = """\
name: conf
base: {{model: llama3-8b, gpu: h100, prompt_tokens: 256, output_tokens: 16, qps: 2.0, requests: 20}}
sweep: {{grid: {{tp: [1]}}}}
slo: {{ttft_p99_seconds: 0.5{extra}}}
output: {{path: {out}}}
"""


def test_sweep_writes_the_chance_columns_and_prints_them_at_a_confidence(tmp_path):
    out = tmp_path / "c.csv"
    (tmp_path / "c.yaml").write_text(SCENARIO.format(extra="", out=out))
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "c.yaml"), "--workers", "1", "--confidence", "0.9"])
    assert result.exit_code == 0, result.output
    assert "with a chance >= 90% given its class's error band" in result.output
    assert "point 0 (tp=1) its own run: meets TTFT p99 <= 0.5 s: predicted" in result.output
    header = out.read_text().splitlines()[0].split(",")
    assert {"slo.probability", "slo.probability.ttft", "slo.confidence"} <= set(header)
    # without --confidence the columns are still written, and the summary keeps its point-estimate wording
    plain = CliRunner().invoke(main, ["sweep", str(tmp_path / "c.yaml"), "--workers", "1"])
    assert plain.exit_code == 0 and "Chance of meeting" not in plain.output
    assert "slo.probability" in out.read_text().splitlines()[0]


def test_confidence_in_the_scenario_and_bad_values(tmp_path):
    (tmp_path / "a.yaml").write_text(SCENARIO.format(extra=", confidence: 1.5", out=tmp_path / "a.csv"))
    bad_file = CliRunner().invoke(main, ["sweep", str(tmp_path / "a.yaml")])
    assert bad_file.exit_code == 2 and "slo.confidence" in bad_file.output and "Traceback" not in bad_file.output
    (tmp_path / "b.yaml").write_text(SCENARIO.format(extra="", out=tmp_path / "b.csv"))
    for value in ("0", "1.5", "nan"):
        bad = CliRunner().invoke(main, ["sweep", str(tmp_path / "b.yaml"), "--confidence", value])
        assert bad.exit_code == 2, (value, bad.output)
        assert "--confidence: must be a probability in (0, 1]" in bad.output
        assert len(bad.output.strip().splitlines()) == 1


@given(low=st.floats(-0.9, 2.0), width=st.floats(0.0, 2.0), p1=st.floats(1e-3, 1e3), p2=st.floats(1e-3, 1e3),
       limit=st.floats(1e-3, 1e3))
def test_the_chance_is_a_probability_and_falls_as_the_prediction_rises(low, width, p1, p2, limit):
    band = {"low": low, "high": low + width, "quantiles": [0.1, 0.9]}
    fast, slow = sorted((p1, p2))
    a, b = chance_within(fast, limit, band), chance_within(slow, limit, band)
    assert a is not None and b is not None
    assert 0.0 <= b <= a <= 1.0
