"""A *step*: the tokens one forward pass processes, summarised as totals.

The cost of a step depends on the sequences in it only through these sums, so one step
costs O(operators) to evaluate however many sequences it holds. Every field may be a
Python number or a numpy array (one entry per step) so thousands of steps are costed in
one vectorised call.

For a sequence that adds ``p`` new tokens on top of ``c`` cached tokens, the ``k = c + p``
keys it attends to give (causal attention, each token attends to itself and all before):
- attention pairs: p*c + p*(p+1)/2
- score-matrix elements (a naive kernel materialises the full p x k block): p*k
- context tokens (keys read from the KV cache at least once): k
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

Number = float | np.ndarray


def ceil_div(a: Number, b: float) -> Number:
    """``ceil(a / b)`` for counts, elementwise for arrays (integers stay integers)."""
    return -((-a) // b)


@dataclass(frozen=True)
class Step:
    """Totals over the sequences of one forward pass (counts of tokens, not bytes)."""

    tokens: Number
    """new tokens processed (prefill + decode)"""
    prefill_tokens: Number
    """the part of ``tokens`` that are prompt (prefill) tokens"""
    sequences: Number
    """sequences taking part in the step"""
    logit_tokens: Number
    """positions whose logits are computed (one per sequence that emits a token)"""
    attention_pairs: Number
    """(query, key) pairs attended, causal"""
    prefill_attention_pairs: Number
    """the part of ``attention_pairs`` that belongs to prefill chunks"""
    score_elements: Number
    """elements of the full score blocks a naive kernel writes, per head"""
    context_tokens: Number
    """keys per sequence summed over sequences (each read from the KV cache once at least)"""

    @classmethod
    def decode(cls, batch: Number, context_tokens: Number) -> "Step":
        """``batch`` sequences each adding one token that attends ``context_tokens`` keys (itself included)."""
        total_keys = batch * context_tokens
        return cls(
            tokens=batch,
            prefill_tokens=0 * batch,
            sequences=batch,
            logit_tokens=batch,
            attention_pairs=total_keys,
            prefill_attention_pairs=0 * batch,
            score_elements=total_keys,
            context_tokens=total_keys,
        )

    @classmethod
    def prefill(
        cls, batch: Number, prompt_tokens: Number, cached_tokens: Number = 0, emits_token: bool = True
    ) -> "Step":
        """``batch`` sequences each prefilling ``prompt_tokens`` on top of ``cached_tokens`` already in the cache.

        ``emits_token`` is False for a prefill chunk that does not reach the end of its prompt.
        """
        keys = cached_tokens + prompt_tokens
        pairs = prompt_tokens * cached_tokens + prompt_tokens * (prompt_tokens + 1) / 2
        return cls(
            tokens=batch * prompt_tokens,
            prefill_tokens=batch * prompt_tokens,
            sequences=batch,
            logit_tokens=batch if emits_token else 0 * batch,
            attention_pairs=batch * pairs,
            prefill_attention_pairs=batch * pairs,
            score_elements=batch * prompt_tokens * keys,
            context_tokens=batch * keys,
        )

    def __add__(self, other: "Step") -> "Step":
        """The step that runs both groups of sequences in one forward pass."""
        return Step(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def decode_tokens(self) -> Number:
        return self.tokens - self.prefill_tokens
