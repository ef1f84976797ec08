"""KV-cache transfer from a prefill replica to a decode replica (disaggregated serving): pure functions.

Under disaggregation (Splitwise, Patel et al. 2024; DistServe, Zhong et al. 2024; Mooncake, Qin
et al. 2024; vLLM's and SGLang's P/D serving) a request's prompt is prefilled on one replica and its
KV cache moves to another that decodes it. The bytes are the prompt's KV cache,

    bytes = prompt tokens x KV bytes per token (all layers and KV heads; sliding windows applied)

(llama3-70b fp16: 2 x 80 x 8 x 128 x 2 = 327,680 bytes per token, so a 2048-token prompt is
671,088,640 bytes). Each tensor-parallel rank holds its share of the KV heads and sends it over its
own link, rank to rank (vLLM's NIXL connector and Mooncake's transfer engine move each rank's
blocks directly), so ``min(tp_prefill, tp_decode)`` links carry one request at once:

    seconds = latency + bytes / (links x bandwidth per link)

The link is that of pipeline stage hops (:mod:`simulator.cost.pipeline`): when both pools sit in
one node (one GPU type, ``P x tp_prefill + D x tp_decode`` at most the GPUs of a node) the node's
interconnect at the GPU's achievable link bandwidth (``link_bandwidth x efficiency.link``) with
NCCL's Simple-protocol base and hop latency; otherwise RDMA over InfiniBand, one NIC per GPU:
50 GB/s (NDR 400 Gb/s) on NVLink-4/5 systems, 25 GB/s (HDR 200 Gb/s) elsewhere, the slower side's
NIC and efficiency, with NCCL's network hop latency (14 us) on top of the base latency.

The transfer starts when the prefill is done (vLLM's NIXL connector: the decode side pulls the
finished blocks) and does not overlap the prefill's compute: an upper bound for connectors that
send layer by layer while the prefill runs (Mooncake, LMCache).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.cost.pipeline import (
    NET_BYTES_PER_SECOND,
    NET_BYTES_PER_SECOND_DEFAULT,
    NET_HOP_SECONDS,
)
from simulator.errors import InputError
from simulator.model.gpu import GPUSpec
from simulator.model.interconnect import load_interconnect
from simulator.model.step import Number


class KVLink(NamedTuple):
    """The path a request's KV cache takes: ``links`` parallel links of ``bytes_per_second`` each, fixed latency."""

    bytes_per_second: float
    """achievable bandwidth of one link, one direction (bytes/s)"""
    latency_seconds: float
    links: int
    """links carrying one request at once: min(tp_prefill, tp_decode)"""
    across_nodes: bool
    name: str

    def describe(self) -> str:
        where = "across nodes" if self.across_nodes else "within the node"
        return f"{self.name} {where}, {self.links} x {self.bytes_per_second / 1e9:.0f} GB/s"


def _simple(gpu: GPUSpec) -> tuple[float, float]:
    """NCCL's Simple-protocol (base, hop) latency over ``gpu``'s interconnect (seconds)."""
    interconnect = load_interconnect(gpu.interconnect)
    simple = interconnect.nccl.get("simple") or next(iter(interconnect.nccl.values()))
    return simple.base_latency_seconds, simple.hop_latency_seconds


def network_bytes_per_second(gpu: GPUSpec) -> float:
    """A GPU's RDMA NIC bandwidth across nodes (NDR on NVLink-4/5 systems, HDR elsewhere), bytes/s."""
    name = load_interconnect(gpu.interconnect).name
    return NET_BYTES_PER_SECOND.get(name, NET_BYTES_PER_SECOND_DEFAULT)


def kv_link(prefill_gpu: GPUSpec, decode_gpu: GPUSpec, prefill_tp: int, decode_tp: int, gpus: int) -> KVLink:
    """The link between the pools (module docstring); ``gpus``: all GPUs of both pools together."""
    if prefill_tp < 1 or decode_tp < 1:
        raise InputError(f"KV transfer: tensor-parallel degrees must be >= 1 (got {prefill_tp}, {decode_tp})")
    links = min(prefill_tp, decode_tp)
    same = prefill_gpu.name == decode_gpu.name
    if same and gpus <= prefill_gpu.max_gpus_per_node:
        base, hop = _simple(prefill_gpu)
        bandwidth = prefill_gpu.link_bandwidth_bytes_per_second * prefill_gpu.efficiency.link
        return KVLink(bandwidth, base + hop, links, False, prefill_gpu.interconnect)
    base = max(_simple(prefill_gpu)[0], _simple(decode_gpu)[0])
    bandwidth = min(network_bytes_per_second(prefill_gpu) * prefill_gpu.efficiency.link,
                    network_bytes_per_second(decode_gpu) * decode_gpu.efficiency.link)
    return KVLink(bandwidth, base + NET_HOP_SECONDS, links, True, "InfiniBand")


def kv_transfer_seconds(kv_bytes: Number, link: KVLink) -> Number:
    """Seconds to move ``kv_bytes`` of one request's KV cache over ``link``: latency + bytes / (links x bandwidth)."""
    seconds = link.latency_seconds + kv_bytes / (link.links * link.bytes_per_second)
    if isinstance(kv_bytes, np.ndarray):
        return np.where(kv_bytes > 0, seconds, 0.0)
    return seconds if kv_bytes > 0 else 0.0


def queued_transfer_ends(ready: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """When each transfer ends if one sender's transfers go one after another, in order of ``ready``.

    A transfer starts at max(its ready time, the previous transfer's end): end_i = max(r_i, end_{i-1}) + d_i,
    i.e. end_i = S_i + max_{j<=i}(r_j - S_{j-1}) with S the running sum of the durations (``ready`` sorted).
    """
    if not len(ready):
        return np.zeros(0)
    sums = np.cumsum(seconds)
    before = sums - seconds
    return sums + np.maximum.accumulate(ready - before)
