"""Calibration: measure a real device with PyTorch and check the cost model against it.

``simulate calibrate`` times HBM bandwidth, GEMMs, attention and a random-weight
LLaMA-shaped decoder, writes the measured efficiencies as a GPU YAML overlay, and compares
the simulator's predicted step times (shipped and measured efficiencies) with the timed ones.

PyTorch is an optional extra (``pip install -e '.[calibrate]'``) and is imported lazily,
only inside the measuring modules (:mod:`bandwidth`, :mod:`gemm`, :mod:`attention`,
:mod:`endtoend`, :mod:`harness`, :mod:`timing`). Turning saved timings into an overlay
(:mod:`overlay`) and the predicted-vs-measured check (:mod:`check`) need no PyTorch.
"""

from __future__ import annotations

from types import ModuleType

from simulator.errors import InputError

INSTALL_HINT = "pip install -e '.[calibrate]'"


class TorchMissing(InputError):
    """PyTorch is not installed; the message says how to install it."""


def require_torch() -> ModuleType:
    """The ``torch`` module, or TorchMissing with the install command."""
    try:
        import torch
    except ImportError:
        raise TorchMissing(f"simulate calibrate needs PyTorch to measure, and it is not installed: {INSTALL_HINT}") from None
    return torch
