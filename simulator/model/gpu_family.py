"""GPU families: the calibrated efficiency parameters and the error bands are per family of GPUs."""

from __future__ import annotations

import functools

from simulator.errors import InputError
from simulator.model import GPUSpec, load_gpu

# GPU families: the calibrated parameters are per family (GPUSpec.name).
GPU_FAMILIES: dict[str, tuple[str, ...]] = {
    "ampere": ("A100-SXM4-80GB", "A100-SXM4-40GB", "A100-PCIe-80GB", "A30", "A10G", "RTX-3090"),
    "hopper": ("H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB", "H20"),
    "ada": ("L40S", "L4", "RTX-4090"),
    "cdna3": ("MI300X", "MI325X"),
    "cdna4": ("MI355X",),
    "blackwell": ("B200", "B300", "GB200", "GB300"),
    "blackwell-rtx": ("RTX-PRO-6000",),
    "volta": ("V100-SXM2-32GB",),
}

FAMILY_PREDECESSOR: dict[str, str] = {"blackwell": "hopper", "hopper": "ampere", "ada": "ampere", "ampere": "volta",
                                      "cdna4": "cdna3", "blackwell-rtx": "ada"}
"""Each family's previous generation from the same vendor and line (CDNA3 has none in the table; the
Blackwell RTX parts, GB202 with GDDR7 on PCIe, follow Ada's line, not the HBM Blackwell's).

A family with no calibrating row of a kind borrows that ceiling from its predecessor first
(crossval rule 6): a new generation runs the next release of the same kernel libraries (cuBLAS,
CUTLASS, TensorRT-LLM's own), so the fraction of peak they reach moves from one generation to the
next, while a median over every family mixes in GPUs two generations back (Ampere's cp.async GEMMs
beside Blackwell's tcgen05 ones)."""


def family_of(gpu_name: str) -> str | None:
    """The family of a GPU (its config name, or any name/alias/path load_gpu accepts); None if unknown."""
    for family, names in GPU_FAMILIES.items():
        if gpu_name in names:
            return family
    try:
        name = _gpu(gpu_name).name
    except InputError:
        return None
    for family, names in GPU_FAMILIES.items():
        if name in names:
            return family
    return None

@functools.cache
def _gpu(name: str) -> GPUSpec:
    return load_gpu(name)
