"""Speculative decoding: tokens per iteration, the verification step, the draft's memory, runs (hand-worked numbers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.cost.memory import kv_bytes_per_token_per_gpu
from simulator.cost.speculation import (
    SpeculativeSystem,
    crossover_batch,
    draft_decode_steps,
    draft_memory,
    expected_tokens_per_iteration,
    parse_acceptance,
    sample_iterations,
    speedup,
    verification_step,
)
from simulator.cost.system import System
from simulator.engine.kvcache import KVCapacity
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.model.step import Step
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings, SpeculativeSettings, parse_settings
from simulator.plan.speculative_run import draft_system, speculative_capacity

EAGLE_K4 = SpeculativeSettings(speculative="eagle", num_speculative_tokens=4, acceptance="0.7")


def test_expected_tokens_per_iteration_by_hand():
    # (1 - 0.7^5) / (1 - 0.7) = (1 - 0.16807) / 0.3 = 2.77310
    assert expected_tokens_per_iteration([0.7] * 4) == pytest.approx(2.7731)
    # Per position: 1 + 0.8 + 0.8 x 0.7 + 0.8 x 0.7 x 0.6 = 1 + 0.8 + 0.56 + 0.336 = 2.696
    assert expected_tokens_per_iteration(parse_acceptance("0.8,0.7,0.6")) == pytest.approx(2.696)
    # Nothing accepted: the target's own token only; everything accepted: k + 1.
    assert expected_tokens_per_iteration([0.0] * 4) == 1.0
    assert expected_tokens_per_iteration([1.0] * 4) == 5.0


def test_acceptance_parsing():
    assert parse_acceptance(0.7, 3) == (0.7, 0.7, 0.7)
    assert parse_acceptance("0.8, 0.7,0.6") == (0.8, 0.7, 0.6)
    with pytest.raises(InputError, match="--acceptance: 1.2 is not in"):
        parse_acceptance("1.2", 2)
    with pytest.raises(InputError, match="2 per-position rates for --num-speculative-tokens 3"):
        parse_acceptance("0.8,0.7", 3)


def test_sampled_iterations():
    rng = np.random.default_rng(1)
    # All accepted: 5 tokens an iteration, so 127 decode tokens take ceil(127 / 5) = 26; none accepted: 127.
    assert sample_iterations(np.array([127]), [1.0] * 4, rng).tolist() == [26]
    assert sample_iterations(np.array([127]), [0.0] * 4, rng).tolist() == [127]
    assert sample_iterations(np.array([0]), [0.5] * 4, rng).tolist() == [0]
    # 5 decode tokens in one iteration only when all 4 drafts are accepted: 0.7^4 = 0.2401 of the requests.
    one = sample_iterations(np.full(100_000, 5), [0.7] * 4, rng) == 1
    assert one.mean() == pytest.approx(0.2401, abs=0.005)


def test_verification_step_counts():
    # 2 sequences decoding at 100 cached tokens each (101 keys with the new token), k = 3: q = 4 query tokens each.
    step = verification_step(Step.decode(2, 101), 3)
    assert step.tokens == 8  # 2 x 4
    assert step.logit_tokens == 8  # logits at all 4 positions
    assert step.attention_pairs == 820  # 4 x 200 cached + 2 x (4 x 5 / 2)
    assert step.context_tokens == 208  # 200 cached + 8 new keys
    assert step.score_elements == 832  # 4 x 200 + 2 x 4 x 4
    # A prefill chunk in the same step is left as it was.
    mixed = verification_step(Step.decode(2, 101) + Step.prefill(1, 10), 3)
    assert (mixed.prefill_tokens, mixed.tokens) == (10, 18)
    # The draft's 3 steps feed one token per sequence on 200, 202, 204 cached tokens in all (+2 each step).
    assert [s.context_tokens for s in draft_decode_steps(Step.decode(2, 101), 3)] == [202, 204, 206]


def test_verification_flops_and_bytes_on_llama3_70b():
    system = System(load_model("llama3-70b"), load_gpu("h100"), Precision(), tp=1)
    qkv = next(op for op in system.operators if op.name == "qkv_proj")
    attention = next(op for op in system.operators if op.name == "attention")
    plain, verify = Step.decode(2, 101), verification_step(Step.decode(2, 101), 3)
    # QKV: H x (n + 2g) d = 8192 x (64 + 16) x 128 = 8192 x 10240; 2 FLOPs per weight per token, 8 tokens.
    assert qkv.work(verify).flops == 2 * 8 * 8192 * 10240 == 1_342_177_280
    # The weights are read once, as in a plain decode step: 8192 x 10240 x 2 bytes.
    assert qkv.work(verify).weight_bytes == qkv.work(plain).weight_bytes == 167_772_160
    # KV per token and layer: 2 x 8 x 128 x 2 = 4,096 bytes; read 208 keys, write 8.
    assert attention.work(verify).kv_read_bytes == 4096 * 208 == 851_968
    assert attention.work(verify).kv_write_bytes == 4096 * 8 == 32_768


def test_a_head_is_one_layer_and_its_memory():
    target = System(load_model("llama3-70b"), load_gpu("h100"), Precision(), tp=2)
    method, _, draft = draft_system(EAGLE_K4, target)
    assert method == "eagle" and draft.model.num_layers == 1
    memory = draft_memory(method, draft, kv_bytes_per_token_per_gpu(draft.model, draft.precision, draft.tp))
    # One layer at tp 2, fp16: (QKV 8192 x 10240 + O 8192^2 + MLP 3 x 8192 x 28672) / 2 x 2 bytes
    # = 855,638,016, plus two replicated norms 2 x 8192 x 2 = 32,768; embedding and LM head are the target's.
    assert memory.weights_bytes_per_gpu == 855_638_016 + 32_768
    # Its KV cache: 2 x (8 / 2) x 128 x 2 = 2,048 bytes per token per GPU.
    assert memory.kv_bytes_per_token_per_gpu == 2048


def test_draft_model_must_share_the_tokenizer():
    target = System(load_model("llama3-70b"), load_gpu("h100"), Precision(), tp=2)
    settings = SpeculativeSettings(speculative="draft:llama2-7b", num_speculative_tokens=4, acceptance="0.7")
    with pytest.raises(InputError, match="vocabulary of 32,000 tokens but llama3-70b has 128,256"):
        draft_system(settings, target)


def test_the_draft_shares_the_kv_budget():
    capacity = KVCapacity(blocks=625, block_size=16, bytes_per_block_per_gpu=1000.0, budget_bytes_per_gpu=1_000_000.0,
                          hbm_bytes_per_gpu=2e6, gpu_memory_utilization=0.9, weights_bytes_per_gpu=5e5,
                          workspace_bytes_per_gpu=0.0, reserved_bytes_per_gpu=0.0)
    from simulator.cost.speculation import DraftMemory

    # (1,000,000 - 200,000) / (1000 + 16 x 25) = 800,000 / 1,400 = 571.4 -> 571 blocks.
    shared = speculative_capacity(capacity, DraftMemory(200_000.0, 25.0), 16, "test")
    assert shared.blocks == 571
    with pytest.raises(InputError, match="does not fit with its draft"):
        speculative_capacity(capacity, DraftMemory(999_000.0, 25.0), 16, "test")


def _spec(tp: int) -> SpeculativeSystem:
    target = System(load_model("llama3-70b"), load_gpu("h100"), Precision(), tp=tp)
    method, name, draft = draft_system(EAGLE_K4, target)
    return SpeculativeSystem(target, draft, method, EAGLE_K4.acceptance_rates, name)


def test_an_iteration_is_the_verification_plus_k_draft_steps():
    spec = _spec(2)
    step = Step.decode(4, 1000)
    whole = spec.step_totals(step)
    parts = [spec.target.step_totals(verification_step(step, 4))]
    parts += [spec.draft.step_totals(s) for s in draft_decode_steps(step, 4)]
    assert whole.flops == pytest.approx(sum(p.flops for p in parts))
    assert whole.seconds == pytest.approx(sum(p.seconds for p in parts))  # the ideal engine adds no host time


def test_memory_bound_gain_and_the_compute_bound_crossover():
    spec = _spec(4)
    # Batch 1: the verification reads the weights once, so the iteration costs little more than a step and
    # emits 2.77 tokens: a gain, below E.
    assert 1.5 < float(speedup(spec, 1, 640)) < 2.7731
    crossover = crossover_batch(spec, 640, 1024)
    assert crossover is not None and 64 < crossover < 1024
    assert float(speedup(spec, crossover, 640)) <= 1.0 < float(speedup(spec, crossover - 1, 640))


def test_settings_need_an_acceptance_and_name_the_flag():
    with pytest.raises(InputError, match="acceptance: needed with speculative"):
        parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "speculative": "mtp"})
    with pytest.raises(InputError, match="num_speculative_tokens: applies only with speculative"):
        parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "num_speculative_tokens": 2})
    result = CliRunner().invoke(main, ["--model", "llama3-8b", "--gpu", "h100", "--speculative", "medusa", "--acceptance", "0.5"])
    assert result.exit_code == 2 and "--speculative: cannot read 'medusa'" in result.output


@pytest.fixture(scope="module")
def run():
    return simulate_settings({"model": "llama3-70b", "gpu": "h100", "tp": 2, "batch": 16, "prompt_tokens": 512,
                              "output_tokens": 64, "speculative": "eagle", "num_speculative_tokens": 4,
                              "acceptance": 0.7, "seed": 3})


def test_a_run_samples_tpot_per_request_and_compares_with_the_plain_run(run):
    stats = run.result.extra["speculative"]
    # Equal requests, different draws: their TPOTs differ.
    tpot = (run.result.finish - run.result.first_token) / 63
    assert tpot.std() > 0
    # The run's own tokens per iteration are near E = 2.77 (16 requests x 63 tokens; the last iteration may overshoot).
    assert 2.2 < stats.tokens_per_iteration < 3.3
    # Memory-bound decode at batch 16: faster than the same run without speculation.
    assert stats.tpot_speedup > 1.3
    assert stats.baseline.tpot.mean > run.metrics.tpot.mean
    # Output tokens are the requests' own, not iterations: 16 x 64.
    assert run.metrics.output_tokens == 16 * 64


def test_json_has_the_speculative_block(run):
    from simulator.plan.result import engine_run_dict

    block = engine_run_dict(run)["speculative"]
    assert block["expected_tokens_per_iteration"] == pytest.approx(2.7731)
    assert block["num_speculative_tokens"] == 4 and block["acceptance"] == [0.7] * 4
    assert block["draft_kv_bytes_per_token_per_gpu"] == 2048
    assert block["tpot_speedup"] > 1.0
    assert json.dumps(block)  # plain numbers only


def test_report_and_explain_name_speculation():
    runner = CliRunner()
    args = ["--model", "llama3-70b", "--gpu", "h100", "--tp", "2", "--batch", "2", "--prompt-tokens", "256",
            "--output-tokens", "16", "--speculative", "eagle", "--num-speculative-tokens", "2", "--acceptance", "0.8,0.6", "-q"]
    text = runner.invoke(main, args)
    assert text.exit_code == 0, text.output
    # 1 + 0.8 + 0.8 x 0.6 = 2.28 tokens per iteration expected.
    assert "Speculative decoding" in text.output and "expected 2.28" in text.output
    explained = runner.invoke(main, ["explain", "--model", "llama3-70b", "--gpu", "h100", "--batch", "1", "--ctx", "2176",
                                     "--gen", "128", "--speculative", "eagle", "--num-speculative-tokens", "4",
                                     "--acceptance", "0.7", "--json"])
    assert explained.exit_code == 0, explained.output
    levers = {lever["lever"]: lever for lever in json.loads(explained.output)["levers"]}
    assert levers["speculative decoding"]["change"] == "eagle head, k 4"
    assert levers["speculative decoding"]["latency_gain"] > 1.5


def test_without_speculation_keeps_the_rest():
    settings = parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "qps": 2.0, "speculative": "mtp",
                                            "acceptance": "0.9", "num_speculative_tokens": 1})
    from simulator.plan.speculative_run import without_speculation

    plain = without_speculation(settings)
    assert plain.speculative is None and plain.qps == 2.0
    assert plain.acceptance is None and plain.num_speculative_tokens is None


def test_the_memory_used_counts_the_draft_model_beside_the_target():
    """llama2-13b drafting for llama2-7b on one A100: the draft's KV is 2 x 40 layers x 40 heads x 128 x 2 bytes =
    819,200 bytes a token, 2,048 tokens of one planned sequence, beside its weights; the target's own plan is
    that of the run without a draft."""
    from simulator.plan.result import engine_run_dict
    from simulator.plan.run import simulate_settings

    base = {"model": "llama2-7b", "gpu": "a100", "batch": 1, "ctx": 2048, "gen": 16}
    plain = engine_run_dict(simulate_settings(base))
    drafted = engine_run_dict(simulate_settings({**base, "speculative": "draft:llama2-13b", "acceptance": 0.8,
                                                 "num_speculative_tokens": 2}))
    draft = drafted["memory"]["draft_bytes_per_gpu"]
    assert draft == pytest.approx(drafted["speculative"]["draft_weights_bytes_per_gpu"] + 819_200 * 2048)
    assert drafted["memory"]["needed_bytes_per_gpu"] == pytest.approx(plain["memory"]["needed_bytes_per_gpu"] + draft)
    assert plain["memory"]["draft_bytes_per_gpu"] == 0
