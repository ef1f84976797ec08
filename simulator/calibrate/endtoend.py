"""A random-weight LLaMA-shaped decoder in plain PyTorch, timed end to end.

Built from a ModelSpec (llama2-7b on a GPU, a tiny one on CPU): token embedding, per layer
RMSNorm -> fused QKV GEMM -> rotary -> KV-cache write -> SDPA -> output GEMM -> residual add
-> RMSNorm -> fused gate/up GEMM -> SiLU x up -> down GEMM -> residual add, then the final
RMSNorm and the LM head on the last position of each sequence. No weights are downloaded:
every tensor is random, scaled so activations stay finite. The KV cache is allocated before
timing. Every elementwise step is its own kernel, so the simulator's matching configuration
is ``attention_kernel='flash', fusion='none'`` (see :mod:`simulator.calibrate.check`).

Decode: ``batch`` sequences each hold ``context - 1`` cached tokens and add one, which then
attends ``context`` keys (the simulator's ``Step.decode(batch, context)``). Prefill: one
sequence of ``context`` prompt tokens (``Step.prefill(1, context)``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable

from simulator.calibrate.bench import Bench
from simulator.model import ModelSpec
from simulator.model.precision import DTYPE_BYTES

RMS_EPS = 1e-5
ROPE_BASE = 10000.0
ACTIVATION_HEADROOM_BYTES = 4 * 2**30
"""Device memory kept free beside weights and KV cache for activations and workspaces."""


def kv_cache_bytes(model: ModelSpec, batch: int, context: int, dtype: str) -> float:
    """K and V of every layer for ``batch`` sequences of ``context`` tokens."""
    return 2.0 * model.num_layers * batch * context * model.num_kv_heads * model.head_dim * DTYPE_BYTES[dtype]


def _unmarked(name: str) -> AbstractContextManager[Any]:
    return nullcontext()


class RandomDecoder:
    """The decoder's weights on the device, and its forward pass."""

    def __init__(self, bench: Bench, model: ModelSpec, dtype: str) -> None:
        torch = bench.torch
        self.torch, self.model, self.bench = torch, model, bench
        H, n, g, d, F, V = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.ffn_size, model.vocab_size
        self.dtype_name, self.dtype = dtype, bench.dtype(dtype)

        def weight(rows: int, cols: int) -> Any:
            # 1/sqrt(fan-in) keeps every GEMM's output near unit scale: no fp16 overflow.
            return bench.random(rows, cols, dtype=dtype).mul_(rows ** -0.5)

        def ones() -> Any:
            return torch.ones(H, dtype=self.dtype, device=bench.device)

        self.embedding = bench.random(V, H, dtype=dtype)
        self.layers = [
            {
                "attn_norm": ones(),
                "qkv": weight(H, (n + 2 * g) * d),
                "o": weight(n * d, H),
                "mlp_norm": ones(),
                "gate_up": weight(H, 2 * F),
                "down": weight(F, H),
            }
            for _ in range(model.num_layers)
        ]
        self.final_norm = ones()
        self.lm_head = weight(H, V)

    def rotary(self, start: int, tokens: int) -> Any:
        """Complex rotations for positions start..start+tokens-1: shape (tokens, 1, head_dim/2)."""
        torch, d = self.torch, self.model.head_dim
        inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, device=self.bench.device, dtype=torch.float32) / d)
        positions = torch.arange(start, start + tokens, device=self.bench.device, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        return torch.polar(torch.ones_like(angles), angles).unsqueeze(1)

    def new_cache(self, batch: int, context: int) -> list[tuple[Any, Any]]:
        """(K, V) per layer, each (batch, kv_heads, context, head_dim), random (a filled cache)."""
        m = self.model
        shape = (batch, m.num_kv_heads, context, m.head_dim)
        return [
            (self.bench.random(*shape, dtype=self.dtype_name), self.bench.random(*shape, dtype=self.dtype_name))
            for _ in range(m.num_layers)
        ]

    def inputs(self, phase: str, batch: int, context: int) -> tuple[list[tuple[Any, Any]], Any, int, Any]:
        """(KV cache, token ids, start position, rotations) of one case: a decode step adds one token to ``context - 1``
        cached ones; a prefill runs ``context`` tokens from position 0 (see the module docstring)."""
        tokens, start = (1, context - 1) if phase == "decode" else (context, 0)
        cache = self.new_cache(batch, context)
        ids = self.torch.randint(0, self.model.vocab_size, (batch, tokens), device=self.bench.device)
        return cache, ids, start, self.rotary(start, tokens)

    def forward(self, ids: Any, cache: list[tuple[Any, Any]], start: int, rotation: Any,
                mark: Callable[[str], AbstractContextManager[Any]] = _unmarked) -> Any:
        """Logits of the last position of each sequence, for ``ids`` (batch, tokens) placed at ``start``.

        ``mark(name)`` wraps each operator, named as ``simulate layers`` names it (a profiler range, in
        :mod:`simulator.calibrate.timeline`; nothing by default).
        """
        torch, m = self.torch, self.model
        F_ = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel

        H, n, g, d = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim
        B, T = ids.shape
        extra = {"enable_gqa": True} if g != n else {}
        with mark("embedding"):
            x = F_.embedding(ids, self.embedding)
        for layer, (k_cache, v_cache) in zip(self.layers, cache):
            with mark("attn_norm"):
                h = F_.rms_norm(x, (H,), layer["attn_norm"], RMS_EPS)
            with mark("qkv_proj"):
                qkv = h @ layer["qkv"]
            with mark("rotary"):
                qk = qkv[..., : (n + g) * d].reshape(B, T, n + g, d // 2, 2).float()
                qk = torch.view_as_real(torch.view_as_complex(qk) * rotation).flatten(3).to(x.dtype)
            q, k = qk[:, :, :n].transpose(1, 2), qk[:, :, n:].transpose(1, 2)
            v = qkv[..., (n + g) * d :].reshape(B, T, g, d).transpose(1, 2)
            with mark("kv_write"):
                k_cache[:, :, start : start + T] = k
                v_cache[:, :, start : start + T] = v
            if T == 1:
                keys, values, causal = k_cache[:, :, : start + 1], v_cache[:, :, : start + 1], False
            else:
                keys, values, causal = k, v, True
            with mark("attention"), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                 SDPBackend.MATH]):
                attn = F_.scaled_dot_product_attention(q, keys, values, is_causal=causal, **extra)
            with mark("o_proj"):
                out = attn.transpose(1, 2).reshape(B, T, n * d) @ layer["o"]
            with mark("attn_residual"):
                x = x + out
            with mark("mlp_norm"):
                h = F_.rms_norm(x, (H,), layer["mlp_norm"], RMS_EPS)
            with mark("gate_up_proj"):
                gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            with mark("activation"):
                act = F_.silu(gate) * up
            with mark("down_proj"):
                out = act @ layer["down"]
            with mark("mlp_residual"):
                x = x + out
        with mark("final_norm"):
            last = F_.rms_norm(x[:, -1], (H,), self.final_norm, RMS_EPS)
        with mark("lm_head"):
            return last @ self.lm_head


