"""Collective communication time: alpha-beta models by algorithm, pure functions (no simpy).

Every collective costs a fixed part (alpha: kernel start, synchronisation, one latency per
step of the algorithm) plus the bytes each GPU sends over its links divided by the achievable
bandwidth (beta). ``m`` is the message size in bytes (the whole tensor each GPU holds), ``n``
the GPUs in the group, ``B`` a GPU's achievable link bandwidth in bytes/s (one direction):

- ring all-reduce (NCCL; Patarasuk & Yuan 2009): reduce-scatter then all-gather around a ring,
  2 (n - 1) steps, each GPU sends 2 (n - 1) / n * m bytes:
  ``base + 2 (n - 1) * hop + 2 (n - 1) / n * m / B``.
- tree all-reduce (NCCL's double binary tree, Sanders, Speck & Traeff 2009): a pipelined reduce
  up and broadcast down, ``base + 2 ceil(log2 n) * hop + 2 m / B``. Within one node NCCL's tree
  is a chain and never beats the ring, so the automatic choice uses it only when asked.
- one-shot all-reduce (the custom kernels of vLLM, SGLang and TensorRT-LLM over NVLink/NVSwitch):
  every GPU reads the other n - 1 GPUs' whole buffers and reduces locally,
  ``alpha_1 + (n - 1) * m / B``.
- two-shot all-reduce (the same kernels for larger messages): reduce-scatter then all-gather,
  ``alpha_2 + 2 (n - 1) / n * m / B``.
- all-gather / reduce-scatter (ring, n - 1 steps, ``m`` the gathered tensor / the input):
  ``base + (n - 1) * hop + (n - 1) / n * m / B``.
- all-to-all (expert parallelism; every GPU sends (n - 1) / n of its ``m`` bytes, one message
  to each peer, all at once over a switch): ``base + hop + (n - 1) / n * m / B``.
- point-to-point (pipeline stages, KV transfer): ``base + hop + m / B``.

NCCL picks, for every call, the protocol (LL, LL128, Simple) with the least predicted time from
exactly such a model (``ncclTopoGetAlgoTime`` in src/graph/tuning.cc: latency + bytes / algBw);
:func:`nccl_allreduce_seconds` does the same with the interconnect YAML's figures.

The automatic choice (:func:`allreduce_seconds`, ``algorithm="auto"``) follows vLLM's custom
all-reduce (csrc/custom_all_reduce.cuh, ``CustomAllreduce::allreduce``): used when the engine has
it, the interconnect gives peer access (NVSwitch or a full mesh; the shipped PCIe configs do not,
see configs/interconnects/pcie4.yaml), the group is 2, 4, 6 or 8 GPUs and the message is at most the engine's buffer (8 MiB);
then one-shot when n = 2 or (n <= 4 and m < 512 KiB) or (n <= 8 and m < 256 KiB), else two-shot.
Anything else goes to NCCL. ``off`` makes every collective free, so a pure roofline stays reachable.

A group wider than one node (``max_gpus_per_node``: the GPUs of one NVLink domain, 8 on HGX, 72 on
an NVL72 rack) also crosses the network between nodes (the GPU's ``network``, one NIC per GPU). Its
all-reduce is hierarchical, with ``g`` GPUs per node and ``k`` nodes: a reduce-scatter inside each
node over NVLink, an all-reduce of the ``m / g`` shard across the ``k`` nodes over the NICs (each
GPU on its own NIC, rail-optimised), then an all-gather inside the node again:

    RS_g(m over NVLink) + AR_k(m / g over the network) + AG_g(m over NVLink)

as NCCL splits its own model into intra-node and network steps (src/graph/tuning.cc: latency
``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``; the tree algorithm is an intra-node
chain under an inter-node double binary tree), each phase at its fastest protocol. An all-to-all
across nodes sends ``(g - 1) / (n - 1)`` of its bytes over NVLink and ``(n - g) / (n - 1)`` over the
NIC at the same time, so the slower share sets its time, plus the network's latency. A group wider
than a node whose GPU config names no network is refused (:func:`collective_network`).

Inputs may be numpy arrays (one message size per step): everything is elementwise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simulator.errors import InputError
from simulator.model.engine_profile import EngineProfile
from simulator.model.interconnect import InterconnectSpec
from simulator.model.step import Number

COLLECTIVE_ALGORITHMS: tuple[str, ...] = ("auto", "nccl", "ring", "tree", "one-shot", "two-shot", "off")
"""Values of the ``collectives`` setting (see the module docstring)."""

CUSTOM_ALLREDUCE_GROUPS: tuple[int, ...] = (2, 4, 6, 8)
"""Group sizes vLLM's custom all-reduce supports (custom_all_reduce.py ``_SUPPORTED_WORLD_SIZES``)."""

