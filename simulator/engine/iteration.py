"""What one engine iteration is made of: the step its chunks and decodes form, its cost fields, why a request is refused."""

from __future__ import annotations

import numpy as np

from simulator.engine.scheduler import Chunk, SchedulerConfig
from simulator.model.step import Step


def _in_order(values: np.ndarray) -> float:
    """The sum of ``values`` added left to right (np.sum adds pairwise, in another order)."""
    return float(np.cumsum(values)[-1])


def _prefix_sums(values: np.ndarray) -> np.ndarray:
    """[0, v0, v0 + v1, ...]: ``len(values) + 1`` running totals."""
    sums = np.zeros(len(values) + 1, dtype=values.dtype)
    np.cumsum(values, out=sums[1:])
    return sums


def _decode_step(batch: float | np.ndarray, context: float | np.ndarray) -> Step:
    """``batch`` decoding sequences whose keys (cache + the new token) sum to ``context``.

    Fields that do not vary over the ticks stay scalars (a Step may mix scalars and arrays), so
    the cost model does array arithmetic only where the context enters.
    """
    return Step(
        tokens=batch, prefill_tokens=0.0, sequences=batch, logit_tokens=batch, attention_pairs=context,
        prefill_attention_pairs=0.0, score_elements=context, context_tokens=context,
    )




def _as_step(step: tuple | None) -> Step | None:
    """A remembered decode step as a Step: (batch, keys attended) of a decode tick, or a Step's fields."""
    if step is not None and len(step) == 2:
        return _decode_step(float(step[0]), float(step[1]))
    return None if step is None else Step(*step)


def iteration_step(chunks: list[Chunk], decoders: int, decode_cached: int) -> Step:
    """The Step of one iteration: prefill ``chunks`` plus one token for each of ``decoders`` sequences
    whose cached tokens sum to ``decode_cached`` (each attends its cache and itself)."""
    return Step(*iteration_fields(chunks, decoders, decode_cached))


def iteration_fields(chunks: list[Chunk], decoders: int, decode_cached: int) -> tuple[float, ...]:
    """:func:`iteration_step`'s fields in Step's order (the engine keys its cost memo by them; a Step is built
    only when the cost model is called)."""
    prefill = logits = pairs = scores = context = 0.0
    for chunk in chunks:
        c, k = float(chunk.tokens), float(chunk.cached)
        prefill += c
        logits += chunk.emits
        pairs += c * k + c * (c + 1.0) / 2.0
        scores += c * (k + c)
        context += k + c
    tokens, prefill_pairs = prefill, pairs
    if decoders:
        keys = float(decode_cached + decoders)
        tokens += decoders
        logits += decoders
        pairs += keys
        scores += keys
        context += keys
    return (tokens, prefill, float(len(chunks) + decoders), logits, pairs, prefill_pairs, scores, context)


def reject_reasons(prompt: np.ndarray, output: np.ndarray, config: SchedulerConfig, max_context: int,
                   kv_blocks: int) -> np.ndarray:
    """Reason code per request of ``prompt``/``output`` tokens (0: admissible), see metrics.REJECT_REASONS."""
    reasons = np.zeros(len(prompt), dtype=np.int8)
    budget = config.max_batched_tokens
    if config.scheduler == "continuous" and budget is not None:
        reasons[prompt > budget] = 4
    largest = np.maximum(prompt + output - 1, prompt)
    reasons[-(-largest // config.block_size) > kv_blocks] = 2
    if config.fit_admission:
        reasons[prompt + output > kv_blocks * config.block_size] = 2  # fit admits only what fits to its last token
    reasons[prompt + output > max_context] = 1
    reasons[(prompt < 1) | (output < 1)] = 3
    return reasons
