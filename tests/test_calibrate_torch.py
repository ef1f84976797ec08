"""The calibration harness on CPU at tiny sizes (skipped where PyTorch is not installed).

CPU numbers describe nothing; these tests check the code path and the structure of what it
writes, and the timing arithmetic with fake timers.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from simulator.calibrate.bandwidth import measure_bandwidth, measure_elementwise  # noqa: E402
from simulator.calibrate.bench import Bench  # noqa: E402
from simulator.calibrate.endtoend import RandomDecoder  # noqa: E402
from simulator.calibrate.gemm import measure_gemms, padded_rows, projection_shapes  # noqa: E402
from simulator.calibrate.harness import run_calibration  # noqa: E402
from simulator.calibrate.overlay import derive_overlay, write_overlay  # noqa: E402
from simulator.calibrate.plan import Budget, tiny_model, tiny_plan  # noqa: E402
from simulator.cli import main  # noqa: E402
from simulator.model import load_gpu, load_model  # noqa: E402


def _json_of(output: str) -> dict:
    """The JSON object in a command's output (click < 8.2 mixes the stderr progress lines in)."""
    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def _bench(seconds_per_call: float) -> Bench:
    def fake_timer(fn):
        fn()  # the case must run; its time is made up
        return seconds_per_call

    return Bench(torch, "cpu", fake_timer, Budget(60.0))


def test_bandwidth_is_bytes_moved_over_seconds_with_a_fake_timer():
    rows = measure_bandwidth(_bench(1e-3), (2**20,))
    copy, read = rows
    # a 1 MiB copy reads and writes 1 MiB: 2 * 1_048_576 bytes in 1 ms = 2.097152e9 B/s
    assert copy["kernel"] == "copy" and copy["bytes"] == 2 * 1_048_576
    assert copy["bytes_per_second"] == pytest.approx(2_097_152_000.0)
    # the sum reads it once: 1.048576e9 B/s
    assert read["kernel"] == "read" and read["bytes_per_second"] == pytest.approx(1_048_576_000.0)


def test_elementwise_rows_count_three_tensors():
    (row,) = measure_elementwise(_bench(2e-6), (4,), 64, "fp16")
    assert row["bytes"] == 3 * 4 * 64 * 2 == 1536
    assert row["seconds"] == 2e-6


def test_gemm_rows_carry_the_llama2_7b_projection_shapes():
    assert projection_shapes(load_model("llama2-7b")) == [
        ("qkv_proj", 4096, 3 * 4096),
        ("o_proj", 4096, 4096),
        ("gate_up_proj", 4096, 2 * 11008),
        ("down_proj", 11008, 4096),
    ]
    assert projection_shapes(load_model("llama2-70b"))[0] == ("qkv_proj", 8192, (64 + 2 * 8) * 128)
    assert padded_rows(1, "fp8") == 16 and padded_rows(17, "fp8") == 32 and padded_rows(3, "fp16") == 3


def test_gemm_on_cpu_with_a_fake_timer():
    bench = _bench(1e-3)
    rows = measure_gemms(bench, (tiny_model(),), (2,), "fp16")
    assert len(rows) == 4  # four projections, one token count
    qkv = rows[0]
    assert (qkv["op"], qkv["k"], qkv["n"]) == ("qkv_proj", 64, 3 * 64)
    assert qkv["flops"] == 2 * 2 * 64 * 192 == 49_152
    # fp8 is CUDA-only: skipped with a reason, not an error
    assert measure_gemms(bench, (tiny_model(),), (2,), "fp8") == []
    assert bench.skipped[-1]["section"] == "gemm fp8"


def test_random_decoder_produces_finite_logits_of_the_vocabulary():
    bench = _bench(1e-3)
    model = tiny_model()
    decoder = RandomDecoder(bench, model, "fp16")
    cache = decoder.new_cache(2, 8)
    ids = torch.randint(0, model.vocab_size, (2, 1))
    logits = decoder.forward(ids, cache, 7, decoder.rotary(7, 1))
    assert tuple(logits.shape) == (2, model.vocab_size)
    assert torch.isfinite(logits.float()).all()
    prefill = decoder.forward(torch.randint(0, model.vocab_size, (1, 8)), decoder.new_cache(1, 8), 0, decoder.rotary(0, 8))
    assert tuple(prefill.shape) == (1, model.vocab_size)


def test_a_failing_case_is_listed_and_the_others_still_run():
    def broken_timer(fn):
        raise RuntimeError("CUDA error: made up")

    bench = Bench(torch, "cpu", broken_timer, Budget(60.0))
    assert measure_bandwidth(bench, (2**16,)) == []
    assert [s["case"] for s in bench.skipped] == ["copy 65536 bytes", "read 65536 bytes"]
    assert bench.skipped[0]["reason"] == "RuntimeError: CUDA error: made up"


