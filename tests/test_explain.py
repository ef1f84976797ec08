"""`simulate explain`: the paragraph's facts against hand arithmetic, and the levers it measures."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from exact import exact_gpu

from simulator.cli import main
from simulator.cost.system import System
from simulator.model import load_model
from simulator.model.precision import Precision
from simulator.plan.deployment_planner import plan_deployment
from simulator.report.explain import explain_run, ridge_batch
from simulator.report.kernel_choices import kernel_choices


@pytest.fixture(scope="module")
def batch_1():
    deployment = plan_deployment(load_model("llama2-7b"), exact_gpu(), Precision(), batch=1, context_tokens=2048)
    return explain_run(deployment, batch=1, ctx=2048, gen=128)


def test_batch_1_decode_is_memory_bound_at_about_1_flop_per_byte(batch_1):
    facts = batch_1.facts
    assert facts["ridge_flop_per_byte"] == pytest.approx(312e12 / 2.039e12)  # 153
    assert 0.99 < facts["gemm_intensity_flop_per_byte"] < 1.0  # 2 H H' / (2 H H' + 2 (H + H'))
    assert facts["memory_bound_share"] > 0.99
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attention"} <= set(facts["memory_bound_operators"])
    text = batch_1.paragraph
    assert "153 FLOP/byte" in text and "memory-bound" in text and "batch 1" in text


def test_ridge_batch_is_near_the_ridge_point_times_bw_over_2():
    # DESIGN.md: decode GEMM intensity ~ 2B / b_w, so fp16 GEMMs reach the 153 FLOP/byte ridge near B = 153
    # (a little later: the activation rows add bytes).
    system = System(load_model("llama2-7b"), exact_gpu(), Precision())
    reach = ridge_batch(system, 2048)
    assert 153 <= reach <= 1.1 * 153
    # int8 weights (1 byte): twice the intensity per token, so about half the batch (~77).
    int8 = ridge_batch(System(load_model("llama2-7b"), exact_gpu(), Precision(weights="int8")), 2048)
    assert 0.45 * reach < int8 < 0.55 * reach


def test_biggest_throughput_lever_at_batch_1_is_a_bigger_batch(batch_1):
    levers = {lv.lever: lv for lv in batch_1.levers}
    assert set(levers) == {"bigger batch", "fewer KV heads", "lower precision", "more GPUs", "speculative decoding",
                           "disaggregate prefill"}
    best = max(batch_1.levers, key=lambda lv: lv.throughput_gain)
    assert best.lever == "bigger batch"
    assert "Biggest lever for throughput: bigger batch" in batch_1.paragraph
    # Memory-bound steps: ~ (weights + B x KV per sequence) / bandwidth. llama2-7b: 6,738,415,616 fp16 params,
    # and (MHA) 2 x 32 x 32 x 128 x 2 x 2048 = 1 GiB of KV per sequence, so batch B gives
    # B x (W + KV) / (W + B x KV) times the tokens/s (activations and the LM head add ~2%).
    W, KV, B = 6_738_415_616 * 2, 2 * 32 * 32 * 128 * 2 * 2048, best.batch
    assert KV == 2**30
    assert best.throughput_gain == pytest.approx(B * (W + KV) / (W + B * KV), rel=0.03)
    # Twice the GPUs halve the weight bytes per GPU: the step gets faster, tokens/s per GPU does not grow.
    assert levers["more GPUs"].latency_gain > 1.5
    assert levers["more GPUs"].throughput_gain < 1.0


def test_kernel_choices_per_layer():
    system = System(load_model("llama2-7b"), exact_gpu(), Precision())
    choices = kernel_choices(system, batch=1, ctx=4096, gen=1)
    fusion = choices["fusion"]
    # none: 2 norms, qkv, rotary, the cache write, attention, o_proj, 2 adds, gate_up, activation, down
    assert [fusion[level]["decode"]["kernels"] for level in ("none", "elementwise", "full")] == [12, 5, 3]
    # Prefill of 4095 tokens: none - elementwise = 4095 x (8H + 2(n+g)d + 4F) x 2 bytes (tests/test_effects.py).
    saved = fusion["none"]["prefill"]["activation_bytes"] - fusion["elementwise"]["prefill"]["activation_bytes"]
    assert saved == 4095 * 93_184 * 2
    attention = choices["attention_kernel"]
    assert attention["naive"]["prefill"]["attention_bytes"] > 3 * attention["flash"]["prefill"]["attention_bytes"]


def test_cli_paragraph_and_json():
    runner = CliRunner()
    args = ["explain", "--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096"]
    text = runner.invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "ridge point" in text.output and "Biggest lever" in text.output
    assert "Attention kernel" in text.output and "Fusion" in text.output
    data = json.loads(runner.invoke(main, args + ["--json"]).output)
    assert data["facts"]["max_batch_that_fits"] >= 64
    assert set(data["kernel_choices"]["fusion"]) == {"none", "kernels", "elementwise", "full"}


def test_a_pipeline_deployment_is_refused_in_one_line():
    # The levers rebuild the deployment's System with one field changed; a pipeline's stage is not such a System.
    from simulator.errors import InputError
    from simulator.plan.placement import build_deployment

    deployment = build_deployment({"model": "llama2-7b", "gpu": "a100"}, 1, 2048, tp=1, pp=2)
    with pytest.raises(InputError, match=r"^explain: a pipeline-parallel deployment \(--pp 2\) cannot be explained"):
        explain_run(deployment, batch=1, ctx=2048, gen=128)


def test_an_engine_that_ignores_the_sliding_window_has_the_window_as_a_lever():
    from simulator.model.step import Step
    from simulator.plan.deployment_planner import deployment_from_options

    mistral = load_model("mistral-7b")  # sliding window 4096 on all 32 layers
    options = {"model": "mistral-7b", "gpu": "h100"}
    full = deployment_from_options({**options, "engine": "trtllm-v0"}, 8, 32768)
    levers = {lv.lever: lv for lv in explain_run(full, 8, 32768, 128, configured=mistral).levers}
    window = levers["sliding window"]
    assert "4096-token window" in window.change and "max_attention_window_size" in window.caveat
    # The lever is the same deployment attending 4096 keys: each decode token reads 8x less KV per layer
    # (32,768 / 4,096), so the step is shorter and the gain above 1.
    honouring = deployment_from_options({**options, "engine": "trtllm"}, 8, 32768).system
    full_kv = next(o for o in full.system.operators if o.name == "attention").work(Step.decode(8, 32768)).kv_read_bytes
    windowed_kv = next(o for o in honouring.operators if o.name == "attention").work(Step.decode(8, 32768)).kv_read_bytes
    assert full_kv == 8 * windowed_kv
    assert window.throughput_gain > 1.0 and window.step_seconds < full.system.step_seconds(Step.decode(8, 32768))
    # an engine that honours the window has no such lever
    honoured = deployment_from_options({**options, "engine": "trtllm"}, 8, 32768)
    assert "sliding window" not in {lv.lever for lv in explain_run(honoured, 8, 32768, 128, configured=mistral).levers}


# ---------------------------------------------------------------------------------------
# explain checks its advice: the run simulated, each lever re-simulated (simulator.report.explain_simulated).
# The card's run: llama2-70b on 4 A100s, a closed batch of 64 prompts of 3,968 tokens each generating 128.

CARD = {"model": "llama2-70b", "gpu": "a100", "batch": 64, "ctx": 4096}


@pytest.fixture(scope="module")
def card():
    args = ["explain", *[f"--{key}={value}" for key, value in CARD.items()], "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def card_run():
    from simulator.plan.run import simulate_settings

    return simulate_settings({**CARD, "tp": 4})


def _per_gpu(run, gpus: int) -> float:
    return run.metrics.output_tokens / run.metrics.duration_seconds / gpus


def test_a_levers_simulated_gain_is_the_ratio_of_the_two_runs(card, card_run):
    from simulator.plan.run import simulate_settings

    levers = {lv["change"]: lv for lv in card["levers"]}
    assert {lv["tp"] for lv in card["levers"] if lv["lever"] != "more GPUs"} == {4}  # the run's own degree
    fp8 = simulate_settings({**CARD, "tp": 4, "kv": "fp8"})
    lever = levers["fp8 KV cache"]
    assert lever["run_change"] == {"kv": "fp8"}
    assert lever["simulated_throughput_gain"] == pytest.approx(_per_gpu(fp8, 4) / _per_gpu(card_run, 4), rel=1e-9)
    assert lever["simulated_latency_gain"] == pytest.approx(card_run.metrics.tpot.mean / fp8.metrics.tpot.mean, rel=1e-9)
    # More GPUs: the same run on tensor parallel 8, per GPU (8 of them against 4).
    wider = simulate_settings({**CARD, "tp": 8})
    assert levers["tensor parallel 8"]["simulated_throughput_gain"] == pytest.approx(
        _per_gpu(wider, 8) / _per_gpu(card_run, 4), rel=1e-9)
    # The bigger batch: the "1.26x" is a decode step's; on this run, 90% prefill, it is far less.
    bigger = next(lv for lv in card["levers"] if lv["lever"] == "bigger batch")
    run = simulate_settings({**CARD, "tp": 4, "batch": bigger["batch"]})
    assert bigger["simulated_throughput_gain"] == pytest.approx(_per_gpu(run, 4) / _per_gpu(card_run, 4), rel=1e-9)
    assert bigger["throughput_gain"] > 1.2 > 1.1 > bigger["simulated_throughput_gain"]


def test_the_phase_mix_comes_from_the_runs_iterations(card, card_run):
    # Each iteration's time split between its prefill tokens and its decoding sequences by their counts.
    log = card_run.result.log
    prefill = decode = 0.0
    for seconds, tokens, seqs in zip(log["seconds"], log["prefill_tokens"], log["decode_seqs"]):
        prefill += seconds * tokens / (tokens + seqs)
        decode += seconds * seqs / (tokens + seqs)
    simulated = card["facts"]["simulated"]
    assert simulated["prefill_share"] == pytest.approx(prefill / (prefill + decode), rel=1e-9)
    assert simulated["decode_share"] == pytest.approx(decode / (prefill + decode), rel=1e-9)
    assert simulated["prefill_share"] > 0.5  # long prompts, 128 outputs: mostly prefill
    assert f"{100 * prefill / (prefill + decode):.0f}% of its GPU time in prefill" in card["paragraph"]


def test_the_fit_count_is_the_engines_kv_cache_in_sequences(card, card_run):
    from simulator.plan.run import simulate_settings

    # A sequence at its longest caches 3,968 + 128 - 1 = 4,095 tokens: ceil(4,095 / 16) = 256 blocks.
    assert card_run.capacity.block_size == 16
    fits = card_run.capacity.blocks // 256
    assert card["facts"]["max_batch_that_fits"] == fits
    assert card["facts"]["simulated"]["kv_cache_blocks"] == card_run.capacity.blocks
    assert f"{fits} sequences of 4,096 tokens" in card["paragraph"]
    # As the engine admits them: with each request's whole length reserved at admission, and outputs long enough
    # (2,048 tokens) that none finishes before all have started, one request more than that never runs at once.
    over = simulate_settings({**CARD, "tp": 4, "gen": 2048, "batch": fits + 1, "kv_admission": "reserve"})
    assert over.capacity.blocks == card_run.capacity.blocks
    assert over.result.max_running == fits
    # The bigger-batch lever stops there (the ridge batch, ~129, is beyond it).
    bigger = next(lv for lv in card["levers"] if lv["lever"] == "bigger batch")
    assert card["facts"]["ridge_batch"] > fits and bigger["batch"] == fits


def test_levers_are_ranked_by_their_simulated_gain(card):
    levers = card["levers"]
    throughput = [lv for lv in levers if not lv["latency_only"]]
    assert levers[: len(throughput)] == throughput  # latency-only levers come last
    gains = [lv["run_gain"] for lv in throughput]
    assert gains == sorted(gains, reverse=True)
    for lv in throughput:  # every lever of this run is a setting: all simulated, ranked by that
        assert lv["simulated_throughput_gain"] is not None and lv["run_gain"] == lv["simulated_throughput_gain"]
    best = max(throughput, key=lambda lv: lv["simulated_throughput_gain"])
    assert f"Biggest lever for throughput: {best['lever']} ({best['change']}: {best['simulated_throughput_gain']:.2f}x" \
        in card["paragraph"]
    # int4 weight-only: faster decode steps, but its prefill dequantises every weight: slower on this run.
    int4 = next(lv for lv in levers if lv["change"].startswith("int4"))
    assert int4["throughput_gain"] > 1.0 > int4["simulated_throughput_gain"]
    assert throughput.index(int4) > throughput.index(next(lv for lv in throughput if lv["change"] == "fp8 KV cache"))


def test_a_lever_that_is_not_a_setting_is_ranked_by_its_decode_gain_over_the_phase_mix():
    from simulator.plan.deployment_planner import deployment_from_options

    # mistral-7b's 4096-token window, ignored by TensorRT-LLM 0.x: an engine behaviour, not a setting of a run.
    options = {"model": "mistral-7b", "gpu": "h100", "engine": "trtllm-v0", "batch": 4, "ctx": 16384, "gen": 256}
    full = deployment_from_options(options, 4, 16384)
    explanation = explain_run(full, 4, 16384, 256, configured=load_model("mistral-7b"), simulate=options)
    window = next(lv for lv in explanation.levers if lv.lever == "sliding window")
    assert window.simulated_throughput_gain is None and "not simulated" in window.simulated_note
    mix = explanation.facts["simulated"]
    assert window.run_gain == pytest.approx(1 / (mix["prefill_share"] + mix["decode_share"] / window.throughput_gain))
    gains = [lv.run_gain for lv in explanation.levers if not lv.latency_only]
    assert gains == sorted(gains, reverse=True)


def test_an_mla_model_is_explained_without_a_kv_heads_lever_or_a_naive_kernel():
    # MLA's latent has no MHA/MQA/GQA variant and runs only its own (flash-style) kernels: explain must leave both
    # choices out rather than refuse the model.
    lite = str(Path(__file__).parent / "data" / "hf-configs" / "DeepSeek-V2-Lite.json")
    args = ["explain", "--model", lite, "--gpu", "h100", "--batch", "8", "--ctx", "2048", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert "fewer KV heads" not in {lever["lever"] for lever in out["levers"]}
    assert out["kernel_choices"]["attention_kernel"]["naive"] is None
    assert out["kernel_choices"]["attention_kernel"]["flash"]["decode"]["step_seconds"] > 0
    text = CliRunner().invoke(main, args[:-1])
    assert text.exit_code == 0, text.output
    assert "  flash *" in text.output and "  naive" not in text.output
