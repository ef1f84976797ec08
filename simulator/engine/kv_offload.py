"""A KV offload tier: prefix blocks evicted from GPU memory kept in CPU DRAM or on local NVMe, loaded back on a hit.

What is modelled, as vLLM's KV offloading connector (``--kv-transfer-config`` ``OffloadingConnector``,
CPU backend), LMCache (CPU and local-disk backends) and SGLang's HiCache (host-memory tier of its
radix cache) do it:

- Store on eviction: when the GPU prefix cache evicts a prefix, its blocks are copied to the tier
  (least recently used out when the tier is full). The copy runs on a copy stream beside compute and
  is not charged (the engines issue it asynchronously; its bytes are counted).
- Load on hit: a request whose prefix is not on the GPU but is in the tier takes GPU blocks for it as
  for a miss, skips its prefill, and its blocks are copied back: ``bytes / bandwidth`` seconds, where
  bytes are the blocks' KV bytes per GPU and bandwidth the GPU's host link (each GPU of the tensor-
  parallel group loads its own share over its own link, at the same time).
- Overlap: the load is overlapped with the iteration's compute layer by layer (LMCache's layerwise
  pipelined retrieval, SGLang HiCache's layer-wise load-back overlapping the forward pass), so an
  iteration that loads lasts ``max(compute, load)`` seconds, not their sum.

Bandwidths (bytes/s, one direction, per GPU), unless given (``cpu:SIZE_GIB:GBPS``):
``cpu``: the GPU's host link, its config's ``host_link_bytes_per_second`` (PCIe Gen5 x16 64e9 on H100,
H200, B200, MI300X and later; PCIe Gen4 x16 32e9 on A100, L40S and older; NVLink-C2C 450e9 on Grace
systems, GB200 and GB300: 900 GB/s both directions, NVIDIA GB200 datasheet).
``nvme``: 7e9 (one PCIe Gen4 x4 data-centre drive per GPU, e.g. Samsung PM9A3: 6.9 GB/s sequential read).
Capacity ``SIZE_GIB`` is per replica (all GPUs of its tensor-parallel group together).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from simulator.errors import InputError
from simulator.model.gpu import GPUSpec

GIB = 2**30

TIERS = ("cpu", "nvme")

NVME_BYTES_PER_SECOND = 7e9


@dataclass(frozen=True)
class OffloadSpec:
    """``--kv-offload KIND:SIZE_GIB[:GBPS]``: the tier's kind, capacity per replica (bytes) and bandwidth (bytes/s, None: default)."""

    kind: str
    capacity_bytes: float
    bandwidth_bytes_per_second: float | None = None


def parse_offload(text: str) -> OffloadSpec:
    """``cpu:64``, ``nvme:1024``, ``cpu:64:25`` (25 GB/s) -> :class:`OffloadSpec`; InputError otherwise."""
    parts = str(text).strip().split(":")
    allowed = "give cpu:SIZE_GIB or nvme:SIZE_GIB, optionally :GBPS (e.g. cpu:256, nvme:2048, cpu:256:50)"
    if len(parts) not in (2, 3) or parts[0].lower() not in TIERS:
        raise InputError(f"--kv-offload: cannot read {text!r}; {allowed}")
    try:
        size = float(parts[1])
        rate = float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise InputError(f"--kv-offload: cannot read {text!r}; {allowed}") from None
    if not 0 < size < 2**40:
        raise InputError(f"--kv-offload: size {parts[1]} GiB must be > 0 and finite; {allowed}")
    if rate is not None and not 0 < rate < 1e6:
        raise InputError(f"--kv-offload: bandwidth {parts[2]} GB/s must be > 0 and finite; {allowed}")
    return OffloadSpec(parts[0].lower(), size * GIB, None if rate is None else rate * 1e9)


def tier_bytes_per_second(gpu: GPUSpec, kind: str) -> float:
    """The default bandwidth of ``kind``'s tier for a GPU of type ``gpu`` (module docstring), bytes/s per GPU."""
    return NVME_BYTES_PER_SECOND if kind == "nvme" else gpu.host_link_bytes_per_second


