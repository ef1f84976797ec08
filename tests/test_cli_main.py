"""The `simulate` command line: the card's command, JSON contract, sub-commands, bad input."""

import json

import pytest
from click.testing import CliRunner

from simulator.cli import main

# The card command. Auto TP: at tp 2, 64.2 GiB of weights + 40 GiB of KV (64 x 4096 x 327,680 B / 2) exceed
# 80 GiB per GPU; at tp 4, 32.1 + 20 GiB hold the whole batch, so tp 4 is chosen and nothing waits for blocks.
CARD = ["--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_card_command_prints_the_report():
    result = invoke(CARD)
    assert result.exit_code == 0, result.output
    for section in ("Setup", "Memory per GPU", "Latency", "TTFT", "TPOT", "Throughput", "Top operators"):
        assert section in result.output
    assert "tensor parallel 4" in result.output
    assert "327,680 bytes/token" in result.output
    assert "kernel efficiency shape, loads and MMAs in series (overlap 0)" in result.output


def test_a_host_bound_engine_shows_the_wait_for_its_launches_and_a_graph_engine_does_not():
    # TGI 1.x on 2 H100s: its launches, 51.7 us each, outlast the kernels (docs/time-model.md).
    args = ["--model", "codellama-34b", "--gpu", "h100", "--tp", "2", "--batch", "1", "--ctx", "512"]
    eager = invoke([*args, "--engine", "tgi-v1"])
    assert eager.exit_code == 0, eager.output
    assert "host launch wait" in eager.output and "waiting for the host to launch them" in eager.output
    assert "no CUDA graphs (51.7 us host launch/kernel)" in eager.output
    graphs = invoke([*args, "--engine", "vllm"])
    assert "host launch wait" not in graphs.output and "waiting for the host" not in graphs.output
    # The setup names what a step outside the graphs pays per launch: vLLM's 5 us, SGLang's 27.1 us.
    assert "CUDA graphs for all steps up to 512 tokens, other steps launched from the host at 5.0 us/kernel" in graphs.output
    sglang = invoke([*args, "--engine", "sglang"])
    assert "CUDA graphs for decode steps up to 160 tokens, other steps launched from the host at 27.1 us/kernel" in sglang.output
    wait = json.loads(invoke([*args, "--engine", "tgi-v1", "--json"]).output)["decode"]
    assert wait["last_step_launch_wait_seconds"] > 0


def test_memory_plan_names_the_requests_it_was_planned_for():
    # 300 requests queued at once, each reaching 128 + 2,048 = 2,176 tokens: the memory section is planned
    # for those 300 sequences (300 x 2,176 x 131,072 B = 79.69 GiB of KV for Llama-3.1-8B at fp16), not for
    # the default --batch 1 the command never set.
    result = invoke(["--model", "llama3.1-8b", "--gpu", "h100", "--tp", "1", "--input-len", "128",
                     "--output-len", "2048", "--num-prompts", "300", "--request-rate", "inf"])
    assert result.exit_code == 0, result.output
    assert "planned for 300 sequences x 2,176 tokens" in result.output
    assert "KV cache     79.69 GiB" in result.output


def test_card_command_json_contract():
    # Continuous batching (prefill first, no token budget) keeps every decode step a pure decode
    # of the 64 sequences, which is what the hand count of FLOPs per step below describes.
    result = invoke(CARD + ["--json", "--scheduler", "continuous"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("model", "gpu", "tp", "batch", "ctx", "gen", "precision", "memory", "prefill", "decode", "latency", "throughput"):
        assert key in data
    assert (data["model"], data["gpu"], data["tp"], data["batch"], data["ctx"], data["gen"]) == (
        "llama2-70b", "A100-SXM4-80GB", 4, 64, 4096, 128)
    assert data["precision"]["weights"] == "fp16" and data["precision"]["kv"] == "fp16"
    memory = data["memory"]
    assert memory["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert memory["kv_bytes"] == 64 * 4096 * 327_680
    assert memory["weights_bytes"] == 68_976_648_192 * 2
    assert memory["capacity_bytes"] == 4 * 80 * 2**30
    assert memory["fits"] is True
    for key in ("seconds", "flops", "bytes"):
        assert data["prefill"][key] > 0
    for key in ("first_step_seconds", "last_step_seconds", "flops_per_step", "bytes_per_step"):
        assert data["decode"][key] > 0
    # Decode FLOPs per step: ~2 FLOPs per parameter per token (64 tokens) plus attention over ~4032 keys.
    per_token = 2 * 68_976_648_192 - 2 * 32000 * 8192 + 4 * 64 * 128 * 80 * 4032
    assert data["decode"]["flops_per_step"] == pytest.approx(64 * per_token, rel=0.01)
    # The runs' shape model charges a kernel's loads and its MMAs in series (efficiency.overlap 0).
    assert data["time_model"]["kernel_efficiency"] == "shape" and data["time_model"]["overlap"] == 0.0
    assert data["throughput"]["output_tokens_per_second"] > 0
    assert data["throughput"]["total_tokens_per_second"] == pytest.approx(
        data["throughput"]["output_tokens_per_second"] * 4096 / 128)


def test_csv_output_is_one_header_and_one_row():
    result = invoke(CARD + ["--csv"])
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    header = lines[0].split(",")
    assert "memory.kv_bytes_per_token" in header
    assert lines[1].split(",")[header.index("memory.kv_bytes_per_token")] == "327680.0"


def test_layers_json_lists_operators_with_roofline_fields():
    result = invoke(["layers", "--model", "llama2-7b", "--gpu", "a100", "--batch", "1", "--ctx", "1024", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    names = [r["name"] for r in rows]
    assert names[0] == "embedding" and names[-1] == "lm_head"
    assert {"qkv_proj", "attention", "o_proj", "gate_up_proj", "down_proj"} <= set(names)
    for row in rows:
        assert {"name", "flops", "bytes", "intensity", "bound", "seconds"} <= set(row)
    qkv = rows[names.index("qkv_proj")]
    assert qkv["flops"] == 32 * 2 * 4096 * 3 * 4096
    assert qkv["bound"] == "memory"


def test_layers_prefill_phase_is_compute_bound_for_big_gemms():
    result = invoke(["layers", "--model", "llama2-7b", "--gpu", "a100", "--batch", "1", "--ctx", "2048",
                     "--gen", "1024", "--phase", "prefill", "--json"])
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["gate_up_proj"]["bound"] == "compute"
    assert rows["gate_up_proj"]["flops"] == 32 * 2 * 1024 * 4096 * 2 * 11008


def test_gpus_json_has_peaks_and_memory():
    data = json.loads(invoke(["gpus", "--json"]).output)
    a100 = next(g for g in data if g["name"] == "A100-SXM4-80GB")
    assert "a100" in a100["aliases"]
    assert a100["peak_flops"]["fp16"] == 312e12
    assert a100["hbm_bandwidth_bytes_per_second"] == 2.039e12
    assert a100["hbm_bytes"] == 80 * 2**30
    assert len(data) >= 11


def test_engines_lists_every_profile_with_what_it_runs():
    output = invoke(["engines"]).output
    for name in ("vllm", "vllm-v0", "vllm-v0.2", "vllm-v0.6", "sglang", "trtllm", "trtllm-v0", "tgi-v1", "tgi-v2",
                 "llamacpp", "ideal"):
        assert any(line.split()[0] == name for line in output.splitlines() if line.strip()), name
    llamacpp = next(line for line in output.splitlines() if line.startswith("llamacpp"))
    assert "naive attention" in llamacpp and "512-token passes" in llamacpp and "fp16 accumulation" in llamacpp
    # vLLM V1: 0.3 ms + 20 us per sequence, graphs for steps up to 512 tokens, chunked 256 seqs / 2048 tokens
    vllm = next(line for line in output.splitlines() if line.startswith("vllm "))
    assert "0.30 ms + 20 us/seq" in vllm and "<= 512" in vllm and "chunked, 256 seqs, 2048 tok" in vllm
    profiles = {p["name"]: p for p in json.loads(invoke(["engines", "--json"]).output)}
    assert profiles["trtllm-v0"]["honours_sliding_window"] is False
    assert profiles["llamacpp"]["scheduler"]["pass_tokens"] == 512


def test_models_lists_every_shipped_model():
    output = invoke(["models"]).output
    for name in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "mistral-7b",
                 "falcon-7b", "opt-66b", "gpt3-175b"):
        assert name in output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "llama2-70", "--gpu", "a100"], "did you mean 'llama2-70b'"),
        (["--model", "llama2-7b", "--gpu", "a1000"], "unknown GPU 'a1000'"),
        (["--model", "llama2-7b", "--gpu", "a100", "--batch", "0"], "--batch: must be >= 1"),
        (["--model", "llama2-7b", "--gpu", "a100", "--ctx", "-5"], "--ctx: must be >= 2"),
        (["--model", "llama2-7b", "--gpu", "a100", "--ctx", "9000"], "exceeds the maximum context"),
        (["--model", "llama2-7b", "--gpu", "a100", "--tp", "3"], "does not divide the 32 attention heads"),
        (["--model", "llama2-7b", "--gpu", "v100", "--weights", "fp8"], "no fp8 peak"),
        (["--model", "llama2-70b", "--gpu", "a100", "--attention", "gqa:3"], "must divide the 64 heads"),
        (["--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096", "--tp", "1"], "GiB per GPU"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_malformed_model_file_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\n  bad: [\n")
    result = CliRunner().invoke(main, ["--model", str(path), "--gpu", "a100"])
    assert result.exit_code == 2
    assert "broken.yaml:" in result.output and "malformed YAML" in result.output


def test_help_teaches_with_examples():
    output = invoke(["--help"]).output
    assert "simulate --model llama2-70b --gpu a100 --batch 64 --ctx 4096" in output
    assert "--attention" in output and "mha|mqa|gqa:N" in output


@pytest.mark.parametrize("command", [[], ["layers"], ["compare"]])
def test_json_and_csv_together_are_refused_by_every_command_that_has_both(command):
    result = CliRunner().invoke(main, [*command, "--model", "llama2-7b", "--gpu", "a100", "--json", "--csv"])
    assert result.exit_code == 2 and result.output.strip() == "Error: --json and --csv: choose one output format"
