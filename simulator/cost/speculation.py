"""Speculative decoding: draft ``k`` tokens cheaply, verify them in one forward pass of ``k + 1`` tokens.

One decode *iteration* of a sequence under speculation (Leviathan, Kalman & Matias 2023, "Fast
Inference from Transformers via Speculative Decoding"; Chen et al. 2023):

1. the draft proposes ``k`` tokens, one after another: ``k`` sequential single-token decode steps
   of the draft for every decoding sequence;
2. the target verifies them in one forward pass of ``k + 1`` query tokens per sequence (the last
   accepted token and the ``k`` drafted ones): attention over the cached context plus those
   tokens, every GEMM with ``(k + 1) x batch`` rows, logits at all ``k + 1`` positions;
3. the longest accepted prefix is kept, plus one token the target samples itself, so an
   iteration emits between 1 and ``k + 1`` tokens.

With per-position acceptance ``a_1 .. a_k`` (``a_j``: the j-th drafted token is accepted given
that the ones before it were) the expected tokens per iteration are

    E = 1 + sum_{j=1..k} prod_{i<=j} a_i        = (1 - a^(k+1)) / (1 - a)  for a constant a

(Leviathan et al. 2023, equation 1). E.g. a = 0.7, k = 4: (1 - 0.7^5) / 0.3 = 2.7731.

Drafts (:func:`draft_model_for`):

- ``draft:MODEL``: a separate, smaller model with the target's tokenizer (vLLM's draft-model
  method, SGLang's STANDALONE). It is a model like any other: its steps are costed by the same
  cost model at the target's tensor-parallel degree, its weights and KV cache take memory.
- ``eagle`` / ``mtp``: a head of one decoder layer fed with the target's hidden states, sharing
  the target's embedding and LM head: EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling
  Requires Rethinking Feature Uncertainty") and DeepSeek's multi-token prediction module
  (DeepSeek-V3 technical report, 2024, section 2.2: one transformer block and a projection with
  the shared embedding and output head). It is costed as a one-layer copy of the target (the
  last layer's kind, so an MoE model's head is an MoE block) with the embedding and LM head;
  its memory is that layer's weights and KV cache.

The draft also prefills every prompt (vLLM and SGLang run the proposer over the prompt), so a
prefill chunk costs the target's prefill plus the draft's.

Where speculation stops paying (:func:`crossover_batch`): decode of a large model is
memory-bound, so verifying ``k + 1`` tokens reads the weights once, as a plain decode step does,
and the iteration costs little more than one step while emitting E tokens. As the batch grows
the GEMMs turn compute-bound, verification costs up to ``k + 1`` steps' FLOPs, and the
speed-up ``E * t_decode / (t_verify + k * t_draft)`` falls below one.

The host time per iteration (:mod:`simulator.cost.engine_overhead`) is charged once per
iteration, with the target's verification: the draft's forward passes run inside the same engine
step (vLLM's proposer replays its CUDA graphs within the step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from simulator.cost.pipeline import PipelineSystem, stage_model
from simulator.cost.step_cost import OperatorCost, StepCost, StepTotals
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.step import Number, Step

METHODS: tuple[str, ...] = ("draft", "eagle", "mtp")
"""Kinds of draft: a separate model (``draft:MODEL``), or a one-layer head (EAGLE, DeepSeek MTP)."""

HEAD_SHARED_OPERATORS = frozenset({"embedding", "final_norm", "lm_head"})
"""Operators of a one-layer head that are the target's own (shared weights: no extra memory)."""

MAX_SPECULATIVE_TOKENS = 64
"""Most drafted tokens per iteration accepted (engines use 1 to ~8)."""

CROSSOVER_BATCH_LIMIT = 1 << 16
"""Largest batch :func:`crossover_batch` tries."""


# ---------------------------------------------------------------------------------------------
# Acceptance and tokens per iteration


