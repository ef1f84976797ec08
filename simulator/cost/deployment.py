"""A deployment: a built System with its memory plan, and the check every run makes of --gen against --ctx."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.memory import MemoryPlan
from simulator.cost.system import System
from simulator.errors import InputError


@dataclass(frozen=True)
class Deployment:
    """A built System with its memory plan; ``auto_tp`` says the TP degree was chosen for the user."""

    system: System
    memory: MemoryPlan
    auto_tp: bool

    @property
    def note(self) -> str:
        if not self.auto_tp or self.system.tp == 1:
            return ""
        return (
            f"does not fit on one {self.system.gpu.name}; using the smallest tensor-parallel degree "
            f"that fits: --tp {self.system.tp}"
        )


def check_gen_tokens(gen_tokens: int, context_tokens: int) -> None:
    """``--gen`` output tokens must be >= 1 and leave a prompt within ``--ctx`` tokens."""
    if gen_tokens < 1:
        raise InputError(f"--gen: must be >= 1 (got {gen_tokens})")
    if gen_tokens >= context_tokens:
        raise InputError(
            f"--gen: {gen_tokens} output tokens leave no prompt within --ctx {context_tokens}; "
            f"--gen must be < --ctx"
        )