def free_device_bytes(bench: Bench) -> float | None:
    """Free device memory in bytes (None on CPU, where the plan is tiny)."""
    if bench.device != "cuda":
        return None
    return float(bench.torch.cuda.mem_get_info()[0])


def case_may_run(bench: Bench, model: ModelSpec, dtype: str, section: str, label: str, batch: int,
                 context: int) -> bool:
    """Whether a case's KV cache fits the free device memory beside the headroom and the time budget is not spent;
    if not, the case is listed as skipped, with the reason."""
    need, free = kv_cache_bytes(model, batch, context, dtype), free_device_bytes(bench)
    if free is not None and need + ACTIVATION_HEADROOM_BYTES > free:
        bench.skip(section, label, f"KV cache of {need / 2**30:.1f} GiB does not fit in {free / 2**30:.1f} GiB free")
        return False
    return not bench.out_of_time(section, label)


def measure_endtoend(
    bench: Bench,
    model: ModelSpec,
    dtype: str,
    decode_batches: tuple[int, ...],
    decode_contexts: tuple[int, ...],
    prefill_tokens: tuple[int, ...],
) -> list[dict[str, Any]]:
    """Decode-step and prefill times of the whole model; cases whose KV cache does not fit are skipped."""
    torch = bench.torch
    decoder = RandomDecoder(bench, model, dtype)
    cases = [("decode", b, c) for b in decode_batches for c in decode_contexts]
    cases += [("prefill", 1, t) for t in prefill_tokens]
    rows = []
    for phase, batch, context in cases:
        label = f"{phase} batch={batch} ctx={context}"
        if not case_may_run(bench, model, dtype, "endtoend", label, batch, context):
            continue
        try:
            cache, ids, start, rotation = decoder.inputs(phase, batch, context)
        except Exception as exc:
            bench.failed("endtoend", label, exc)
            continue
        with torch.inference_mode():
            seconds = bench.time_case("endtoend", label, lambda: decoder.forward(ids, cache, start, rotation))  # noqa: F821
        del cache
        bench.release()
        if seconds is None:
            continue
        rows.append({"phase": phase, "batch": batch, "context": context, "seconds": seconds})
        bench.log(f"endtoend {label}: {seconds * 1e3:.3f} ms")
    return rows
