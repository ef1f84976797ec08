"""vLLM's benchmark_serving result block and JSON keys, and the engine launch commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.plan.run import simulate_settings
from simulator.report.vllm_format import launch_command, parse_percentiles, vllm_result_block, vllm_result_json


@pytest.fixture(scope="module")
def run():
    # 8 requests, 1024 prompt + 128 output tokens each, all at t = 0.
    return simulate_settings({"model": "llama3-8b", "gpu": "h100", "input_len": 1024, "output_len": 128, "num_prompts": 8,
                              "request_rate": float("inf")})


def _value(block: str, label: str) -> str:
    line = next(line for line in block.splitlines() if line.startswith(label))
    # vLLM's layout: the label left-aligned in 40 characters, a space, then the value.
    assert line[40] == " " and line[:40].rstrip() == label
    return line[41:].strip()


def test_block_has_vllms_layout_and_totals(run):
    block = vllm_result_block(run, [99])
    lines = block.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============" and len(lines[0]) == 50
    assert lines[-1] == "=" * 50
    assert _value(block, "Successful requests:") == "8"
    assert _value(block, "Total input tokens:") == str(8 * 1024)  # 8,192
    assert _value(block, "Total generated tokens:") == str(8 * 128)  # 1,024
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert not any("E2EL" in line for line in lines)  # vLLM prints it only when asked (--percentile-metrics)


def test_percentile_lines_are_numpy_percentiles_of_the_per_request_times(run):
    block = vllm_result_block(run, [50, 99.9], ["ttft", "e2el"])
    ttft_ms = (run.result.first_token - run.workload.arrival_seconds) * 1e3
    assert float(_value(block, "P99.9 TTFT (ms):")) == pytest.approx(np.percentile(ttft_ms, 99.9), abs=0.006)
    assert float(_value(block, "Median TTFT (ms):")) == pytest.approx(np.median(ttft_ms), abs=0.006)
    assert "P50 E2EL (ms):" in block and "Mean TPOT (ms):" not in block


def test_json_has_vllms_keys(run):
    data = vllm_result_json(run, [99])
    for key in ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms"):
        assert key in data
    assert data["completed"] == 8 and data["total_input_tokens"] == 8192 and data["input_lens"] == [1024] * 8
    # request throughput = completed / duration, as vLLM defines it
    assert data["request_throughput"] == pytest.approx(8 / data["duration"])


def test_percentiles_are_checked():
    assert parse_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    for bad in ("0", "101", "nan", "x"):
        with pytest.raises(Exception, match="--metric-percentiles"):
            parse_percentiles(bad)


def test_launch_commands_carry_the_simulated_settings():
    run = simulate_settings({"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096, "gen": 8,
                             "scheduler": "chunked", "max_batched_tokens": 4096, "max_num_seqs": 128})
    # Weights 128.5 GiB; KV 327,680 B/token x 64 x 4096 = 80 GiB. TP 2: 64.2 + 40 > 80 GiB per GPU;
    # TP 4: 32.1 + 20 GiB holds the whole batch, so the planner picks 4.
    command = launch_command(run, "vllm")
    for part in ("vllm serve meta-llama/Llama-2-70b-hf", "--tensor-parallel-size 4", "--max-num-seqs 128",
                 "--max-num-batched-tokens 4096", "--enable-chunked-prefill"):
        assert part in command
    sglang = launch_command(run, "sglang")
    assert "--tp 4" in sglang and "--chunked-prefill-size 4096" in sglang and "--max-running-requests 128" in sglang
    # Decodes mixed into the prefill chunks' iterations are SGLang's --enable-mixed-chunk; its default
    # (prefill batches alone) is the simulator's prefill-first.
    assert "--enable-mixed-chunk" in sglang
    alone = simulate_settings({"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096, "gen": 8,
                               "scheduler": "prefill-first", "max_batched_tokens": 4096, "max_num_seqs": 128})
    default = launch_command(alone, "sglang")
    assert "--chunked-prefill-size 4096" in default and "--enable-mixed-chunk" not in default


def test_cli_save_result_writes_json_and_checks_the_path_first(tmp_path):
    out = tmp_path / "r.json"
    args = ["--model", "llama3-8b", "--gpu", "h100", "--num-prompts", "4", "--input-len", "256", "--output-len", "16",
            "--result-format", "vllm", "--save-result", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Serving Benchmark Result" in result.output
    assert json.loads(out.read_text())["total_output_tokens"] == 4 * 16
    bad = CliRunner().invoke(main, args[:-1] + [str(tmp_path / "missing" / "r.json")])
    assert bad.exit_code == 2 and "does not exist" in bad.output


def test_launch_commands_carry_speculative_decoding():
    run = simulate_settings({"model": "llama3-70b", "gpu": "h100", "batch": 1, "ctx": 2176, "gen": 128,
                             "speculative": "draft:llama3-8b", "num_speculative_tokens": 3, "acceptance": 0.7})
    # The draft is served by its Hugging Face id, as the target is (configs/models/llama3-8b.yaml: hf_id).
    assert ('"num_speculative_tokens": 3' in launch_command(run, "vllm")
            and '"model": "meta-llama/Meta-Llama-3-8B"' in launch_command(run, "vllm"))
    # SGLang verifies k drafted tokens plus the one the target emits: k + 1 = 4 draft tokens per step.
    sglang = launch_command(run, "sglang")
    assert "--speculative-num-steps 3" in sglang and "--speculative-num-draft-tokens 4" in sglang


def test_save_result_of_a_closed_loop_with_warm_up_lists_only_the_scored_requests(tmp_path):
    # 42 scored requests after 7 warm-up ones, one client: the per-request lists hold 42 entries (the warm-ups are
    # sent but not scored, as vLLM's benchmark leaves them out), and max_concurrency is the run's.
    out = tmp_path / "r.json"
    args = ["--model", "mistral-7b", "--gpu", "l4", "--ctx", "64", "--gen", "24", "--requests", "42",
            "--max-concurrency", "1", "--warmup-requests", "7", "--client-path", "off", "--save-result", str(out),
            "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["num_prompts"] == 42 and data["completed"] == 42
    assert len(data["input_lens"]) == len(data["output_lens"]) == len(data["ttfts"]) == 42
    assert data["input_lens"] == [64 - 24] * 42 and data["output_lens"] == [24] * 42
    assert data["max_concurrency"] == 1
