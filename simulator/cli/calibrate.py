"""``simulate calibrate``: measure a GPU with PyTorch, write a measured overlay, check the cost model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from simulator.cli.options import reports_input_errors
from simulator.errors import InputError
from simulator.files import check_output_path, path_kind
from simulator.model import GPUSpec, load_gpu
from simulator.plan.settings import MAX_CONTEXT_TOKENS
from simulator.tabular import to_json

EPILOG = """\b
Examples:
  simulate calibrate --out configs/gpus/measured/h200.yaml
  simulate calibrate --out configs/gpus/measured/h200.yaml --quick --check
  simulate calibrate --check --measurements configs/gpus/measured/h200.measurements.json
  simulate calibrate --check --measurements M.json --overlay configs/gpus/measured/h200.yaml --json
  simulate calibrate --device cpu --base a100 --out /tmp/cpu.yaml --check
  simulate --model llama2-7b --gpu configs/gpus/measured/h200.yaml --batch 8 --ctx 2048
  simulate calibrate --measurements M.json --kernel-table-out h200-kernels.csv   # timed GEMMs as a kernel table
  simulate --model llama2-7b --gpu h200 --kernel-table h200-kernels.csv --batch 8 --ctx 2048
  simulate calibrate --from-benchmark result.json --model llama3-8b --base h100 --out h100-mine.yaml
  simulate calibrate --from-benchmark my-rows.csv --out a100-mine.yaml   # published.csv schema

\b
--from-benchmark fits the compute and memory ceilings on vLLM benchmark_serving /
benchmark_throughput JSON results (or a CSV of rows) by replaying them through the
engine, and prints in-sample and cross-validated error (docs/readme-validation.md).
Measuring needs PyTorch: pip install -e '.[calibrate]'. Turning saved timings
(--measurements) into an overlay or a check table does not.
"""


def default_measurements_path(out: Path) -> Path:
    """Where the raw timings go beside an overlay: NAME.yaml -> NAME.measurements.json."""
    return out.with_suffix(".measurements.json")


def _base_gpu(base: str | None, device: str, device_name: str) -> GPUSpec:
    from simulator.calibrate.harness import detect_base_gpu

    if base:
        return load_gpu(base)
    found = detect_base_gpu(device_name) if device == "cuda" else None
    if found is None:
        where = "on CPU" if device != "cuda" else f"for '{device_name}'"
        raise InputError(f"--base: no shipped GPU matches {where}; give --base NAME (see `simulate gpus`)")
    return found


def _measure(device: str, quick: bool, base: str | None, dtype: str, budget: float, saved: Path | None) -> dict[str, Any]:
    from simulator.calibrate import require_torch
    from simulator.calibrate.harness import cuda_ready, run_calibration
    from simulator.calibrate.plan import full_plan, quick_plan, tiny_plan

    torch = require_torch()
    if device == "cuda":
        cuda_ready(torch)
        name = str(torch.cuda.get_device_name(0))
        plan = quick_plan() if quick else full_plan()
    else:
        name, plan = "cpu", tiny_plan()
    gpu = _base_gpu(base, device, name)
    from simulator.calibrate.overlay import save_measurements

    def checkpoint(partial: dict[str, Any]) -> None:
        # after each section, so that a run cut short keeps what it measured
        if saved is not None:
            save_measurements(saved, partial)

    return run_calibration(torch, device, plan, gpu, dtype, budget, log=lambda line: click.echo(line, err=True), checkpoint=checkpoint)


def _overlay_gpu(overlay: dict[str, Any]) -> GPUSpec:
    """Validate a derived overlay exactly as ``--gpu PATH`` would load it."""
    from simulator.calibrate.overlay import write_overlay

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "overlay.yaml"
        write_overlay(path, overlay)
        return load_gpu(str(path))


def _prepare_output(path: Path, what: str, suffixes: tuple[str, ...]) -> None:
    """Create the output's folder (as writing it would) and check the path is writable with the right suffix."""
    if path.suffix.lower() in suffixes and path_kind(path.parent, what) is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{what}: cannot create folder '{path.parent}' ({exc.strerror or exc})") from None
    check_output_path(path, what, suffixes)


