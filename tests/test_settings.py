"""The settings model: one definition of every run setting, checked once, shared by CLI, API and scenarios."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.errors import InputError
from simulator.plan.settings import RunSettings, field_flag, parse_settings

BASE = {"model": "llama2-7b", "gpu": "a100"}


def parse(**values):
    return parse_settings(RunSettings, {**BASE, **values}, field_flag)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"batch": 0}, "--batch: must be >= 1 (got 0)"),
        ({"batch": True}, "--batch: expected a number, got True"),
        ({"batch": 2.5}, "--batch: expected an integer, got 2.5"),
        ({"launch_overhead": math.inf}, "--launch-overhead: must be a finite number"),
        ({"compute_efficiency": 1e-320}, "--compute-efficiency: must be >= 0.001"),
        ({"seed": -1}, "--seed: must be >= 0 (got -1)"),
        ({"qps": 1e-320}, "--qps: must be >= 0.000001"),
        ({"requests": 2**63}, "--requests: must be <= 134217728"),
        ({"requests": 3_000_000_000}, "--requests: must be <= 134217728"),
        ({"kv_blocks": 10**20}, "--kv-blocks: must be <= 1099511627776"),
        ({"burstiness": math.inf}, "--burstiness: must be a finite number"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization: must be <= 1"),
        ({"kv": "fp4"}, "--kv: must be 'fp16', 'bf16', 'fp8' or 'int8' (got 'fp4')"),
        ({"attention": "xqa"}, "--attention: unknown variant 'xqa'"),
        ({"gen": 5000}, "gen: 5000 output tokens leave no prompt within ctx 2048"),
        ({"batxh": 3}, "--batxh: unknown setting (did you mean 'batch'?)"),
        ({"qps": 2.0, "batch": 4}, "--batch: sizes a closed batch at t=0"),
        ({"requests": 5, "batch": 4}, "--requests: 5 and batch 4 both size the closed batch"),
        ({"arrival": "gamma"}, "--arrival: gamma arrivals need qps"),
        ({"goodput": "ttft:abc"}, "goodput: 'ttft:abc': 'abc' is not a number of milliseconds"),
        ({"goodput": "latency:5"}, "goodput: cannot read 'latency:5'"),
    ],
)
def test_every_bad_value_is_one_error_naming_the_setting(values, message):
    with pytest.raises(InputError) as info:
        parse(**values)
    assert message in str(info.value)


def test_vllm_spellings_mean_the_same_as_ours():
    ours = parse(prompt_tokens=1024, output_tokens=128, requests=2000, qps=10, max_batched_tokens=4096,
                 tp=2, kv="fp8", scheduler="chunked", slo_ttft=0.5, slo_tpot=0.05)
    vllm = parse(input_len=1024, output_len=128, num_prompts=2000, request_rate=10, max_num_batched_tokens=4096,
                 tensor_parallel_size=2, kv_cache_dtype="fp8_e4m3", enable_chunked_prefill=True,
                 goodput=["ttft:500", "tpot:50"])
    assert vllm == ours
    # Fixed prompt and output lengths plan the deployment for what the requests reach: 1024 + 128 = 1152.
    assert (ours.ctx, ours.gen) == (1152, 128)
    # goodput is in milliseconds: 500 ms = 0.5 s, 50 ms = 0.05 s.
    assert (vllm.slo_ttft, vllm.slo_tpot) == (0.5, 0.05)


def test_request_rate_inf_is_every_request_at_t0():
    settings = parse(request_rate=math.inf, num_prompts=8)
    assert settings.qps is None and settings.closed_batch_size == 8


def test_an_alias_and_its_field_disagreeing_is_an_error():
    with pytest.raises(InputError, match="num_prompts: sets requests to 3, but requests is also given as 4"):
        parse(num_prompts=3, requests=4)


def test_request_rate_inf_with_a_qps_is_a_contradiction_and_a_rate_must_be_one():
    # inf is no rate (every request at t = 0): with qps 5 the two say different things, as 3 and 5 would
    with pytest.raises(InputError, match="request_rate: inf sends every request at t = 0, but qps is also given"):
        parse(request_rate=math.inf, qps=5)
    for bad in ("abc", math.nan, 0, -1, True):
        with pytest.raises(InputError, match="request_rate: expected requests/s > 0 or inf"):
            parse(request_rate=bad)


def test_every_setting_has_a_cli_option_and_every_cli_option_a_setting():
    params = {p.name for p in main.params}
    presentation = {"top", "as_json", "as_csv", "result_format", "save_result", "metric_percentiles",
                    "percentile_metrics", "launch_command", "per_request", "quiet", "records", "version", "deploy", "html_path"}
    vllm_only = {"request_rate", "kv_cache_dtype", "enable_chunked_prefill", "goodput"}
    assert set(RunSettings.model_fields) == params - presentation - vllm_only


def test_cli_synonyms_give_the_same_run():
    runner = CliRunner()
    common = ["--model", "llama2-7b", "--gpu", "a100", "--json", "-q"]
    ours = runner.invoke(main, common + ["--requests", "6", "--qps", "3", "--prompt-tokens", "200", "--output-tokens", "20"])
    theirs = runner.invoke(main, common + ["--num-prompts", "6", "--request-rate", "3", "--input-len", "200", "--output-len", "20"])
    assert ours.exit_code == 0 and theirs.exit_code == 0, ours.output + theirs.output
    a, b = json.loads(ours.output), json.loads(theirs.output)
    assert a == b
    # 6 requests of 200 prompt tokens: 1,200 input tokens; of 20 output tokens: 120 generated.
    assert a["requests"]["completed"] == 6
    assert a["workload"]["prompt_tokens_mean"] == 200 and a["workload"]["output_tokens_mean"] == 20


def test_json_and_csv_together_is_an_error():
    result = CliRunner().invoke(main, ["--model", "llama2-7b", "--gpu", "a100", "--json", "--csv"])
    assert result.exit_code == 2 and "--json and --csv: choose one" in result.output


def test_trace_window_replays_the_arrivals_inside_it():
    from simulator.plan.engine_run import prepare

    # tests/data/azure_trace_small.csv arrives at 46.68059, 46.981, 47.18059, 48.68059, 49.0, 50.68059 s past
    # 18:15; from the first arrival: 0, 0.30041, 0.5, 2.0, 2.31941, 4.0 s. The window [0.4, 2.4) s holds the
    # 3rd, 4th and 5th requests, rebased to the window start: 0.1, 1.6, 1.91941 s.
    prep = prepare({**BASE, "trace": "tests/data/azure_trace_small.csv", "trace_start": 0.4, "trace_duration": 2.0})
    assert prep.workload.prompt_tokens.tolist() == [879, 91, 1200]
    assert prep.workload.arrival_seconds.tolist() == pytest.approx([0.1, 1.6, 1.91941], abs=1e-6)


def test_trace_window_settings_need_a_trace():
    with pytest.raises(InputError, match="--trace-start: applies only with trace|trace_start: applies only with trace"):
        parse(trace_start=5.0)


def test_options_without_model_and_gpu_are_an_error_not_help():
    runner = CliRunner()
    assert runner.invoke(main, []).exit_code == 0  # bare `simulate` shows its help
    result = runner.invoke(main, ["--json"])
    assert result.exit_code == 2 and "--model and --gpu are required" in result.output


def test_an_open_ended_trace_window_prints_no_infinity():
    result = CliRunner().invoke(main, ["--model", "llama2-7b", "--gpu", "a100", "--trace", "tests/data/azure_trace_small.csv",
                                       "--trace-start", "0.01", "-q"])
    assert result.exit_code == 0, result.output
    assert "window from 0.01 s to the end" in result.output and "inf" not in result.output
