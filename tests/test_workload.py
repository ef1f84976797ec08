"""Workloads: length specs, arrival processes, trace files (ours and the Azure LLM trace format)."""

from pathlib import Path

import numpy as np
import pytest

from simulator.engine.workload import (
    LengthSpec, closed_batch, open_loop, parse_length_spec, read_trace, trace_workload,
)
from simulator.errors import InputError

DATA = Path(__file__).parent / "data"


def test_length_specs_parse_and_sample_within_bounds():
    assert parse_length_spec("512", "--prompt-tokens") == LengthSpec("fixed", 512)
    assert parse_length_spec("uniform:16:512", "--output-tokens") == LengthSpec("uniform", 16, 512)
    assert parse_length_spec("normal:300:50", "--output-tokens") == LengthSpec("normal", 300.0, 50.0)
    rng = np.random.default_rng(1)
    values = LengthSpec("uniform", 16, 512).sample(5000, rng, max_tokens=4096)
    assert values.min() >= 16 and values.max() <= 512
    # Inclusive bounds: with 5000 draws over 497 values both ends appear (P(miss) ~ e^-10).
    assert {16, 512} <= set(values.tolist())
    clipped = LengthSpec("normal", 10, 100).sample(2000, rng, max_tokens=50)
    assert clipped.min() == 1 and clipped.max() == 50


@pytest.mark.parametrize("spec", ["0", "uniform:5", "uniform:9:3", "normal:-1:3", "zipf:1:2", "abc"])
def test_bad_length_spec_names_the_option(spec):
    with pytest.raises(InputError, match="--prompt-tokens"):
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


def test_gamma_burstiness_is_the_squared_coefficient_of_variation():
    w = open_loop(20_000, 10.0, LengthSpec("fixed", 10), LengthSpec("fixed", 10), arrival="gamma", burstiness=4.0, seed=3)
    gaps = np.diff(w.arrival_seconds)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(4.0, rel=0.15)


def test_same_seed_same_workload_different_seed_different_arrivals():
    def make(seed):
        return open_loop(100, 5.0, LengthSpec("uniform", 1, 100), LengthSpec("uniform", 1, 100), seed=seed)

    a, b, c = make(7), make(7), make(8)
    assert np.array_equal(a.arrival_seconds, b.arrival_seconds) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_seconds, c.arrival_seconds)
    # Changing a length distribution does not move the arrivals (independent streams).
    d = open_loop(100, 5.0, LengthSpec("fixed", 9), LengthSpec("fixed", 9), seed=7)
    assert np.array_equal(a.arrival_seconds, d.arrival_seconds)


def test_bad_rates_are_rejected():
    with pytest.raises(InputError, match="--qps"):
        open_loop(10, 0.0, LengthSpec("fixed", 1), LengthSpec("fixed", 1))
    with pytest.raises(InputError, match="--burstiness"):
        open_loop(10, 1.0, LengthSpec("fixed", 1), LengthSpec("fixed", 1), arrival="gamma", burstiness=0.0)


def test_azure_trace_is_read_as_published():
    trace = read_trace(DATA / "azure_trace_small.csv")
    # TIMESTAMPs 18:15:46.68059, 46.98100, 47.18059, 48.68059, 49.00000, 50.68059 -> seconds after the first.
    expected = [0.0, 46.981 - 46.68059, 47.18059 - 46.68059, 2.0, 49.0 - 46.68059, 4.0]
    assert trace.arrival_seconds.tolist() == pytest.approx(expected, abs=1e-6)
    assert trace.prompt_tokens.tolist() == [374, 396, 879, 91, 1200, 512]
    assert trace.output_tokens.tolist() == [44, 109, 32, 12, 250, 128]


def test_trace_speedup_divides_arrival_times():
    w = trace_workload(read_trace(DATA / "azure_trace_small.csv"), speedup=2.0)
    assert w.arrival_seconds[-1] == pytest.approx(4.0 / 2, abs=1e-6)
    assert w.kind == "trace" and not w.notes


def test_unsorted_jsonl_trace_is_sorted_with_a_note():
    w = trace_workload(read_trace(DATA / "trace_small.jsonl"))
    assert w.arrival_seconds.tolist() == [0.0, 0.25, 0.5]
    assert w.prompt_tokens.tolist() == [100, 300, 200]
    assert len(w.notes) == 1 and "not sorted" in w.notes[0] and "2 requests moved" in w.notes[0]


def test_empirical_lengths_come_from_the_trace():
    trace = read_trace(DATA / "azure_trace_small.csv")
    w = open_loop(200, 2.0, trace.prompt_tokens, trace.output_tokens, seed=1)
    assert set(w.prompt_tokens.tolist()) <= {374, 396, 879, 91, 1200, 512}
    assert len(set(w.prompt_tokens.tolist())) > 3


def test_trace_with_missing_column_names_what_it_found(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,10\n")
    with pytest.raises(InputError, match=r"t.csv: missing column for output tokens.*found: TIMESTAMP, ContextTokens"):
        read_trace(path)


def test_trace_with_negative_length_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens\n0,10,5\n1,-3,5\n")
    with pytest.raises(InputError, match=r"t.csv:3: prompt_tokens must be a non-negative integer"):
        read_trace(path)


def test_trace_with_bad_time_or_json_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens\nsoon,10,5\n")
    with pytest.raises(InputError, match=r"t.csv:2: arrival time 'soon'"):
        read_trace(path)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"arrival_seconds": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: not JSON"):
        read_trace(jsonl)
