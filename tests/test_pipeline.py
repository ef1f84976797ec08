"""Pipeline parallelism: the GPipe bubble, micro-batches, stage sizing and the TP x PP layout, by hand."""

import pytest

from simulator.cost.pipeline import (
    bubble_fraction,
    micro_batch,
    pipeline_slots,
    stage_model,
)
from simulator.engine.scheduler import SchedulerConfig
from simulator.errors import InputError
from simulator.model import load_model
from simulator.model.step import Step
from simulator.plan.engine_run import fit_error
from simulator.plan.placement import build_deployment, plan_serving
from simulator.plan.run import run_from_options

EXACT = {"compute_efficiency": 1.0, "memory_efficiency": 1.0, "link_efficiency": 1.0, "launch_overhead": 0.0}


def test_gpipe_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    assert bubble_fraction(1, 4) == 0.0  # one stage never waits
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3)  # (2 - 1) / (2 + 2 - 1)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)  # (4 - 1) / (8 + 4 - 1)
    assert pipeline_slots(4, 8) == 11
    with pytest.raises(InputError):
        bubble_fraction(0, 1)


def test_a_micro_batch_is_an_equal_share_of_every_sum():
    step = Step.prefill(batch=4, prompt_tokens=100)
    half = micro_batch(step, 2)
    assert (half.tokens, half.sequences, half.logit_tokens) == (200, 2, 2)
    assert half.attention_pairs == step.attention_pairs / 2  # 4 x 100 x 101 / 2 = 20,200 -> 10,100


def test_the_heaviest_stage_holds_the_last_ceil_l_over_p_layers():
    model = load_model("llama2-70b")
    assert stage_model(model, 1) is model
    assert stage_model(model, 2).num_layers == 40  # 80 / 2
    assert stage_model(model, 3).num_layers == 27  # ceil(80 / 3)
    assert stage_model(model, 3).hidden_size == model.hidden_size


@pytest.fixture(scope="module")
def pipeline():
    options = {"model": "llama2-70b", "gpu": "a100", "engine": "ideal", **EXACT}
    return build_deployment(options, 1, 2048, tp=4, pp=2)


def test_one_sequence_crosses_every_stage_in_turn(pipeline):
    # One sequence: one micro-batch, m + p - 1 = 2 slots of a 40-layer stage, plus one hop of its hidden state:
    # 1 token x 8192 x 2 bytes = 16,384 bytes over NVLink 3 (300 GB/s at link efficiency 1) after NCCL's Simple
    # base and hop latencies (8.4 + 3.4 us): 11.8 us + 16,384 / 300e9 s = 11.855 us.
    system = pipeline.system
    step = Step.decode(batch=1, context_tokens=1000)
    stage = system.stage.step_totals(step).seconds
    hop = 8.4e-6 + 3.4e-6 + 16_384 / 300e9
    assert system.step_totals(step).seconds == pytest.approx(2 * stage + hop, rel=1e-9)
    assert not system.link.across_nodes  # 4 x 2 = 8 GPUs: one node


def test_micro_batches_pipeline_a_larger_batch(pipeline):
    # 8 sequences in 2 micro-batches of 4: 3 slots of a 4-sequence stage step, one hop of 4 tokens (65,536 bytes).
    system = pipeline.system
    step = Step.decode(batch=8, context_tokens=1000)
    part = system.stage.step_totals(Step.decode(batch=4, context_tokens=1000)).seconds
    hop = 8.4e-6 + 3.4e-6 + 65_536 / 300e9
    assert system.step_totals(step).seconds == pytest.approx(3 * part + hop, rel=1e-9)
    # FLOPs on a stage GPU: both micro-batches' work; the per-operator view adds up to the same totals.
    totals, cost = system.step_totals(step), system.step_cost(step)
    assert totals.flops == pytest.approx(2 * system.stage.step_totals(Step.decode(4, 1000)).flops)
    assert cost.seconds == pytest.approx(totals.seconds, rel=1e-9)
    assert cost.flops == pytest.approx(totals.flops, rel=1e-9)
    assert cost.communication_seconds == pytest.approx(totals.communication_seconds, rel=1e-9)


def test_memory_is_planned_for_the_heaviest_stage(pipeline):
    one = build_deployment({"model": "llama2-70b", "gpu": "a100"}, 1, 2048, tp=4, pp=1)
    # Half the layers per GPU: about half the weights (the stage keeps the embedding and the head, 2 x 32000 x
    # 8192 x 2 B / 4 = 0.25 GiB per GPU), and half the KV bytes per token per GPU.
    assert pipeline.memory.weights_bytes_per_gpu == pytest.approx(one.memory.weights_bytes_per_gpu / 2, rel=0.02)
    assert pipeline.memory.weights_bytes == one.memory.weights_bytes
    assert pipeline.memory.kv_bytes_per_gpu == pytest.approx(one.memory.kv_bytes_per_gpu / 2)
    assert pipeline.gpus == 8


def test_a_model_too_big_for_a_node_gets_tp_8_x_pp_2():
    # gpt3-175b fp16 weights: 325 GiB. One node of 8 A100-40GB: 325 / 8 = 40.7 GiB per GPU > 0.9 x 40 = 36 GiB.
    # Two stages of 48 layers: ~20.4 GiB per GPU, which leaves room for a 2048-token sequence.
    config = SchedulerConfig()
    deployment = plan_serving({"model": "gpt3-175b", "gpu": "a100-40gb"}, 1, 2048, config, 0.9)
    assert (deployment.system.tp, deployment.pp, deployment.gpus) == (8, 2, 16)
    assert "--tp 8 --pp 2" in deployment.note
    assert deployment.system.link.across_nodes  # 16 GPUs: two nodes, stages talk over InfiniBand
    assert "does not fit" in fit_error({"model": "gpt3-175b", "gpu": "a100-40gb", "tp": 8})


def test_json_reports_pp_and_counts_every_gpu():
    data = run_from_options({"model": "llama2-7b", "gpu": "a100", "tp": 2, "pp": 2, "replicas": 2, "qps": 2,
                             "requests": 20, "prompt_tokens": "128", "output_tokens": "16"})
    assert (data["tp"], data["pp"], data["replicas"], data["gpus"]) == (2, 2, 2, 8)
    assert data["pipeline"]["layers_per_stage"] == 16 and data["pipeline"]["bubble_fraction"] == pytest.approx(1 / 3)
    assert data["requests"]["completed"] == 20


def test_a_pipelined_run_reports_the_whole_model_and_every_gpu():
    """llama2-70b on tp 2 x pp 2: 68.98 G parameters as without a pipeline (a stage holds half), on 4 GPUs."""
    from click.testing import CliRunner

    from simulator.cli import main
    from simulator.plan.result import engine_run_dict
    from simulator.plan.run import simulate_settings

    base = {"model": "llama2-70b", "gpu": "a100", "batch": 16, "ctx": 2048}
    piped = engine_run_dict(simulate_settings({**base, "tp": 2, "pp": 2}))
    whole = engine_run_dict(simulate_settings({**base, "tp": 4}))
    assert piped["params"] == whole["params"] and piped["active_params"] == whole["active_params"]
    title = CliRunner().invoke(main, ["--model", "llama2-70b", "--gpu", "a100", "--batch", "16", "--ctx", "2048",
                                      "--tp", "2", "--pp", "2", "--quiet"]).output.splitlines()[0]
    assert title == "memwall: llama2-70b on 4x A100-SXM4-80GB (tp 2 x pp 2)"
