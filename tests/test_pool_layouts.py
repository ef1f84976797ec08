"""Each disaggregated pool at its own layout (--prefill-ep/--decode-ep, --prefill-dp-attention/--decode-dp-attention):
the layout reaches the pool's deployment, its report, JSON and launch command, and the pool is charged its own
collectives, worked out here by hand."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.errors import InputError
from simulator.model import load_gpu
from simulator.model.step import Step
from simulator.plan.disaggregated_run import disaggregation_summary
from simulator.plan.result import engine_run_dict
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings, parse_settings

# qwen3-30b-a3b (configs/models/qwen3-30b-a3b.yaml): 48 layers, all MoE; hidden 2048; 128 routed experts, top-8.
LAYERS, HIDDEN, EXPERTS, TOP_K = 48, 2048, 128, 8
FP16 = 2  # bytes per activation element (fp16 weights, so fp16 activations)

# H100 SXM: NVLink 4 at 450 GB/s per direction x the default link efficiency 0.75 (configs/gpus/h100-sxm5-80gb.yaml).
LINK = 450e9 * 0.75  # 337.5 GB/s
# configs/interconnects/nvlink4.yaml: NCCL Simple base 8.4 us + hop 3.4 us; vLLM's custom all-reduce one-shot 6 us,
# two-shot 13 us (fixed parts); configs/engines/vllm.yaml: custom all-reduce up to 8 MiB.
SIMPLE_BASE, SIMPLE_HOP, ONE_SHOT, TWO_SHOT = 8.4e-6, 3.4e-6, 6.0e-6, 13.0e-6

PROMPT = 2048

# Prefill pool: tp 4, ep 4, attention data-parallel; decode pool: tp 8, ep 8, attention tensor-parallel.
BASE = {"model": "qwen3-30b-a3b", "gpu": "h100", "qps": 2.0, "requests": 6, "prompt_tokens": PROMPT,
        "output_tokens": 16, "seed": 3, "disaggregate": "1:1"}
LAYOUTS = {"prefill_tp": 4, "prefill_ep": 4, "prefill_dp_attention": True, "decode_tp": 8, "decode_ep": 8}


def remote_gpus_per_token(ep: int) -> float:
    """GPUs other than its own that a token's hidden state goes to: each of the ep - 1 others holds 128 / ep
    experts, all k = 8 picks miss them with probability C(128 - 128/ep, 8) / C(128, 8)."""
    held = EXPERTS // ep
    return (ep - 1) * (1 - math.comb(EXPERTS - held, TOP_K) / math.comb(EXPERTS, TOP_K))


@pytest.fixture(scope="module")
def run():
    return simulate_settings({**BASE, **LAYOUTS})


def test_the_hand_numbers_the_tests_use():
    h100 = load_gpu("h100")
    assert h100.link_bandwidth_bytes_per_second * h100.efficiency.link == pytest.approx(LINK)
    # ep 4: C(96, 8) / C(128, 8) = 96/128 x 95/127 x ... x 89/121 = 0.0927473; 3 x (1 - 0.0927473) = 2.72176 GPUs
    assert remote_gpus_per_token(4) == pytest.approx(2.72176, abs=1e-5)
    # ep 8: C(112, 8) / C(128, 8) = 112/128 x 111/127 x ... x 105/121 = 0.332580; 7 x (1 - 0.332580) = 4.67194 GPUs
    assert remote_gpus_per_token(8) == pytest.approx(4.67194, abs=1e-5)


def test_each_pool_is_deployed_at_its_own_layout(run):
    prefill, decode = run.result.extra["pools"]
    p, d = prefill.deployment.system, decode.deployment.system
    assert (p.tp, p.ep, p.dp_attention) == (4, 4, True)
    assert (d.tp, d.ep, d.dp_attention) == (8, 8, False)
    # Attention DP in the prefill pool only: each of its 4 GPUs projects the output of 1/4 of a step's tokens
    # with all 32 heads (32 x 128 = 4,096 inputs); a decode GPU projects every token with its 32 / 8 = 4 heads.
    step = Step.decode(8, 1024)
    p_o = next(op for op in p.operators if op.name == "o_proj")
    d_o = next(op for op in decode.deployment.system.operators if op.name == "o_proj")
    assert (p_o.in_features, p_o.tokens(step)) == (32 * 128, 2)
    assert (d_o.in_features, d_o.tokens(step)) == (4 * 128, 8)


def test_the_prefill_pool_is_charged_its_gather_and_reduce_scatter_and_no_all_to_all(run):
    summary = disaggregation_summary(run)
    assert summary is not None
    step = summary.prefill.step
    # The first request arrives alone and its 2,048-token prompt is within the 8,192-token budget: one step.
    assert step is not None and (step.kind, step.tokens) == ("prefill", PROMPT)
    system = run.result.extra["pools"][0].deployment.system
    ops = {op.name: op for op in system.operators}
    prefill = Step.prefill(1, PROMPT)
    # Under attention DP each GPU's attention output is whole for its sequences: no all-reduce after it. The MoE
    # layers need every GPU's tokens: an all-gather of the whole step before them (2,048 x 2,048 x 2 bytes =
    # 8,388,608 bytes, the gathered result) and a reduce-scatter of their partial sums after (the same bytes in).
    gathered = PROMPT * HIDDEN * FP16
    assert gathered == 8_388_608
    assert "attn_allreduce" not in ops and "mlp_allreduce" not in ops
    assert (ops["dp_gather"].collective, ops["dp_reduce_scatter"].collective) == ("allgather", "reducescatter")
    assert ops["dp_gather"].work(prefill).link_bytes == gathered
    assert ops["dp_reduce_scatter"].work(prefill).link_bytes == gathered
    # NCCL's ring all-gather on 4 GPUs over the Simple protocol: 8.4 us + 3 hops x 3.4 us + 3/4 x 8,388,608 /
    # 337.5e9 = 8.4 + 10.2 + 18.64 = 37.24 us; gather and reduce-scatter x 48 layers = 3.575 ms (the two
    # all-reduces charged before were 4.827 ms).
    gather_scatter = 2 * LAYERS * (SIMPLE_BASE + 3 * SIMPLE_HOP + 3 / 4 * gathered / LINK)
    assert gather_scatter == pytest.approx(3.575e-3, rel=1e-3)
    assert step.allreduce_seconds == pytest.approx(gather_scatter, rel=1e-9)
    # The gathered tokens are on every GPU, which runs its own 128 / 4 = 32 experts on them: no dispatch, no
    # combine (TensorRT-LLM without enable_alltoall; SGLang without DeepEP).
    assert "moe_dispatch" not in ops and "moe_combine" not in ops
    assert step.alltoall_seconds == 0.0


def test_the_decode_pool_is_charged_its_own(run):
    summary = disaggregation_summary(run)
    assert summary is not None
    step = summary.decode.step
    # 6 requests at 2/s, each decoding 15 tokens in well under a second: the last one decodes alone.
    assert step is not None and (step.kind, step.sequences, step.tokens) == ("decode", 1, 1)
    tokens = 1
    # Attention tensor-parallel over 8 GPUs: two all-reduces of tokens x 2,048 x 2 bytes per layer; under 256 KiB
    # on 8 GPUs vLLM's one-shot kernel: 6 us + 7 x bytes / 337.5 GB/s.
    message = tokens * HIDDEN * FP16
    assert message < 256 * 1024
    assert step.allreduce_seconds == pytest.approx(2 * LAYERS * (ONE_SHOT + 7 * message / LINK), rel=1e-9)
    # The 8-GPU EP group: tokens / 8 x 4.6767 other GPUs x 2,048 x 2 bytes, dispatch and combine in each layer.
    dispatched = tokens / 8 * remote_gpus_per_token(8) * HIDDEN * FP16
    assert step.alltoall_seconds == pytest.approx(2 * LAYERS * (SIMPLE_BASE + SIMPLE_HOP + dispatched / LINK), rel=1e-9)
    # One token: 2 x 48 x (6 us + 7 x 4,096 / 337.5e9) = 584.2 us of all-reduce; all-to-all of
    # 1 / 8 x 4.67194 x 4,096 = 2,392 bytes: 2 x 48 x (11.8 us + 2,392 / 337.5e9) = 1.1335 ms.
    assert step.allreduce_seconds == pytest.approx(584.2e-6, rel=1e-4)
    assert step.alltoall_seconds == pytest.approx(1.1335e-3, rel=1e-4)


def test_the_json_names_each_pools_layout_and_collectives(run):
    block = engine_run_dict(run)["disaggregation"]
    prefill, decode = block["prefill"], block["decode"]
    assert (prefill["tp"], prefill["ep"], prefill["dp_attention"], prefill["gpus"]) == (4, 4, True, 4)
    assert (decode["tp"], decode["ep"], decode["dp_attention"], decode["gpus"]) == (8, 8, False, 8)
    assert prefill["step"]["tokens"] == PROMPT
    assert prefill["step"]["allreduce_seconds"] == pytest.approx(
        2 * LAYERS * (SIMPLE_BASE + 3 * SIMPLE_HOP + 0.75 * 8_388_608 / LINK))
    assert 0 < prefill["communication_share"] < 1 and 0 < decode["communication_share"] < 1


def test_a_pool_left_out_takes_the_runs_layout():
    settings = {**BASE, "tp": 4, "ep": 4, "dp_attention": True, "decode_tp": 2, "decode_ep": 1,
                "decode_dp_attention": False}
    prefill, decode = simulate_settings(settings).result.extra["pools"]
    assert (prefill.deployment.system.tp, prefill.deployment.system.ep, prefill.deployment.system.dp_attention) == (
        4, 4, True)
    assert (decode.deployment.system.tp, decode.deployment.system.ep, decode.deployment.system.dp_attention) == (
        2, 1, False)
    # At ep 1 the decode pool's experts are sliced over its 2 GPUs: no all-to-all at all.
    assert not any(op.kind == "alltoall" for op in decode.deployment.system.operators)


def _cli(*args: str):
    return CliRunner().invoke(main, ["--model", "qwen3-30b-a3b", "--gpu", "h100", "--qps", "2", "--requests", "6",
                                     "--prompt-tokens", str(PROMPT), "--output-tokens", "16", "--seed", "3", *args])


def test_the_report_and_launch_commands_carry_each_pools_layout():
    result = _cli("--disaggregate", "1:1", "--tp", "4", "--ep", "4", "--dp-attention", "--decode-tp", "8",
                  "--decode-ep", "8", "--no-decode-dp-attention", "--launch-command", "sglang")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "1 prefill x 4 H100-SXM5-80GB (ep 4, dp-attention) : 1 decode x 8 H100-SXM5-80GB (ep 8) = 12 GPUs" in out
    prefill_line = next(line for line in out.splitlines() if line.startswith("  prefill layout "))
    # the all-reduce and all-to-all as worked out above: 4.827 ms and 2.756 ms
    assert prefill_line.startswith("  prefill layout tp 4 ep 4 dp-attention; first prefill step (2,048 tokens) ")
    assert ": gather and reduce-scatter 3.58 ms; collectives " in prefill_line
    assert "  decode layout  tp 8 ep 8; last decode step" in out
    prefill_worker, decode_worker = out.split("# prefill worker")[1].split("# decode worker")
    assert "--tp 4" in prefill_worker and "--ep-size 4" in prefill_worker and "--enable-dp-attention --dp 4" in prefill_worker
    assert "--tp 8" in decode_worker and "--ep-size 8" in decode_worker and "dp-attention" not in decode_worker


@pytest.mark.parametrize("args, message", [
    (("--prefill-ep", "4"), "Error: --prefill-ep: applies only with disaggregate"),
    (("--no-decode-dp-attention",), "Error: --decode-dp-attention: applies only with disaggregate"),
    (("--disaggregate", "1:1", "--decode-ep", "0"), "Error: --decode-ep: must be >= 1 (got 0)"),
    (("--disaggregate", "1:1", "--decode-tp", "4", "--decode-ep", "8"), "Error: --decode-ep: 8 must be 1 or equal --decode-tp 4"),
    (("--disaggregate", "1:1", "--decode-ep", "3"), "Error: --decode-ep: 3 does not divide the 32 attention heads"),
    (("--disaggregate", "1:1", "--ep", "8", "--decode-tp", "4"),
     "Error: --disaggregate: the decode pool: --ep: 8 must be 1 or equal --decode-tp 4"),
    (("--disaggregate", "1:1", "--prefill-tp", "1", "--prefill-dp-attention"),
     "Error: --prefill-dp-attention: needs --tp N with N >= 2 GPUs to split the sequences over (got --prefill-tp 1)"),
])
def test_a_bad_pool_layout_is_one_line_naming_the_setting(args, message):
    result = _cli(*args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message) and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output


def test_the_same_rules_as_the_runs_own():
    # ep must divide the routed experts: mixtral's 8 cannot be split over 16 GPUs (ep = tp = 16).
    with pytest.raises(InputError, match=r"^--decode-ep: 16 does not divide the 8 routed experts of mixtral-8x7b$"):
        simulate_settings({**BASE, "model": "mixtral-8x7b", "decode_tp": 16, "decode_ep": 16})
    # a dense model has no experts to split, nor attention DP to deploy
    with pytest.raises(InputError, match="^--decode-ep: llama3-8b has no routed experts"):
        simulate_settings({**BASE, "model": "llama3-8b", "decode_ep": 2})
    with pytest.raises(InputError, match="^--prefill-dp-attention: llama3-8b has no routed experts"):
        simulate_settings({**BASE, "model": "llama3-8b", "prefill_tp": 2, "prefill_dp_attention": True})
    # without disaggregate, in scenario files and the API alike
    with pytest.raises(InputError, match="^prefill_ep: applies only with disaggregate$"):
        parse_settings(RunSettings, {"model": "m", "gpu": "g", "prefill_ep": 8})
    with pytest.raises(InputError, match="^decode_dp_attention: applies only with disaggregate$"):
        parse_settings(RunSettings, {"model": "m", "gpu": "g", "decode_dp_attention": True})
