"""Calibration without PyTorch: work counts, overlay derivation, the check's arithmetic, the CLI.

Every expected number is worked out by hand here. The shipped efficiency defaults never
matter: the check's GPUs are built in the test, and overlays are compared on their own
fields.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from simulator.calibrate.check import check_rows, error_percent, summary
from simulator.calibrate.overlay import (
    SCHEMA,
    achieved_fraction,
    derive_overlay,
    load_measurements,
    save_measurements,
    token_buckets,
    write_overlay,
)
from simulator.calibrate.timeline import summarise
from simulator.calibrate.timing import CpuTimer, calls_per_repeat
from simulator.calibrate.work import (
    attention_work,
    copies_to_defeat_cache,
    copy_bytes,
    elementwise_add_work,
    gemm_work,
    read_bytes,
)
from simulator.cli import main
from simulator.cost.step_cost import efficiency_factors
from simulator.errors import InputError
from simulator.model import GPUSpec, ModelSpec, load_gpu
from simulator.model.gpu import Efficiency

# ---- work counts (the cost model's own) -------------------------------------------------

def _json_of(output: str) -> dict:
    """The JSON object in a command's output (click < 8.2 mixes the stderr progress lines in)."""
    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def test_gemm_work_of_a_decode_token_through_a_4096_square_weight():
    work = gemm_work(1, 4096, 4096, "fp16")
    assert work.flops == 2 * 1 * 4096 * 4096 == 33_554_432
    # weight read once (2 bytes each) + the token's input and output rows
    assert work.bytes == 4096 * 4096 * 2 + 1 * (4096 + 4096) * 2 == 33_570_816


def test_fp8_gemm_counts_one_byte_weights_and_fp16_activations():
    work = gemm_work(16, 1024, 2048, "fp8")
    assert work.flops == 2 * 16 * 1024 * 2048 == 67_108_864
    assert work.bytes == 1024 * 2048 * 1 + 16 * (1024 + 2048) * 2 == 2_195_456


def test_attention_work_of_one_decode_query_against_512_keys_llama2_7b_layer():
    # 32 heads, 32 KV heads, head dim 128, fp16: K and V of 512 tokens read, one token's K/V written,
    # q read and the output written (flash, no I/O fusion).
    work = attention_work("decode", 1, 512, 32, 32, 128, "fp16", query_tile_rows=128)
    assert work.bytes == 2 * 32 * 128 * 2 * 512 + 2 * 32 * 128 * 2 * 1 + 2 * 1 * 32 * 128 * 2 == 8_421_376
    # 4 n d per (query, key) pair for QK^T and PV, 5 n per pair for the softmax
    assert work.flops == 4 * 32 * 128 * 512 + 5 * 32 * 512 == 8_470_528


def test_elementwise_add_and_bandwidth_bytes():
    work = elementwise_add_work(8, 4096, "fp16")
    assert work.bytes == 3 * 8 * 4096 * 2 == 196_608
    assert work.flops == 8 * 4096 == 32_768
    assert copy_bytes(2**30) == 2 * 2**30
    assert read_bytes(2**30) == 2**30


def test_buffer_sets_cycled_to_miss_a_50_mib_cache():
    l2 = 50 * 2**20
    assert copies_to_defeat_cache(32 * 2**20, l2) == 5  # ceil(150 MiB / 32 MiB)
    assert copies_to_defeat_cache(1 * 2**20, l2) == 16  # 150 would be needed; capped
    assert copies_to_defeat_cache(2**30, l2) == 1
    assert copies_to_defeat_cache(2**20, 0) == 1  # CPU: no cache to defeat


def test_calls_per_repeat_groups_short_calls():
    assert calls_per_repeat(1e-4, 2e-3, 64) == 20
    assert calls_per_repeat(3e-4, 2e-3, 64) == 7  # ceil(6.67)
    assert calls_per_repeat(1e-6, 2e-3, 64) == 64
    assert calls_per_repeat(5e-3, 2e-3, 64) == 1


def test_cpu_timer_calls_warmup_then_repeats():
    calls = []
    timer = CpuTimer(warmup=2, repeats=3, target_seconds=0.0, most_calls=16)
    seconds = timer(lambda: calls.append(1))
    # 2 warm-up calls, 1 call to size the groups, then 3 repeats of 1 call each
    assert len(calls) == 2 + 1 + 3
    assert seconds >= 0.0


# ---- overlay --------------------------------------------------------------------------

