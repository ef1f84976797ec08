"""GEMM time over decode-like and prefill-like token counts x the projection shapes of a model.

fp16 and bf16 run through ``torch.matmul``; fp8 (e4m3 inputs, per-tensor scales, bf16 out)
through ``torch._scaled_mm`` where torch and the chip support it (CUDA, compute capability
8.9 or newer). ``_scaled_mm`` needs row counts divisible by 16, so fp8 cases of fewer than
16 tokens run padded to 16 rows; their work is counted for the real token count.
"""

from __future__ import annotations

import itertools
from typing import Any

from simulator.calibrate.bench import Bench
from simulator.calibrate.work import copies_to_defeat_cache, gemm_work
from simulator.model import ModelSpec
from simulator.model.precision import DTYPE_BYTES

FP8_ROW_MULTIPLE = 16


def projection_shapes(model: ModelSpec) -> list[tuple[str, int, int]]:
    """(operator, in_features, out_features) of each weight GEMM of one decoder layer, tp = 1."""
    H, n, g, d, F = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.ffn_size
    up = ("gate_up_proj", H, 2 * F) if model.gated_mlp else ("up_proj", H, F)
    return [("qkv_proj", H, (n + 2 * g) * d), ("o_proj", n * d, H), up, ("down_proj", F, H)]


def fp8_unsupported_reason(bench: Bench) -> str | None:
    """Why fp8 GEMMs cannot be measured here, or None when they can."""
    torch = bench.torch
    if bench.device != "cuda":
        return "fp8 GEMMs are measured on CUDA only"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn/_scaled_mm"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"compute capability {major}.{minor} has no fp8 tensor cores (needs 8.9+)"
    return None


def padded_rows(tokens: int, dtype: str) -> int:
    """Rows actually multiplied: fp8 pads to a multiple of 16."""
    if dtype != "fp8":
        return tokens
    return -(-tokens // FP8_ROW_MULTIPLE) * FP8_ROW_MULTIPLE


def _case_fn(bench: Bench, dtype: str, weights: list[Any], rows: int, k: int, n: int) -> Any:
    torch = bench.torch
    cycle = itertools.cycle(weights)
    a = bench.random(rows, k, dtype=dtype)
    if dtype == "fp8":
        scale = torch.ones((), dtype=torch.float32, device=bench.device)

        def fp8() -> None:
            # weights are stored n x k so that .t() is the column-major k x n operand _scaled_mm wants
            torch._scaled_mm(a, next(cycle).t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

        return fp8
    out = torch.empty(rows, n, dtype=bench.dtype(dtype), device=bench.device)

    def matmul() -> None:
        torch.matmul(a, next(cycle), out=out)

    return matmul


def measure_gemms(bench: Bench, models: tuple[ModelSpec, ...], tokens: tuple[int, ...], dtype: str) -> list[dict[str, Any]]:
    """One row per (model, projection, token count) in ``dtype``."""
    section = f"gemm {dtype}"
    if dtype == "fp8":
        reason = fp8_unsupported_reason(bench)
        if reason:
            bench.skip(section, "all", reason)
            return []
    rows = []
    for model in models:
        for op, k, n in projection_shapes(model):
            if bench.out_of_time(section, f"{model.name} {op}"):
                continue
            copies = copies_to_defeat_cache(k * n * DTYPE_BYTES[dtype], bench.cache_bytes)
            shape = (n, k) if dtype == "fp8" else (k, n)
            try:
                weights = [bench.random(*shape, dtype=dtype) for _ in range(copies)]
            except Exception as exc:
                bench.failed(section, f"{model.name} {op}", exc)
                continue
            for m in tokens:
                if bench.out_of_time(section, f"{model.name} {op} m={m}"):
                    continue
                rows_run = padded_rows(m, dtype)
                case = f"{model.name} {op} m={m}"
                try:
                    fn = _case_fn(bench, dtype, weights, rows_run, k, n)
                except Exception as exc:
                    bench.failed(section, case, exc)
                    continue
                seconds = bench.time_case(section, case, fn)
                if seconds is None:
                    continue
                work = gemm_work(m, k, n, dtype)
                rows.append({
                    "dtype": dtype, "model": model.name, "op": op, "tokens": m, "rows_run": rows_run,
                    "k": k, "n": n, "flops": work.flops, "bytes": work.bytes, "seconds": seconds,
                })
            del weights
            bench.release()
    return rows
