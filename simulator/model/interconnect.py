"""Interconnects: how the GPUs of one node reach each other, as data for the collective cost model.

A GPU YAML names its interconnect (``interconnect: nvlink4``) and gives its own per-GPU link
bandwidth (``link_bandwidth_bytes_per_second``, one direction) and the achievable fraction of it
(``efficiency.link``). The interconnect YAML (``configs/interconnects/*.yaml``, user files in
``$MEMWALL_CONFIG_DIR/interconnects/``) adds what the bandwidth does not say:

- ``topology``: ``switch`` (NVSwitch: every GPU reaches any set of peers at its full link
  bandwidth), ``mesh`` (a direct link to each peer, as AMD Infinity Fabric on MI300X: a GPU
  talking to ``n - 1`` of its ``N - 1`` possible peers uses ``(n - 1) / (N - 1)`` of its links)
  or ``bus`` (PCIe through a switch or the host bridge), or ``network``: the NICs between nodes
  (InfiniBand), named by a GPU's ``network`` field, one NIC per GPU at the GPU's
  ``network_bandwidth_bytes_per_second``.
- ``peer_access``: GPUs load and store each other's memory directly (NVLink/NVSwitch, Infinity
  Fabric), which the custom one-shot/two-shot all-reduce kernels of vLLM, SGLang and
  TensorRT-LLM need. Over PCIe vLLM allows them only for two GPUs.
- ``nccl``: NCCL's (RCCL's) own latency model per protocol (LL, LL128, Simple): a base
  latency, a latency per ring step, and the fraction of the bus bandwidth the protocol reaches.
  :mod:`simulator.cost.collectives` takes the fastest protocol, as NCCL's tuner does.
- ``one_shot_latency_seconds`` / ``two_shot_latency_seconds``: the fixed cost of a custom
  all-reduce kernel (launch inside a CUDA graph, the cross-GPU barriers), from published
  kernel benchmarks.

Every number carries its source in the YAML's comments. All quantities are SI (seconds, fractions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.errors import InputError
from simulator.files import is_file
from simulator.model.loader import load_validated, looks_like_path, suggest
from simulator.model.registry import config_files, find_named

NCCL_PROTOCOLS: tuple[str, ...] = ("ll", "ll128", "simple")


class NcclProtocol(BaseModel):
    """One NCCL protocol's latency and bandwidth in NCCL's tuning model (src/graph/tuning.cc)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    base_latency_seconds: float = Field(ge=0.0, le=1e-3)
    """fixed cost of one collective call (NCCL ``baseLat``)"""
    hop_latency_seconds: float = Field(ge=0.0, le=1e-3)
    """cost of one ring step over this link type (NCCL ``hwLat``)"""
    bandwidth_fraction: float = Field(gt=0.0, le=1.0)
    """share of the bus bandwidth the protocol reaches (LL sends a flag with every 8 bytes: 0.5)"""
    bandwidth_cap_bytes_per_second: float | None = Field(default=None, gt=0.0)
    """ceiling on the protocol's bus bandwidth whatever the links (NCCL ``llMaxBw`` for LL), or None"""


class InterconnectSpec(BaseModel):
    """One intra-node interconnect (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    description: str = ""
    topology: Literal["switch", "mesh", "bus", "network"]
    peer_access: bool
    nccl: dict[str, NcclProtocol]
    one_shot_latency_seconds: float = Field(ge=0.0, le=1e-3)
    two_shot_latency_seconds: float = Field(ge=0.0, le=1e-3)

    @field_validator("nccl")
    @classmethod
    def _known_protocols(cls, value: dict[str, NcclProtocol]) -> dict[str, NcclProtocol]:
        unknown = sorted(set(value) - set(NCCL_PROTOCOLS))
        if unknown:
            raise ValueError(f"unknown protocol(s) {', '.join(unknown)}; allowed: {', '.join(NCCL_PROTOCOLS)}")
        if not value:
            raise ValueError(f"at least one protocol is needed ({', '.join(NCCL_PROTOCOLS)})")
        return value


def _load_interconnect_file(path: Path) -> InterconnectSpec:
    return load_validated(InterconnectSpec, path)


def list_interconnects() -> list[InterconnectSpec]:
    """Every interconnect config: $MEMWALL_CONFIG_DIR's first, then the shipped ones."""
    return [_load_interconnect_file(path) for path in config_files("interconnects")]


def load_interconnect(name_or_path: str) -> InterconnectSpec:
    """A shipped interconnect by name or alias (case-insensitive), or an interconnect YAML by path."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not is_file(path, "interconnect"):
            raise InputError(f"interconnect: no such file {name_or_path}")
        return load_validated(InterconnectSpec, path)
    found = find_named("interconnects", name_or_path, _load_interconnect_file, lambda spec: [spec.name, *spec.aliases])
    if found is not None:
        return found
    known = [n for spec in list_interconnects() for n in (spec.name, *spec.aliases)]
    raise InputError(
        f"interconnect: unknown '{name_or_path}'{suggest(name_or_path, known)} (the GPU config's 'interconnect' "
        f"field); known: {', '.join(s.name for s in list_interconnects())}, or a path to an interconnect YAML"
    )