def parse_method(text: str) -> tuple[str, str | None]:
    """``draft:MODEL`` -> ('draft', MODEL); ``eagle`` / ``mtp`` -> (that, None); InputError otherwise."""
    value = text.strip()
    kind, colon, name = value.partition(":")
    kind = kind.lower()
    if kind == "draft" and colon and name.strip():
        return "draft", name.strip()
    if kind in ("eagle", "mtp") and not colon:
        return kind, None
    raise InputError(f"--speculative: cannot read '{text}'; use draft:MODEL (a smaller model with the same tokenizer), "
                     f"eagle or mtp (a one-layer draft head)")


def parse_acceptance(text: str | float | Sequence[float], tokens: int | None = None) -> tuple[float, ...]:
    """Per-position acceptance rates ``a_1 .. a_k`` from a number (every position) or a list ("0.8,0.7,0.6").

    ``tokens``: k, the drafted tokens per iteration; a list must have k entries (None: its length).
    InputError names ``--acceptance`` when a rate is not a number in [0, 1] or the lengths disagree.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        parts = [str(text)]
    elif isinstance(text, str):
        parts = [part.strip() for part in text.split(",")]
    elif isinstance(text, bool):
        raise InputError("--acceptance: expected a rate in [0, 1], got a true/false value")
    else:
        parts = [str(part) for part in text]
    if len(parts) > MAX_SPECULATIVE_TOKENS:  # before any work: k is at most MAX_SPECULATIVE_TOKENS
        raise InputError(f"--acceptance: {len(parts)} per-position rates; allowed: one rate, or at most "
                         f"{MAX_SPECULATIVE_TOKENS} (one per drafted token, as --num-speculative-tokens)")
    rates = []
    for part in parts:
        try:
            rate = float(part)
        except ValueError:
            raise InputError(f"--acceptance: '{part}' is not a number; give a rate in [0, 1] or a list like 0.8,0.7,0.6") from None
        if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
            raise InputError(f"--acceptance: {part} is not in [0, 1] (a probability that a drafted token is accepted)")
        rates.append(rate)
    if not rates:
        raise InputError("--acceptance: empty; give a rate in [0, 1] or a list like 0.8,0.7,0.6")
    if len(rates) == 1:
        if tokens is None:
            raise InputError("--num-speculative-tokens: needed with a single --acceptance rate (how many tokens to draft)")
        return tuple(rates * tokens)
    if tokens is not None and tokens != len(rates):
        raise InputError(f"--acceptance: {len(rates)} per-position rates for --num-speculative-tokens {tokens}; "
                         f"give one rate per drafted token, or a single rate")
    return tuple(rates)


def expected_tokens_per_iteration(acceptance: Sequence[float]) -> float:
    """E = 1 + sum_j prod_{i<=j} a_i: tokens an iteration emits on average (module docstring).

    For a constant rate a over k positions this is (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1).
    """
    expected, survive = 1.0, 1.0
    for rate in acceptance:
        survive *= rate
        expected += survive
    return expected


def sample_iterations(decode_tokens: np.ndarray, acceptance: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """Iterations each request needs to emit its ``decode_tokens`` tokens (after the prefill's first one).

    Every iteration draws, per drafted position j, whether the draft's token is accepted (probability
    ``a_j``); the accepted prefix plus the target's own token are emitted, so 1 to k + 1 tokens. The
    draws are per request and per iteration, so requests of equal length finish after different
    numbers of iterations, and their TPOTs differ. A request with no decode tokens needs none.
    """
    left = np.asarray(decode_tokens, dtype=np.int64).copy()
    iterations = np.zeros(len(left), dtype=np.int64)
    rates = np.asarray(acceptance, dtype=float)
    active = np.flatnonzero(left > 0)
    while len(active):
        accepted = rng.random((len(active), len(rates))) < rates
        # Tokens emitted: the leading run of accepted drafts, plus the target's own token.
        emitted = 1 + np.cumprod(accepted, axis=1).sum(axis=1)
        left[active] -= emitted
        iterations[active] += 1
        active = active[left[active] > 0]
    return iterations


# ---------------------------------------------------------------------------------------------
# The steps of an iteration


def _decode_part(step: Step) -> tuple[Number, Number]:
    """(decoding sequences, their cached tokens summed) of an engine step: each decoder adds one token
    that attends its cache and itself, so its keys are cached + 1 and its attention pairs equal its keys."""
    decoders = step.tokens - step.prefill_tokens
    keys = step.attention_pairs - step.prefill_attention_pairs
    return decoders, keys - decoders


def verification_step(step: Step, tokens: int) -> Step:
    """``step`` with each decoding sequence verifying ``tokens`` drafted tokens: k + 1 query tokens on its cache.

    A sequence with ``c`` cached tokens adds q = k + 1 tokens: q c + q (q + 1) / 2 causal pairs,
    c + q keys read, a q x (c + q) score block, logits at all q positions. Prefill chunks in the
    step are unchanged.
    """
    q = tokens + 1
    decoders, cached = _decode_part(step)
    decode_keys = cached + decoders
    return Step(
        tokens=step.prefill_tokens + q * decoders,
        prefill_tokens=step.prefill_tokens,
        sequences=step.sequences,
        logit_tokens=step.logit_tokens + tokens * decoders,
        attention_pairs=step.prefill_attention_pairs + q * cached + decoders * q * (q + 1) / 2.0,
        prefill_attention_pairs=step.prefill_attention_pairs,
        score_elements=step.score_elements - decode_keys + q * cached + decoders * q * q,
        context_tokens=step.context_tokens - decode_keys + cached + q * decoders,
    )


def draft_decode_steps(step: Step, tokens: int) -> list[Step]:
    """The ``tokens`` sequential single-token draft steps for the decoding sequences of ``step``.

    Draft step j (j = 0 .. k - 1) feeds one token per sequence on c + j cached tokens: it attends
    c + j + 1 keys.
    """
    decoders, cached = _decode_part(step)
    steps = []
    for j in range(tokens):
        keys = cached + decoders * (j + 1.0)
        steps.append(Step(tokens=decoders, prefill_tokens=0.0 * decoders, sequences=decoders, logit_tokens=decoders,
                          attention_pairs=keys, prefill_attention_pairs=0.0 * decoders, score_elements=keys,
                          context_tokens=keys))
    return steps


def draft_prefill_step(step: Step) -> Step:
    """The prefill chunks of ``step`` alone (the draft prefills every prompt too)."""
    decoders, cached = _decode_part(step)
    decode_keys = cached + decoders
    return Step(
        tokens=step.prefill_tokens,
        prefill_tokens=step.prefill_tokens,
        sequences=step.sequences - decoders,
        logit_tokens=step.logit_tokens - decoders,
        attention_pairs=step.prefill_attention_pairs,
        prefill_attention_pairs=step.prefill_attention_pairs,
        score_elements=step.score_elements - decode_keys,
        context_tokens=step.context_tokens - decode_keys,
    )


def _nothing(count: Number) -> bool:
    return not isinstance(count, np.ndarray) and count <= 0


# ---------------------------------------------------------------------------------------------
# Drafts


def head_model(model: ModelSpec) -> ModelSpec:
    """The one-decoder-layer head of EAGLE / DeepSeek MTP: the target's last layer, with its embedding and LM head."""
    head = stage_model(model, model.num_layers)
    return head.model_copy(update={"name": f"{model.name} draft head (1 layer)"})


