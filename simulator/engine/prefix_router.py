"""Prefix-aware routing: send a request where its prefix is cached, unless that replica is much busier.

What llm-d's inference scheduler (its prefix-cache scorer beside the queue and KV-utilisation
scorers) and NVIDIA Dynamo's KV-aware router do: each replica gets a score, the weighted sum of
how much of the request's prefix its KV cache holds and how lightly loaded it is, and the request
goes to the best score. Here, per replica r:

    score_r = PREFIX_WEIGHT * cached_r / wanted  -  LOAD_WEIGHT * outstanding_r / max(1, max_r' outstanding_r')

``wanted``: the request's reusable prefix blocks; ``cached_r``: blocks of that prefix replica r holds
(on its GPU or in its offload tier: :mod:`simulator.engine.kv_offload`), as the router last saw them;
``outstanding``: requests in flight, the router's own live count (as ``least_outstanding``). A
request without a prefix scores load only, so the policy falls back to least-outstanding.

Staleness: the router's view of the caches is a snapshot refreshed every ``staleness`` seconds (0: it
reads them live), as an index fed by KV-cache events from the replicas lags them (llm-d's KV-events
index, Dynamo's KV events). A stale view sends requests where their prefix was, so it loses hits.
The weights are this simulator's choice (the prefix counts twice the load), not the projects' defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.engine.router import ReplicaLoad, Router
from simulator.errors import InputError

PREFIX_WEIGHT = 2.0
LOAD_WEIGHT = 1.0


def check_staleness(seconds: float) -> float:
    if not (seconds >= 0 and seconds < float("inf")):
        raise InputError(f"--router-staleness: must be a finite number of seconds >= 0 (got {seconds})")
    return float(seconds)


class PrefixRouter(Router):
    """The ``prefix`` policy (module docstring); ties go round the replicas as the other policies' do."""

    def __init__(self, replicas: int, staleness: float = 0.0) -> None:
        super().__init__("least_outstanding", replicas)
        self.policy = "prefix"
        self.staleness = check_staleness(staleness)
        self.view_time = float("-inf")
        self.views: list[dict[int, int]] | None = None
        self.caches: Sequence[object] = ()

    def observe(self, caches: Sequence[object], at: float) -> None:
        """The router is routing at ``at``: a stale view is refreshed when ``staleness`` seconds have passed since
        its last refresh (the first at the first request routed). ``caches``: each replica's PrefixCache or None."""
        self.caches = caches
        if self.staleness > 0 and at - self.view_time >= self.staleness:
            self.views = [_held(cache) for cache in caches]
            self.view_time = at

    def cached(self, prefix: int) -> list[int]:
        """Blocks of ``prefix`` each replica holds as the router sees it (after :meth:`observe`)."""
        if self.staleness > 0 and self.views is not None:
            return [view.get(prefix, 0) for view in self.views]
        return [_held_one(cache, prefix) for cache in self.caches]

    def choose_by_prefix(self, loads: Sequence[ReplicaLoad], cached: Sequence[int], wanted: int) -> int:
        count = self.replicas
        busiest = max(1, max(load.outstanding for load in loads))
        keys = [(PREFIX_WEIGHT * min(hold, wanted) / wanted if wanted else 0.0) - LOAD_WEIGHT * load.outstanding / busiest
                for load, hold in zip(loads, cached, strict=True)]
        best = max(keys)
        chosen = next(r % count for r in range(self.start, self.start + count) if keys[r % count] == best)
        self.start = (chosen + 1) % count
        return chosen


def _held(cache) -> dict[int, int]:
    """Prefix id -> blocks a replica's cache holds: on its GPU, else in its offload tier (the longer copy)."""
    if cache is None:
        return {}
    held = dict(cache.blocks)
    tier = getattr(cache, "tier", None)
    if tier is not None:
        for prefix, blocks in tier.held.items():
            if blocks > held.get(prefix, 0):
                held[prefix] = blocks
    return held


def _held_one(cache, prefix: int) -> int:
    """Blocks of ``prefix`` a replica's cache holds now (as :func:`_held`, for one prefix)."""
    if cache is None:
        return 0
    tier = getattr(cache, "tier", None)
    return max(cache.blocks.get(prefix, 0), 0 if tier is None else tier.held.get(prefix, 0))
