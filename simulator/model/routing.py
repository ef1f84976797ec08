"""Mixture-of-experts routing: which experts a step's tokens reach, in expectation.

A token picks ``k`` of ``E`` routed experts. Write ``q_i`` for the probability that one token
picks expert ``i`` (so the ``q_i`` sum to ``k``). Tokens route independently, so over a step of
``t`` tokens expert ``i`` is touched (its weights must be read) with probability
``1 - (1 - q_i)^t``, and the expected number of distinct experts touched is

    sum_i 1 - (1 - q_i)^t          (uniform routing, q_i = k / E:  E * (1 - (1 - k/E)^t))

which is ``t * k`` for few tokens (every routed pair a new expert) and tends to ``E``.

Uniform routing is what load-balanced training aims for (DeepSeek-V3's auxiliary-loss-free
balancing, the auxiliary losses of Switch/Mixtral/Qwen); real traffic is skewed. ``skew`` s > 0
gives expert ``i`` (0 = hottest) a Zipf-like popularity p_i proportional to (i + 1)^-s; a
token's ``k`` distinct picks are approximated by inclusion probabilities q_i = k * p_i, capped
at 1 with the excess spread over the others in proportion to p (so the q_i still sum to ``k``).
Published routing traces show such skew (e.g. Huang et al. 2023, "Towards MoE Deployment:
Mitigating Inefficiencies in Mixture-of-Expert (MoE) Inference"); the exponent is the user's
assumption, 0 (uniform) by default.

Under expert parallelism over ``ep`` GPUs, expert ``i`` lives on GPU ``i mod ep`` (round-robin,
as vLLM and SGLang lay experts out); the GPU holding the hottest experts (GPU 0) is the one a
step waits for, so operators are costed for it.

Grouped GEMMs pad each expert's rows to the kernel's row tile: vLLM's ``moe_align_block_size``
pads every expert's token list to a multiple of ``BLOCK_SIZE_M``, which its default fused-MoE
config sets to 16 when the step has no more tokens than experts and 64 otherwise
(vllm/model_executor/layers/fused_moe/fused_moe.py, ``get_default_config``). The tensor cores
then spend FLOPs on the padding rows; :func:`row_tiles` counts the tiles of the touched experts
from the expected tokens of a touched expert, t q_i / (1 - (1 - q_i)^t), rounded up to the tile.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.model.step import Number

SMALL_STEP_ROW_TILE = 16
LARGE_STEP_ROW_TILE = 64


def expert_probabilities(experts: int, top_k: int, skew: float = 0.0) -> np.ndarray:
    """q_i, the probability that one token picks expert i (hottest first); they sum to ``top_k``."""
    if skew <= 0.0:
        return np.full(experts, top_k / experts)
    popularity = (np.arange(1, experts + 1, dtype=float)) ** -skew
    popularity /= popularity.sum()
    q = top_k * popularity
    capped = np.zeros(experts, dtype=bool)
    while (q > 1.0 + 1e-12).any():
        capped |= q > 1.0
        free = ~capped
        q[capped] = 1.0
        q[free] = (top_k - capped.sum()) * popularity[free] / popularity[free].sum()
    return q


def local_probabilities(q: np.ndarray, ep: int, rank: int = 0) -> np.ndarray:
    """The q_i of the experts GPU ``rank`` holds when experts are laid out round-robin over ``ep`` GPUs."""
    return q[rank::ep]


def _is_uniform(q: np.ndarray) -> bool:
    return bool(np.all(q == q[0]))


def _untouched(q: np.ndarray, tokens: Number) -> Number:
    """P(expert untouched by ``tokens`` tokens), shape (experts,) or (experts, steps)."""
    if isinstance(tokens, np.ndarray):
        return (1.0 - q)[:, None] ** tokens[None, :]
    return (1.0 - q) ** tokens


def expected_touched(q: np.ndarray, tokens: Number) -> Number:
    """Expected distinct experts among those of ``q`` that ``tokens`` tokens touch (module docstring)."""
    if _is_uniform(q):
        return len(q) * (1.0 - (1.0 - q[0]) ** tokens)
    return np.sum(1.0 - _untouched(q, tokens), axis=0) if isinstance(tokens, np.ndarray) else \
        float(np.sum(1.0 - _untouched(q, tokens)))


def row_tile(tokens: Number, experts: int) -> Number:
    """vLLM fused-MoE row tile: 16 when the step has no more tokens than experts, else 64."""
    if isinstance(tokens, np.ndarray):
        return np.where(tokens <= experts, SMALL_STEP_ROW_TILE, LARGE_STEP_ROW_TILE)
    return SMALL_STEP_ROW_TILE if tokens <= experts else LARGE_STEP_ROW_TILE


def row_tiles(q: np.ndarray, tokens: Number, tile: Number) -> Number:
    """Expected row tiles over the experts of ``q``: sum_i touched_i * ceil(rows of a touched expert / tile)."""
    touched = 1.0 - _untouched(q, tokens)
    qq = q[:, None] if isinstance(tokens, np.ndarray) else q
    with np.errstate(invalid="ignore", divide="ignore"):
        rows = np.where(touched > 0, tokens * qq / np.where(touched > 0, touched, 1.0), 0.0)
    tiles = touched * np.ceil(rows / tile)
    if isinstance(tokens, np.ndarray):
        return np.sum(tiles, axis=0)
    return float(np.sum(tiles))


def remote_gpus_per_token(experts: int, top_k: int, ep: int) -> float:
    """Expected GPUs other than a token's own that hold one of its k experts (uniform routing, ep GPUs).

    A given other GPU holds e = E / ep experts; the k picks (without replacement) all miss it with
    probability C(E - e, k) / C(E, k).
    """
    if ep <= 1:
        return 0.0
    held = experts // ep
    miss = math.comb(experts - held, top_k) / math.comb(experts, top_k)
    return (ep - 1) * (1.0 - miss)


def busiest_share(q: np.ndarray, ep: int) -> float:
    """Expected GPUs a token's hidden state travels to, as seen by the busiest GPU of ``ep`` (skewed routing).

    Uniform routing: :func:`remote_gpus_per_token` (every GPU sends and receives the same). Skewed:
    GPU 0 (the hottest experts) receives from each of the other ``ep - 1`` shares the tokens that hit
    it, with probability 1 - prod(1 - q_i) over its experts (picks taken as independent); the
    larger of that and what it sends sets the all-to-all time.
    """
    if ep <= 1:
        return 0.0
    if _is_uniform(q):
        return remote_gpus_per_token(len(q), round(float(q.sum())), ep)
    hit = np.array([1.0 - np.prod(1.0 - local_probabilities(q, ep, rank)) for rank in range(ep)])
    return float(max((ep - 1) * hit[0], hit[1:].sum()))
