"""Roofline and sweep plots: the data handed to the plot, and a valid PNG (not its pixels)."""

import sys

import pytest
from click.testing import CliRunner
from exact import exact_gpu

from simulator.cli import main
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.precision import Precision
from simulator.report.plots import (
    plot_roofline,
    plot_sweep,
    roofline_data,
    sweep_plot_data,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KERNELS = {"qkv_proj", "attention", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
ELEMENTWISE = {"attn_norm", "rotary", "attn_residual", "mlp_norm", "activation", "mlp_residual", "final_norm"}


def system(fusion="elementwise"):
    gpu = exact_gpu()
    return System(load_model("llama2-7b"), gpu, Precision(), fusion=fusion)


def names(data, phase):
    return {p.name for p in data.points if p.phase == phase}


def test_a_point_for_every_kernel_of_prefill_and_decode():
    data = roofline_data(system(), batch=8, context_tokens=2048, gen_tokens=128)
    assert names(data, "prefill") == names(data, "decode") == KERNELS
    assert len(data.points) == 2 * 6
    skipped = {name for _, name, _ in data.not_plotted}
    assert skipped == ELEMENTWISE | {"embedding"}  # fused ops and the FLOP-free lookup
    assert data.ridge == pytest.approx(312e12 / 2.039e12)  # 153 FLOP/byte


def test_without_fusion_every_elementwise_kernel_is_a_point():
    data = roofline_data(system("none"), batch=1, context_tokens=1024, gen_tokens=64)
    assert names(data, "decode") == KERNELS | ELEMENTWISE
    assert {name for _, name, _ in data.not_plotted} == {"embedding"}


def test_points_sit_on_the_roofline_with_exact_efficiency():
    data = roofline_data(system(), batch=1, context_tokens=1024, gen_tokens=64)
    for p in data.points:
        roof = min(312e12, 2.039e12 * p.intensity)
        assert p.achieved_flops_per_second == pytest.approx(roof, rel=1e-9)
    o_proj = next(p for p in data.points if p.phase == "decode" and p.name == "o_proj")
    H = 4096
    assert o_proj.intensity == pytest.approx(2 * H * H / (2 * H * H + 2 * (H + H)))  # ~1 FLOP/byte at batch 1


def test_the_achievable_roof_holds_the_gpus_sustained_clock():
    # MI300X: compute 0.70 of a peak it reaches only at 1,207 of 2,100 MHz under GEMM load (AMD): 0.70 x 0.575.
    gpu = load_gpu("mi300x").with_efficiency(compute=0.70, memory=0.5).model_copy(update={"efficiency_by_op": []})
    data = roofline_data(System(load_model("llama2-7b"), gpu, Precision()), batch=1, context_tokens=1024, gen_tokens=64)
    assert data.compute_efficiency == pytest.approx(0.70 * 0.575)
    assert data.achievable_ridge == pytest.approx(1307.4e12 * 0.70 * 0.575 / (5.3e12 * 0.5))  # 190 FLOP/byte


def test_roofline_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    data = roofline_data(system(), batch=8, context_tokens=2048, gen_tokens=128)
    out = plot_roofline(data, tmp_path / "roofline.png")
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_roofline_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.png"
    result = CliRunner().invoke(main, ["roofline", "--model", "llama2-7b", "--gpu", "a100", "--batch", "4",
                                       "--ctx", "1024", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert "ridge 153 FLOP/byte" in result.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_missing_matplotlib_is_a_clear_input_error(tmp_path, monkeypatch):
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    data = roofline_data(system(), batch=1, context_tokens=512, gen_tokens=64)
    with pytest.raises(InputError, match=r"pip install -e '\.\[plot\]'"):
        plot_roofline(data, tmp_path / "r.png")


def test_bad_plot_path_is_an_input_error(tmp_path):
    data = roofline_data(system(), batch=1, context_tokens=512, gen_tokens=64)
    with pytest.raises(InputError, match="--plot"):
        plot_roofline(data, tmp_path / "r.jpeg")
    with pytest.raises(InputError, match="does not exist"):
        plot_roofline(data, tmp_path / "missing" / "r.png")


SWEEP_ROWS = [
    {"model": "llama2-7b", "gpu": g, "batch": b, "latency": {"tpot_seconds": t},
     "throughput": {"output_tokens_per_second": b / t}}
    for g, base in (("A100-SXM4-80GB", 0.010), ("H100-SXM5-80GB", 0.006))
    for b, t in ((1, base), (8, base * 1.1), (64, base * 2.0))
]


def test_sweep_plot_data_has_one_series_per_gpu_sorted_by_batch():
    data = sweep_plot_data(SWEEP_ROWS)
    assert data["latency_key"] == "latency.tpot_seconds"
    assert data["throughput_key"] == "throughput.output_tokens_per_second"
    assert [s["label"] for s in data["series"]] == ["gpu A100-SXM4-80GB", "gpu H100-SXM5-80GB"]
    a100 = data["series"][0]
    assert a100["batch"] == [1, 8, 64]
    assert a100["latency_ms"] == pytest.approx([10.0, 11.0, 20.0])
    assert a100["throughput"] == pytest.approx([1 / 0.010, 8 / 0.011, 64 / 0.020])
    assert data["has_batch_axis"]


def test_sweep_plot_accepts_flattened_rows_and_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    flat = [{"batch": r["batch"], "gpu": r["gpu"], "latency.tpot_seconds": r["latency"]["tpot_seconds"],
             "throughput.output_tokens_per_second": r["throughput"]["output_tokens_per_second"]} for r in SWEEP_ROWS]
    data = plot_sweep(flat, tmp_path / "sweep.png")
    assert len(data["series"]) == 2
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_SIGNATURE


def test_sweep_rows_without_metrics_are_an_input_error():
    with pytest.raises(InputError, match="throughput"):
        sweep_plot_data([{"batch": 1}])