def draft_model_for(method: str, draft: ModelSpec | None, target: ModelSpec) -> ModelSpec:
    """The model the draft steps run: ``draft`` for ``draft:MODEL``, else the target's one-layer head.

    A draft model must share the target's vocabulary (the engines verify token ids, so the tokenizer
    is the same; vLLM refuses a draft with another vocabulary size).
    """
    if method == "draft":
        if draft is None:
            raise InputError("--speculative: draft:MODEL needs a model name")
        if draft.vocab_size != target.vocab_size:
            raise InputError(
                f"--speculative: draft {draft.name} has a vocabulary of {draft.vocab_size:,} tokens but {target.name} "
                f"has {target.vocab_size:,}; a draft model must share the target's tokenizer"
            )
        return draft
    return head_model(target)


class DraftMemory(NamedTuple):
    """What the draft adds to each GPU: weights (bytes) and KV cache per token (bytes)."""

    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float


def draft_memory(method: str, draft: System, kv_bytes_per_token_per_gpu: float) -> DraftMemory:
    """Per GPU: the draft's own weights (a head shares the target's embedding and LM head) and its KV per token."""
    operators = draft.operators
    if method != "draft":
        operators = tuple(op for op in operators if op.name not in HEAD_SHARED_OPERATORS)
    weights = float(sum(op.count * op.resident_bytes for op in operators))
    return DraftMemory(weights, kv_bytes_per_token_per_gpu)


