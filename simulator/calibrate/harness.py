"""One calibration run: every measurement of a plan on one device, as a JSON-ready dict.

Order: the per-kernel cost, bandwidth, elementwise adds, GEMMs in the overlay's dtype,
attention, the end-to-end decoder, then GEMMs in the other dtypes, so that what the overlay
and the check need is measured before a tight time budget runs out.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Callable

from simulator.calibrate.attention import measure_attention
from simulator.calibrate.bandwidth import (
    measure_bandwidth,
    measure_elementwise,
    measure_launch_seconds,
)
from simulator.calibrate.bench import Bench
from simulator.calibrate.endtoend import measure_endtoend
from simulator.calibrate.gemm import measure_gemms
from simulator.calibrate.overlay import SCHEMA
from simulator.calibrate.plan import Budget, Plan
from simulator.calibrate.timeline import measure_timeline
from simulator.calibrate.timing import CudaTimer, make_timer
from simulator.errors import InputError
from simulator.model import GPUSpec, list_gpus
from simulator.model.layers import flash_query_tile_rows
from simulator.model.precision import DTYPE_BYTES
from simulator.units import fmt_bytes


def _words(text: str) -> str:
    return " " + re.sub(r"[^a-z0-9]+", " ", text.lower()).strip() + " "


def detect_base_gpu(device_name: str) -> GPUSpec | None:
    """The shipped GPU whose name or alias appears (as whole words) in the device's name; the longest match wins."""
    words = _words(device_name)
    best, best_length = None, 0
    for gpu in list_gpus():
        for name in (gpu.name, *gpu.aliases):
            candidate = _words(name)
            if candidate in words and len(candidate) > best_length:
                best, best_length = gpu, len(candidate)
    return best


def environment(torch: Any, device: str) -> dict[str, Any]:
    """Device name, torch and CUDA versions, date (UTC, ISO 8601), cache and SM counts where known."""
    env: dict[str, Any] = {
        "kind": device,
        "torch": str(torch.__version__),
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            name=str(props.name),
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
            l2_bytes=getattr(props, "L2_cache_size", 0),
        )
    else:
        import platform

        env["name"] = f"CPU {platform.machine()} ({torch.get_num_threads()} thread(s))"
    return env


def cuda_ready(torch: Any) -> None:
    """InputError unless torch sees a CUDA device."""
    if not torch.cuda.is_available():
        raise InputError(
            f"--device cuda: torch {torch.__version__} sees no CUDA device; run on a GPU machine, "
            "or use --device cpu to exercise the code path (its numbers describe nothing)"
        )


