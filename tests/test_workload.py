"""Workloads: length specs, arrival processes (vLLM's burstiness), the memory guard, trace replay and windows."""

import math
from pathlib import Path

import numpy as np
import pytest

from simulator.engine import workload
from simulator.engine.workload import (
    LengthSpec,
    arrival_times,
    check_request_count,
    closed_batch,
    open_loop,
    parse_length_spec,
    read_trace,
    trace_workload,
)
from simulator.errors import InputError

DATA = Path(__file__).parent / "data"


def test_length_specs_parse_and_sample_within_bounds():
    assert parse_length_spec("512", "--prompt-tokens") == LengthSpec("fixed", 512)
    assert parse_length_spec(2147483647, "--prompt-tokens") == LengthSpec("fixed", 2**31 - 1)
    assert parse_length_spec("uniform:16:512", "--output-tokens") == LengthSpec("uniform", 16, 512)
    assert parse_length_spec("normal:300:50", "--output-tokens") == LengthSpec("normal", 300.0, 50.0)
    rng = np.random.default_rng(1)
    values = LengthSpec("uniform", 16, 512).sample(5000, rng, max_tokens=4096)
    assert values.min() >= 16 and values.max() <= 512
    # Inclusive bounds: with 5000 draws over 497 values both ends appear (P(miss) ~ e^-10).
    assert {16, 512} <= set(values.tolist())
    clipped = LengthSpec("normal", 10, 100).sample(2000, rng, max_tokens=50)
    assert clipped.min() == 1 and clipped.max() == 50


@pytest.mark.parametrize(
    "spec, message",
    [
        ("0", r"length must be in \[1, 2\^31 - 1 = 2,147,483,647\] tokens \(got 0\)"),
        ("2147483648", r"length must be in \[1, 2\^31 - 1"),
        ("abc", r"length 'abc' is not a whole number"),
        ("12.5", r"length '12.5' is not a whole number"),
        ("", r"empty"),
        ("uniform:5", r"uniform needs two values LO:HI, got 1"),
        ("uniform:9:3", r"LO 9 is above HI 3"),
        ("uniform:1:9223372036854775808", r"HI must be in \[1, 2\^31 - 1"),
        ("uniform:x:3", r"LO 'x' is not a whole number"),
        ("normal:nan:1", r"MEAN must be finite \(got nan\)"),
        ("normal:1:inf", r"STD must be finite \(got inf\)"),
        ("normal:-1:3", r"MEAN must be in \[1, 2,147,483,647\] tokens \(got -1\)"),
        ("normal:5:-1", r"STD must be in \[0, 2,147,483,647\] tokens"),
        ("normal:5", r"normal needs two values MEAN:STD, got 1"),
        ("zipf:1:2", r"unknown distribution 'zipf'"),
    ],
)
def test_bad_length_spec_says_what_is_wrong(spec, message):
    with pytest.raises(InputError, match=r"--prompt-tokens: cannot read .*" + message + r".*; allowed: N, uniform"):
        parse_length_spec(spec, "--prompt-tokens")


def test_closed_batch_is_all_at_time_zero():
    w = closed_batch(8, LengthSpec("fixed", 100), LengthSpec("fixed", 28))
    assert w.arrival_seconds.tolist() == [0.0] * 8
    assert w.prompt_tokens.tolist() == [100] * 8 and w.output_tokens.tolist() == [28] * 8


def test_poisson_arrivals_have_the_asked_rate_and_exponential_spread():
    w = open_loop(20_000, 10.0, LengthSpec("fixed", 10), LengthSpec("fixed", 10), seed=3)
    gaps = np.diff(np.concatenate([[0.0], w.arrival_seconds]))
    # Mean gap 1/10 s; std error of the mean 0.1/sqrt(20000) = 0.0007, so 3% is > 4 sigma.
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    # Exponential: coefficient of variation 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert np.all(np.diff(w.arrival_seconds) >= 0)


def test_gamma_gaps_are_vllms_formula():
    # vLLM benchmark_serving: interval = np.random.gamma(shape=burstiness, scale=1/(request_rate*burstiness)).
    # The arrival stream is the first of three spawned from the seed.
    rng = np.random.default_rng(np.random.SeedSequence(5).spawn(3)[0])
    expected = np.cumsum(rng.gamma(0.5, 1.0 / (4.0 * 0.5), size=50))
    w = open_loop(50, 4.0, LengthSpec("fixed", 1), LengthSpec("fixed", 1), arrival="gamma", burstiness=0.5, seed=5)
    assert np.array_equal(w.arrival_seconds, expected)