# ---------------------------------------------------------------------------------------------
# The system that runs speculative iterations


def _add_totals(parts: list[StepTotals], overhead_free: list[StepTotals]) -> StepTotals:
    """Sum of ``parts`` (with their host time) and ``overhead_free`` (without it: the draft's passes)."""
    seconds: Number = 0.0
    flops: Number = 0.0
    moved: Number = 0.0
    compute: Number = 0.0
    memory: Number = 0.0
    communication: Number = 0.0
    wait: Number = 0.0
    for part in parts:
        seconds = seconds + part.seconds
        flops, moved = flops + part.flops, moved + part.bytes
        compute, memory = compute + part.compute_bound_seconds, memory + part.memory_bound_seconds
        communication, wait = communication + part.communication_seconds, wait + part.launch_wait_seconds
    for part in overhead_free:
        seconds = seconds + part.seconds - part.overhead_seconds
        flops, moved = flops + part.flops, moved + part.bytes
        compute, memory = compute + part.compute_bound_seconds, memory + part.memory_bound_seconds
        communication, wait = communication + part.communication_seconds, wait + part.launch_wait_seconds
    return StepTotals(seconds, flops, moved, compute, memory, communication, wait)


ADDITIVE = ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "activation_bytes", "link_bytes", "launches",
            "compute_seconds", "memory_seconds", "link_seconds", "seconds", "dequant_ops", "launch_seconds",
            "host_seconds")


def _summed(records: list[OperatorCost], name: str) -> OperatorCost:
    first = records[0]
    sums = {key: sum(getattr(record, key) for record in records) for key in ADDITIVE}
    return first._replace(name=name, **sums)


