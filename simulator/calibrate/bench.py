"""What every measuring module needs: torch, the device, the timer, the budget, the skip list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.calibrate.plan import Budget
from simulator.calibrate.timing import Timer

TORCH_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "float8_e4m3fn"}


@dataclass
class Bench:
    """A device to measure on. ``cache_bytes`` is the last-level cache the cases must not fit in (0 on CPU)."""

    torch: Any
    device: str
    timer: Timer
    budget: Budget
    cache_bytes: float = 0.0
    log: Callable[[str], None] = lambda line: None
    skipped: list[dict[str, str]] = field(default_factory=list)

    def dtype(self, name: str) -> Any:
        """The torch dtype of a simulator dtype name ('fp16', 'bf16', 'fp8', 'fp32')."""
        return getattr(self.torch, TORCH_DTYPE_NAMES[name])

    def skip(self, section: str, case: str, reason: str) -> None:
        self.skipped.append({"section": section, "case": case, "reason": reason})

    def out_of_time(self, section: str, case: str) -> bool:
        """True (and the case listed as skipped) once the run's time budget is spent."""
        if self.budget.expired():
            self.skip(section, case, f"time budget of {self.budget.seconds:.0f} s spent")
            return True
        return False

    def time_case(self, section: str, case: str, fn: Callable[[], Any]) -> float | None:
        """Seconds per call of ``fn``, or None with the case listed as skipped and its error.

        A failing case must not cost the others: a GPU run cannot be repeated at will.
        """
        try:
            return self.timer(fn)
        except Exception as exc:
            self.failed(section, case, exc)
            return None

    def failed(self, section: str, case: str, exc: BaseException) -> None:
        """List a case that raised, and leave the device usable for the next one."""
        self.skip(section, case, f"{type(exc).__name__}: {str(exc)[:200]}")
        try:
            self.synchronize()
            self.release()
        except Exception:  # a broken context fails the next case too, which is listed in turn
            pass

    def random(self, *shape: int, dtype: str) -> Any:
        """Normal random values (never zeros: some kernels run faster on them)."""
        torch = self.torch
        if dtype == "fp8":
            return torch.randn(*shape, device=self.device, dtype=torch.float16).to(self.dtype("fp8"))
        return torch.randn(*shape, device=self.device, dtype=self.dtype(dtype))

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def release(self) -> None:
        """Return freed device memory to the driver between cases that allocate a lot."""
        if self.device == "cuda":
            self.torch.cuda.empty_cache()