ONE_SHOT_BELOW_BYTES_4 = 512 * 1024
"""vLLM: one-shot for groups of up to 4 GPUs below 512 KiB (custom_all_reduce.cuh)."""
ONE_SHOT_BELOW_BYTES_8 = 256 * 1024
"""vLLM: one-shot for groups of up to 8 GPUs below 256 KiB (custom_all_reduce.cuh)."""


class Protocol(NamedTuple):
    """One NCCL protocol, resolved for a group: base latency (s), per-step latency (s), bandwidth (bytes/s)."""

    base_seconds: float
    hop_seconds: float
    bytes_per_second: float


class NetworkPath(NamedTuple):
    """The inter-node part of a group wider than a node: the network's name, NIC rate and protocols."""

    name: str
    bytes_per_second: float
    """a GPU's achievable NIC bandwidth (one direction): network_bandwidth x efficiency.link"""
    protocols: tuple[Protocol, ...]


class CollectiveNetwork(NamedTuple):
    """Everything a collective of one tensor-parallel group costs, worked out once (see :func:`collective_network`)."""

    gpus: int
    bytes_per_second: float
    """a GPU's achievable link bandwidth towards the group (one direction)"""
    protocols: tuple[Protocol, ...]
    one_shot_seconds: float
    two_shot_seconds: float
    custom: bool
    """the engine's custom all-reduce can run on this group"""
    custom_max_bytes: float
    algorithm: str
    latency_override_seconds: float | None = None
    """when set, replaces every algorithm's fixed part (efficiency.allreduce_latency_seconds)"""
    node_gpus: int = 0
    """GPUs per node when the group spans nodes (``protocols`` and ``bytes_per_second`` are then the
    node's NVLink); 0: the whole group is inside one node"""
    network: NetworkPath | None = None
    """the network between the nodes of a group wider than a node; None inside one node"""


def group_bandwidth(link_bytes_per_second: float, link_efficiency: float, topology: str, gpus: int,
                    gpus_per_node: int) -> float:
    """A GPU's achievable bandwidth to the rest of a group of ``gpus`` (bytes/s, one direction).

    Over a switch or a bus a GPU drives its whole link whoever the peers are. In a full mesh
    (MI300X Infinity Fabric: one link to each of the ``gpus_per_node - 1`` others) a group of
    ``gpus`` uses ``gpus - 1`` of those links.
    """
    achievable = link_bytes_per_second * link_efficiency
    if topology == "mesh" and gpus_per_node > 1:
        return achievable * min(gpus - 1, gpus_per_node - 1) / (gpus_per_node - 1)
    return achievable


def ring_allreduce_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                           base_seconds: float, hop_seconds: float) -> Number:
    """``base + 2 (n - 1) hop + 2 (n - 1) / n * m / B`` (0 for one GPU or an empty message)."""
    if gpus < 2:
        return 0.0 * message_bytes
    steps = 2 * (gpus - 1)
    seconds = base_seconds + steps * hop_seconds + steps / gpus * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def tree_allreduce_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                           base_seconds: float, hop_seconds: float) -> Number:
    """``base + 2 ceil(log2 n) hop + 2 m / B``: pipelined double binary tree."""
    if gpus < 2:
        return 0.0 * message_bytes
    depth = math.ceil(math.log2(gpus))
    seconds = base_seconds + 2 * depth * hop_seconds + 2.0 * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def one_shot_allreduce_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                               latency_seconds: float) -> Number:
    """``alpha_1 + (n - 1) m / B``: every GPU reads every peer's whole buffer."""
    if gpus < 2:
        return 0.0 * message_bytes
    seconds = latency_seconds + (gpus - 1) * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def two_shot_allreduce_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                               latency_seconds: float) -> Number:
    """``alpha_2 + 2 (n - 1) / n * m / B``: reduce-scatter, then all-gather, through peer memory."""
    if gpus < 2:
        return 0.0 * message_bytes
    seconds = latency_seconds + 2.0 * (gpus - 1) / gpus * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def all_gather_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                       base_seconds: float, hop_seconds: float) -> Number:
    """Ring all-gather of an ``m``-byte result: ``base + (n - 1) hop + (n - 1) / n * m / B``."""
    if gpus < 2:
        return 0.0 * message_bytes
    seconds = base_seconds + (gpus - 1) * hop_seconds + (gpus - 1) / gpus * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def reduce_scatter_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                           base_seconds: float, hop_seconds: float) -> Number:
    """Ring reduce-scatter of an ``m``-byte input: the same traffic and steps as an all-gather."""
    return all_gather_seconds(message_bytes, gpus, bytes_per_second, base_seconds, hop_seconds)


