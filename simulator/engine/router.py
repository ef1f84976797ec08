"""Routers: which replica of a data-parallel deployment serves each arriving request.

A deployment of ``replicas`` model copies (each a tensor-parallel group) behind one load
balancer, as production serving stacks run them. The policies are those of real routers:

- ``round_robin``: replica ``k mod R`` for the k-th request, whatever their load (vLLM
  production-stack's ``roundrobin`` router, NGINX's and Kubernetes services' default).
  It does not look at the replicas, so the stream can be split up front and every replica
  run on its own: exact, and the cost per request does not grow with R.
- ``least_outstanding``: the replica with the fewest requests in flight (routed and not yet
  finished, queued ones included), as Envoy's and NGINX's least-request balancers and
  llm-d's queue scorer do. Counts are the router's own: +1 when it routes, -1 when the
  response ends.
- ``least_kv``: the replica whose KV cache is least loaded: blocks in use plus the blocks its
  queued requests need to start, over its capacity (the KV-cache-utilisation scorers of llm-d
  and vLLM production-stack's KV-aware routing, with the queue counted so that requests
  arriving within one iteration do not all herd onto the same replica).

Ties go to the first tied replica at or after the one after the previous choice (a rotating
start), so idle replicas share a light load instead of replica 0 taking everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from simulator.errors import InputError

ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "least_kv", "prefix")
"""``prefix``: simulator.engine.prefix_router (cached prefix and load, with a staleness of its view)."""


class ReplicaLoad(NamedTuple):
    """What a router sees of one replica at an arrival: requests in flight, KV blocks in use and wanted, capacity."""

    outstanding: int
    kv_blocks_used: int
    kv_blocks_queued: int
    kv_blocks: int

    @property
    def kv_load(self) -> float:
        """(blocks in use + blocks the queued requests need to start) / blocks in the cache."""
        return (self.kv_blocks_used + self.kv_blocks_queued) / self.kv_blocks


def check_router(name: str) -> str:
    if name not in ROUTERS:
        raise InputError(f"--router: unknown '{name}'; allowed: {', '.join(ROUTERS)}")
    return name


def round_robin_split(admitted: np.ndarray, replicas: int) -> np.ndarray:
    """Replica of every request (-1 where ``admitted`` is False): the k-th admitted request goes to k mod R."""
    assignment = np.full(len(admitted), -1, dtype=np.int64)
    order = np.flatnonzero(admitted)
    assignment[order] = np.arange(len(order)) % replicas
    return assignment


class Router:
    """Chooses a replica per request by ``policy`` (see the module docstring); keeps the rotating start."""

    def __init__(self, policy: str, replicas: int) -> None:
        self.policy = check_router(policy)
        self.replicas = replicas
        self.start = 0  # where the search for a tie starts: one past the previous choice

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        """The replica for the next request, given each replica's load now."""
        count = self.replicas
        if self.policy == "round_robin":
            chosen = self.start
        else:
            keys: list[float]
            if self.policy == "least_outstanding":
                keys = [float(load.outstanding) for load in loads]
            else:
                keys = [load.kv_load for load in loads]
            best = min(keys)
            chosen = next(r % count for r in range(self.start, self.start + count) if keys[r % count] == best)
        self.start = (chosen + 1) % count
        return chosen
