"""What the independent fuzzer of issue 37 (item 6) found, each fixed at its root, one case per finding.

Bad input is one line on stderr and exit code 2 (an InputError), checked before any work.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import yaml
from click.testing import CliRunner

from simulator.cli import main
from simulator.cost.speculation import expected_tokens_per_iteration, parse_acceptance
from simulator.errors import InputError
from simulator.files import is_file, path_kind
from simulator.model.hf_config import MAX_LAYERS, from_hf_config
from simulator.sweep.scenario import load_scenario
from simulator.validation.user_benchmark import BenchmarkSetup, rows_from_serving, rows_from_throughput

LONG = "a" * 300  # one path component over the 255 bytes Linux file systems allow (ENAMETOOLONG)


def one_error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    message = result.output.strip()
    assert message.startswith("Error: ") and "\n" not in message, message
    return message


# ---- names over 255 bytes: one reader for every path-like option --------------------------------


def test_a_name_the_file_system_refuses_is_an_input_error_not_an_os_error(tmp_path):
    assert path_kind(tmp_path / "missing.csv") is None
    assert path_kind(tmp_path) == "folder"
    assert path_kind("with\x00nul") is None
    with pytest.raises(InputError) as exc:
        is_file(tmp_path / LONG, "--trace")
    # the path is cut to 60 characters and its length given, so the line stays readable
    assert str(exc.value) == f"--trace: cannot use '{str(tmp_path / LONG)[:60]}...({len(str(tmp_path / LONG))} characters)': File name too long"


@pytest.mark.parametrize("args, expected", [
    (["--model", LONG, "--gpu", "h100"], f"Error: --model: unknown model '{LONG}'"),
    (["--model", "llama3-8b", "--gpu", "h100", "--speculative", f"draft:{LONG}", "--acceptance", "0.7",
      "--num-speculative-tokens", "3"], f"Error: --speculative draft:{LONG}: unknown model '{LONG}'"),
    (["--model", "llama3-8b", "--gpu", "h100", "--trace", LONG], "Error: --trace: cannot use 'aaaa"),
    (["--model", f"/tmp/{LONG}.yaml", "--gpu", "h100"], "Error: --model: cannot use '/tmp/aaaa"),
    (["--model", "llama3-8b", "--gpu", "h100", "--engine", f"{LONG}.yaml"], "Error: --engine: cannot use 'aaaa"),
])
def test_long_names_on_the_command_line(args, expected):
    assert one_error_line([*args, "--quiet"]).startswith(expected)


def test_a_long_model_name_in_a_scenario_and_in_calibrate(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"base": {"model": LONG, "gpu": "h100"}, "sweep": {"grid": {"batch": [1]}}}),
                        encoding="utf-8")
    assert one_error_line(["sweep", str(scenario)]).startswith(f"Error: {scenario}: base.model: unknown model '{LONG}'")
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps(_serving()), encoding="utf-8")
    message = one_error_line(["calibrate", "--from-benchmark", str(bench), "--model", LONG, "--base", "h100"])
    assert message.startswith(f"Error: --model: unknown model '{LONG}'")


# ---- calibrate --from-benchmark: every field checked --------------------------------------------


def _serving() -> dict:
    return {"completed": 3, "request_rate": "inf", "total_input_tokens": 600, "total_output_tokens": 60,
            "input_lens": [100, 200, 300], "output_lens": [10, 20, 30], "mean_ttft_ms": 25.0, "mean_tpot_ms": 8.0}


@pytest.mark.parametrize("change, field, shown, allowed", [
    ({"input_lens": ["inf", 200, 300]}, "input_lens[0]", "'inf'", "a whole number in [0, 10000000]"),
    ({"input_lens": [100, None, 300]}, "input_lens[1]", "None", "a whole number in [0, 10000000]"),
    ({"output_lens": [10, 20, [30]]}, "output_lens[2]", "a list", "a whole number in [0, 10000000]"),
    ({"completed": "inf"}, "completed", "'inf'", "a finite whole number in [1, 10000000]"),
    ({"completed": 2.5}, "completed", "2.5", "a finite whole number in [1, 10000000]"),
    # without per-request lengths the totals are read; 3 requests x 10^7 tokens = 30000000 at most
    ({"input_lens": None, "total_input_tokens": "inf"}, "total_input_tokens", "'inf'", "a finite whole number in [0, 30000000]"),
    ({"max_concurrency": "abc"}, "max_concurrency", "'abc'", "a finite whole number in [1, 1000000]"),
    ({"max_concurrency": {}}, "max_concurrency", "a dict", "a finite whole number in [1, 1000000]"),
    ({"mean_ttft_ms": "inf"}, "mean_ttft_ms", "'inf'", "a finite number >= 0"),
    ({"request_rate": -1}, "request_rate", "-1", 'a finite number >= 1e-09 or "inf"'),
])
def test_a_serving_result_field_out_of_range_names_file_field_value_and_what_is_allowed(tmp_path, change, field, shown, allowed):
    path = tmp_path / "run.json"
    with pytest.raises(InputError) as exc:
        rows_from_serving({**_serving(), **change}, path, BenchmarkSetup("llama3-8b", "h100"), tmp_path)
    assert str(exc.value) == f"--from-benchmark: {path}: '{field}' is {shown}; allowed: {allowed}"


def test_a_closed_loop_serving_result_keeps_its_concurrency(tmp_path):
    rows = rows_from_serving({**_serving(), "max_concurrency": 4}, tmp_path / "run.json", BenchmarkSetup("llama3-8b", "h100"), tmp_path)
    # a closed loop keeps TPOT only (its TTFT holds the client's wait): the one mean_tpot_ms row, 8 ms
    assert [(r.metric, r.measured, r.max_num_seqs) for r in rows] == [("tpot_mean_seconds", 0.008, 4)]


def test_a_throughput_result_with_an_infinite_request_count_is_refused(tmp_path):
    path = tmp_path / "t.json"
    data = {"num_requests": "inf", "requests_per_second": 10.0, "tokens_per_second": 3000.0}
    with pytest.raises(InputError) as exc:
        rows_from_throughput(data, path, BenchmarkSetup("llama3-8b", "h100", input_tokens=200, output_tokens=100))
    assert str(exc.value) == f"--from-benchmark: {path}: 'num_requests' is 'inf'; allowed: a finite whole number in [1, 10000000]"


def test_the_cli_reports_a_bad_benchmark_field_in_one_line(tmp_path):
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps({**_serving(), "input_lens": ["inf", 1, 2]}), encoding="utf-8")
    message = one_error_line(["calibrate", "--from-benchmark", str(bench), "--model", "llama3-8b", "--base", "h100"])
    assert message == f"Error: --from-benchmark: {bench}: 'input_lens[0]' is 'inf'; allowed: a whole number in [0, 10000000]"


# ---- HF configs: the layer count is bounded before any per-layer list is built ------------------


def _llama(**extra) -> dict:
    return {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
            "intermediate_size": 11008, "vocab_size": 32000, **extra}


@pytest.mark.parametrize("extra", [
    {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096},
    {"num_local_experts": 8, "moe_layer_freq": 2},
    {"model_type": "llama4_text", "attention_chunk_size": 8192},
])
def test_a_billion_layers_is_refused_before_a_per_layer_list_is_built(extra):
    with pytest.raises(InputError) as exc:
        from_hf_config(_llama(**{**extra, "num_hidden_layers": 10**9}), "big")
    assert str(exc.value) == f"big: num_hidden_layers is 1000000000; allowed: a whole number of layers in [1, {MAX_LAYERS}]"


def test_a_per_layer_list_longer_than_the_bound_is_refused():
    with pytest.raises(InputError) as exc:
        from_hf_config(_llama(layer_types=["full_attention"] * (MAX_LAYERS + 1)), "long")
    assert str(exc.value) == f"long: layer_types has {MAX_LAYERS + 1} entries; allowed: at most {MAX_LAYERS}, one per layer"


def test_the_largest_allowed_layer_count_still_maps():
    # Qwen2 with use_sliding_window: layers >= max_window_layers (0 here) slide, so all 4096 do
    spec = from_hf_config(_llama(model_type="qwen2", use_sliding_window=True, sliding_window=4096,
                                 num_hidden_layers=MAX_LAYERS), "edge")
    assert spec["layer_types"] == ["sliding"] * 4096


# ---- --acceptance: at most 64 rates, as --num-speculative-tokens --------------------------------


def test_an_acceptance_list_is_bounded_like_num_speculative_tokens():
    with pytest.raises(InputError, match=r"^--acceptance: 1000 per-position rates; allowed: one rate, or at most 64"):
        parse_acceptance(",".join(["0.5"] * 1000))
    rates = parse_acceptance(",".join(["0.5"] * 64))
    # E = 1 + sum_{j=1..64} 0.5^j = 2 - 0.5^64
    assert expected_tokens_per_iteration(rates) == pytest.approx(2 - 0.5**64, rel=1e-12)
    message = one_error_line(["--model", "llama3-8b", "--gpu", "h100", "--speculative", "eagle", "--acceptance",
                              ",".join(["0.7"] * 1000), "--quiet"])
    assert message.startswith("Error: --acceptance: 1000 per-position rates")


# ---- scenario files take the vLLM spellings the CLI takes ---------------------------------------


def _scenario(tmp_path, base: dict, grid: dict):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"base": {"model": "llama2-7b", "gpu": "a100", **base}, "sweep": {"grid": grid},
                                    "output": {"path": str(tmp_path / "out.csv")}}), encoding="utf-8")
    return path


def test_a_scenario_takes_vllm_spellings_as_the_cli_does(tmp_path):
    path = _scenario(tmp_path, {"enable_prefix_caching": True, "pipeline_parallel_size": 1, "num_prompts": 10,
                                "request_rate": 4.0, "goodput": "ttft:500 tpot:50"}, {"tensor_parallel_size": [1, 2]})
    scenario = load_scenario(path)
    # goodput's milliseconds become seconds: 500 ms -> 0.5 s, 50 ms -> 0.05 s
    assert scenario.base == {"model": "llama2-7b", "gpu": "a100", "prefix_caching": True, "pp": 1, "requests": 10,
                             "qps": 4.0, "slo_ttft": 0.5, "slo_tpot": 0.05}
    assert [(axis.name, axis.values) for axis in scenario.grid] == [("tp", (1, 2))]


@pytest.mark.parametrize("base, grid, expected", [
    ({"tp": 1, "tensor_parallel_size": 2}, {"batch": [1]}, "base.tensor_parallel_size: sets tp, which base also sets; give one of them"),
    ({"request_rate": "abc"}, {"batch": [1]}, "base.request_rate: cannot read 'abc' as vLLM's request_rate"),
    ({}, {"enable_chunked_prefill": [True, False]},
     "sweep.grid.enable_chunked_prefill[1]: False does not set one setting; sweep the setting it stands for (none for this value)"),
    ({}, {"tensor_parallel_sise": [1]}, "sweep.grid.tensor_parallel_sise: unknown option 'tensor_parallel_sise' (did you mean"),
])
def test_a_vllm_spelling_in_a_scenario_is_checked_like_any_option(tmp_path, base, grid, expected):
    path = _scenario(tmp_path, base, grid)
    with pytest.raises(InputError) as exc:
        load_scenario(path)
    assert str(exc.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(exc.value)


def test_an_infinite_request_rate_in_a_scenario_is_a_closed_batch(tmp_path):
    # vLLM's --request-rate inf sends every request at t=0: no qps, as on the CLI
    scenario = load_scenario(_scenario(tmp_path, {"request_rate": math.inf}, {"batch": [1]}))
    assert "qps" not in scenario.base


# ---- the long profile's own findings (MEMWALL_FUZZ=long, 33,084 cases) ---------------------------------------------


def test_a_tiny_model_explained_with_measured_kernels_has_finite_times(tmp_path):
    # 2 layers, hidden 256, 4 heads over 2 KV heads (head dim 64): a shape H200's measured attention tables do not
    # hold near its edge. At commit 2bb12b9 its decode step came out NaN and the engine stopped with
    # "cannot convert float NaN to integer"; every time must be a finite number of seconds.
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
                                     "num_kv_heads": 2, "ffn_size": 512, "vocab_size": 1000, "max_context": 4096}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an inf - inf inside the engine fails the run here
        result = CliRunner().invoke(main, ["explain", "--model", str(model), "--gpu", "h200", "--batch", "8", "--ctx",
                                           "382", "--gen", "11", "--kernels", "auto", "--collectives", "nccl", "--json"])
    assert result.exit_code == 0, result.output
    assert "nan" not in result.output.lower()

    def numbers(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from numbers(v)
        elif isinstance(value, list):
            for v in value:
                yield from numbers(v)
        elif isinstance(value, float):
            yield value

    assert all(math.isfinite(x) for x in numbers(json.loads(result.output)))


def test_a_closed_loop_with_warm_up_saves_a_vllm_result(tmp_path):
    # --save-result listed the warm-up requests' lengths beside the scored requests' times (IndexError).
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["--model", "mistral-7b", "--gpu", "l4", "--ctx", "64", "--gen", "24",
                                       "--requests", "42", "--max-concurrency", "1", "--warmup-requests", "7",
                                       "--client-path", "off", "--save-result", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["input_lens"]) == 42


def test_a_speculative_verification_step_with_a_prefill_is_finite_on_measured_attention(tmp_path):
    # explain's speculative lever on that model: a mixed step of one 371-token prefill and one sequence verifying
    # k + 1 = 2 tokens has decode tokens (2) equal to its sequences (2), so "sequences - decode tokens" left no
    # prefilling sequence and its chunk was 371 / 1e-300 tokens: the step took inf seconds and the run printed
    # "completed 8 of 8 in inf s" with NaN percentiles. Every time must be finite.
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
                                     "num_kv_heads": 2, "ffn_size": 512, "vocab_size": 1000, "max_context": 4096}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = CliRunner().invoke(main, ["--model", str(model), "--gpu", "h200", "--batch", "8", "--ctx", "382",
                                           "--gen", "11", "--kernels", "auto", "--speculative", "eagle",
                                           "--num-speculative-tokens", "1", "--acceptance", "0.85", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for metric in ("ttft_seconds", "tpot_seconds", "e2e_seconds"):
        assert all(math.isfinite(v) and v > 0 for v in data["latency"][metric].values()), metric


def test_a_closed_loop_with_warm_ups_that_waits_for_kv_blocks_is_reported_on_its_scored_requests():
    # The long fuzz profile's one traceback: a closed loop of 8 clients sending 30 scored requests after 6 warm-ups
    # on a V100 whose cache holds 4,304 tokens. The KV-wait note took the arrivals of all 36 requests against the
    # 30 scored ones' admissions: "operands could not be broadcast together with shapes (30,) (36,)".
    args = ["--model", "llama2-13b", "--gpu", "v100", "--ctx", "645", "--gen", "14", "--requests", "30",
            "--max-concurrency", "8", "--warmup-requests", "6", "--client-path", "off"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    # The note counts the 30 scored requests and their demand: 30 x (631 + 14 - 1) = 19,320 tokens.
    assert "of 30 requests waited for free KV blocks" in result.output
    assert "the requests reach 19,320 in total" in result.output