@dataclass
class TierStats:
    """Counters of one tier: prefix hits served from it, blocks stored and loaded, load seconds, and the seconds
    loads added to iterations beyond their compute (what the overlap did not hide)."""

    kind: str
    hits: int = 0
    stored_blocks: int = 0
    loaded_blocks: int = 0
    load_seconds: float = 0.0
    exposed_seconds: float = 0.0
    evictions: int = 0

    def add(self, other: TierStats) -> None:
        self.hits += other.hits
        self.stored_blocks += other.stored_blocks
        self.loaded_blocks += other.loaded_blocks
        self.load_seconds += other.load_seconds
        self.exposed_seconds += other.exposed_seconds
        self.evictions += other.evictions

    def as_dict(self) -> dict:
        return {"tier": self.kind, "hits": self.hits, "stored_blocks": self.stored_blocks,
                "loaded_blocks": self.loaded_blocks, "load_seconds": self.load_seconds,
                "exposed_seconds": self.exposed_seconds, "evictions": self.evictions}


class OffloadTier:
    """Prefixes held in the tier (id -> blocks), least recently used first; capacity in blocks."""

    def __init__(self, kind: str, capacity_blocks: int, bytes_per_block_per_gpu: float,
                 bandwidth_bytes_per_second: float) -> None:
        self.kind = kind
        self.capacity_blocks = capacity_blocks
        self.bytes_per_block = bytes_per_block_per_gpu
        self.bandwidth = bandwidth_bytes_per_second
        self.held: OrderedDict[int, int] = OrderedDict()
        self.used = 0
        self.stats = TierStats(kind)

    def load_seconds(self, blocks: int) -> float:
        """Seconds to copy ``blocks`` blocks back to the GPU: their KV bytes per GPU over the link's bytes/s."""
        return blocks * self.bytes_per_block / self.bandwidth

    def store(self, prefix: int, blocks: int) -> None:
        """The GPU evicted ``prefix`` (``blocks`` blocks): keep a copy (a longer one replaces a shorter), LRU out."""
        if blocks <= 0 or blocks > self.capacity_blocks:
            return
        old = self.held.pop(prefix, 0)
        self.used -= old
        self.stats.stored_blocks += max(0, blocks - old)
        self.held[prefix] = max(blocks, old)
        self.used += self.held[prefix]
        while self.used > self.capacity_blocks:
            _, gone = self.held.popitem(last=False)
            self.used -= gone
            self.stats.evictions += 1

    def peek(self, prefix: int, blocks: int) -> int:
        """Blocks of ``prefix`` (of ``blocks`` wanted) the tier could load."""
        return min(self.held.get(prefix, 0), blocks)

    def load(self, prefix: int, blocks: int) -> tuple[int, float]:
        """Load ``blocks`` of ``prefix`` (at most what it holds): (blocks loaded, seconds). The copy stays (LRU: now newest)."""
        loaded = self.peek(prefix, blocks)
        if not loaded:
            return 0, 0.0
        self.held.move_to_end(prefix)
        seconds = self.load_seconds(loaded)
        self.stats.hits += 1
        self.stats.loaded_blocks += loaded
        self.stats.load_seconds += seconds
        return loaded, seconds


def offload_tier(spec: OffloadSpec | None, gpu: GPUSpec, bytes_per_block_per_gpu: float, tp: int) -> OffloadTier | None:
    """The tier ``spec`` describes for a replica of ``tp`` GPUs whose blocks take ``bytes_per_block_per_gpu`` each."""
    if spec is None:
        return None
    capacity = int(spec.capacity_bytes // (bytes_per_block_per_gpu * tp))
    bandwidth = spec.bandwidth_bytes_per_second or tier_bytes_per_second(gpu, spec.kind)
    return OffloadTier(spec.kind, capacity, bytes_per_block_per_gpu, bandwidth)
