"""`simulate compare`: MHA / GQA / MQA side by side, numbers by hand."""

import json

import pytest
from click.testing import CliRunner
from exact import exact_gpu

from simulator.cli import main
from simulator.cost.memory import plan_memory
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_model
from simulator.model.precision import Precision
from simulator.model.step import Step
from simulator.report.compare import (
    compare_attention,
    max_batch_that_fits,
    parse_contexts,
)


@pytest.fixture(scope="module")
def comparison():
    return compare_attention(load_model("llama2-70b"), exact_gpu(), Precision(), ["mha", "gqa:8", "mqa"],
                             [512, 4096, 32768])


def cell(comparison, kind, ctx):
    return next(r for r in comparison.rows if r.attention_kind == kind and r.ctx == ctx)


def test_kv_bytes_per_token_and_sequence_by_hand(comparison):
    # 2 (K and V) x 80 layers x KV heads x 128 x 2 bytes
    assert cell(comparison, "MHA", 4096).kv_bytes_per_token == 2 * 80 * 64 * 128 * 2 == 2_621_440
    assert cell(comparison, "GQA-8", 4096).kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert cell(comparison, "MQA", 4096).kv_bytes_per_token == 2 * 80 * 1 * 128 * 2 == 40_960
    # The essay's 10.7 GB at T = 4096 is the MHA case; the real GQA-8 model needs 1.34 GB.
    assert cell(comparison, "MHA", 4096).kv_bytes_per_sequence == 4 * 80 * 4096 * 8192 == 10_737_418_240
    assert cell(comparison, "GQA-8", 4096).kv_bytes_per_sequence == 1_342_177_280
    assert len(comparison.rows) == 9


def test_one_tp_for_all_rows_the_smallest_where_mha_at_32k_fits(comparison):
    # fp16 weights are 2 x 68.98e9 B = 128.5 GiB; MHA at 32768 tokens needs 80 GiB of KV per sequence.
    # tp 2: 64 GiB of weights + 40 GiB of KV > 80 GiB; tp 4: 32 + 20 GiB fits.
    assert comparison.tp == 4
    assert {r.tp for r in comparison.rows} == {4}


def test_contexts_beyond_the_trained_maximum_are_flagged(comparison):
    assert [r.beyond_max_context for r in comparison.rows if r.attention_kind == "MHA"] == [False, False, True]
    assert cell(comparison, "MHA", 32768).decode_step_seconds > cell(comparison, "MHA", 4096).decode_step_seconds


def test_decode_step_at_batch_1_differs_by_the_kv_heads_traffic(comparison):
    # tp 4: MHA keeps 16 KV heads per GPU, MQA its one head (replicated). Per layer and GPU the
    # 2 x 15 x 128 = 3840 extra K/V columns cost, in fp16, QKV weights 8192 x 3840, one QKV output
    # row of 3840, the KV-cache read of 4096 keys and the write of one: all memory-bound at batch 1.
    extra = 2 * 15 * 128
    delta = 80 * extra * 2 * (8192 + 1 + 4096 + 1) / 2.039e12
    mha, mqa = cell(comparison, "MHA", 4096), cell(comparison, "MQA", 4096)
    assert mha.decode_step_seconds - mqa.decode_step_seconds == pytest.approx(delta, rel=1e-6)


def test_max_batch_is_the_largest_that_fits_and_grows_as_kv_heads_shrink(comparison):
    model, gpu, precision = load_model("llama2-70b"), exact_gpu(), Precision()
    system = System(model, gpu, precision, 4)
    largest = max_batch_that_fits(model, precision, gpu, 4, 4096, system)
    assert plan_memory(model, precision, gpu, 4, largest, 4096, system.operators).fits
    assert not plan_memory(model, precision, gpu, 4, largest + 1, 4096, system.operators).fits
    assert cell(comparison, "GQA-8", 4096).max_batch == largest
    # Per GPU, a GQA-8 sequence of 4096 tokens holds 2 KV heads: 2 x 80 x 2 x 128 x 2 x 4096 = 320 MiB, and
    # the 80 GiB GPU keeps ~46 GiB after 32.1 GiB of weights, workspace and runtime: ~147 sequences.
    assert 140 <= largest <= 150
    gqa, mha = cell(comparison, "GQA-8", 4096), cell(comparison, "MHA", 4096)
    # MHA: 8x the KV bytes per GPU (2.5 GiB per sequence) and 80 x 8192 x 14336 x 2 / 4 B = 4.375 GiB more
    # QKV weights per GPU, taken from the ~147 x 320 MiB the GQA-8 rows use: (45.94 - 4.375) / 2.5 = 16.6.
    assert 80 * 8192 * 2 * (64 - 8) * 128 * 2 / 4 == 4.375 * 2**30
    assert mha.max_batch == int((largest * 320 / 1024 - 4.375) / 2.5) == 16
    assert gqa.max_batch_tokens_per_second == pytest.approx(
        largest / System(model, gpu, precision, 4).step_seconds(Step.decode(largest, 4096)))


def test_bad_lists_are_input_errors():
    with pytest.raises(InputError, match="--ctx"):
        parse_contexts("512,lots")
    with pytest.raises(InputError, match="--attention"):
        compare_attention(load_model("llama2-70b"), exact_gpu(), Precision(), ["gqa:7"], [512])


def test_cli_table_json_and_warning():
    runner = CliRunner()
    args = ["compare", "--model", "llama2-70b", "--gpu", "a100", "--attention", "mha,gqa:8,mqa", "--ctx", "512,4096,32768"]
    text = runner.invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "32768*" in text.output and "beyond the 4096-token context" in text.output
    assert "GQA-8" in text.output and "max batch" in text.output
    data = json.loads(runner.invoke(main, args + ["--json"]).output)
    assert len(data["rows"]) == 9
    assert data["rows"][0]["kv_bytes_per_token"] == 2_621_440
    bad = runner.invoke(main, ["compare", "--model", "llama2-70b", "--gpu", "a100", "--ctx", "0"])
    assert bad.exit_code == 2 and "--ctx" in bad.output


def test_the_headline_does_not_claim_a_fit_no_row_has():
    """10^8 tokens of llama2-70b's KV (327,680 bytes each: 32.8 TB) fit no A100 at any degree."""
    out = CliRunner().invoke(main, ["compare", "--model", "llama2-70b", "--gpu", "a100", "--ctx", "100000000"]).output
    assert "(the largest degree tried: not every row fits one sequence even there)" in out.splitlines()[0]