PEAK = 1e12  # FLOP/s
BANDWIDTH = 1e9  # bytes/s
LAUNCH = 1e-6  # s


def _measurements() -> dict:
    """Timings made up so that every achieved fraction is a round number."""

    def gemm(tokens, flops, moved, seconds, dtype="fp16"):
        return {"dtype": dtype, "model": "m", "op": "o", "tokens": tokens, "k": 1, "n": 1,
                "flops": flops, "bytes": moved, "seconds": seconds}

    return {
        "schema": SCHEMA,
        "device": {"kind": "cuda", "name": "Made-up GPU", "torch": "2.13.0", "cuda": "12.8", "date": "2026-12-02T00:00:00Z"},
        "base_gpu": "A100-SXM4-80GB",
        "dtype": "fp16",
        "plan": "test",
        "peaks": {"source": "datasheet of A100-SXM4-80GB", "flops": {"fp16": PEAK}, "hbm_bandwidth_bytes_per_second": BANDWIDTH},
        "launch_seconds": LAUNCH,
        "timing": {"method": "made up", "warmup": 0, "repeats": 1, "statistic": "median"},
        "bandwidth": [
            {"kernel": "copy", "buffer_bytes": 1000, "bytes": 2000, "seconds": 2000 / 9.5e8, "bytes_per_second": 9.5e8},
            {"kernel": "copy", "buffer_bytes": 10**6, "bytes": 2e6, "seconds": 2.5e-3, "bytes_per_second": 8e8},
            {"kernel": "read", "buffer_bytes": 10**6, "bytes": 1e6, "seconds": 1e6 / 7e8, "bytes_per_second": 7e8},
        ],
        "elementwise": [
            {"kernel": "add", "dtype": "fp16", "tokens": 1, "width": 8, "flops": 8, "bytes": 48, "seconds": 5e-7},
            {"kernel": "add", "dtype": "fp16", "tokens": 1024, "width": 1000, "flops": 1.024e6, "bytes": 3e6,
             "seconds": LAUNCH + 3e6 / (BANDWIDTH * 0.6)},
        ],
        "gemm": [
            # memory-bound (2e6 / 1e12 = 2 us of compute < 2.004 ms of memory): achieved 0.5 of bandwidth
            gemm(1, 2e6, 2_004_000, LAUNCH + 2_004_000 / (BANDWIDTH * 0.5)),
            # memory-bound, 0.7 of bandwidth
            gemm(1, 1e3, 7e5, LAUNCH + 7e5 / (BANDWIDTH * 0.7)),
            # compute-bound (10 ms of compute > 1 ms of memory): achieved 0.8 of peak
            gemm(4096, 1e10, 1e6, LAUNCH + 1e10 / (PEAK * 0.8)),
            # another dtype: not part of an fp16 overlay
            gemm(4096, 1e10, 1e6, 1.0, dtype="bf16"),
        ],
        "attention": [
            {"variant": "MHA", "phase": "decode", "batch": 1, "context": 512, "tokens": 1, "dtype": "fp16",
             "flops": 1e3, "bytes": 1e6, "seconds": LAUNCH + 1e6 / (BANDWIDTH * 0.25)},
        ],
        "endtoend": {"model": {}, "cases": []},
        "skipped": [],
    }


def test_achieved_fraction_subtracts_the_kernel_cost():
    case = {"flops": 2e6, "bytes": 2_004_000, "seconds": 1e-6 + 4.008e-3}
    bound, fraction = achieved_fraction(case, PEAK, BANDWIDTH, LAUNCH)
    assert bound == "memory"
    assert fraction == pytest.approx(2_004_000 / (1e9 * 4.008e-3)) == pytest.approx(0.5)
    assert achieved_fraction({"flops": 1, "bytes": 1, "seconds": 5e-7}, PEAK, BANDWIDTH, LAUNCH) is None


def test_achieved_fraction_is_capped_at_one():
    # 1e6 bytes in 0.5 ms = 2e9 B/s, twice the "peak"
    assert achieved_fraction({"flops": 0.0, "bytes": 1e6, "seconds": 5e-4}, PEAK, BANDWIDTH, 0.0) == ("memory", 1.0)


def test_token_buckets_cover_every_count():
    assert token_buckets([8, 1, 64]) == [(0, 7), (8, 63), (64, None)]
    assert token_buckets([512]) == [(0, None)]


