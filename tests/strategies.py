"""Hypothesis strategies for the property tests: random but valid models, GPUs, precisions.

Sizes are kept small (a few layers, hidden <= 2048) so each example costs microseconds;
the laws under test do not depend on scale. Heads and KV heads are powers of two and the
FFN and vocabulary are multiples of 64, so every tensor-parallel degree 1..8 is valid.
"""

from __future__ import annotations

from exact import EXACT as EXACT_FIELDS
from hypothesis import strategies as st

from simulator.model import Efficiency, GPUSpec, ModelSpec, Precision

EXACT = Efficiency(**EXACT_FIELDS)
"""Pure roofline: every efficiency 1, no kernel-launch or all-reduce overhead."""

TP_DEGREES = (1, 2, 4, 8)
# int8/int4 are weight-only (their GEMMs also pay dequantisation); the rest compute in their dtype.
FULL_PRECISION_WEIGHTS = ("fp32", "fp16", "bf16", "fp8")
ALL_WEIGHTS = FULL_PRECISION_WEIGHTS + ("int8", "int4")
KV_DTYPES = ("fp16", "bf16", "fp8", "int8")


@st.composite
def models(draw: st.DrawFn, gated: bool | None = None, bias: bool | None = None, **fixed: object) -> ModelSpec:
    """A dense decoder-only model; ``fixed`` pins any ModelSpec field."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * group
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    parallel = draw(st.booleans())
    learned = draw(st.booleans())
    fields: dict[str, object] = dict(
        name="random-model",
        num_layers=draw(st.integers(1, 6)),
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_size=64 * draw(st.integers(1, 64)),
        gated_mlp=draw(st.booleans()) if gated is None else gated,
        vocab_size=64 * draw(st.integers(1, 600)),
        max_context=4096,
        tied_embeddings=draw(st.booleans()),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        norms_per_layer=1 if parallel else 2,
        parallel_attention=parallel,
        linear_bias=draw(st.booleans()) if bias is None else bias,
        position_embedding="learned" if learned else "rotary",
    )
    fields.update(fixed)
    return ModelSpec(**fields)


@st.composite
def gpus(draw: st.DrawFn, exact: bool = True) -> GPUSpec:
    """A GPU with round-number peaks; ``exact`` pins the pure roofline (EXACT), else random factors."""
    fp16 = 1e12 * draw(st.integers(20, 2500))
    if exact:
        efficiency = EXACT
    else:
        efficiency = Efficiency(
            compute=draw(st.sampled_from([0.3, 0.5, 0.7, 1.0])),
            memory=draw(st.sampled_from([0.4, 0.6, 0.8, 1.0])),
            link=draw(st.sampled_from([0.5, 0.75, 1.0])),
            kernel_launch_seconds=draw(st.sampled_from([0.0, 2e-6, 5e-6])),
            allreduce_latency_seconds=draw(st.sampled_from([0.0, 8e-6])),
        )
    return GPUSpec(
        name="random-gpu",
        peak_flops={"fp32": fp16 / 8, "fp16": fp16, "bf16": fp16, "fp8": 2 * fp16, "int8": 2 * fp16},
        hbm_bytes=float(2**45),  # capacity is not under test here (2^45 is the most a GPU file may hold)
        hbm_bandwidth_bytes_per_second=1e9 * draw(st.integers(200, 8000)),
        sram_bytes_per_sm=1024.0 * draw(st.sampled_from([64, 100, 164, 228])),
        link_bandwidth_bytes_per_second=1e9 * draw(st.integers(16, 900)),
        efficiency=efficiency,
    )


def precisions(weights: tuple[str, ...] = ALL_WEIGHTS) -> st.SearchStrategy[Precision]:
    return st.builds(
        Precision,
        weights=st.sampled_from(weights),
        kv=st.sampled_from(KV_DTYPES),
        group_size=st.sampled_from([32, 64, 128]),
    )


batches = st.integers(1, 512)
contexts = st.integers(1, 4096)
