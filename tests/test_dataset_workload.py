"""--dataset: prompt/output lengths drawn in pairs from a lengths file (simulator.engine.datasets)."""

from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from simulator import api
from simulator.cli import main
from simulator.engine.datasets import MIN_TOKENS, read_dataset
from simulator.errors import InputError
from simulator.model.registry import validation_file
from simulator.plan.engine_run import build_workload
from simulator.plan.settings import RunSettings, parse_settings
from simulator.sweep.scenario import load_scenario

# Five rows; vLLM's is_valid_sequence keeps prompt >= 4 and output >= 4 tokens:
#   (10, 20) kept; (30, 0) dropped: 0 output tokens; (5, 6) kept; (2, 9) dropped: 2-token prompt; (40, 50) kept.
TINY = "input_tokens,output_tokens\n10,20\n30,0\n5,6\n# a comment line\n2,9\n40,50\n"
KEPT = [(10, 20), (5, 6), (40, 50)]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text(TINY)
    return str(path)


def _workload(**options):
    settings = parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", **options})
    return build_workload(settings, 8192)


def test_short_and_zero_output_rows_are_dropped_as_vllm_does(tiny):
    data = read_dataset(tiny)
    assert MIN_TOKENS == 4
    assert (data.rows, data.dropped) == (5, 2)
    assert list(zip(data.prompt_tokens.tolist(), data.output_tokens.tolist())) == KEPT
    # with the output length given (vLLM's --sharegpt-output-len) the output minimum is skipped: (30, 0) stays
    assert read_dataset(tiny, skip_output_check=True).dropped == 1


def test_a_closed_batch_of_as_many_requests_as_rows_sends_each_row_once(tiny):
    workload = _workload(dataset=tiny, batch=3)
    pairs = sorted(zip(workload.prompt_tokens.tolist(), workload.output_tokens.tolist()))
    assert pairs == sorted(KEPT)  # paired, each once
    assert "2 of 5 rows dropped" in " ".join(workload.notes)


def test_more_requests_than_rows_draw_rows_again_and_keep_pairs(tiny):
    workload = _workload(dataset=tiny, qps=2.0, requests=7)
    pairs = list(zip(workload.prompt_tokens.tolist(), workload.output_tokens.tolist()))
    assert sorted(pairs[:3]) == sorted(KEPT)  # the shuffled rows first
    assert all(pair in KEPT for pair in pairs[3:])  # then draws of the same rows
    # the arrivals are those of the same run without the dataset (a stream of their own)
    plain = _workload(qps=2.0, requests=7)
    np.testing.assert_array_equal(workload.arrival_seconds, plain.arrival_seconds)


def test_a_closed_loop_takes_its_lengths_from_the_dataset(tiny):
    workload = _workload(dataset=tiny, max_concurrency=2, requests=3)
    assert (workload.kind, workload.concurrency, len(workload)) == ("closed-loop", 2, 3)
    assert sorted(zip(workload.prompt_tokens.tolist(), workload.output_tokens.tolist())) == sorted(KEPT)


def test_output_tokens_replace_the_datasets_outputs(tiny):
    workload = _workload(dataset=tiny, batch=4, output_tokens="7")
    # 4 rows kept with the output check skipped: prompts 10, 30, 5, 40, each once; every output 7
    assert sorted(workload.prompt_tokens.tolist()) == [5, 10, 30, 40]
    assert workload.output_tokens.tolist() == [7, 7, 7, 7]


def test_a_run_on_the_shipped_sharegpt_sample():
    path = validation_file("lengths", "sharegpt-vllm-lambda.csv")
    with open(path) as handle:
        rows = [(int(r["input_tokens"]), int(r["output_tokens"])) for r in csv.DictReader(handle)]
    # By hand from the file: 320 rows, 17 with 0 output tokens and one (328, 3) under 4: 18 dropped.
    short = [r for r in rows if r[0] < 4 or r[1] < 4]
    assert (len(rows), len(short), Counter(o for _, o in short)) == (320, 18, Counter({0: 17, 3: 1}))
    result = api.simulate(model="llama3-8b", gpu="h100", dataset="sharegpt", qps=4.0, requests=40)
    data = result.to_dict()
    assert data["requests"]["completed"] == 40
    assert "18 of 320 rows dropped" in " ".join(data.get("warnings") or [])


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("nope", "no shipped dataset 'nope'; allowed: sharegpt"),
        ("/no/such/file.csv", "no file '/no/such/file.csv'"),
        ("x" * 300, "no shipped dataset"),
        ("/" + "x" * 300 + ".csv", "--dataset"),
    ],
)
def test_bad_name_or_path_is_one_line(value, words):
    result = CliRunner().invoke(main, ["--model", "llama3-8b", "--gpu", "h100", "--dataset", value])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_bad_file_contents_and_clashes(tmp_path, tiny):
    bad = tmp_path / "bad.csv"
    bad.write_text("input_tokens,output_tokens\n12,abc\n")
    with pytest.raises(InputError, match=r"dataset: .*bad\.csv: data row 1: expected whole token counts"):
        api.simulate(model="llama3-8b", gpu="h100", dataset=str(bad))
    header = tmp_path / "header.csv"
    header.write_text("prompt,completion\n1,2\n")
    with pytest.raises(InputError, match="expected the columns input_tokens,output_tokens"):
        api.simulate(model="llama3-8b", gpu="h100", dataset=str(header))
    short = tmp_path / "short.csv"
    short.write_text("input_tokens,output_tokens\n100,0\n3,50\n")
    with pytest.raises(InputError, match="every row has fewer than 4"):
        api.simulate(model="llama3-8b", gpu="h100", dataset=str(short), qps=1.0)
    with pytest.raises(InputError, match="dataset: draws the prompt lengths itself; it does not apply with prompt_tokens"):
        api.simulate(model="llama3-8b", gpu="h100", dataset=tiny, prompt_tokens="100")


def test_scenario_files_take_dataset(tmp_path, tiny):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"name: s\nbase: {{model: llama3-8b, gpu: h100, qps: 1.0}}\n"
                        f"sweep: {{grid: {{dataset: [sharegpt, '{tiny}']}}}}\n")
    points = load_scenario(str(scenario)).points()
    assert [p["dataset"] for p in points] == ["sharegpt", tiny]
    scenario.write_text("name: s\nbase: {model: llama3-8b, gpu: h100}\nsweep: {grid: {dataset: [sharegpt, nope]}}\n")
    with pytest.raises(InputError, match=r"sweep\.grid\.dataset\[1\]: no shipped dataset 'nope'"):
        load_scenario(str(scenario))


def test_the_rows_drawn_and_the_client_jitter_are_different_streams_of_the_seed():
    """Both derive from the run's seed; drawn from one stream, a request's place in the shuffle would fix its jitter."""
    from simulator.engine.datasets import sample_rows

    for seed in range(5):
        jitter_stream = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])  # closed_loop.with_client_path
        assert not np.array_equal(sample_rows(50, 1000, seed), jitter_stream.permutation(1000)[:50])
