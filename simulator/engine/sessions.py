"""Agentic and multi-turn sessions: turns sent after the previous answer plus a think time, prompts that grow.

A session is a conversation of ``turns`` requests. Turn k (k = 1 .. T) is sent ``think`` seconds
after the client received the whole answer of turn k - 1 (the first turn at the session's start);
its prompt is the conversation so far - every earlier prompt and answer - plus ``P`` new tokens:

    prompt_k = P + (k - 1) * (P + O)        tokens (each earlier turn added its P new tokens and O answer tokens)

so a turn's prompt starts with the previous turn's prompt and answer, ``(k - 1) * (P + O)`` tokens
that a prefix cache may still hold. Every turn of a session carries the session as its prefix id
and that history as its prefix tokens (:class:`~simulator.engine.workload.Workload` ``prefix_id``,
``prefix_tokens``). With prefix caching the engine keeps a finished turn's full blocks (prompt and
answer, as vLLM's V1 block hashes and SGLang's radix tree keep generated tokens) under the session's
id (:meth:`simulator.engine.prefix_cache.PrefixCache.extend`), so the next turn recomputes only what
was evicted; hit rate, recomputed tokens and their collapse when the cache is too small for the
sessions' working set come out of the cache itself.

Send times are not known in advance: requests are ordered turn by turn (every session's turn 1,
then every turn 2, ...), the first turns arrive at their sessions' starts and each later turn has
``previous`` (the request it follows) and ``think_seconds``; the engine sends it when ``previous``
finishes (:class:`~simulator.engine.engine.Engine`, :class:`~simulator.engine.cluster.Cluster`).
Sessions start spread evenly over one think time (session s at ``s * think / sessions``), so the
first turns do not all arrive at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simulator.engine.traces import Trace
from simulator.engine.workload import MAX_LENGTH, Workload, check_request_count
from simulator.errors import InputError


@dataclass(frozen=True)
class SessionWorkload(Workload):
    """A :class:`Workload` whose requests are turns of sessions; later turns are sent when the one before finishes."""

    session: np.ndarray | None = None
    """per request, its session (0-based)"""
    turn: np.ndarray | None = None
    """per request, its turn within the session (1-based)"""
    previous: np.ndarray | None = None
    """per request, the request whose answer it waits for (-1: none, sent at its arrival)"""
    think_seconds: np.ndarray | None = None
    """per request, seconds between the client receiving ``previous``'s answer and sending this one"""

    def followers(self) -> np.ndarray:
        """Per request, the request sent after it finishes (-1: none)."""
        assert self.previous is not None
        follower = np.full(len(self), -1, dtype=np.int64)
        has = np.flatnonzero(self.previous >= 0)
        follower[self.previous[has]] = has
        return follower


def is_sessions(workload: Workload) -> bool:
    return isinstance(workload, SessionWorkload) and workload.previous is not None


def session_workload(sessions: int, turns: int, think_seconds: float, turn_tokens: int, output_tokens: int,
                     description: str = "") -> SessionWorkload:
    """``sessions`` sessions of ``turns`` turns (module docstring): ``turn_tokens`` new prompt tokens and
    ``output_tokens`` answer tokens per turn, ``think_seconds`` between an answer and the next turn."""
    for name, value, low in (("--sessions", sessions, 1), ("--turns", turns, 1), ("--turn-tokens", turn_tokens, 1),
                             ("--output-tokens", output_tokens, 1)):
        if value < low:
            raise InputError(f"{name}: must be >= {low} (got {value})")
    if not np.isfinite(think_seconds) or think_seconds < 0:
        raise InputError(f"--think-time: must be a finite number of seconds >= 0 (got {think_seconds})")
    longest = turns * turn_tokens + (turns - 1) * output_tokens
    if longest > MAX_LENGTH:
        raise InputError(f"--turns {turns}: the last turn's prompt would be {longest} tokens (at most {MAX_LENGTH})")
    n = sessions * turns
    check_request_count(n, "--sessions x --turns")
    turn = np.repeat(np.arange(1, turns + 1, dtype=np.int64), sessions)  # turn-major: every turn 1, then every turn 2
    session = np.tile(np.arange(sessions, dtype=np.int64), turns)
    history = (turn - 1) * (turn_tokens + output_tokens)
    prompts = turn_tokens + history
    starts = session * (think_seconds / sessions)
    arrival = np.where(turn == 1, starts, np.inf)  # later turns: sent by the engine
    previous = np.where(turn == 1, -1, np.arange(n, dtype=np.int64) - sessions)
    text = description or (f"{sessions} session{'s' if sessions != 1 else ''} of {turns} turns: {turn_tokens} new "
                           f"prompt tokens and {output_tokens} output tokens per turn, {think_seconds:g} s think time")
    return SessionWorkload(
        arrival_seconds=arrival, prompt_tokens=prompts, output_tokens=np.full(n, output_tokens, dtype=np.int64),
        kind="sessions", description=text, prefix_id=session.copy(), prefix_tokens=history,
        session=session, turn=turn, previous=previous, think_seconds=np.full(n, float(think_seconds)),
    )


