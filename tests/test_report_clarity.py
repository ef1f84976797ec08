"""Issue 36: every number of the report says what it is (batch, context, what an average is over, which sign of an
error band is the simulator too fast), comparisons say when a setting moved, launch commands serve the checkpoint
by its Hugging Face id and name every process of the deployment, and the API speaks in its own words.

Expected values are worked out by hand here or read from another part of the output (``simulate layers``, the
shipped config files, the per-request CSV), never pasted from the code under test.
"""

from __future__ import annotations

import csv
import json
import re
import typing

import pytest
import yaml
from click.testing import CliRunner

import simulator
from simulator.cli import main
from simulator.model.registry import config_files
from simulator.plan.error_bands import band_reading, band_text
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings
from simulator.report.run_report import write_per_request_csv
from simulator.report.vllm_format import launch_command

CARD = ["--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096"]


def invoke(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def card_text() -> str:
    return invoke([*CARD, "-q"])


@pytest.fixture(scope="module")
def card_json() -> dict:
    return json.loads(invoke([*CARD, "--json", "-q"]))


def _ms(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"ms": 1.0, "s": 1e3, "us": 1e-3}[unit]


# -- 1. decode steps and operator tables name their batch and context --------------------------------------------


def test_the_planned_decode_step_names_its_batch_and_context_and_matches_simulate_layers(card_text):
    line = next(line for line in card_text.splitlines() if "(the planned batch)" in line)
    # The card plans 64 sequences of 4,096 tokens (--batch 64 --ctx 4096).
    match = re.fullmatch(r"  decode step  of 64 sequences at 4,096 tokens \(the planned batch\): (\S+ \S+)", line)
    assert match, line
    # The same step through another command: `simulate layers` at the card's shape and TP (4, the report's setup).
    assert "tensor parallel 4" in card_text
    layers = invoke(["layers", "--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096",
                     "--phase", "decode", "--tp", "4"])
    step = re.search(r"step time (\S+ \S+),", layers)
    assert step is not None and _ms(match.group(1)) == pytest.approx(_ms(step.group(1)), abs=0.01)


def test_first_and_last_decode_steps_and_the_operator_table_name_their_batch(card_text):
    # The last request of the chunked card decodes alone; its last decode step feeds output token 127, at position
    # 3,968 + 126, so it attends 3,968 + 127 = 4,095 keys.
    assert "; last, 1 sequence at 4,095 tokens: " in card_text
    assert "first decode-only step, 64 sequences at " in card_text  # every request is decoding once prefills end
    assert "Top operators, last decode step: 1 sequence at 4,095 tokens (" in card_text
    # The first prefill iteration is one 2,048-token chunk (the chunked scheduler's budget) of request 0.
    assert "Top operators, first prefill iteration: 1 sequence at 2,048 tokens, 2,048 of them prefill tokens" in card_text


# -- 1. JSON keys say what they average ----------------------------------------------------------------------------


def test_decode_only_flops_are_a_batch_64_step_where_nothing_mixes():
    data = json.loads(invoke([*CARD, "--json", "-q", "--scheduler", "continuous"]))["decode"]
    # No mixed iteration under the continuous scheduler: every decode step is a batch of up to 64 decode tokens.
    assert data["mixed_iterations"] == 0 and data["mixed_decode_token_share"] == 0.0
    # ~2 FLOPs per weight (less the embedding table, a lookup) per token, plus attention over ~4,032 keys:
    per_token = 2 * 68_976_648_192 - 2 * 32000 * 8192 + 4 * 64 * 128 * 80 * 4032
    assert data["flops_per_decode_only_step"] == pytest.approx(64 * per_token, rel=0.01)
    assert data["flops_per_decode_only_step"] == pytest.approx(data["flops_per_step"])
    assert data["planned_step"]["sequences"] == 64 and data["planned_step"]["context_tokens_per_sequence"] == 4096


def test_flops_per_step_averages_mixed_iterations_and_the_new_keys_do_not(card_json):
    decode = card_json["decode"]
    per_token = 2 * 68_976_648_192 - 2 * 32000 * 8192 + 4 * 64 * 128 * 80 * 4032
    # A decode-only step holds at most 64 sequences: its FLOPs are at most a full batch's.
    assert 0 < decode["flops_per_decode_only_step"] <= 64 * per_token * 1.01
    # A 2,048-token prefill chunk alone is ~2,048 x 2 x params: mixing it in lifts flops_per_step far above.
    assert decode["flops_per_step"] > 10 * decode["flops_per_decode_only_step"]
    assert decode["steps"] == decode["decode_only_steps"] + decode["mixed_iterations"]
    # Every request decodes 127 of its 128 tokens (the first comes from its prefill): 64 x 127 sequence decodes.
    assert decode["decode_tokens"] == 64 * 127
    assert decode["mixed_decode_token_share"] == pytest.approx(decode["mixed_decode_tokens"] / (64 * 127))
    assert decode["first_step"]["sequences"] == 64 and decode["last_step"] == {
        "sequences": 1, "prefill_tokens": 0, "context_tokens_per_sequence": 4095.0}


# -- 1. TPOT against ITL ---------------------------------------------------------------------------------------


def test_tpot_itl_line_explains_mixed_iterations_under_chunked_prefill(card_text, card_json):
    line = next(line for line in card_text.splitlines() if line.startswith("  TPOT vs ITL  "))
    share = card_json["decode"]["mixed_decode_tokens"] / (64 * 127)
    assert f"{100 * share:.0f}% of decode tokens rode in {card_json['decode']['mixed_iterations']:,} mixed iterations" in line
    assert "up to 2,048 tokens of prefill each, chunked scheduler" in line
    # Both durations come from the iteration log; the decode-only one is the mean of the steps the first/last lines
    # bracket (1 to 64 sequences).
    first, last = card_json["decode"]["first_step_seconds"], card_json["decode"]["last_step_seconds"]
    assert last <= card_json["decode"]["decode_only_step_seconds_mean"] <= first
    # TPOT well above the decode step is what the line explains: the mean TPOT sits between the two kinds.
    tpot = card_json["latency"]["tpot_seconds"]["mean"]
    assert card_json["decode"]["decode_only_step_seconds_mean"] < tpot < card_json["decode"]["mixed_iteration_seconds_mean"]


def test_no_tpot_itl_line_for_one_request_under_the_continuous_scheduler():
    text = invoke(["--model", "llama2-70b", "--gpu", "a100", "--batch", "1", "--ctx", "4096",
                   "--scheduler", "continuous", "-q"])
    assert "TPOT vs ITL" not in text
    assert "decode step  of 1 sequence at 4,096 tokens (the planned batch)" in text


# -- 1. error bands read one way ------------------------------------------------------------------------------------


def test_error_bands_say_which_sign_is_too_fast():
    # A time predicted 46% below the measurement promised more speed than was measured: too fast.
    assert band_reading(-0.46, 0.19, "ttft") == \
        "the prediction ran 46% below (too fast) to 19% above (too slow) the measurement"
    # A rate predicted above the measurement is the simulator too fast.
    assert band_reading(-0.21, 0.14, "throughput") == \
        "the prediction ran 21% below (too slow) to 14% above (too fast) the measurement"
    band = {"low": -0.1, "high": 0.3, "rows": 12, "metric_kind": "tpot", "quantiles": [0.1, 0.9]}
    assert band_text(band) == ("the prediction ran 10% below (too fast) to 30% above (too slow) the measurement "
                               "(10th-90th percentile, 12 validation rows)")


def test_the_report_prints_bands_with_their_direction(card_text, card_json):
    section = card_text[card_text.index("\nTypical error"):].splitlines()
    for label, kind in (("TTFT", "ttft"), ("throughput", "throughput")):
        band = card_json["error_band"][kind]
        line = next(line for line in section if line.startswith(f"  {label:<12} "))
        if band["low"] is None:
            assert "no error band" in line
        else:
            assert f"{abs(100 * band['low']):.0f}% below" in line and f"{band['rows']} validation rows" in line
            assert "(too fast)" in line and "(too slow)" in line


# -- 2. comparisons are like for like --------------------------------------------------------------------------------


def _precision_scenario(tmp_path, tp: int | None) -> str:
    base = {"model": "llama3-8b", "gpu": "l4", "batch": 32, "ctx": 2048, "gen": 32}
    if tp is not None:
        base["tp"] = tp
    path = tmp_path / f"precision-{tp}.yaml"
    path.write_text(yaml.safe_dump({"name": "precision-l4", "base": base,
                                    "sweep": {"grid": {"weights": ["fp16", "fp8", "int4"]}}}))
    return str(path)


def test_a_precision_sweep_says_loudly_that_fp16_moved_to_more_gpus(tmp_path):
    # Llama-3-8B: 8.03 G parameters; KV 2 x 32 layers x 8 heads x 128 x 2 bytes = 131,072 B/token, so 32 x 2,048
    # tokens hold 8 GiB. fp16 weights are 16.1 GB = 15.0 GiB: with 8 GiB of KV more than 0.9 of an L4's 24 GB, so
    # the planner takes TP 2; fp8 (7.5 GiB) and int4 (~4 GiB) hold the batch on one L4.
    out = invoke(["sweep", _precision_scenario(tmp_path, None), "--workers", "1", "--out", str(tmp_path / "a.csv")])
    warning = next(line for line in out.splitlines() if line.startswith("  WARNING  "))
    assert "tp 2 at point 0 (weights=fp16)" in warning
    assert "tp 1 at points 1, 2 (weights=fp8; weights=int4)" in warning
    assert "Set base.tp" in warning
    with open(tmp_path / "a.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["tp"] for row in rows] == ["2", "1", "1"]


def test_a_precision_sweep_at_a_fixed_tp_has_no_warning(tmp_path):
    out = invoke(["sweep", _precision_scenario(tmp_path, 2), "--workers", "1", "--out", str(tmp_path / "b.csv")])
    assert "WARNING" not in out
    with open(tmp_path / "b.csv") as handle:
        assert {row["tp"] for row in csv.DictReader(handle)} == {"2"}


# -- 3. launch commands ----------------------------------------------------------------------------------------------


def _hf_id(name: str) -> str | None:
    path = next(p for p in config_files("models") if p.stem == name)
    return yaml.safe_load(path.read_text()).get("hf_id")


def test_launch_command_serves_the_hugging_face_id_from_the_config():
    assert _hf_id("llama2-70b") == "meta-llama/Llama-2-70b-hf"  # the config.json its YAML names as its source
    run = simulate_settings({"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096})
    assert launch_command(run, "vllm").startswith("vllm serve meta-llama/Llama-2-70b-hf \\\n")
    assert "--model-path meta-llama/Llama-2-70b-hf" in launch_command(run, "sglang")


def test_launch_command_without_a_known_id_says_so():
    assert _hf_id("gpt3-175b") is None  # GPT-3 has no public checkpoint
    run = simulate_settings({"model": "gpt3-175b", "gpu": "h100", "batch": 1, "ctx": 1024})
    command = launch_command(run, "vllm")
    assert command.startswith("# no Hugging Face id is known for gpt3-175b")
    assert "\nvllm serve gpt3-175b \\\n" in command


def test_a_disaggregated_deployment_prints_every_worker_and_the_router():
    run = simulate_settings({"model": "llama3-8b", "gpu": "h100", "qps": 4, "requests": 40, "disaggregate": "1:3"})
    command = launch_command(run, "vllm")
    served = _hf_id("llama3-8b")
    # 1 prefill and 3 decode workers, each serving the checkpoint with its KV-transfer role (vLLM's NixlConnector).
    assert command.count(f"vllm serve {served} --port ") == 4
    assert command.count('"kv_role":"kv_producer"') == 1 and command.count('"kv_role":"kv_consumer"') == 3
    ports = re.findall(r"vllm serve \S+ --port (\d+)", command)
    sides = re.findall(r"VLLM_NIXL_SIDE_CHANNEL_PORT=(\d+)", command)
    assert len(set(ports)) == 4 and len(set(sides)) == 4  # one host can hold them all (4 of its 8 GPUs)
    router = command[command.index("vllm-router"):]
    assert "--vllm-pd-disaggregation" in router
    assert re.findall(r"--prefill http://localhost:(\d+)", router) == ports[:1]
    assert re.findall(r"--decode http://localhost:(\d+)", router) == ports[1:]
    sglang = launch_command(run, "sglang")
    assert sglang.count("--disaggregation-mode prefill") == 1 and sglang.count("--disaggregation-mode decode") == 3
    assert "sglang_router.launch_router --pd-disaggregation" in sglang


def test_replicas_print_one_server_each_and_a_router():
    run = simulate_settings({"model": "llama3-8b", "gpu": "h100", "qps": 4, "requests": 40, "replicas": 2})
    command = launch_command(run, "vllm")
    assert command.count("vllm serve meta-llama/Meta-Llama-3-8B --port ") == 2
    assert "vllm-router --policy round_robin --worker-urls http://localhost:8000 http://localhost:8001" in command


@pytest.mark.parametrize("router, policy", [("round_robin", "round_robin"), ("least_outstanding", "power_of_two"),
                                            ("least_kv", "power_of_two"), ("prefix", "cache_aware")])
def test_every_router_prints_its_policy(router, policy):
    # --router prefix came after the launch commands and ended in KeyError: 'prefix' (the long fuzz profile).
    assert set(typing.get_args(RunSettings.model_fields["router"].annotation)) == {
        "round_robin", "least_outstanding", "least_kv", "prefix"}
    run = simulate_settings({"model": "llama3-8b", "gpu": "h100", "qps": 4, "requests": 20, "replicas": 2,
                             "router": router, "prefix_caching": router == "prefix"})
    for engine in ("vllm", "sglang"):
        assert f"--policy {policy} --worker-urls http://localhost:" in launch_command(run, engine)


def test_the_cli_prints_the_disaggregated_command_set():
    out = invoke(["--model", "llama3-8b", "--gpu", "h100", "--qps", "4", "--requests", "40", "--disaggregate", "1:3",
                  "--launch-command", "vllm", "-q"])
    assert out.count("vllm serve meta-llama/Meta-Llama-3-8B") == 4 and "vllm-router" in out


# -- 4. the API's words -------------------------------------------------------------------------------------------


def test_to_frame_uses_the_per_request_csv_strings(tmp_path):
    # 100 blocks of 16 tokens hold 1,600 tokens: a prompt over 1,585 tokens (+ 16 outputs - 1) cannot be held.
    options = {"model": "llama2-7b", "gpu": "a100", "batch": 20, "kv_blocks": 100,
               "prompt_tokens": "uniform:100:3000", "output_tokens": 16}
    result = simulator.simulate(**options)
    frame = result.to_frame()
    path = tmp_path / "requests.csv"
    write_per_request_csv(result.run, str(path))
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    assert frame["status"].tolist() == [row["status"] for row in rows]
    assert frame["reject_reason"].tolist() == [row["reject_reason"] for row in rows]
    prompts = frame["prompt_tokens"].tolist()
    too_long = [p + 16 - 1 > 1600 for p in prompts]
    assert any(too_long) and not all(too_long)
    assert frame["status"].tolist() == ["rejected" if gone else "done" for gone in too_long]
    assert set(frame["reject_reason"][frame["status"] == "rejected"]) == {
        "needs more KV-cache blocks than the whole cache holds"}


@pytest.mark.parametrize(("options", "setting"), [
    ({"tp": 3}, "tp"),  # checked while planning (model.parallelism)
    ({"model": "no-such-model"}, "model"),  # checked while loading configs
    ({"batch": 0}, "batch"),  # checked by the settings model
])
def test_api_errors_name_the_keyword_not_the_flag(options, setting):
    with pytest.raises(simulator.InputError) as caught:
        simulator.simulate(**{"model": "llama2-7b", "gpu": "a100", **options})
    message = str(caught.value)
    assert message.startswith(f"{setting}: ") and "--" not in message.split(";")[0]


def test_the_cli_keeps_naming_flags():
    result = CliRunner().invoke(main, ["--model", "llama2-7b", "--gpu", "a100", "--tp", "3"])
    assert result.exit_code == 2 and "--tp: 3 does not divide" in result.output


def test_an_operator_s_share_is_of_the_whole_step_even_in_a_top_few_table():
    from simulator.cost.system import System
    from simulator.model import load_gpu, load_model
    from simulator.model.precision import parse_precision
    from simulator.model.step import Step
    from simulator.report.run_report import operator_table

    system = System(load_model("llama2-7b"), load_gpu("a100"), parse_precision("fp16", "fp16"), 1)
    cost = system.step_cost(Step.decode(8, 1024))
    slowest = sorted(cost.operators, key=lambda o: float(o.seconds), reverse=True)[:2]
    lines = operator_table(cost.operators, top=2, overhead_seconds=float(cost.overhead_seconds),
                           launch_wait_seconds=float(cost.launch_wait_seconds))
    shares = [float(line.split()[-1].rstrip("%")) for line in lines[2:4]]
    step = float(cost.seconds)
    assert shares == [pytest.approx(100 * float(o.seconds) / step, abs=0.05) for o in slowest]
