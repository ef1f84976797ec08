"""Disaggregated prefill/decode: KV bytes and transfer time by hand, the link, the pools, the runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.cost.kv_transfer import (
    KVLink,
    kv_link,
    kv_transfer_seconds,
    queued_transfer_ends,
)
from simulator.errors import InputError
from simulator.model import load_gpu
from simulator.plan.disaggregated_run import disaggregation_summary, prompt_kv_bytes
from simulator.plan.placement import build_deployment
from simulator.plan.result import engine_run_dict
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings, parse_settings

LLAMA3_70B_2048_KV = 2048 * 327_680  # 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes per token


def test_kv_bytes_of_a_2048_token_prompt():
    assert LLAMA3_70B_2048_KV == 671_088_640
    deployment = build_deployment({"model": "llama3-70b", "gpu": "h100"}, 1, 4096, tp=2, pp=1)
    assert prompt_kv_bytes(deployment, np.array([2048, 1])).tolist() == [671_088_640, 327_680]


def test_transfer_time_over_a_stated_link():
    # 671,088,640 bytes over 2 links of 25 GB/s after 20 us: 20e-6 + 671,088,640 / 50e9 = 0.0134417728 s.
    link = KVLink(25e9, 20e-6, 2, True, "test")
    assert kv_transfer_seconds(671_088_640, link) == pytest.approx(0.0134417728, rel=1e-12)
    assert kv_transfer_seconds(0, link) == 0.0


def test_the_link_within_a_node_and_across_nodes():
    h100 = load_gpu("h100")
    # 1 x 2 + 3 x 2 = 8 GPUs fit one 8-GPU node: NVLink 4 at 450 GB/s x link efficiency 0.75 = 337.5 GB/s per link.
    inside = kv_link(h100, h100, 2, 2, 8)
    assert not inside.across_nodes and inside.links == 2
    assert inside.bytes_per_second == pytest.approx(450e9 * h100.efficiency.link) == pytest.approx(337.5e9)
    # 10 GPUs do not: InfiniBand NDR, 50 GB/s per GPU x 0.75, NCCL's 14 us network hop on top of the base latency.
    across = kv_link(h100, h100, 4, 2, 10)
    assert across.across_nodes and across.links == 2
    assert across.bytes_per_second == pytest.approx(50e9 * 0.75)
    # NCCL Simple over NVLink 4 (configs/interconnects/nvlink4.yaml): base 8.4 us + hop 3.4 us = 11.8 us inside;
    # base 8.4 us + network hop 14 us = 22.4 us across.
    assert inside.latency_seconds == pytest.approx(11.8e-6)
    assert across.latency_seconds == pytest.approx(22.4e-6)
    # A100 nodes have HDR: 25 GB/s per GPU; different GPU types are different nodes.
    a100 = load_gpu("a100")
    assert kv_link(a100, h100, 1, 1, 2).bytes_per_second == pytest.approx(25e9 * a100.efficiency.link)
    # The 2048-token prompt between tp-2 pools in one H100 node: 11.8 us + 671,088,640 / (2 x 337.5e9) = ~1.0 ms.
    seconds = kv_transfer_seconds(LLAMA3_70B_2048_KV, inside)
    assert seconds == pytest.approx(inside.latency_seconds + 671_088_640 / 675e9)
    assert 0.99e-3 < seconds < 1.01e-3


def test_transfers_of_one_sender_queue():
    # Ready at 0, 0, 10 taking 1, 2, 1 s: the second waits for the first (ends at 3), the third starts at 10.
    assert queued_transfer_ends(np.array([0.0, 0.0, 10.0]), np.array([1.0, 2.0, 1.0])).tolist() == [1.0, 3.0, 11.0]


def test_settings():
    with pytest.raises(InputError, match="number 63; give P:D as text, quoted in YAML"):
        parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "disaggregate": 63})
    with pytest.raises(InputError, match="replicas: with disaggregate"):
        parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "disaggregate": "1:3", "replicas": 2})
    with pytest.raises(InputError, match="decode_tp: applies only with disaggregate"):
        parse_settings(RunSettings, {"model": "llama3-8b", "gpu": "h100", "decode_tp": 2})
    assert parse_settings(RunSettings, {"model": "m", "gpu": "g", "disaggregate": "2:6"}).pools == (2, 6)


def test_one_request_prefills_like_a_colocated_one_then_moves_and_decodes():
    base = {"model": "llama3-70b", "gpu": "h100", "tp": 2, "batch": 1, "prompt_tokens": 2048, "output_tokens": 32}
    split = simulate_settings({**base, "disaggregate": "1:1"})
    alone = simulate_settings(base)
    # The prefill replica prefills it exactly as a colocated replica does: the same TTFT.
    assert split.metrics.ttft.mean == pytest.approx(alone.metrics.ttft.mean, rel=1e-12)
    # It finishes after its first token + the transfer + the decode pool's iterations (the first feeds token 1).
    pools = split.result.extra["disaggregation"]
    decode_busy = float(pools.decode.log["seconds"].sum())
    moved = float(pools.transfers.seconds[0])
    assert moved == pytest.approx(kv_transfer_seconds(LLAMA3_70B_2048_KV, pools.transfers.link))
    assert split.result.finish[0] == pytest.approx(split.result.first_token[0] + moved + decode_busy, rel=1e-9)
    assert pools.decode.log.size == 31  # token 1 fed back (emits token 2), then 30 decode ticks to token 32


@pytest.fixture(scope="module")
def loaded():
    """llama3-70b fp8 on 8 H100s at 4 requests/s of 2048 + 256 tokens: 1 prefill : 3 decode replicas of tp 2
    against 4 colocated replicas."""
    base = {"model": "llama3-70b", "gpu": "h100", "tp": 2, "weights": "fp8", "qps": 4.0, "requests": 240,
            "prompt_tokens": 2048, "output_tokens": 256, "seed": 1}
    return simulate_settings({**base, "disaggregate": "1:3"}), simulate_settings({**base, "replicas": 4})


def test_disaggregation_trades_ttft_for_tpot(loaded):
    split, colocated = loaded
    # Colocated, every prompt's chunks share iterations with the decodes; split, decodes run alone.
    assert split.metrics.tpot.p99 < 0.9 * colocated.metrics.tpot.p99
    # One prefill replica queues the prompts that four colocated replicas would share.
    assert split.metrics.ttft.p99 > colocated.metrics.ttft.p99
    assert split.metrics.completed == colocated.metrics.completed == 240


def test_json_and_report(loaded):
    split, _ = loaded
    data = engine_run_dict(split)
    assert data["gpus"] == 8  # 1 x 2 + 3 x 2
    block = data["disaggregation"]
    assert block["ratio"] == "1:3" and block["prefill"]["gpus"] == 2 and block["decode"]["gpus"] == 6
    assert block["kv_bytes_mean"] == 671_088_640  # fp8 weights, fp16 KV cache: 2048 x 327,680 bytes
    json.dumps(data)
    summary = disaggregation_summary(split)
    assert summary is not None and summary.transfers == 240


def test_cli_disaggregated_run():
    result = CliRunner().invoke(main, ["--model", "llama3-8b", "--gpu", "h100", "--qps", "4", "--requests", "20",
                                       "--prompt-tokens", "512", "--output-tokens", "16", "--disaggregate", "1:1", "-q"])
    assert result.exit_code == 0, result.output
    assert "Disaggregated prefill : decode = 1:1" in result.output and "KV transfer" in result.output


def _scenario(tmp_path, axis: str):
    from simulator.sweep.scenario import load_scenario

    path = tmp_path / "ratio.yaml"
    path.write_text(
        "base: {model: llama3-8b, gpu: h100, qps: 4.0, requests: 12, prompt_tokens: 256, output_tokens: 8}\n"
        f"sweep:\n  grid:\n    disaggregate: {axis}\n"
    )
    return load_scenario(path, out=str(tmp_path / "rows.csv"))


def test_a_sweep_axis_over_ratios(tmp_path):
    from simulator.sweep.sweep import InlineExecutor, run_sweep

    outcome = run_sweep(_scenario(tmp_path, '["1:1", "1:2"]'), InlineExecutor())
    rows = sorted(outcome.rows, key=lambda row: row["point"])
    assert [row["disaggregation.ratio"] for row in rows] == ["1:1", "1:2"]
    assert [row["gpus"] for row in rows] == [2, 3]  # llama3-8b at tp 1: 1 + 1, 1 + 2 GPUs


def test_an_unquoted_ratio_in_yaml_is_explained(tmp_path):
    # YAML 1.1 reads 1:3 as 1 x 60 + 3 = 63.
    with pytest.raises(InputError, match="63; give P:D as text, quoted in YAML"):
        _scenario(tmp_path, "[1:3]")


def test_a_speculative_decode_pool():
    run = simulate_settings({"model": "llama3-8b", "gpu": "h100", "qps": 2.0, "requests": 16, "prompt_tokens": 256,
                             "output_tokens": 32, "disaggregate": "1:1", "speculative": "eagle",
                             "num_speculative_tokens": 3, "acceptance": 0.8})
    data = engine_run_dict(run)
    assert data["disaggregation"]["ratio"] == "1:1"
    # 1 + 0.8 + 0.64 + 0.512 = 2.952 tokens per iteration expected.
    assert data["speculative"]["expected_tokens_per_iteration"] == pytest.approx(2.952)
    assert data["speculative"]["tpot_speedup"] > 1.0
    assert run.metrics.output_tokens == 16 * 32
