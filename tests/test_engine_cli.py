"""The main command through the engine: open-loop and trace workloads, JSON keys, per-request CSV, bad input."""

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import main

DATA = Path(__file__).parent / "data"
SMALL = ["--model", "llama2-7b", "--gpu", "a100"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_json_latencies_are_percentiles_and_engine_keys_are_added():
    result = invoke(SMALL + ["--qps", "5", "--requests", "40", "--output-tokens", "uniform:5:40", "--ctx", "600",
                             "--slo-ttft", "0.2", "--slo-tpot", "0.05", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("ttft_seconds", "tpot_seconds", "e2e_seconds", "itl_seconds", "queue_seconds"):
        summary = data["latency"][key]
        assert set(summary) == {"mean", "p50", "p90", "p99"}
        assert summary["p50"] <= summary["p90"] <= summary["p99"]
    assert data["requests"]["total"] == 40 and data["requests"]["completed"] == 40
    # The default engine profile is vLLM V1 (configs/engines/vllm.yaml): chunked prefill, 2048-token budget.
    assert data["workload"]["kind"] == "poisson" and data["scheduler"]["name"] == "chunked"
    assert data["scheduler"]["max_batched_tokens"] == 2048
    assert isinstance(data["preemptions"], int)
    assert 0 < data["mfu"] < 1 and 0 < data["mbu"] < 1
    throughput = data["throughput"]
    assert throughput["requests_per_second"] == pytest.approx(40 / data["time"]["duration_seconds"])
    assert throughput["goodput_requests_per_second"] <= throughput["requests_per_second"]
    assert throughput["slo_attainment"] == pytest.approx(
        throughput["goodput_requests_per_second"] * data["time"]["duration_seconds"] / 40)


def test_per_request_csv_has_one_row_per_request(tmp_path):
    out = tmp_path / "requests.csv"
    result = invoke(SMALL + ["--trace", str(DATA / "azure_trace_small.csv"), "--kv-blocks", "60",
                             "--per-request", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [int(r["prompt_tokens"]) for r in rows] == [374, 396, 879, 91, 1200, 512]
    # 60 blocks of 16 tokens = 960 tokens: the request of 1200 + 250 tokens can never fit.
    assert [r["status"] for r in rows] == ["done", "done", "done", "done", "rejected", "done"]
    assert "KV-cache blocks" in rows[4]["reject_reason"] and rows[4]["ttft_seconds"] == ""
    assert "rejected     1" in result.output
    data = json.loads(invoke(SMALL + ["--trace", str(DATA / "azure_trace_small.csv"), "--kv-blocks", "60", "--json"]).stdout)
    assert data["requests"]["rejected"] == 1
    assert data["requests"]["rejected_reasons"] == {"kv_cache": 1, "max_context": 0, "empty": 0, "prompt_over_budget": 0}
    assert "simulating" not in result.stderr  # no progress bar when stderr is not a terminal


def test_unsorted_trace_warns_on_stderr():
    result = invoke(SMALL + ["--trace", str(DATA / "trace_small.jsonl"), "--json"])
    assert result.exit_code == 0
    assert "arrivals were not sorted" in result.stderr
    assert json.loads(result.stdout)["warnings"]


def test_the_four_schedulers_run_and_report_themselves():
    outputs = {}
    for scheduler in ("static", "continuous", "chunked", "prefill-first"):
        result = invoke(SMALL + ["--qps", "8", "--requests", "60", "--ctx", "1024", "--scheduler", scheduler, "--json"])
        assert result.exit_code == 0, result.output
        outputs[scheduler] = json.loads(result.stdout)
        assert outputs[scheduler]["scheduler"]["name"] == scheduler
    assert outputs["chunked"]["scheduler"]["max_batched_tokens"] == 2048
    assert outputs["prefill-first"]["scheduler"]["max_batched_tokens"] == 8192  # SGLang's chunked_prefill_size
    # Static makes arrivals wait for the running batch to finish: its median TTFT is the worst.
    ttft = {name: data["latency"]["ttft_seconds"]["p50"] for name, data in outputs.items()}
    assert ttft["static"] > ttft["continuous"] and ttft["static"] > ttft["chunked"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--trace", "no/such/file.csv"], "--trace: cannot read"),
        (["--qps", "-1"], "--qps: must be >= 0.000001"),
        (["--scheduler", "chunked", "--max-batched-tokens", "10"], "--max-batched-tokens 10 is below the vllm profile's default --max-num-seqs"),
        (["--output-tokens", "uniform:9"], "--output-tokens: cannot read"),
        (["--gpu-memory-utilization", "0.1", "--tp", "1"], "less than one"),
        (["--slo-ttft", "0"], "--slo-ttft: must be > 0"),
        (["--qps", "2", "--requests", "0"], "--requests: must be >= 1"),
    ],
)
def test_bad_engine_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(main, SMALL + args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_run_whose_every_request_is_rejected_says_its_zeros_measure_nothing():
    """llama2-7b holds 4,096 tokens: a 5,000-token prompt is rejected, and the run's zeros come with a warning;
    a 3,000-token prompt and its 128 generated tokens fit, and the run has none."""
    base = ["--model", "llama2-7b", "--gpu", "a100", "--json"]
    out = CliRunner().invoke(main, [*base, "--prompt-tokens", "5000"])
    assert out.exit_code == 0, out.output
    run = json.loads(out.stdout)
    assert run["requests"]["completed"] == 0 and run["requests"]["rejected_reasons"]["max_context"] == 1
    (warning,) = [w for w in run["warnings"] if w.startswith("no request completed")]
    assert "maximum context of 4,096 tokens" in warning and "zeros, not measurements" in warning
    fits = json.loads(CliRunner().invoke(main, [*base, "--prompt-tokens", "3000"]).stdout)
    assert fits["requests"]["completed"] == 1 and not any(w.startswith("no request") for w in fits["warnings"])


def test_requests_longer_than_the_planned_ctx_are_warned_about():
    """--ctx 1024 plans for 1,024-token sequences; prompts of 3,000 and 500 output tokens make 3,500."""
    base = ["--model", "llama2-7b", "--gpu", "a100", "--json", "--prompt-tokens", "3000", "--output-tokens", "500"]
    conflicting = json.loads(CliRunner().invoke(main, [*base, "--ctx", "1024", "--gen", "64"]).stdout)
    (warning,) = [w for w in conflicting["warnings"] if w.startswith("--ctx 1,024 sizes the deployment")]
    assert "requests of up to 3,500" in warning and "give --ctx 3500" in warning
    derived = json.loads(CliRunner().invoke(main, base).stdout)  # ctx = 3,500 and gen = 500 derived from them
    assert not any(w.startswith("--ctx") for w in derived["warnings"])