def test_overlay_from_saved_timings():
    overlay = derive_overlay(_measurements())
    assert overlay["base"] == "A100-SXM4-80GB"
    assert overlay["efficiency"] == {
        "kernel_launch_seconds": 1e-6,
        "sustained_clock": 1.0,  # the measured fractions already hold the clock the GPU ran at
        "memory": 0.8,  # best on the largest (1e6-byte) buffer: copy 8e8 / 1e9; the 1000-byte copy is not used
        "compute": 0.8,  # the one compute-bound fp16 GEMM
    }
    assert overlay["efficiency_by_op"] == [
        {"op_class": "gemm", "min_tokens": 0, "max_tokens": 4095, "memory": 0.6},  # median of 0.5 and 0.7
        {"op_class": "gemm", "min_tokens": 4096, "max_tokens": None, "compute": 0.8},
        {"op_class": "attention", "min_tokens": 0, "max_tokens": None, "memory": 0.25},
        # the 1-token add took less than the kernel cost: no information, no entry for its bucket
        {"op_class": "elementwise", "min_tokens": 1024, "max_tokens": None, "memory": 0.6},
    ]
    measured = overlay["measured"]
    assert measured["date"] == "2026-12-02T00:00:00Z"
    assert measured["torch"] == "2.13.0" and measured["cuda"] == "12.8" and measured["device"] == "Made-up GPU"
    assert all(isinstance(v, str) for v in measured.values())


def test_overlay_file_loads_as_a_gpu_and_drives_the_cost_model(tmp_path):
    path = tmp_path / "made-up.yaml"
    write_overlay(path, derive_overlay(_measurements()))
    gpu = load_gpu(str(path))
    a100 = load_gpu("a100")
    assert gpu.name == "A100-SXM4-80GB-measured"
    assert gpu.peak_flops == a100.peak_flops  # peaks come from the base on a GPU
    assert gpu.efficiency.memory == 0.8 and gpu.efficiency.compute == 0.8
    assert gpu.efficiency.kernel_launch_seconds == 1e-6
    assert gpu.efficiency.link == a100.efficiency.link  # not measured: the base's
    assert len(gpu.efficiency_by_op) == 4
    assert efficiency_factors(gpu, "gemm", 1)[1] == 0.6
    assert efficiency_factors(gpu, "gemm", 8192)[0] == 0.8
    assert efficiency_factors(gpu, "attention", 128)[1] == 0.25
    assert gpu.measured["device"] == "Made-up GPU"


def test_cpu_overlay_replaces_the_peaks(tmp_path):
    timings = _measurements()
    timings["peaks"] = {"source": "measured", "flops": {"fp16": 4e9}, "hbm_bandwidth_bytes_per_second": 8e10}
    overlay = derive_overlay(timings)
    assert overlay["peak_flops"] == {"fp16": 4e9}
    assert overlay["hbm_bandwidth_bytes_per_second"] == 8e10
    path = tmp_path / "cpu.yaml"
    write_overlay(path, overlay)
    assert load_gpu(str(path)).hbm_bandwidth_bytes_per_second == 8e10