def turn_order(session: np.ndarray, turn: np.ndarray, arrival: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
               history: np.ndarray, think: np.ndarray, description: str, notes: tuple[str, ...] = ()) -> SessionWorkload:
    """A :class:`SessionWorkload` from per-turn columns in any order (a trace's): sorted turn-major, first turns
    by arrival; ``arrival`` is used for first turns only."""
    index = {(int(s), int(t)): i for i, (s, t) in enumerate(zip(session.tolist(), turn.tolist()))}
    before = np.array([index.get((int(s), int(t) - 1), -1) for s, t in zip(session.tolist(), turn.tolist())],
                      dtype=np.int64)  # original index of the turn each follows (-1: none, sent at its arrival)
    roots = np.flatnonzero(before < 0)
    roots = roots[np.argsort(arrival[roots], kind="stable")]
    rest = np.flatnonzero(before >= 0)
    rest = rest[np.lexsort((session[rest], turn[rest]))]
    order = np.concatenate([roots, rest])  # sent-at-arrival first (the engine walks them in order), then followers
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.arange(len(order))
    previous = np.where(before[order] < 0, -1, where[np.maximum(before[order], 0)])
    session, turn = session[order], turn[order]
    arrive = np.where(previous < 0, arrival[order], np.inf)
    return SessionWorkload(
        arrival_seconds=arrive, prompt_tokens=prompts[order].astype(np.int64),
        output_tokens=outputs[order].astype(np.int64), kind="sessions", description=description, notes=notes,
        prefix_id=session.astype(np.int64), prefix_tokens=np.minimum(history[order], prompts[order]).astype(np.int64),
        session=session, turn=turn, previous=previous, think_seconds=think[order].astype(float),
    )


def sent_workload(workload: Workload, sent: np.ndarray) -> Workload:
    """``workload`` with the send times the run chose (NaN: never sent): TTFT counts from them."""
    return replace(workload, arrival_seconds=np.asarray(sent, dtype=float))


@dataclass(frozen=True)
class TurnRow:
    """One turn's figures: requests sent, and over those completed: prompt tokens, tokens served from a cache
    (GPU or an offload tier), history tokens computed again, and the mean TTFT (seconds)."""

    turn: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    ttft_mean_seconds: float | None

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache over prompt tokens (vLLM's prefix-cache hit rate, by tokens)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        return {"turn": self.turn, "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "hit_rate": self.hit_rate,
                "recomputed_tokens": self.recomputed_tokens, "ttft_mean_seconds": self.ttft_mean_seconds}


