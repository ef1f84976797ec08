"""What the host-launch derivations share: an engine profile with a trial launch cost, and the bisection.

``tgi_host_launch.py`` and ``sglang_host_launch.py`` each replay a source's timings through the
simulator with the engine's profile at a trial ``graphs.eager_launch_seconds`` and solve for the
value that reproduces them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[2]


def profile_with_launch(folder: Path, engine: str, launch_seconds: float) -> str:
    """Path of a copy of ``configs/engines/<engine>.yaml`` whose host time per launch is ``launch_seconds``."""
    profile = yaml.safe_load(open(ROOT / "configs" / "engines" / f"{engine}.yaml"))
    profile["graphs"]["eager_launch_seconds"] = launch_seconds
    profile.update(name=f"{engine}-derivation", aliases=[])
    path = folder / f"{engine}-{launch_seconds:.9f}.yaml"
    yaml.safe_dump(profile, open(path, "w"))
    return str(path)


def solve_launch(seconds_at: Callable[[float], float], measured: float, high: float = 200e-6) -> float:
    """Host seconds per launch in [0, ``high``] at which ``seconds_at`` gives ``measured`` (bisection; it grows with it)."""
    low = 0.0
    for _ in range(20):
        middle = (low + high) / 2
        if seconds_at(middle) < measured:
            low = middle
        else:
            high = middle
    return (low + high) / 2