def test_load_measurements_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": "something else"}))
    with pytest.raises(InputError, match="not a calibration timings file"):
        load_measurements(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_measurements(path)
    with pytest.raises(InputError, match="no such file"):
        load_measurements(tmp_path / "missing.json")


# ---- the check -------------------------------------------------------------------------

# One layer, hidden 8, one head (head dim 8), FFN 16, vocabulary 16, fp16, fusion none.
# HBM bytes of one decode step at batch 1, context 4 (flash attention, every elementwise op a kernel):
#   embedding 8*2 read + 8*2 written = 32; each RMSNorm 8*2 weight + (8+8)*2 = 48 (three of them: 144)
#   qkv 8*24*2 + (8+24)*2 = 448; rotary (16+16)*2 = 64
#   attention: K/V read 2*8*2*4 = 128, K/V written 2*8*2 = 32, q in + out 2*8*2 = 32 -> 192
#   o_proj 8*8*2 + (8+8)*2 = 160; two residual adds (16+8)*2 = 48 each: 96
#   gate_up 8*32*2 + (8+32)*2 = 592; SiLU x up (32+16)*2 = 96; down 16*8*2 + (16+8)*2 = 304
#   lm_head 8*16*2 + (8+16)*2 = 304
STEP_BYTES = 32 + 144 + 448 + 64 + 192 + 160 + 96 + 592 + 96 + 304 + 304
assert STEP_BYTES == 2432


def _hand_gpu(memory: float) -> GPUSpec:
    # FLOPs are free (1e30 FLOP/s) and launches cost nothing: the step takes bytes / (bandwidth * memory).
    return GPUSpec(
        name=f"hand-{memory}", peak_flops={"fp16": 1e30}, hbm_bytes=1e12, hbm_bandwidth_bytes_per_second=STEP_BYTES,
        sram_bytes_per_sm=1e5, link_bandwidth_bytes_per_second=1e9,
        efficiency=Efficiency(compute=1.0, memory=memory, link=1.0, kernel_launch_seconds=0.0, allreduce_latency_seconds=0.0),
    )


def _check_timings() -> dict:
    model = ModelSpec(name="hand", num_layers=1, hidden_size=8, num_heads=1, ffn_size=16, vocab_size=16, max_context=64)
    timings = _measurements()
    timings["endtoend"] = {
        "model": model.model_dump(),
        "cases": [
            {"phase": "decode", "batch": 1, "context": 4, "seconds": 0.8},
            {"phase": "decode", "batch": 1, "context": 4, "seconds": 1.25},
        ],
    }
    timings["skipped"] = [{"section": "endtoend", "case": "decode batch=128 ctx=8192", "reason": "does not fit"}]
    return timings


def test_a_step_measured_under_a_nanosecond_is_refused(tmp_path):
    timings = _check_timings()
    timings["endtoend"]["cases"][0]["seconds"] = 1e-300  # its relative error would overflow to infinity
    path = tmp_path / "t.json"
    path.write_text(json.dumps(timings))
    with pytest.raises(InputError, match="seconds"):
        load_measurements(path)


def test_error_percent():
    assert error_percent(1.0, 0.8) == pytest.approx(25.0)
    assert error_percent(1.0, 1.25) == pytest.approx(-20.0)


def test_check_rows_predict_the_unfused_flash_decoder():
    rows = check_rows(_check_timings(), _hand_gpu(1.0), _hand_gpu(0.5))
    assert len(rows) == 2
    # shipped column: 2432 bytes at 2432 B/s = 1 s; measured column at half the bandwidth: 2 s
    assert [r.shipped_seconds for r in rows] == pytest.approx([1.0, 1.0])
    assert [r.overlay_seconds for r in rows] == pytest.approx([2.0, 2.0])
    assert [r.shipped_error_percent for r in rows] == pytest.approx([25.0, -20.0])  # (1 - 0.8)/0.8, (1 - 1.25)/1.25
    assert [r.overlay_error_percent for r in rows] == pytest.approx([150.0, 60.0])  # (2 - 0.8)/0.8, (2 - 1.25)/1.25
    stats = summary(rows)
    assert stats["shipped_median_abs_error_percent"] == pytest.approx(22.5)
    assert stats["shipped_max_abs_error_percent"] == pytest.approx(25.0)
    assert stats["overlay_median_abs_error_percent"] == pytest.approx(105.0)
    assert stats["overlay_max_abs_error_percent"] == pytest.approx(150.0)


# ---- CLI -----------------------------------------------------------------------------

def _saved(tmp_path: Path) -> Path:
    """Saved timings of the hand model on the A100 base."""
    timings = _check_timings()
    path = tmp_path / "timings.json"
    save_measurements(path, timings)
    return path


def test_cli_check_from_saved_timings_needs_no_torch(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now fails
    out = tmp_path / "overlay.yaml"
    result = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(_saved(tmp_path)), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    table = _json_of(result.output)
    assert [r["measured_seconds"] for r in table["rows"]] == [0.8, 1.25]
    assert table["fusion"] == "none" and table["attention_kernel"] == "flash"
    assert table["skipped"][0]["case"] == "decode batch=128 ctx=8192"
    assert load_gpu(str(out)).efficiency.memory == 0.8


def test_cli_check_text_has_a_row_per_case_and_the_summary(tmp_path):
    result = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(_saved(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.output.count("decode  batch   1  ctx     4") == 2
    assert "|error| with shipped efficiencies:  median" in result.output
    assert "skipped: does not fit" in result.output


def _event(name, device="CPU", device_us=0.0, cpu_us=0.0, annotation=False):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), device_time_total=device_us,
                           cpu_time_total=cpu_us, is_user_annotation=annotation)


def test_a_profile_on_a_device_sums_kernels_and_each_operator_range_per_forward():
    events = [
        _event("memwall::qkv_proj", device_us=100.0), _event("memwall::qkv_proj", device_us=200.0),
        _event("memwall::attention", device_us=600.0),
        _event("aten::mm", device_us=900.0),  # a CPU op: its kernels are the device events below, counted once
        _event("gemm kernel", "CUDA", 100.0), _event("gemm kernel", "CUDA", 200.0),
        _event("flash kernel", "CUDA", 600.0), _event("Memset (Device)", "CUDA", 100.0),
        # the qkv range mirrored on the device's timeline: its span (kernels and gaps), neither kernel nor operator
        _event("memwall::qkv_proj", "CUDA", 450.0, annotation=True),
    ]
    found = summarise(events, on_device=True, forwards=2)
    assert found["kernel_seconds"] == pytest.approx((100 + 200 + 600 + 100) / 2 * 1e-6)
    assert found["kernels"] == 2  # 4 device events over 2 forwards
    assert found["operators"] == pytest.approx({"attention": 300e-6, "qkv_proj": 150e-6})


def test_a_profile_with_activity_types_counts_only_the_device_work():
    def event(name, kind, device="CUDA", device_us=0.0):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), device_time_total=device_us,
                               cpu_time_total=0.0, activity_type=kind)

    events = [event("memwall::down_proj", "user_annotation", "CPU", 70.0),
              event("memwall::down_proj", "gpu_user_annotation", device_us=90.0),  # span: kernel and gap
              event("gemm kernel", "kernel", device_us=70.0), event("Memcpy DtoD", "gpu_memcpy", device_us=5.0),
              event("Memset (Device)", "gpu_memset", device_us=1.0), event("sync wait", "cuda_sync", device_us=40.0),
              event("cudaLaunchKernel", "cuda_runtime", "CPU", 3.0)]
    found = summarise(events, on_device=True, forwards=1)
    assert found["kernel_seconds"] == pytest.approx(76e-6) and found["kernels"] == 3
    assert found["operators"] == pytest.approx({"down_proj": 70e-6})