@click.command("calibrate", epilog=EPILOG, context_settings={"max_content_width": 100})
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the measured GPU overlay (YAML) here, e.g. configs/gpus/measured/h200.yaml.")
@click.option("--kernel-table-out", "kernel_table_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the timed GEMMs as a memwall kernel table (.csv) here; runs take it with --kernel-table FILE.")
@click.option("--quick", is_flag=True, help="Fewer sizes (GPU); --device cpu always runs tiny sizes.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True, help="cpu runs a 2-layer, 64-wide model to exercise the code path; its numbers describe nothing.")
@click.option("--base", metavar="NAME", help="Shipped GPU the overlay refines. Default: the one matching the CUDA device's name (required on CPU).")
@click.option("--dtype", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True, help="Dtype of the overlay's GEMMs, attention and the end-to-end model (fp8 GEMMs are timed too, into the raw timings).")
@click.option("--budget-seconds", type=click.FloatRange(min=1), default=240.0, show_default=True, help="Wall-clock budget; later cases are skipped (and listed) once it is spent.")
@click.option("--save-measurements", type=click.Path(dir_okay=False, path_type=Path), help="Write the raw timings (JSON) here. Default with --out: NAME.measurements.json beside it.")
@click.option("--check", is_flag=True, help="Print predicted (shipped and measured efficiencies) vs measured end-to-end step times.")
@click.option("--measurements", type=click.Path(dir_okay=False, path_type=Path), help="Use timings saved by an earlier run instead of measuring (no PyTorch needed).")
@click.option("--overlay", type=click.Path(dir_okay=False, path_type=Path), help="With --check: the overlay for the measured column (default: derived from the timings).")
@click.option("--json", "as_json", is_flag=True, help="With --check or --from-benchmark: print one JSON object (SI units).")
@click.option("--from-benchmark", "benchmarks", multiple=True, type=click.Path(dir_okay=False, path_type=Path), help="Fit the compute/memory ceilings on these benchmark results (vLLM serving/throughput JSON, or a published.csv-schema CSV); repeatable.")
@click.option("--model", "bench_model", metavar="NAME", help="With --from-benchmark JSON: the model it ran.")
@click.option("--tp", "bench_tp", type=click.IntRange(min=1), default=1, show_default=True, help="With --from-benchmark JSON: tensor-parallel degree.")
@click.option("--weights", "bench_weights", default="fp16", show_default=True, help="With --from-benchmark JSON: weight dtype.")
@click.option("--kv", "bench_kv", default="fp16", show_default=True, help="With --from-benchmark JSON: KV-cache dtype.")
@click.option("--engine", "bench_engine", default="vllm", show_default=True, help="With --from-benchmark JSON: engine (profile) that ran it.")
@click.option("--input-tokens", "bench_input", type=click.IntRange(min=1, max=MAX_CONTEXT_TOKENS),
              help="With a benchmark_throughput JSON: prompt tokens per request.")
@click.option("--output-tokens", "bench_output", type=click.IntRange(min=1, max=MAX_CONTEXT_TOKENS),
              help="With a benchmark_throughput JSON: output tokens per request.")
@reports_input_errors
def calibrate_command(
    out: Path | None, quick: bool, device: str, base: str | None, dtype: str, budget_seconds: float,
    save_measurements: Path | None, check: bool, measurements: Path | None, overlay: Path | None, as_json: bool,
    benchmarks: tuple[Path, ...] = (), bench_model: str | None = None, bench_tp: int = 1, bench_weights: str = "fp16",
    bench_kv: str = "fp16", bench_engine: str = "vllm", bench_input: int | None = None, bench_output: int | None = None,
    kernel_table_out: Path | None = None,
) -> None:
    """Measure a GPU with PyTorch and check the cost model against real timings.

    Times HBM bandwidth (copy, read-reduce), elementwise adds, GEMMs (fp16/bf16/fp8;
    decode-like M = 1..256 and prefill-like M = 512..8192 over llama2-7b/70b projection
    shapes), SDPA attention (prefill T = 512..8192, decode against a KV cache of T =
    512..32768, MHA and GQA) and a random-weight llama2-7b decoder end to end (decode at
    batch 1/8/32/128 x context 512/2048/8192, prefill of 512/2048 tokens). The achieved
    fractions of the base GPU's peaks become a GPU YAML overlay that --gpu loads.
    """
    from simulator.calibrate.check import base_gpu, check_dict, check_rows, check_text
    from simulator.calibrate.overlay import (
        derive_overlay,
        load_measurements,
        write_overlay,
    )
    from simulator.calibrate.overlay import save_measurements as save

    if benchmarks:
        from simulator.cli.calibrate_benchmark import calibrate_from_benchmark
        from simulator.validation.user_benchmark import BenchmarkSetup

        setup = BenchmarkSetup(bench_model, base, bench_tp, bench_weights, bench_kv, bench_engine, bench_input, bench_output)
        calibrate_from_benchmark(benchmarks, setup, out, as_json)
        return
    if out is None and not check and kernel_table_out is None:
        raise InputError("simulate calibrate: give --out PATH (the overlay to write), --kernel-table-out PATH and/or --check")
    if overlay is not None and not check:
        raise InputError("--overlay: only used with --check")
    # Outputs are checked before minutes of measuring, so a bad path never loses a run.
    if out is not None:
        _prepare_output(out, "--out", (".yaml", ".yml"))
    if kernel_table_out is not None:
        _prepare_output(kernel_table_out, "--kernel-table-out", (".csv",))
    if save_measurements is not None:
        _prepare_output(save_measurements, "--save-measurements", (".json",))
    elif out is not None and measurements is None:
        _prepare_output(default_measurements_path(out), "--out (its raw timings beside it)", (".json",))
    if measurements is not None:
        timings = load_measurements(measurements)
    else:
        saved = save_measurements or (default_measurements_path(out) if out is not None else None)
        timings = _measure(device, quick, base, dtype, budget_seconds, saved)
        if saved is not None:
            save(saved, timings)
            click.echo(f"wrote raw timings to {saved}", err=True)
    if kernel_table_out is not None:
        from simulator.calibrate.overlay import write_kernel_table_of

        written = write_kernel_table_of(kernel_table_out, timings)
        click.echo(f"wrote kernel table {kernel_table_out} ({written} GEMM rows; use it with --kernel-table "
                   f"{kernel_table_out})", err=True)
    derived = derive_overlay(timings)
    if out is not None:
        write_overlay(out, derived)
        click.echo(f"wrote overlay {out} ({len(derived['efficiency_by_op'])} efficiency_by_op entries; load it with --gpu {out})", err=True)
    if not check:
        return
    measured_gpu = load_gpu(str(overlay)) if overlay is not None else _overlay_gpu(derived)
    shipped_gpu = base_gpu(timings)
    rows = check_rows(timings, shipped_gpu, measured_gpu)
    if as_json:
        click.echo(to_json(check_dict(timings, rows, shipped_gpu, measured_gpu), indent=2))
    else:
        click.echo(check_text(timings, rows, shipped_gpu, measured_gpu))