@pytest.mark.parametrize("shape, tolerance", [(0.25, 0.10), (4.0, 0.03)])
def test_gamma_burstiness_is_the_shape(shape, tolerance):
    # Gamma(k, 1/(qps k)): mean 1/qps, CV^2 = 1/k (4 for k = 0.25, 0.25 for k = 4). With n draws the
    # sample variance has relative std error sqrt((2 + 6/k)/n) (gamma excess kurtosis 6/k) and the mean
    # CV/sqrt(n). n = 200,000: k = 0.25 -> 0.0114 and 0.0045, so CV^2 within 2*0.0045 + 0.0114 = 0.020 per
    # sigma: 10% is 5 sigma; k = 4 -> 0.0042 and 0.0011: 0.0064 per sigma, 3% is 4.7 sigma.
    rng = np.random.default_rng(11)
    gaps = np.diff(np.concatenate([[0.0], arrival_times(200_000, 10.0, "gamma", shape, rng)]))
    assert gaps.mean() == pytest.approx(0.1, rel=tolerance)
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1.0 / shape, rel=tolerance)


def test_infinite_burstiness_spaces_arrivals_evenly():
    times = arrival_times(3, 4.0, "gamma", math.inf, np.random.default_rng(0))
    assert times.tolist() == [0.25, 0.5, 0.75]


def test_same_seed_same_workload_different_seed_different_arrivals():
    def make(seed):
        return open_loop(100, 5.0, LengthSpec("uniform", 1, 100), LengthSpec("uniform", 1, 100), seed=seed)

    a, b, c = make(7), make(7), make(8)
    assert np.array_equal(a.arrival_seconds, b.arrival_seconds) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_seconds, c.arrival_seconds)
    # Changing a length distribution does not move the arrivals (independent streams).
    d = open_loop(100, 5.0, LengthSpec("fixed", 9), LengthSpec("fixed", 9), seed=7)
    assert np.array_equal(a.arrival_seconds, d.arrival_seconds)


@pytest.mark.parametrize(
    "qps, arrival, burstiness, message",
    [
        (0.0, "poisson", 1.0, "--qps: must be a finite rate > 0"),
        (math.nan, "poisson", 1.0, "--qps: must be a finite rate > 0"),
        (math.inf, "poisson", 1.0, "--qps: must be a finite rate > 0"),
        (1e-320, "gamma", 1.0, "--qps: 1e-320 requests/s makes the mean gap"),
        (1e-12, "poisson", 1.0, r"--qps: 3 requests at 1e-12/s span about 3e\+12 s, beyond 1e\+12 s"),
        (1.0, "gamma", 0.0, "--burstiness: must be > 0"),
        (1.0, "gamma", math.nan, "--burstiness: must be > 0"),
        # The reported hang: shape 1e-320. P(gap underflows) ~ (2.2e-308 * qps * k)^k / Gamma(k + 1) ~ 1.
        (1.0, "gamma", 1e-320, "--burstiness: 1e-320 at 1.0 requests/s gives a gamma scale"),
        # k = 0.01 at 10/s: scale 10 s, odds exp(0.01 * (ln 2.2e-308 - ln 10) - lnGamma(1.01))
        # = exp(0.01 * -710.70 + 0.0057) = 8.2e-4 of the gaps would be 0 s.
        (10.0, "gamma", 0.01, r"--burstiness: 0.01 is too small a gamma shape: about 0.00082 of the gaps"),
        # qps * k = 1e309 overflows: scale 0.
        (10.0, "gamma", 1e308, "gamma scale"),
        (1.0, "uniform", 1.0, "--arrival: unknown 'uniform'"),
    ],
)
def test_degenerate_arrivals_are_refused(qps, arrival, burstiness, message):
    with pytest.raises(InputError, match=message):
        open_loop(3, qps, LengthSpec("fixed", 1), LengthSpec("fixed", 1), arrival=arrival, burstiness=burstiness)


def test_extreme_but_sound_shapes_terminate_with_finite_sorted_times():
    # k = 0.05 at 10/s: odds exp(0.05 * -709.9) = 2e-16 per gap, accepted; k = 1e300 is near-even spacing.
    for shape in (0.05, 1e300):
        times = arrival_times(1000, 10.0, "gamma", shape, np.random.default_rng(1))
        assert np.all(np.isfinite(times)) and np.all(np.diff(times) >= 0)
    even = arrival_times(1000, 10.0, "gamma", 1e300, np.random.default_rng(1))
    assert even[-1] == pytest.approx(100.0, rel=1e-9)


