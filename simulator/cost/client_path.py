"""The client path: what lies between a benchmark client and the engine's scheduler, in seconds.

A benchmark client (``vllm bench serve``, ``sglang.bench_serving``, genai-perf) times a request
from the moment it sends it to the moment the first streamed chunk arrives. Before the engine's
scheduler sees the request, the API server parses the HTTP request, tokenises the prompt and hands
the request to the engine core (vLLM V1: AsyncLLM -> EngineCore over a ZMQ socket, picked up at
the core's next loop; SGLang: TokenizerManager -> Scheduler over ZMQ); after the engine emits the
first token, it is detokenised and streamed back as the first chunk. Per request (an engine
profile's ``client``, :class:`simulator.model.engine_profile.ClientPath`):

    request  = (http_seconds + tokenize_seconds_per_token x prompt tokens) x jitter
    response = first_chunk_seconds + detokenize_seconds_per_token

``request`` delays the request's arrival at the engine, ``response`` every token the client sees
(so TTFT and end-to-end latency grow by request + response; the gaps between tokens do not: in
every shipped profile the later tokens' detokenisation runs in another process while the engine
computes the next step). ``jitter`` is lognormal with mean 1 and the profile's coefficient of
variation: real clients drift apart because their requests' CPU time varies, and that is what
keeps a closed loop of identical requests from staying in lockstep (simulator.engine.closed_loop).

Requests reach the engine in the order they were sent (one API-server process and one socket hand
them over first in, first out): a request whose client path is short does not overtake one sent
before it (:func:`engine_arrivals`). The CPU contention of a saturated API server (one core doing
every request's HTTP and tokenisation) is not modelled.

Pure numpy functions; the engine charges what they return.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.model.engine_profile import ClientPath

__all__ = ["breakdown", "engine_arrivals", "jitter", "request_seconds", "response_seconds"]


def request_seconds(client: ClientPath, prompt_tokens: np.ndarray) -> np.ndarray:
    """Mean seconds from a client's send to the engine's receipt, per prompt of ``prompt_tokens`` tokens."""
    return client.http_seconds + client.tokenize_seconds_per_token * np.asarray(prompt_tokens, dtype=float)


def response_seconds(client: ClientPath) -> float:
    """Seconds from the engine's emission of a token to the client's receipt of its chunk."""
    return client.first_chunk_seconds + client.detokenize_seconds_per_token


def jitter(n: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` lognormal factors of mean 1 and coefficient of variation ``cv`` (all 1 when ``cv`` is 0).

    A lognormal exp(N(mu, s^2)) has mean exp(mu + s^2/2) and CV sqrt(exp(s^2) - 1), so
    s^2 = ln(1 + cv^2) and mu = -s^2/2.
    """
    if cv <= 0:
        return np.ones(n)
    s2 = math.log1p(cv * cv)
    return rng.lognormal(-s2 / 2.0, math.sqrt(s2), size=n)


def engine_arrivals(sent_seconds: np.ndarray, request_seconds: np.ndarray) -> np.ndarray:
    """When each request reaches the engine: its send time plus its client path, never before the request
    sent ahead of it (first in, first out): a_k = max(sent_k + request_k, a_{k-1}). Non-decreasing when the
    sends are."""
    return np.maximum.accumulate(np.asarray(sent_seconds, dtype=float) + np.asarray(request_seconds, dtype=float))


def breakdown(client: ClientPath, prompt_tokens: float) -> dict[str, float]:
    """The mean client path of a request of ``prompt_tokens`` tokens, by part (seconds): ``http_seconds``
    (HTTP and hand-off), ``tokenize_seconds``, ``response_seconds`` (first chunk and its detokenisation) and
    ``total_seconds``, what it adds to TTFT on an otherwise idle engine."""
    tokenize = client.tokenize_seconds_per_token * prompt_tokens
    response = response_seconds(client)
    return {"http_seconds": client.http_seconds, "tokenize_seconds": tokenize, "response_seconds": response,
            "total_seconds": client.http_seconds + tokenize + response}
