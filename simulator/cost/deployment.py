"""A deployment: a built System with its memory plan, and the check every run makes of --gen against --ctx."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.cost.memory import MemoryPlan
from simulator.cost.system import System
from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.cost.pipeline import PipelineSystem


@dataclass(frozen=True)
class Deployment:
    """A built System with its memory plan; ``auto_tp`` says the TP degree was chosen for the user.

    With ``pp`` > 1 the system is a :class:`~simulator.cost.pipeline.PipelineSystem` and the memory
    plan's per-GPU figures are those of its heaviest stage.
    """

    system: System | PipelineSystem
    memory: MemoryPlan
    auto_tp: bool
    pp: int = 1
    fewest_gpus: int = 0
    """the fewest GPUs that could serve the model with queueing when ``auto_tp`` chose more to hold the whole
    planned batch at once (0: the chosen degree is the fewest that serves it)"""

    @property
    def gpus(self) -> int:
        """GPUs of one copy of the model: tp x pp."""
        return self.system.tp * self.pp

    @property
    def note(self) -> str:
        if not self.auto_tp or self.gpus == 1:
            return ""
        if self.pp > 1:
            return (
                f"does not fit on one node of {self.system.gpu.max_gpus_per_node} {self.system.gpu.name}; using "
                f"tensor parallelism within a node and the fewest pipeline stages that fit: --tp {self.system.tp} --pp {self.pp}"
            )
        if self.fewest_gpus:
            return (
                f"{self.fewest_gpus} {self.system.gpu.name} would serve it with requests queued for KV blocks; using the "
                f"smallest tensor-parallel degree whose KV cache holds all {self.memory.sequences:,} sequences at once: "
                f"--tp {self.system.tp} (give --tp {self.fewest_gpus} for the fewer GPUs)"
            )
        if self.system.dp_attention:  # one GPU was never a candidate: there is nothing to split the sequences over
            return (f"using the smallest tensor-parallel degree of 2 or more (--dp-attention splits the sequences over "
                    f"the GPUs) that fits: --tp {self.system.tp}")
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
