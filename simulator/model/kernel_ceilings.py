"""The roofline's GEMM parameters fitted on measured kernels, not on end-to-end runs (issue 33, item 4).

``configs/gpus/*.yaml`` carry ceilings fitted on the end-to-end validation table (``simulate validate``):
they hold, besides the GEMMs' own speed, every cost the time model misses. ``validation/kernel_ceilings.json``
holds the same parameters fitted on NVIDIA AIConfigurator's measured GEMM tables alone
(``python -m validation.kernels.gemm_accuracy --write-ceilings``; method and figures in
docs/kernel-accuracy.md): per GPU config, its own tables' fit, else its family's, else the fit pooled over
every tabled GPU. ``--ceilings kernels`` runs with them, so a run says what the kernels alone take and the
end-to-end validation tests everything else.

What is taken from the file: ``compute`` and ``memory`` (fractions of the data-sheet peak and bandwidth),
``memory_latency_seconds`` and ``overlap`` (:class:`~simulator.model.gpu.Efficiency`). The fitted fixed cost
per fp8 GEMM (``floor_seconds``: the activation-quantisation kernels of a per-tensor fp8 ``Linear``) is in the
file but not charged: the layer builder has no such operator yet, so small fp8 GEMMs stay faster than measured.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from simulator.errors import InputError
from simulator.model.gpu import GPUSpec
from simulator.model.registry import validation_file

CEILINGS = "kernels"
"""``--ceilings`` value that selects this file's parameters."""
END_TO_END = "end-to-end"
"""``--ceilings`` value that keeps the GPU config's own (fitted end to end); the default."""
CEILING_SOURCES = (END_TO_END, CEILINGS)

TAKEN = ("compute", "memory", "memory_latency_seconds", "overlap")
"""The :class:`~simulator.model.gpu.Efficiency` fields the file sets."""


def ceilings_file() -> Path:
    """The shipped file of kernel-fitted parameters."""
    return validation_file("kernel_ceilings.json")


@functools.cache
def _document() -> dict:
    path = ceilings_file()
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: missing; it ships with memwall (python -m validation.kernels.gemm_accuracy "
                         "--write-ceilings writes it)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    gpus = document.get("gpus") if isinstance(document, dict) else None
    if not isinstance(gpus, dict):
        raise InputError(f"{path}: expected an object with a 'gpus' object (GPU name -> parameters)")
    return document


def kernel_fitted(gpu: GPUSpec) -> dict[str, float | str]:
    """The file's entry for ``gpu`` (by its config name): the :data:`TAKEN` fields and ``source``."""
    document = _document()
    entry = document["gpus"].get(gpu.name)
    if entry is None:
        known = ", ".join(sorted(document["gpus"]))
        raise InputError(f"--ceilings kernels: no kernel-fitted parameters for GPU {gpu.name!r} in {ceilings_file()} "
                         f"(it has: {known}); use --ceilings end-to-end, or set --compute-efficiency and "
                         "--memory-efficiency yourself")
    try:
        values: dict[str, float | str] = {key: float(entry[key]) for key in TAKEN}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{ceilings_file()}: GPU {gpu.name!r}: expected numbers for {', '.join(TAKEN)} ({exc})") from None
    values["source"] = str(entry.get("source", ""))
    return values


def with_ceilings(gpu: GPUSpec, source: str | None) -> GPUSpec:
    """``gpu`` with the ceilings of ``source`` (:data:`CEILING_SOURCES`; None: end to end, the config's own)."""
    if source in (None, END_TO_END):
        return gpu
    if source != CEILINGS:
        raise InputError(f"--ceilings: expected one of {', '.join(CEILING_SOURCES)} (got {source!r})")
    fitted = kernel_fitted(gpu)
    changed = gpu.with_efficiency(**{key: float(fitted[key]) for key in TAKEN})
    efficiency = changed.efficiency.model_copy(update={"fitted_on": f"kernels ({fitted['source']})"})
    return changed.model_copy(update={"efficiency": efficiency})