def all_to_all_seconds(message_bytes: Number, gpus: int, bytes_per_second: float,
                       base_seconds: float, hop_seconds: float) -> Number:
    """``base + hop + (n - 1) / n * m / B``: each GPU sends a share of its ``m`` bytes to every peer at once."""
    if gpus < 2:
        return 0.0 * message_bytes
    seconds = base_seconds + hop_seconds + (gpus - 1) / gpus * message_bytes / bytes_per_second
    return _only_if_sent(message_bytes, seconds)


def point_to_point_seconds(message_bytes: Number, bytes_per_second: float,
                           base_seconds: float, hop_seconds: float) -> Number:
    """``base + hop + m / B``: one GPU sends ``m`` bytes to another."""
    return _only_if_sent(message_bytes, base_seconds + hop_seconds + message_bytes / bytes_per_second)


def _only_if_sent(message_bytes: Number, seconds: Number) -> Number:
    """No message, no collective: a step without tokens launches none."""
    if isinstance(message_bytes, np.ndarray) or isinstance(seconds, np.ndarray):
        return np.where(message_bytes > 0, seconds, 0.0)
    return seconds if message_bytes > 0 else 0.0


def nccl_allreduce_seconds(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """NCCL's ring all-reduce with its fastest protocol for the message (as NCCL's tuner picks)."""
    gpus = net.gpus
    if not isinstance(message_bytes, np.ndarray):
        # The engine's hot path: the same formula as ring_allreduce_seconds, without array checks.
        if gpus < 2 or message_bytes <= 0:
            return 0.0
        steps = 2 * (gpus - 1)
        sent = steps / gpus * message_bytes
        return min(p.base_seconds + steps * p.hop_seconds + sent / p.bytes_per_second for p in net.protocols)
    times = [ring_allreduce_seconds(message_bytes, gpus, protocol.bytes_per_second, protocol.base_seconds,
                                    protocol.hop_seconds) for protocol in net.protocols]
    return np.minimum.reduce(np.asarray(times))  # one row per protocol: what reduce would build from the list


def one_shot_wins(message_bytes: Number, gpus: int) -> Number:
    """vLLM's choice between its kernels: one-shot (True) or two-shot (False) for this message."""
    if gpus == 2:
        return message_bytes >= 0
    if gpus <= 4:
        return message_bytes < ONE_SHOT_BELOW_BYTES_4
    return message_bytes < ONE_SHOT_BELOW_BYTES_8


def allreduce_seconds(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """Seconds of one all-reduce of ``message_bytes`` per GPU over the group, by ``net.algorithm``."""
    algorithm = net.algorithm
    if algorithm == "off" or net.gpus < 2:
        return 0.0 * message_bytes
    if net.network is not None:
        return hierarchical_allreduce_seconds(message_bytes, net)
    if net.latency_override_seconds is not None:
        return _with_fixed_latency(message_bytes, net)
    if algorithm in ("nccl", "ring"):
        return nccl_allreduce_seconds(message_bytes, net)
    bandwidth = net.bytes_per_second
    if algorithm == "tree":
        simple = net.protocols[-1]
        return tree_allreduce_seconds(message_bytes, net.gpus, simple.bytes_per_second,
                                      simple.base_seconds, simple.hop_seconds)
    one_shot = one_shot_allreduce_seconds(message_bytes, net.gpus, bandwidth, net.one_shot_seconds)
    two_shot = two_shot_allreduce_seconds(message_bytes, net.gpus, bandwidth, net.two_shot_seconds)
    if algorithm == "one-shot":
        return one_shot
    if algorithm == "two-shot":
        return two_shot
    # auto: the engine's policy (module docstring).
    nccl = nccl_allreduce_seconds(message_bytes, net)
    if not net.custom:
        return nccl
    custom = _where(one_shot_wins(message_bytes, net.gpus), one_shot, two_shot)
    return _where(message_bytes <= net.custom_max_bytes, custom, nccl)


def _fastest(times: list[Number]) -> Number:
    """The least of several protocols' times (as NCCL's tuner picks), elementwise for arrays."""
    if any(isinstance(t, np.ndarray) for t in times):
        return np.minimum.reduce(np.broadcast_arrays(*times))
    return min(times)


def _phase(kind: str, message_bytes: Number, gpus: int, protocols: tuple[Protocol, ...],
           latency_override_seconds: float | None) -> Number:
    """One phase of a hierarchical all-reduce at its fastest protocol (a fixed latency replaces base + hops)."""
    form = {"ring": ring_allreduce_seconds, "tree": tree_allreduce_seconds, "gather": all_gather_seconds}[kind]
    if latency_override_seconds is not None:
        simple = protocols[-1]
        return form(message_bytes, gpus, simple.bytes_per_second, latency_override_seconds, 0.0)
    return _fastest([form(message_bytes, gpus, p.bytes_per_second, p.base_seconds, p.hop_seconds)
                     for p in protocols])


def hierarchical_allreduce_seconds(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """All-reduce of a group over ``k`` nodes of ``g`` GPUs (module docstring):
    ``RS_g(m) + AR_k(m / g) + AG_g(m)``, the middle one over the network (tree when ``algorithm`` is tree)."""
    network = net.network
    assert network is not None and net.node_gpus >= 1
    gpus_per_node = net.node_gpus
    nodes = net.gpus // gpus_per_node
    override = net.latency_override_seconds
    inside = _phase("gather", message_bytes, gpus_per_node, net.protocols, override)
    across = _phase("tree" if net.algorithm == "tree" else "ring", message_bytes / gpus_per_node, nodes,
                    network.protocols, override)
    return 2.0 * inside + across  # reduce-scatter and all-gather cost the same (ring, n - 1 steps each)


def gather_phase_seconds(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """One all-gather (or reduce-scatter) of an ``m``-byte result (or input) over the group: NCCL's ring at its
    fastest protocol, ``(n - 1) / n * m`` through each GPU's link. Across nodes, half the hierarchical
    all-reduce, which is a reduce-scatter and an all-gather of the same cost."""
    if net.algorithm == "off" or net.gpus < 2:
        return 0.0 * message_bytes
    if net.network is not None:
        return 0.5 * hierarchical_allreduce_seconds(message_bytes, net)
    return _phase("gather", message_bytes, net.gpus, net.protocols, net.latency_override_seconds)


def all_to_all_group_seconds(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """One all-to-all (expert-parallel dispatch or combine) of ``message_bytes`` per GPU over the group.

    Inside a node: NCCL's grouped sends, one step over the Simple protocol, ``base + hop + m / B``
    (``m``: what the busiest GPU sends to the others). Across nodes: ``(g - 1) / (n - 1)`` of ``m`` over
    NVLink and ``(n - g) / (n - 1)`` over the NIC at once, plus the network's base and hop latency.
    """
    if net.algorithm == "off" or net.gpus < 2:
        return 0.0 * message_bytes
    simple = net.protocols[-1]
    network = net.network
    if network is None:
        return point_to_point_seconds(message_bytes, net.bytes_per_second, simple.base_seconds, simple.hop_seconds)
    others = net.gpus - 1
    inside = (net.node_gpus - 1) / others * message_bytes / net.bytes_per_second
    across = (net.gpus - net.node_gpus) / others * message_bytes / network.bytes_per_second
    wire = network.protocols[-1]
    return _only_if_sent(message_bytes, wire.base_seconds + wire.hop_seconds + np.maximum(inside, across))


def collective_path(interconnect: str, network: str | None, gpus: int, gpus_per_node: int) -> str:
    """What a group of ``gpus`` talks over, for reports: ``nvlink4`` or ``nvlink4 + infiniband``."""
    if gpus > gpus_per_node and network:
        return f"{interconnect} + {network}"
    return interconnect


def _with_fixed_latency(message_bytes: Number, net: CollectiveNetwork) -> Number:
    """A user-fixed latency replaces the algorithm's fixed part; the bytes still cost the algorithm's traffic."""
    latency = net.latency_override_seconds
    assert latency is not None
    gpus, bandwidth = net.gpus, net.bytes_per_second
    if net.algorithm == "one-shot":
        traffic = (gpus - 1) * message_bytes
    elif net.algorithm == "tree":
        traffic = 2.0 * message_bytes
    else:
        traffic = 2.0 * (gpus - 1) / gpus * message_bytes
    return _only_if_sent(message_bytes, latency + traffic / bandwidth)


def _where(condition: Number, a: Number, b: Number) -> Number:
    if isinstance(condition, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(condition, a, b)
    return a if condition else b


def check_algorithm(algorithm: str) -> str:
    """``algorithm`` if it is one of :data:`COLLECTIVE_ALGORITHMS`, else InputError."""
    if algorithm not in COLLECTIVE_ALGORITHMS:
        raise InputError(f"--collectives: unknown '{algorithm}'; allowed: {', '.join(COLLECTIVE_ALGORITHMS)}")
    return algorithm


def _protocols(spec: InterconnectSpec, bandwidth: float) -> tuple[Protocol, ...]:
    """NCCL's protocols over ``spec`` at a GPU's achievable ``bandwidth`` (bytes/s), Simple last."""
    protocols = []
    for name in ("ll", "ll128", "simple"):  # Simple last: the tree and fixed-latency forms use it
        protocol = spec.nccl.get(name)
        if protocol is None:
            continue
        protocol_bandwidth = bandwidth * protocol.bandwidth_fraction
        if protocol.bandwidth_cap_bytes_per_second is not None:
            # NCCL caps the bus bandwidth; the ring moves 2 (n - 1) / n of the message per bus byte.
            protocol_bandwidth = min(protocol_bandwidth, protocol.bandwidth_cap_bytes_per_second)
        protocols.append(Protocol(protocol.base_latency_seconds, protocol.hop_latency_seconds, protocol_bandwidth))
    return tuple(protocols)


def collective_network(
    gpus: int,
    link_bytes_per_second: float,
    link_efficiency: float,
    gpus_per_node: int,
    interconnect: InterconnectSpec,
    engine: EngineProfile,
    algorithm: str = "auto",
    latency_override_seconds: float | None = None,
    network: InterconnectSpec | None = None,
    network_bytes_per_second: float | None = None,
    gpu_name: str = "GPU",
) -> CollectiveNetwork:
    """Resolve an interconnect and an engine profile into the numbers of one group of ``gpus`` GPUs.

    A group wider than ``gpus_per_node`` spans nodes joined by ``network`` (one NIC of
    ``network_bytes_per_second`` per GPU); without one it is refused with an InputError.
    """
    check_algorithm(algorithm)
    if gpus <= gpus_per_node:
        bandwidth = group_bandwidth(link_bytes_per_second, link_efficiency, interconnect.topology, gpus, gpus_per_node)
        custom = engine.allreduce == "custom" and interconnect.peer_access and gpus in CUSTOM_ALLREDUCE_GROUPS
        return CollectiveNetwork(
            gpus=gpus,
            bytes_per_second=bandwidth,
            protocols=_protocols(interconnect, bandwidth),
            one_shot_seconds=interconnect.one_shot_latency_seconds,
            two_shot_seconds=interconnect.two_shot_latency_seconds,
            custom=custom,
            custom_max_bytes=engine.custom_allreduce_max_bytes,
            algorithm=algorithm,
            latency_override_seconds=latency_override_seconds,
        )
    nodes = -(-gpus // gpus_per_node)
    where = f"a group of {gpus} GPUs spans {nodes} nodes of {gpus_per_node} {gpu_name}"
    if network is None or network_bytes_per_second is None:
        raise InputError(f"{where}, but the GPU config names no network between nodes (fields network and "
                         f"network_bandwidth_bytes_per_second); use --tp/--ep of at most {gpus_per_node}")
    if gpus % gpus_per_node:
        raise InputError(f"{where} unevenly; use a multiple of {gpus_per_node} GPUs (or at most {gpus_per_node})")
    if algorithm in ("one-shot", "two-shot"):
        raise InputError(f"--collectives {algorithm}: the custom all-reduce needs peer access between all GPUs, "
                         f"and {where}; use auto, nccl, ring or tree")
    # Inside a node every GPU of the group is a peer (the node is full: gpus is a multiple of it).
    bandwidth = group_bandwidth(link_bytes_per_second, link_efficiency, interconnect.topology, gpus_per_node,
                                gpus_per_node)
    nic = network_bytes_per_second * link_efficiency
    return CollectiveNetwork(
        gpus=gpus,
        bytes_per_second=bandwidth,
        protocols=_protocols(interconnect, bandwidth),
        one_shot_seconds=interconnect.one_shot_latency_seconds,
        two_shot_seconds=interconnect.two_shot_latency_seconds,
        custom=False,
        custom_max_bytes=engine.custom_allreduce_max_bytes,
        algorithm=algorithm,
        latency_override_seconds=latency_override_seconds,
        node_gpus=gpus_per_node,
        network=NetworkPath(network.name, nic, _protocols(network, nic)),
    )
