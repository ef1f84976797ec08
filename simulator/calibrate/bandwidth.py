"""HBM bandwidth (device-to-device copy, read-reduce), elementwise adds and the per-kernel cost."""

from __future__ import annotations

import itertools
from typing import Any

from simulator.calibrate.bench import Bench
from simulator.calibrate.work import (
    copies_to_defeat_cache,
    copy_bytes,
    elementwise_add_work,
    read_bytes,
)


def bandwidth_row(kernel: str, buffer_bytes: int, moved_bytes: float, seconds: float) -> dict[str, Any]:
    """One bandwidth measurement; ``bytes_per_second`` = bytes moved / seconds."""
    return {
        "kernel": kernel,
        "buffer_bytes": buffer_bytes,
        "bytes": moved_bytes,
        "seconds": seconds,
        "bytes_per_second": moved_bytes / seconds,
    }


def measure_bandwidth(bench: Bench, buffer_sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """For each buffer size: a copy (reads and writes the buffer) and a sum (reads it)."""
    torch = bench.torch
    rows = []
    for size in buffer_sizes:
        if bench.out_of_time("bandwidth", f"{size} bytes"):
            continue
        label = f"{size} bytes"
        try:
            src = bench.random(size // 2, dtype="fp16")
            dst = torch.empty_like(src)
            total = torch.empty((), dtype=torch.float32, device=bench.device)
        except Exception as exc:
            bench.failed("bandwidth", label, exc)
            continue
        kernels = (
            ("copy", copy_bytes(size), lambda: dst.copy_(src)),  # noqa: F821  (defined above; ruff reads the later del)
            ("read", read_bytes(size), lambda: torch.sum(src, dim=0, dtype=torch.float32, out=total)),  # noqa: F821
        )
        for kernel, moved, fn in kernels:
            seconds = bench.time_case("bandwidth", f"{kernel} {label}", fn)
            if seconds is not None:
                rows.append(bandwidth_row(kernel, size, moved, seconds))
        del src, dst, kernels
        bench.release()
    return rows


def measure_elementwise(bench: Bench, tokens: tuple[int, ...], width: int, dtype: str) -> list[dict[str, Any]]:
    """``out = a + b`` over ``tokens x width`` (a residual add), the unfused elementwise kernel."""
    torch = bench.torch
    rows = []
    for m in tokens:
        if bench.out_of_time("elementwise", f"add {m}x{width}"):
            continue
        work = elementwise_add_work(m, width, dtype)
        sets = [
            (bench.random(m, width, dtype=dtype), bench.random(m, width, dtype=dtype), torch.empty(m, width, dtype=bench.dtype(dtype), device=bench.device))
            for _ in range(copies_to_defeat_cache(work.bytes, bench.cache_bytes))
        ]
        cycle = itertools.cycle(sets)

        def add() -> None:
            a, b, out = next(cycle)
            torch.add(a, b, out=out)

        seconds = bench.time_case("elementwise", f"add {m}x{width}", add)
        if seconds is not None:
            rows.append({"kernel": "add", "dtype": dtype, "tokens": m, "width": width, "flops": work.flops, "bytes": work.bytes, "seconds": seconds})
    return rows


def measure_launch_seconds(bench: Bench) -> float:
    """Seconds per call of a one-element kernel: the fixed cost each kernel pays."""
    x = bench.torch.ones(1, device=bench.device)
    return bench.timer(lambda: x.add_(1.0))