def test_a_spent_budget_skips_the_remaining_cases():
    bench = Bench(torch, "cpu", lambda fn: 1e-3, Budget(-1.0))
    assert measure_bandwidth(bench, (2**16, 2**17)) == []
    assert len(bench.skipped) == 2 and "time budget" in bench.skipped[0]["reason"]


CHECKPOINTS: list[int] = []


@pytest.fixture(scope="module")
def tiny_run():
    def checkpoint(partial):
        CHECKPOINTS.append(len(partial["gemm"]))

    return run_calibration(torch, "cpu", tiny_plan(), load_gpu("a100"), "fp16", budget_seconds=120.0, checkpoint=checkpoint)


def test_tiny_run_checkpoints_after_every_section(tiny_run):
    # per-kernel cost, bandwidth, elementwise, gemm fp16, attention, end to end, timeline, gemm bf16
    assert len(CHECKPOINTS) == 8
    assert CHECKPOINTS[3] == 16 and CHECKPOINTS[-1] == 32  # 4 projections x 4 token counts per dtype


def test_tiny_run_measures_every_section(tiny_run):
    plan = tiny_plan()
    assert tiny_run["device"]["kind"] == "cpu"
    assert tiny_run["peaks"]["source"] == "measured"
    assert len(tiny_run["bandwidth"]) == 2 * len(plan.bandwidth_buffer_bytes)
    # 4 projections x 4 token counts, in fp16 and bf16
    assert len(tiny_run["gemm"]) == 4 * len(plan.gemm_tokens) * 2
    # per shape (MHA, GQA): 2 prefill + 2 x 2 decode cases
    assert len(tiny_run["attention"]) == 2 * (2 + 2 * 2)
    cases = tiny_run["endtoend"]["cases"]
    assert [(c["phase"], c["batch"], c["context"]) for c in cases] == [
        ("decode", 1, 16), ("decode", 1, 32), ("decode", 2, 16), ("decode", 2, 32), ("prefill", 1, 16), ("prefill", 1, 32),
    ]
    assert all(c["seconds"] > 0 for c in cases)
    json.dumps(tiny_run)  # the raw timings are plain JSON


def test_tiny_run_overlay_is_a_valid_gpu_with_efficiencies_in_range(tiny_run, tmp_path):
    path = tmp_path / "cpu.yaml"
    write_overlay(path, derive_overlay(tiny_run))
    gpu = load_gpu(str(path))
    assert gpu.measured["torch"] == torch.__version__
    assert gpu.efficiency_by_op
    for entry in gpu.efficiency_by_op:
        for value in (entry.compute, entry.memory):
            assert value is None or 0.0 < value <= 1.0
    assert 0.0 < gpu.efficiency.memory <= 1.0


def test_cli_on_cpu_writes_overlay_timings_and_a_row_per_case(tmp_path):
    out = tmp_path / "measured" / "cpu.yaml"
    result = CliRunner().invoke(main, ["calibrate", "--device", "cpu", "--base", "h100", "--out", str(out), "--check", "--json"])
    assert result.exit_code == 0, result.output
    table = _json_of(result.output)
    assert len(table["rows"]) == 6
    assert load_gpu(str(out)).measured["plan"] == "tiny"
    saved = json.loads((tmp_path / "measured" / "cpu.measurements.json").read_text())
    assert saved["base_gpu"] == "H100-SXM5-80GB"


def test_tiny_run_profiles_each_timeline_case_operator_by_operator(tiny_run):
    from simulator.calibrate.timeline import PROFILED_FORWARDS

    profiled = tiny_run["timeline"]
    assert [(c["phase"], c["batch"], c["context"]) for c in profiled] == list(tiny_plan().timeline_cases)
    # every operator the decoder runs, named as `simulate layers` names them, plus the KV-cache write
    names = {"embedding", "attn_norm", "qkv_proj", "rotary", "kv_write", "attention", "o_proj", "attn_residual",
             "mlp_norm", "gate_up_proj", "activation", "down_proj", "mlp_residual", "final_norm", "lm_head"}
    for case in profiled:
        assert set(case["operators"]) == names
        assert all(seconds > 0 for seconds in case["operators"].values())
        # on CPU the ranges together are the forward, and no device kernel is counted
        assert case["kernel_seconds"] == pytest.approx(sum(case["operators"].values()))
        assert case["kernels"] is None and case["forwards"] == PROFILED_FORWARDS