def test_memory_guard_refuses_huge_request_counts_up_front():
    # 3e9 requests * 256 bytes = 768e9 bytes = 715.3 GiB, beyond the 2^27 cap whatever the memory.
    with pytest.raises(InputError, match=r"--requests: 3,000,000,000 requests need about 715.3 GiB \(256 bytes each\)"):
        check_request_count(3_000_000_000)
    with pytest.raises(InputError, match=r"--batch/--requests: 1,000,000,000 requests need about 238.4 GiB"):
        closed_batch(10**9, LengthSpec("fixed", 1), LengthSpec("fixed", 1))
    with pytest.raises(InputError, match=r"--requests: 134,217,729 requests"):
        open_loop(2**27 + 1, 1.0, LengthSpec("fixed", 1), LengthSpec("fixed", 1))
    with pytest.raises(InputError, match=r"--requests: must be >= 1 \(got 0\)"):
        open_loop(0, 1.0, LengthSpec("fixed", 1), LengthSpec("fixed", 1))


def test_memory_guard_applies_to_a_replayed_trace(monkeypatch):
    monkeypatch.setattr(workload, "MAX_REQUESTS", 3)
    trace = read_trace(DATA / "vidur_small.csv")  # 4 requests
    # 4 * 256 bytes = 1,024 bytes = 9.5e-7 GiB.
    with pytest.raises(InputError, match=r"--trace: 4 requests need about 0.0 GiB \(256 bytes each\), beyond the cap of 3"):
        trace_workload(trace)
    assert len(trace_workload(trace, start_seconds=4.4)) == 2  # a window of 2 fits


# -- traces -----------------------------------------------------------------------------------------------


def test_trace_speedup_divides_arrival_times():
    w = trace_workload(read_trace(DATA / "azure_trace_small.csv"), speedup=2.0)
    # Last arrival 4.0 s after the first; twice as fast: 2.0 s.
    assert w.arrival_seconds[-1] == 2.0
    assert w.kind == "trace" and not w.notes


def test_unsorted_jsonl_trace_is_sorted_with_a_note():
    w = trace_workload(read_trace(DATA / "trace_small.jsonl"))
    assert w.arrival_seconds.tolist() == [0.0, 0.25, 0.5]
    assert w.prompt_tokens.tolist() == [100, 300, 200]
    assert len(w.notes) == 1 and "not sorted" in w.notes[0] and "2 requests moved" in w.notes[0]


def test_trace_window_is_rebased_to_its_start():
    trace = read_trace(DATA / "vidur_small.csv")  # arrivals 0, 4.314579, 4.541877, 4.710427 s
    # [4.4, 4.7) holds 4.541877 only: (4.541877 - 4.4) / 2 = 0.0709385 s.
    w = trace_workload(trace, speedup=2.0, start_seconds=4.4, duration_seconds=0.3)
    assert w.arrival_seconds.tolist() == pytest.approx([0.0709385], abs=1e-12)
    assert w.prompt_tokens.tolist() == [879] and w.output_tokens.tolist() == [55]
    assert "window [4.4, 4.7) s" in w.description
    # From 4 s to the end: 0.314579, 0.541877, 0.710427.
    w = trace_workload(trace, start_seconds=4.0)
    assert w.arrival_seconds.tolist() == pytest.approx([0.314579, 0.541877, 0.710427], abs=1e-12)
    assert w.prompt_tokens.tolist() == [396, 879, 91]
    # The window's start is inclusive, its end exclusive: [0, 4.314579) holds only the first request.
    w = trace_workload(trace, start_seconds=0.0, duration_seconds=4.314579)
    assert w.arrival_seconds.tolist() == [0.0]


def test_trace_window_errors():
    trace = read_trace(DATA / "vidur_small.csv")
    with pytest.raises(InputError, match=r"the window \[5, 6\) s holds no requests; vidur_small.csv's arrivals span 0 to 4.71043 s"):
        trace_workload(trace, start_seconds=5.0, duration_seconds=1.0)
    with pytest.raises(InputError, match="--trace-start: must be finite seconds >= 0"):
        trace_workload(trace, start_seconds=-1.0)
    with pytest.raises(InputError, match="--trace-duration: must be finite seconds > 0"):
        trace_workload(trace, duration_seconds=0.0)
    with pytest.raises(InputError, match="--trace-speedup: must be a finite factor > 0"):
        trace_workload(trace, speedup=math.nan)
    # 4.710427 s / 1e-320 overflows a double.
    with pytest.raises(InputError, match="--trace-speedup: 1e-320 stretches the trace beyond a double"):
        trace_workload(trace, speedup=1e-320)


def test_trace_notes_carry_into_the_workload():
    w = trace_workload(read_trace(DATA / "burstgpt_small.csv"))
    assert len(w.notes) == 1 and "skipped 2 of 5 rows" in w.notes[0]


def test_empirical_lengths_come_from_the_trace():
    trace = read_trace(DATA / "azure_trace_small.csv")
    w = open_loop(200, 2.0, trace.prompt_tokens, trace.output_tokens, seed=1)
    assert set(w.prompt_tokens.tolist()) <= {374, 396, 879, 91, 1200, 512}
    assert len(set(w.prompt_tokens.tolist())) > 3
