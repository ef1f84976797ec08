"""What a calibration run measures: sizes for a full GPU run, a quick one, and tiny CPU sizes.

The full and quick plans use the shapes of the shipped llama2-7b (MHA; end to end) and
llama2-70b (GQA-8) configs. The tiny plan (always used with ``--device cpu``) is a 2-layer,
64-wide model whose cases take milliseconds on a CPU; it exists to run the code path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from simulator.model import ModelSpec, load_model

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class AttentionShape:
    """Heads of one attention layer: ``label`` is 'MHA' or 'GQA'."""

    label: str
    q_heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Plan:
    """Sizes of every case of one run. Bytes in bytes, times in seconds, sizes in tokens."""

    name: str
    bandwidth_buffer_bytes: tuple[int, ...]
    elementwise_tokens: tuple[int, ...]
    elementwise_width: int
    gemm_models: tuple[ModelSpec, ...]
    gemm_tokens: tuple[int, ...]
    gemm_dtypes: tuple[str, ...]
    attention_shapes: tuple[AttentionShape, ...]
    attention_prefill_tokens: tuple[int, ...]
    attention_decode_batches: tuple[int, ...]
    attention_decode_contexts: tuple[int, ...]
    attention_max_kv_bytes: float
    endtoend_model: ModelSpec
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    timeline_cases: tuple[tuple[str, int, int], ...] = ()
    """End-to-end cases (phase, batch, context) whose forward is also profiled kernel by kernel (a subset of the
    end-to-end cases, so that each has its step time, at token counts the gemm section times alone)."""
    peak_matmul_size: int = 0
    """CPU only: side of the square matmul whose FLOP/s stands in for the compute peak."""
    warmup: int = 3
    repeats: int = 10
    target_seconds: float = 2e-3

    def with_dtype_first(self, dtype: str) -> "Plan":
        """The plan with ``dtype`` measured first among the GEMM dtypes (added if missing)."""
        rest = tuple(d for d in self.gemm_dtypes if d != dtype)
        return replace(self, gemm_dtypes=(dtype, *rest))


def shape_of(model: ModelSpec, label: str) -> AttentionShape:
    return AttentionShape(label, model.num_heads, model.num_kv_heads, model.head_dim)


def full_plan() -> Plan:
    """The GPU plan: every size the calibration issue lists."""
    llama7, llama70 = load_model("llama2-7b"), load_model("llama2-70b")
    return Plan(
        name="full",
        bandwidth_buffer_bytes=(256 * MIB, 1 * GIB, 4 * GIB),
        elementwise_tokens=(1, 8, 32, 128, 512, 2048, 8192),
        elementwise_width=llama7.hidden_size,
        gemm_models=(llama7, llama70),
        gemm_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
        gemm_dtypes=("fp16", "bf16", "fp8"),
        attention_shapes=(shape_of(llama7, "MHA"), shape_of(llama70, "GQA")),
        attention_prefill_tokens=(512, 1024, 2048, 4096, 8192),
        attention_decode_batches=(1, 8, 32, 128),
        attention_decode_contexts=(512, 2048, 8192, 32768),
        attention_max_kv_bytes=8 * GIB,
        endtoend_model=llama7,
        decode_batches=(1, 8, 32, 128),
        decode_contexts=(512, 2048, 8192),
        prefill_tokens=(512, 2048),
        timeline_cases=(("decode", 1, 2048), ("decode", 32, 2048), ("prefill", 1, 2048)),
    )


def quick_plan() -> Plan:
    """Fewer sizes of the same kinds, for a shorter GPU run."""
    full = full_plan()
    return replace(
        full,
        name="quick",
        bandwidth_buffer_bytes=(1 * GIB, 4 * GIB),
        elementwise_tokens=(1, 32, 512, 8192),
        gemm_tokens=(1, 8, 32, 128, 256, 512, 2048, 8192),
        gemm_dtypes=("fp16", "fp8"),
        attention_prefill_tokens=(512, 2048, 8192),
        attention_decode_contexts=(512, 8192, 32768),
        warmup=2,
        repeats=5,
    )


def tiny_model() -> ModelSpec:
    """A 2-layer LLaMA-shaped model, 64 wide, for the CPU code path."""
    return ModelSpec(
        name="tiny-llama",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=4,
        ffn_size=172,
        vocab_size=256,
        max_context=64,
    )


def tiny_plan() -> Plan:
    """Millisecond cases on a CPU: the code path, not a measurement of anything useful."""
    tiny = tiny_model()
    gqa = AttentionShape("GQA", q_heads=4, kv_heads=2, head_dim=16)
    return Plan(
        name="tiny",
        bandwidth_buffer_bytes=(256 * 2**10, 1 * MIB),
        elementwise_tokens=(1, 16),
        elementwise_width=64,
        gemm_models=(tiny,),
        gemm_tokens=(1, 4, 16, 64),
        gemm_dtypes=("fp16", "bf16"),
        attention_shapes=(shape_of(tiny, "MHA"), gqa),
        attention_prefill_tokens=(16, 32),
        attention_decode_batches=(1, 4),
        attention_decode_contexts=(16, 64),
        attention_max_kv_bytes=1 * MIB,
        endtoend_model=tiny,
        decode_batches=(1, 2),
        decode_contexts=(16, 32),
        prefill_tokens=(16, 32),
        timeline_cases=(("decode", 1, 16), ("prefill", 1, 16)),
        peak_matmul_size=128,
        warmup=1,
        repeats=3,
        target_seconds=2e-4,
    )


@dataclass
class Budget:
    """Wall-clock budget of a run, in seconds; cases after it expires are skipped and listed."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def expired(self) -> bool:
        return self.elapsed() > self.seconds