def test_a_device_profile_without_kernels_is_an_error_not_zero_seconds():
    with pytest.raises(RuntimeError, match="no device kernel"):
        summarise([_event("memwall::qkv_proj", cpu_us=10.0), _event("aten::mm", cpu_us=9.0)], on_device=True,
                  forwards=1)


def test_a_profile_on_cpu_times_the_operator_ranges():
    events = [_event("memwall::qkv_proj", cpu_us=40.0), _event("memwall::attention", cpu_us=60.0),
              _event("aten::mm", cpu_us=35.0)]
    found = summarise(events, on_device=False, forwards=2)
    assert found["operators"] == pytest.approx({"attention": 30e-6, "qkv_proj": 20e-6})
    assert found["kernel_seconds"] == pytest.approx(50e-6) and found["kernels"] is None


def _profiled_timings() -> dict:
    timings = _check_timings()
    timings["endtoend"]["model"]["num_layers"] = 2
    timings["endtoend"]["cases"] = [{"phase": "decode", "batch": 1, "context": 4, "seconds": 1e-3}]
    timings["gemm"].append({"dtype": "fp16", "model": "hand", "op": "qkv_proj", "tokens": 1, "k": 8, "n": 24,
                            "flops": 384, "bytes": 432, "seconds": 1e-4})
    timings["timeline"] = [{"phase": "decode", "batch": 1, "context": 4, "forwards": 3, "kernel_seconds": 8e-4,
                            "kernels": 30, "operators": {"qkv_proj": 1.5e-4, "attention": 2e-4}}]
    return timings


def test_check_sets_the_profiled_step_against_the_step_and_the_gemm_alone(tmp_path):
    path = tmp_path / "timings.json"
    save_measurements(path, _profiled_timings())
    result = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = _json_of(result.output)["timeline"]
    assert row["busy"] == pytest.approx(0.8)  # 0.8 ms of kernels in a 1 ms step
    operators = {op["name"]: op for op in row["operators"]}
    # 150 us in the step (both layers) against 100 us alone for one layer, x 2 layers
    assert operators["qkv_proj"]["in_step_over_alone"] == pytest.approx(0.75)
    assert operators["attention"]["alone_seconds"] is None  # the gemm section times no attention
    assert operators["qkv_proj"]["predicted_seconds"] > 0
    text = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(path)]).output
    assert "busy 80% of the step" in text and "30 kernels" in text
    assert text.splitlines()[-1].startswith("|error| with measured efficiencies")  # the summary stays last