@dataclass(frozen=True)
class SpeculativeSystem:
    """A target deployment decoding with speculation: each decode step of the engine is one iteration.

    The engine builds its steps as usual (one token per decoding sequence); this system costs each as
    ``k`` draft steps plus the target's verification of ``k + 1`` tokens per sequence (module
    docstring), and a prefill chunk as the target's plus the draft's prefill. Everything else
    (model, GPU, tp, precision, ...) is the target's.
    """

    target: System | PipelineSystem
    draft: System
    method: str
    acceptance: tuple[float, ...]
    draft_name: str = ""
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        if name == "target":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.target, name)

    @property
    def tokens(self) -> int:
        """k: tokens drafted per iteration."""
        return len(self.acceptance)

    @property
    def expected_tokens(self) -> float:
        """E: tokens emitted per iteration on average."""
        return expected_tokens_per_iteration(self.acceptance)

    def step_totals(self, step: Step) -> StepTotals:
        """Totals of one speculative iteration of ``step`` on one GPU (seconds include one host overhead)."""
        decoders = step.tokens - step.prefill_tokens
        target = self.target.step_totals(verification_step(step, self.tokens))
        drafts = [] if _nothing(decoders) else [self.draft.step_totals(s) for s in draft_decode_steps(step, self.tokens)]
        if not _nothing(step.prefill_tokens):
            drafts.append(self.draft.step_totals(draft_prefill_step(step)))
        return _add_totals([target], drafts)

    def step_cost(self, step: Step) -> StepCost:
        """Per-operator cost of one iteration: the target's verification, then the draft's operators summed
        over its k steps and prefill (named ``draft <operator>``)."""
        decoders = step.tokens - step.prefill_tokens
        target = self.target.step_cost(verification_step(step, self.tokens))
        steps = [] if _nothing(decoders) else draft_decode_steps(step, self.tokens)
        if not _nothing(step.prefill_tokens):
            steps.append(draft_prefill_step(step))
        if not steps:
            return target
        costs = [self.draft.step_cost(s) for s in steps]
        merged = [_summed([cost.operators[i] for cost in costs], f"draft {op.name}")
                  for i, op in enumerate(costs[0].operators)]
        # Each pass waits for its own launches: the waits add up, they are not one max over the merged operators.
        wait = target.launch_wait_seconds + sum(cost.launch_wait_seconds for cost in costs)
        return StepCost((*target.operators, *merged), target.overhead_seconds, wait)

    def step_seconds(self, step: Step) -> float:
        return float(self.step_totals(step).seconds)

    def describe(self) -> str:
        return f"{self.target.describe()}, speculative decoding ({self.label()})"

    def label(self) -> str:
        """'draft llama3-8b, k 4' / 'eagle head, k 4'."""
        what = f"draft {self.draft_name}" if self.method == "draft" else f"{self.method} head"
        return f"{what}, k {self.tokens}"


# ---------------------------------------------------------------------------------------------
# What it buys


def plain_decode_seconds(system: System | PipelineSystem, batch: Number, context_tokens: Number) -> Number:
    """One ordinary decode step of ``batch`` sequences at ``context_tokens`` keys each (seconds)."""
    return system.step_totals(Step.decode(batch, context_tokens)).seconds


def seconds_per_token(spec: SpeculativeSystem, batch: Number, context_tokens: Number) -> Number:
    """Expected decode seconds per emitted token under speculation: iteration time / E."""
    return spec.step_totals(Step.decode(batch, context_tokens)).seconds / spec.expected_tokens


def speedup(spec: SpeculativeSystem, batch: Number, context_tokens: Number) -> Number:
    """Decode speed-up at ``batch`` and ``context_tokens``: t_decode / (t_iteration / E); below 1 it is a slow-down."""
    return plain_decode_seconds(spec.target, batch, context_tokens) / seconds_per_token(spec, batch, context_tokens)


def crossover_batch(spec: SpeculativeSystem, context_tokens: int, max_batch: int = CROSSOVER_BATCH_LIMIT) -> int | None:
    """Smallest decode batch up to ``max_batch`` at which speculation stops paying (speed-up <= 1), or None.

    The speed-up is not monotone in the batch: it falls as the GEMMs turn compute-bound, but at long
    contexts attention (memory-bound at any batch, its KV read shared by the k + 1 verified tokens)
    takes over and lifts it again. So the batches are scanned on a geometric grid (steps of at most
    ~19%) in one vectorised cost-model call, and the first failing grid interval is bisected.
    """
    limit = max(1, min(int(max_batch), CROSSOVER_BATCH_LIMIT))
    grid = np.unique(np.rint(np.geomspace(1, limit, num=max(2, int(math.log(limit) / math.log(1.19)) + 2))))
    slower = np.asarray(speedup(spec, grid, float(context_tokens))) <= 1.0
    failing = np.flatnonzero(slower)
    if not len(failing):
        return None
    first = int(failing[0])
    if first == 0:
        return 1
    good, bad = int(grid[first - 1]), int(grid[first])
    while bad - good > 1:
        middle = (good + bad) // 2
        if float(speedup(spec, middle, float(context_tokens))) <= 1.0:
            bad = middle
        else:
            good = middle
    return bad