def by_turn(result) -> list[TurnRow]:
    """Per-turn hit rate, recomputed tokens and TTFT of a session run (empty when the workload has no sessions).

    Recomputed tokens of a turn: its history (the earlier turns' prompts and answers) less what the cache served,
    summed over its requests."""
    workload = result.workload
    if not is_sessions(workload):
        return []
    from simulator.engine.metrics import DONE

    cached = result.extra.get("cached_tokens")
    cached = np.zeros(len(workload), dtype=np.int64) if cached is None else np.asarray(cached, dtype=np.int64)
    history = workload.prefix_tokens if workload.prefix_tokens is not None else np.zeros(len(workload), dtype=np.int64)
    done = result.status == DONE
    ttft = result.first_token - workload.arrival_seconds
    rows = []
    for turn in np.unique(workload.turn).tolist():
        sent = (workload.turn == turn) & ~np.isnan(workload.arrival_seconds)
        served = sent & done  # tokens are counted over the turns served (a rejected turn computes nothing)
        rows.append(TurnRow(
            turn=int(turn), requests=int(sent.sum()), prompt_tokens=int(workload.prompt_tokens[served].sum()),
            cached_tokens=int(cached[served].sum()),
            recomputed_tokens=int(np.maximum(history[served] - cached[served], 0).sum()),
            ttft_mean_seconds=float(ttft[served].mean()) if served.any() else None,
        ))
    return rows


MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces (kvcache-ai/Mooncake FAST25-release/README.md)."""


def with_hash_prefixes(trace: Trace) -> Trace:
    """A Mooncake trace (simulator.engine.traces, format ``Mooncake``) with its ``hash_ids`` read as conversations.

    Request j continues the conversation of the earlier request i with the longest whole ``hash_ids`` list that
    starts j's (the latest such request where two are as long; a later turn's prompt holds the earlier turn's
    prompt, so its block hashes begin with them): j's prefix
    is that conversation (its id) and ``512 * len(hash_ids of i)`` tokens of it (at most j's prompt). A request
    that continues none starts a conversation of its own; blocks it shares with another conversation only in
    part (a common system prompt) are not credited, since a request has one prefix here. Rows with 0 tokens
    are skipped as the trace reader skips them.
    """
    from simulator.engine.traces import MOONCAKE

    if trace.format != MOONCAKE:
        return trace
    import json
    from pathlib import Path

    path = Path(trace.path)
    whole: dict[int, int] = {}  # hash of a request's whole hash_ids list -> its conversation
    conversations: list[int] = []
    shared: list[int] = []
    fresh = 0
    with path.open(encoding="utf-8-sig") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            record = json.loads(text)
            if not record.get("input_length") or not record.get("output_length"):
                continue
            hashes = record.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
                raise InputError(f"{path}:{line}: hash_ids {str(hashes)[:60]!r} is not a list of whole numbers")
            key, best, found = 0, -1, 0
            keys = []
            for k, block in enumerate(hashes, start=1):
                key = hash((key, block))
                keys.append(key)
                if key in whole:
                    best, found = whole[key], k
            chain = best
            if best < 0:  # a conversation of its own
                chain = fresh
                fresh += 1
            conversations.append(chain)
            shared.append(found * MOONCAKE_BLOCK_TOKENS)
            if keys:
                whole[keys[-1]] = chain
    if len(conversations) != len(trace):
        raise InputError(f"{path}: {len(conversations)} rows with hash_ids for {len(trace)} requests")
    tokens = np.minimum(np.array(shared, dtype=np.int64), trace.prompt_tokens)
    return replace(trace, prefix_id=np.array(conversations, dtype=np.int64), prefix_tokens=tokens)


def as_sessions(workload: Workload) -> Workload:
    """A trace workload whose prefixes are conversations (:func:`with_hash_prefixes`) as a :class:`SessionWorkload`
    replayed at its own times: every request arrives when the trace says (no request waits for another), and a
    turn's blocks join its conversation's cached prefix when it finishes."""
    if workload.prefix_id is None or workload.prefix_tokens is None:
        return workload
    session = workload.prefix_id.astype(np.int64)
    order = np.lexsort((np.arange(len(session)), session))
    turn = np.empty(len(session), dtype=np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(session[order])) + 1]
    counts = np.diff(np.r_[starts, len(order)])
    turn[order] = np.arange(len(order)) - np.repeat(starts, counts) + 1
    return SessionWorkload(
        arrival_seconds=workload.arrival_seconds, prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens, kind=workload.kind, description=workload.description,
        notes=workload.notes, prefix_id=workload.prefix_id, prefix_tokens=workload.prefix_tokens,
        client_seconds=workload.client_seconds, response_seconds=workload.response_seconds,
        session=session, turn=turn, previous=np.full(len(session), -1, dtype=np.int64),
        think_seconds=np.zeros(len(session)),
    )