def test_timings_without_a_profile_still_load_and_a_bad_profile_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_check_timings()))  # saved before the timeline section existed
    assert load_measurements(path)["timeline"] == []
    timings = _profiled_timings()
    timings["timeline"][0]["kernel_seconds"] = -1.0
    path.write_text(json.dumps(timings))
    with pytest.raises(InputError, match="kernel_seconds"):
        load_measurements(path)


def test_cli_without_torch_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = CliRunner().invoke(main, ["calibrate", "--out", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2
    assert "pip install -e '.[calibrate]'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_needs_out_or_check():
    result = CliRunner().invoke(main, ["calibrate"])
    assert result.exit_code == 2
    assert "--out" in result.output


def test_cli_overlay_only_with_check(tmp_path):
    result = CliRunner().invoke(main, ["calibrate", "--out", str(tmp_path / "x.yaml"), "--overlay", "y.yaml"])
    assert result.exit_code == 2
    assert "--overlay" in result.output



# ---- the CUDA timer, on a fake torch.cuda with a simulated clock ---------------------------

class _FakeCuda:
    """Just enough of torch.cuda: events read a simulated clock; a graph records calls and replays them."""

    def __init__(self, capture_fails: bool = False):
        self.now = 0.0
        self.capturing: list | None = None
        self.capture_fails = capture_fails
        self.graph_sizes: list[int] = []
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool):
                self.at = None

            def record(self):
                self.at = cuda.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3  # milliseconds, as torch reports

        class CUDAGraph:
            def __init__(self):
                self.calls = []

            def replay(self):
                for call in self.calls:
                    call()

        self.Event, self.CUDAGraph = Event, CUDAGraph

    def kernel(self, seconds: float):
        def run():
            self.now += seconds

        def launch():
            if self.capturing is not None:
                self.capturing.append(run)
            else:
                run()

        return launch

    def synchronize(self):
        pass

    def Stream(self):
        return self

    def current_stream(self):
        return self

    def wait_stream(self, other):
        pass

    def stream(self, s):
        import contextlib

        return contextlib.nullcontext()

    def graph(self, graph):
        import contextlib

        @contextlib.contextmanager
        def capture():
            if self.capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.capturing = graph.calls
            try:
                yield
            finally:
                self.capturing = None
                self.graph_sizes.append(len(graph.calls))

        return capture()


class _FakeTorch:
    def __init__(self, cuda):
        self.cuda = cuda


def test_cuda_timer_replays_a_graph_of_grouped_calls():
    from simulator.calibrate.timing import CudaTimer

    cuda = _FakeCuda()
    # powers of two keep the simulated clock exact: a 2**-13 s (122 us) kernel, 2**-9 s (1.95 ms) per repeat
    timer = CudaTimer(_FakeTorch(cuda), warmup=3, repeats=5, target_seconds=2**-9, most_calls=64)
    assert timer(cuda.kernel(2**-13)) == pytest.approx(2**-13)
    # grouped 2**-9 / 2**-13 = 16 calls to a graph
    assert cuda.graph_sizes == [16]
    assert timer.graph_failures == 0


def test_cuda_timer_falls_back_to_eager_calls_when_capture_fails():
    from simulator.calibrate.timing import CudaTimer

    cuda = _FakeCuda(capture_fails=True)
    timer = CudaTimer(_FakeTorch(cuda), warmup=1, repeats=3, target_seconds=1e-3)
    assert timer(cuda.kernel(5e-4)) == pytest.approx(5e-4)
    assert timer.graph_failures == 1
    assert "RuntimeError" in timer.failures[0]


def test_gemm_rows_without_the_harness_s_model_and_op_keys_time_no_operator(tmp_path):
    # The schema checks a gemm row's dtype, tokens, flops, bytes and seconds; model and op are optional (fuzz find).
    timings = _profiled_timings()
    for case in timings["gemm"]:
        case.pop("model", None)
        case.pop("op", None)
    path = tmp_path / "timings.json"
    save_measurements(path, timings)
    result = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = _json_of(result.output)["timeline"]
    assert all(op["alone_seconds"] is None for op in row["operators"])


def test_timings_without_end_to_end_cases_check_to_an_empty_table_not_a_traceback(tmp_path):
    """The made-up timings have GEMMs and no end-to-end case (and an empty model): nothing to predict."""
    path = tmp_path / "timings.json"
    save_measurements(path, _measurements())
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(main, ["calibrate", "--check", "--measurements", str(path), *extra])
        assert result.exit_code == 0, result.output
    table = _json_of(result.output)
    assert table["rows"] == [] and table["timeline"] == [] and table["model"] is None
