"""Attention time: ``scaled_dot_product_attention`` (flash backend where it runs), MHA and GQA.

Prefill: one sequence of T tokens, causal. Decode: ``batch`` single-token queries against a
KV cache of T keys each. GQA passes ``enable_gqa=True`` so the kernel reads the small KV
tensors rather than copies expanded to every query head. When the flash backend refuses a
case, PyTorch's own choice runs and the row says ``backend: default``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from simulator.calibrate.bench import Bench
from simulator.calibrate.plan import AttentionShape
from simulator.calibrate.work import (
    attention_tokens,
    attention_work,
    copies_to_defeat_cache,
)
from simulator.model.precision import DTYPE_BYTES


def sdpa_call(bench: Bench, shape: AttentionShape, q: Any, k: Any, v: Any, causal: bool, backend: str) -> Callable[[], Any]:
    """A call of SDPA on these tensors, restricted to the flash backend when ``backend`` is 'flash'."""
    torch = bench.torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    extra = {"enable_gqa": True} if shape.kv_heads != shape.q_heads else {}
    if backend != "flash":
        return lambda: sdpa(q, k, v, is_causal=causal, **extra)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash() -> Any:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return sdpa(q, k, v, is_causal=causal, **extra)

    return flash


def attention_fn(bench: Bench, shape: AttentionShape, sets: list[tuple[Any, Any, Any]], causal: bool) -> tuple[Callable[[], Any], str]:
    """The timed function cycling over ``sets`` of (q, k, v), and the backend it uses."""
    for backend in ("flash", "default"):
        calls = [sdpa_call(bench, shape, q, k, v, causal, backend) for q, k, v in sets]
        try:
            calls[0]()
        except RuntimeError:
            continue
        cycle = itertools.cycle(calls)
        return (lambda: next(cycle)()), backend
    raise RuntimeError("no SDPA backend runs this case")


def measure_attention(
    bench: Bench,
    shapes: tuple[AttentionShape, ...],
    prefill_tokens: tuple[int, ...],
    decode_batches: tuple[int, ...],
    decode_contexts: tuple[int, ...],
    max_kv_bytes: float,
    dtype: str,
    query_tile_rows: Callable[[int], int],
) -> list[dict[str, Any]]:
    """One row per (shape, phase, batch, context); ``query_tile_rows(head_dim)`` is the cost model's B_r."""
    cases = [("prefill", 1, t) for t in prefill_tokens]
    cases += [("decode", b, t) for b in decode_batches for t in decode_contexts]
    b = DTYPE_BYTES[dtype]
    rows = []
    for shape in shapes:
        n, g, d = shape.q_heads, shape.kv_heads, shape.head_dim
        for phase, batch, context in cases:
            label = f"{shape.label} {phase} batch={batch} T={context}"
            kv_bytes = 2.0 * batch * g * context * d * b
            if kv_bytes > max_kv_bytes:
                bench.skip("attention", label, f"K/V of {kv_bytes / 2**30:.1f} GiB exceed the plan's {max_kv_bytes / 2**30:.1f} GiB")
                continue
            if bench.out_of_time("attention", label):
                continue
            queries = 1 if phase == "decode" else context
            try:
                sets = [
                    (bench.random(batch, n, queries, d, dtype=dtype), bench.random(batch, g, context, d, dtype=dtype),
                     bench.random(batch, g, context, d, dtype=dtype))
                    for _ in range(copies_to_defeat_cache(kv_bytes, bench.cache_bytes))
                ]
                fn, backend = attention_fn(bench, shape, sets, causal=phase == "prefill")
            except Exception as exc:
                bench.failed("attention", label, exc)
                continue
            seconds = bench.time_case("attention", label, fn)
            del sets, fn
            if seconds is None:
                continue
            work = attention_work(phase, batch, context, n, g, d, dtype, query_tile_rows(d))
            rows.append({
                "variant": shape.label, "phase": phase, "batch": batch, "context": context,
                "tokens": attention_tokens(phase, batch, context), "q_heads": n, "kv_heads": g, "head_dim": d,
                "dtype": dtype, "backend": backend, "flops": work.flops, "bytes": work.bytes, "seconds": seconds,
            })
            bench.release()
    return rows