def measured_cpu_peaks(bench: Bench, size: int, dtypes: tuple[str, ...], bandwidth_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU stand-ins for the peaks: a ``size``-cubed matmul's FLOP/s per dtype and the best bandwidth measured."""
    torch = bench.torch
    flops = {}
    for dtype in dtypes:
        if dtype == "fp8":
            continue
        a, b = bench.random(size, size, dtype=dtype), bench.random(size, size, dtype=dtype)
        out = torch.empty(size, size, dtype=bench.dtype(dtype))
        flops[dtype] = 2.0 * size**3 / bench.timer(lambda: torch.matmul(a, b, out=out))
    best = max((r["bytes_per_second"] for r in bandwidth_rows), default=1.0)  # 1 B/s if none ran: code path only
    return {"source": "measured", "flops": flops, "hbm_bandwidth_bytes_per_second": best}


def datasheet_peaks(base: GPUSpec) -> dict[str, Any]:
    return {
        "source": f"datasheet of {base.name}",
        "flops": dict(base.peak_flops),
        "hbm_bandwidth_bytes_per_second": base.hbm_bandwidth_bytes_per_second,
    }


def run_calibration(
    torch: Any,
    device: str,
    plan: Plan,
    base: GPUSpec,
    dtype: str,
    budget_seconds: float,
    log: Callable[[str], None] = lambda line: None,
    checkpoint: Callable[[dict[str, Any]], None] = lambda partial: None,
) -> dict[str, Any]:
    """Measure everything ``plan`` lists on ``device``; the dict :func:`overlay.derive_overlay` and the check read.

    ``checkpoint`` receives the timings so far after each section (a run cut short keeps them).
    A section that raises is listed in ``skipped`` and the run goes on.
    """
    if device == "cuda":
        cuda_ready(torch)
    else:
        # One thread: the CPU mode only runs the code path, often on a shared machine.
        torch.set_num_threads(1)
    if dtype not in base.peak_flops:
        raise InputError(f"--dtype {dtype}: {base.name} has no {dtype} peak (it has: {', '.join(sorted(base.peak_flops))})")
    plan = plan.with_dtype_first(dtype)
    budget = Budget(budget_seconds)
    timer = make_timer(torch, device, plan.warmup, plan.repeats, plan.target_seconds)
    env = environment(torch, device)
    bench = Bench(torch, device, timer, budget, cache_bytes=float(env.get("l2_bytes", 0) or 0), log=log)
    log(f"calibrating {env['name']} (torch {env['torch']}, CUDA {env['cuda']}), plan {plan.name}, overlay on {base.name}")
    timing = {"method": getattr(timer, "method", type(timer).__name__), "warmup": plan.warmup, "repeats": plan.repeats,
              "statistic": "median"}
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "device": env,
        "base_gpu": base.name,
        "dtype": dtype,
        "plan": plan.name,
        "peaks": datasheet_peaks(base),
        "launch_seconds": 0.0,
        "timing": timing,
        "bandwidth": [],
        "elementwise": [],
        "gemm": [],
        "attention": [],
        "endtoend": {"model": plan.endtoend_model.model_dump(), "cases": []},
        "timeline": [],
        "skipped": bench.skipped,
        "elapsed_seconds": 0.0,
    }

    def section(name: str, measure: Callable[[], Any], store: Callable[[Any], None]) -> None:
        """Run one section, store what it measured into ``result``, then checkpoint."""
        try:
            got = measure()
        except Exception as exc:
            bench.failed(name, "whole section", exc)
            got = None
        if got is not None:
            store(got)
        if isinstance(timer, CudaTimer):
            timing["graph_capture_failures"] = timer.graph_failures
            timing["graph_capture_errors"] = sorted(set(timer.failures))[:10]
        result["elapsed_seconds"] = budget.elapsed()
        count = f": {len(got)} cases" if isinstance(got, list) else ""
        log(f"[{budget.elapsed():6.1f} s] {name} done{count}")
        checkpoint(result)

    def put(key: str) -> Callable[[Any], None]:
        return lambda got: result.__setitem__(key, got)

    section("per-kernel cost", lambda: measure_launch_seconds(bench), put("launch_seconds"))
    section("bandwidth", lambda: measure_bandwidth(bench, plan.bandwidth_buffer_bytes), put("bandwidth"))
    for row in result["bandwidth"]:
        log(f"  {row['kernel']} {fmt_bytes(row['buffer_bytes'])}: {row['bytes_per_second'] / 1e9:.0f} GB/s")
    if device != "cuda":
        result["peaks"] = measured_cpu_peaks(bench, plan.peak_matmul_size, plan.gemm_dtypes, result["bandwidth"])
    section("elementwise", lambda: measure_elementwise(bench, plan.elementwise_tokens, plan.elementwise_width, dtype),
            put("elementwise"))
    section(f"gemm {dtype}", lambda: measure_gemms(bench, plan.gemm_models, plan.gemm_tokens, dtype), put("gemm"))
    section("attention", lambda: measure_attention(
        bench, plan.attention_shapes, plan.attention_prefill_tokens, plan.attention_decode_batches,
        plan.attention_decode_contexts, plan.attention_max_kv_bytes, dtype,
        lambda head_dim: flash_query_tile_rows(base, head_dim, DTYPE_BYTES[dtype]),
    ), put("attention"))
    section("end to end", lambda: measure_endtoend(
        bench, plan.endtoend_model, dtype, plan.decode_batches, plan.decode_contexts, plan.prefill_tokens),
        lambda cases: result["endtoend"].__setitem__("cases", cases))
    section("timeline", lambda: measure_timeline(bench, plan.endtoend_model, dtype, plan.timeline_cases),
            put("timeline"))
    for other in plan.gemm_dtypes[1:]:
        section(f"gemm {other}", lambda: measure_gemms(bench, plan.gemm_models, plan.gemm_tokens, other),
                lambda rows: result["gemm"].extend(rows))
    return result
