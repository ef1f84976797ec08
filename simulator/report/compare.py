"""Side-by-side comparison of attention variants (MHA / GQA-N / MQA) across context lengths.

For every (variant, context) cell: KV-cache bytes per token and per sequence, the decode
step time at the requested batch, the largest batch whose weights + KV cache + workspace
fit in GPU memory, and the decode throughput at that batch (tokens/s = batch / step).

All cells use one tensor-parallel degree so that rows are comparable: the requested one,
or the smallest candidate at which every cell fits one sequence.

Contexts beyond the model's trained maximum (``max_context``) are evaluated analytically
(the cost model does not care that positions past the trained range would need RoPE
scaling or a fine-tuned model to give good answers); such cells carry
``beyond_max_context`` and the report prints a warning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.cost.memory import kv_bytes_per_token, plan_memory
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec, with_attention
from simulator.model.gpu import GPUSpec
from simulator.model.operators import AttentionKernel, Fusion
from simulator.model.parallelism import check_tensor_parallel
from simulator.model.precision import Precision
from simulator.model.step import Step

# Largest batch the max-batch search tries; beyond it the cell reports this bound.
MAX_BATCH_SEARCHED = 1 << 20


@dataclass(frozen=True)
class CompareRow:
    """One (attention variant, context) cell. Seconds, bytes, tokens/s."""

    attention: str
    attention_kind: str
    kv_heads: int
    ctx: int
    beyond_max_context: bool
    tp: int
    batch: int
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
    fits_batch: bool
    decode_step_seconds: float
    max_batch: int
    max_batch_step_seconds: float | None
    max_batch_tokens_per_second: float | None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    model: ModelSpec
    gpu: GPUSpec
    precision: Precision
    tp: int
    tp_auto: bool
    rows: tuple[CompareRow, ...]

    @property
    def beyond_max_context(self) -> bool:
        return any(r.beyond_max_context for r in self.rows)


def parse_list(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"{option}: give a comma-separated list (got '{text}')")
    return items


def parse_contexts(text: str) -> list[int]:
    contexts = []
    for item in parse_list(text, "--ctx"):
        try:
            value = int(item)
        except ValueError:
            raise InputError(f"--ctx: '{item}' is not a whole number of tokens (e.g. --ctx 512,4096,32768)") from None
        if value < 1:
            raise InputError(f"--ctx: {value} must be >= 1 token")
        contexts.append(value)
    return contexts


def _fits(model: ModelSpec, precision: Precision, gpu: GPUSpec, tp: int, batch: int, ctx: int, system: System) -> bool:
    return plan_memory(model, precision, gpu, tp, batch, ctx, system.operators).fits


def max_batch_that_fits(model: ModelSpec, precision: Precision, gpu: GPUSpec, tp: int, ctx: int, system: System) -> int:
    """Largest batch of ``ctx``-token sequences that fits (0 if not even one); memory grows with batch."""
    if not _fits(model, precision, gpu, tp, 1, ctx, system):
        return 0
    low, high = 1, 2
    while high <= MAX_BATCH_SEARCHED and _fits(model, precision, gpu, tp, high, ctx, system):
        low, high = high, high * 2
    if high > MAX_BATCH_SEARCHED:
        return low
    while high - low > 1:  # invariant: low fits, high does not
        mid = (low + high) // 2
        if _fits(model, precision, gpu, tp, mid, ctx, system):
            low = mid
        else:
            high = mid
    return low


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


def _valid_tp(model: ModelSpec, tp: int) -> bool:
    """TP splits the heads and FFN; KV heads are split, or replicated when fewer than GPUs (as MQA needs)."""
    try:
        check_tensor_parallel(model, tp)
    except InputError:
        return False
    return model.ffn_size % tp == 0


def _choose_tp(variants: list[ModelSpec], contexts: list[int], gpu: GPUSpec, precision: Precision,
               attention_kernel: AttentionKernel, fusion: Fusion) -> int:
    """Smallest candidate degree at which every cell fits one sequence (the largest candidate if none does)."""
    candidates = [tp for tp in _powers_of_two(gpu.max_gpus_per_node) if all(_valid_tp(m, tp) for m in variants)]
    if not candidates:
        raise InputError(f"--attention: no tensor-parallel degree divides the heads of every variant on {gpu.name}")
    for tp in candidates:
        if all(
            _fits(m, precision, gpu, tp, 1, ctx, System(m, gpu, precision, tp, attention_kernel, fusion))
            for m in variants
            for ctx in contexts
        ):
            return tp
    return candidates[-1]


def compare_attention(
    model: ModelSpec,
    gpu: GPUSpec,
    precision: Precision,
    variants: list[str],
    contexts: list[int],
    batch: int = 1,
    tp: int | None = None,
    attention_kernel: AttentionKernel = "flash",
    fusion: Fusion = "elementwise",
) -> Comparison:
    """Every (variant, context) cell; see the module docstring."""
    if batch < 1:
        raise InputError(f"--batch: must be >= 1 (got {batch})")
    specs = [with_attention(model, v) for v in variants]
    chosen = tp if tp is not None else _choose_tp(specs, contexts, gpu, precision, attention_kernel, fusion)
    rows = []
    for variant, spec in zip(variants, specs):
        system = System(spec, gpu, precision, chosen, attention_kernel, fusion)
        per_token = kv_bytes_per_token(spec, precision)
        for ctx in contexts:
            largest = max_batch_that_fits(spec, precision, gpu, chosen, ctx, system)
            at_max = float(system.step_seconds(Step.decode(largest, ctx))) if largest else None
            rows.append(
                CompareRow(
                    attention=variant,
                    attention_kind=spec.attention_kind,
                    kv_heads=spec.num_kv_heads,
                    ctx=ctx,
                    beyond_max_context=ctx > model.max_context,
                    tp=chosen,
                    batch=batch,
                    kv_bytes_per_token=per_token,
                    kv_bytes_per_sequence=per_token * ctx,
                    fits_batch=batch <= largest,
                    decode_step_seconds=float(system.step_seconds(Step.decode(batch, ctx))),
                    max_batch=largest,
                    max_batch_step_seconds=at_max,
                    max_batch_tokens_per_second=largest / at_max if at_max else None,
                )
            )
    return Comparison(model, gpu, precision, chosen, tp is None, tuple(rows))


def text_table(headers: list[str], rows: list[list[str]], align_right: set[int]) -> list[str]:
    """Plain-text table lines: a header, a rule, then the rows."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in align_right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]
