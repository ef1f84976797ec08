"""GPU specifications: peaks, memory, interconnect and the achievable-efficiency factors.

A GPU YAML (``configs/gpus/*.yaml``) holds the vendor data-sheet figures (dense, no
sparsity) with their source in a comment, and an ``efficiency`` block. Roofline time is
a lower bound; each efficiency factor is the fraction of a peak that real kernels reach:

- ``compute``: fraction of tensor-core peak reached by GEMMs and attention (default 0.70;
  large fp16 GEMMs reach ~70-85% on A100/H100, TensorRT-LLM prefill of Llama-2-7B reaches 67%).
- ``memory``: fraction of HBM bandwidth reached by streaming reads (default 0.80; large
  reads reach ~80-92%, batch-1 decode in TensorRT-LLM ~66-82%).
- ``link``: fraction of the interconnect bandwidth that a ring all-reduce reaches
  (default 0.75; NCCL bus bandwidth is ~70-85% of NVLink peak for large messages).
- ``kernel_launch_seconds``: GPU-side cost per kernel replayed from a CUDA graph (default 2 us:
  the graph's per-node launch gap, ~0.5 us on V100 in NVIDIA's "Getting Started with CUDA Graphs"
  blog, 2019, plus the ramp-up and tail of a short kernel's waves). Outside a graph the host's
  launch cost applies too (the engine profile's ``graphs.eager_launch_seconds``).
- ``allreduce_latency_seconds``: None (default) lets the collective model charge each algorithm's
  own fixed costs (interconnect YAML: NCCL's tuning-model latencies, custom all-reduce kernels;
  simulator/cost/collectives.py); a number replaces them with one fixed cost per all-reduce.
- ``memory_latency_seconds``: DRAM latency a kernel pays before its stream reaches full rate
  (default 0.5 us: pointer-chasing HBM latency on A100/H100 is ~0.45-0.6 us, Chips and Cheese
  2023; Luo et al. 2024); used by the shape-aware kernel model (simulator/cost/kernels.py).
- ``attention_compute``: fraction of tensor peak FlashAttention prefill reaches under the
  shape-aware model (default 0.70: FlashAttention-2 50-73% of A100 peak, Dao 2023;
  FlashAttention-3 75% of H100 fp16 peak, Shah et al. 2024).
- ``expert``: fraction of the compute and memory factors that the routed experts' grouped GEMMs
  of a mixture-of-experts layer reach (default 1: as dense GEMMs). Fused-MoE kernels run a few rows
  per expert behind a gather of the routed tokens, and how close they come to a dense kernel depends
  on the kernel: one B200 deployment of Llama 4 Scout decodes at 7.60 or 12.84 ms per token with
  two MoE kernels (flashinfer-ai/flashinfer issue 1734). ``simulate validate`` fits it on the MoE
  rows of the table, leave one source out (simulator/validation/crossval.py).
- ``overlap``: fraction of the shorter of a kernel's real MMA time (no tile padding) and its memory
  time that hides under the longer, under the shape-aware model (default 0: the kernel takes the
  roofline's max plus that shorter time; the flat model keeps the plain roofline, max). A tiled GEMM overlaps its loads with its MMAs only while
  an SM holds enough independent warps to cover the load latency; the one or two large tiles per
  SM of a weight-streaming GEMM leave too few, and then memory and compute periods run one after
  the other (Hong and Kim, ISCA 2009, the MWP/CWP model; the non-overlapping transfers of the
  Execution-Cache-Memory model, Hager et al. 2016). docs/time-model.md gives the evidence.
- ``sustained_clock``: the clock the compute units hold under dense GEMM load, as a fraction of
  the boost clock the data-sheet peaks are quoted at; it scales every compute rate (tensor and
  vector), not bandwidth (default 1). Set where the vendor documents it and no calibrating row
  of the GPU's own absorbs it: AMD measures the MI300X at a median 1,207 MHz of its 2,100 MHz
  boost under dense GEMMs ("Measuring Max-Achievable FLOPs - Part 2", ROCm blogs, 2025), and no
  MI300X row calibrates compute, whose ceiling is borrowed from NVIDIA families whose fitted
  ceilings already hold their own (smaller) clock drop. A measured overlay sets it back to 1:
  its ceilings are fractions of the data-sheet peak measured at whatever clock the GPU held.

A measured overlay (``configs/gpus/measured/*.yaml``) may add ``efficiency_by_op`` entries
which replace the compute/memory factors for one op class and shape bucket. Its ``base:``
names the GPU it refines (a shipped name or another file); a chain that comes back to a
file already on it is an error.

Every number must be finite. A GPU read from a file must also be physically plausible
(:data:`PLAUSIBLE`; bounds wide enough for every shipped chip from a V100 to a B200 and for
the CPU code path of ``simulate calibrate``, narrow enough to catch a unit slip such as
bandwidth in GB/s or memory in GiB); objects built in code (tests, what-if copies) are not
held to them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from simulator.errors import InputError
from simulator.model.loader import (
    load_validated,
    looks_like_path,
    read_mapping,
    suggest,
    validate,
)
from simulator.model.precision import DTYPE_BYTES
from simulator.model.registry import config_files, find_named

# (low, high, unit) per field, checked when a GPU is read from a file (validation context
# {"plausible": True}). Sources for the edges:
# - peak_flops: 1e8 admits the CPU code path of `simulate calibrate` (a CPU's fp16 matmul
#   reaches ~1e9-1e11 FLOP/s); 1e17 is ~10x a B200's dense fp4 peak (9e15, NVIDIA datasheet).
# - hbm_bytes: 1 GiB (2^30) to 32 TiB (2^45); shipped chips hold 24-192 GB.
# - hbm_bandwidth_bytes_per_second: 1e9 (a CPU memory channel) to 1e15 (100x a B200's 8e12).
# - link_bandwidth_bytes_per_second: 1e8 (1 Gbit/s Ethernet) to 1e14 (~50x NVLink 5's 1.8e12).
# - l2_bytes: up to 4 GiB (the largest last-level caches are 256 MiB, MI300X Infinity Cache).
# - sram_bytes_per_sm: 1 KiB to 16 MiB (shipped: 64-228 KiB).
# - kernel_launch_seconds, allreduce_latency_seconds: up to 10 ms (measured: 2-20 us);
#   memory_latency_seconds: up to 1 ms (measured: ~0.5 us).
# - compute, memory, link efficiencies: at least 0.001 (measured kernels reach 0.05-0.95 of a
#   peak; below 0.001 a time is a unit slip, and 1e-320 makes every time overflow to inf).
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "peak_flops": (1e8, 1e17, "FLOP/s"),
    "fp16_accumulate_flops": (1e8, 1e17, "FLOP/s"),
    "hbm_bytes": (2.0**30, 2.0**45, "bytes"),
    "hbm_bandwidth_bytes_per_second": (1e9, 1e15, "bytes/s"),
    "link_bandwidth_bytes_per_second": (1e8, 1e14, "bytes/s"),
    "network_bandwidth_bytes_per_second": (1e8, 1e14, "bytes/s"),
    "l2_bytes": (0.0, 2.0**32, "bytes"),
    "sram_bytes_per_sm": (2.0**10, 2.0**24, "bytes"),
    "kernel_launch_seconds": (0.0, 1e-2, "seconds"),
    "allreduce_latency_seconds": (0.0, 1e-2, "seconds"),
    "memory_latency_seconds": (0.0, 1e-3, "seconds"),
    "compute": (1e-3, 1.0, "of peak"),
    "attention_compute": (1e-3, 1.0, "of peak"),
    "memory": (1e-3, 1.0, "of peak"),
    "link": (1e-3, 1.0, "of peak"),
    "expert": (1e-3, 1.0, "of the dense factors"),
    "overlap": (0.0, 1.0, "of the shorter time"),
    "sustained_clock": (0.2, 1.0, "of the boost clock"),
}


def _plausible(value: float, info: ValidationInfo) -> float:
    """``value`` if within PLAUSIBLE[field] or the caller did not ask for the check (None: not set)."""
    if value is None or not (info.context or {}).get("plausible"):
        return value
    low, high, unit = PLAUSIBLE[str(info.field_name)]
    if not low <= value <= high:
        raise ValueError(f"{value:g} {unit} is not plausible for a GPU; allowed: {low:g} to {high:g} {unit}")
    return value


class Efficiency(BaseModel):
    """Achievable fractions of peak; see the module docstring for defaults and sources."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    compute: float = Field(default=0.70, gt=0.0, le=1.0)
    memory: float = Field(default=0.80, gt=0.0, le=1.0)
    link: float = Field(default=0.75, gt=0.0, le=1.0)
    kernel_launch_seconds: float = Field(default=2e-6, ge=0.0)
    allreduce_latency_seconds: float | None = Field(default=None, ge=0.0)
    memory_latency_seconds: float = Field(default=5e-7, ge=0.0)
    attention_compute: float = Field(default=0.70, gt=0.0, le=1.0)
    expert: float = Field(default=1.0, gt=0.0, le=1.0)
    overlap: float = Field(default=0.0, ge=0.0, le=1.0)
    sustained_clock: float = Field(default=1.0, gt=0.0, le=1.0)
    fitted_on: str = Field(default="end-to-end", min_length=1)
    """what compute and memory were fitted on: end-to-end validation rows (a config's own), or ``kernels (...)``
    (simulator.model.kernel_ceilings)"""

    _plausible_values = field_validator(
        "compute", "memory", "link", "kernel_launch_seconds", "allreduce_latency_seconds", "memory_latency_seconds",
        "attention_compute", "expert", "overlap", "sustained_clock",
    )(_plausible)

    @property
    def compute_of_peak(self) -> float:
        """The GEMM ceiling as a fraction of the data-sheet peak: ``compute`` at the ``sustained_clock``."""
        return self.compute * self.sustained_clock


class OpEfficiency(BaseModel):
    """A measured efficiency for one op class (gemm, attention, ...) and token bucket."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    op_class: str
    min_tokens: int = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    compute: float | None = Field(default=None, gt=0.0, le=1.0)
    memory: float | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("compute", "memory")
    @classmethod
    def _plausible_fraction(cls, value: float | None, info: ValidationInfo) -> float | None:
        return value if value is None else _plausible(value, info)

    @field_validator("max_tokens")
    @classmethod
    def _not_below_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        low = info.data.get("min_tokens")
        if value is not None and low is not None and value < low:
            raise ValueError(f"max_tokens {value} is below min_tokens {low}")
        return value


class GPUSpec(BaseModel):
    """One GPU model. All quantities in SI base units (FLOP/s, bytes, bytes/s, seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    vendor: str = "nvidia"
    peak_flops: dict[str, float] = Field(description="dense tensor peak in FLOP/s by dtype")
    fp16_accumulate_flops: float | None = Field(
        default=None, description="dense FP16 tensor peak in FLOP/s with FP16 accumulation, where it exceeds the "
        "fp16 peak (GeForce parts run FP32-accumulate tensor math at half rate); None: the fp16 peak")
    hbm_bytes: float = Field(gt=0)
    hbm_bandwidth_bytes_per_second: float = Field(gt=0)
    l2_bytes: float = Field(default=0.0, ge=0)
    sm_count: int = Field(default=0, ge=0, le=2**20)
    sram_bytes_per_sm: float = Field(gt=0, description="shared memory per SM usable by one kernel")
    interconnect: str = "pcie"
    link_bandwidth_bytes_per_second: float = Field(gt=0, description="one direction, per GPU")
    host_link_bytes_per_second: float = Field(
        default=32e9, gt=0, description="GPU <-> host CPU memory, one direction, per GPU (a KV offload tier's "
        "loads): PCIe Gen4 x16 32e9, Gen5 x16 64e9, NVLink-C2C on Grace systems 450e9; default PCIe Gen4")
    max_gpus_per_node: int = Field(default=8, ge=1, le=4096, description="GPUs joined by the interconnect (one "
                                   "NVLink domain: 8 on an HGX board, 72 on a GB200/GB300 NVL72 rack)")
    network: str | None = Field(default=None, description="the network between nodes (an interconnect config of "
                                "topology 'network', e.g. infiniband); None: a group wider than a node is refused")
    network_bandwidth_bytes_per_second: float | None = Field(
        default=None, gt=0, description="one direction, per GPU: its NIC's line rate (NDR 400 Gb/s = 50e9)")
    efficiency: Efficiency = Field(default_factory=Efficiency)
    efficiency_by_op: list[OpEfficiency] = Field(default_factory=list)
    measured: dict[str, str] = Field(default_factory=dict, description="provenance of a measured overlay")

    @field_validator("peak_flops")
    @classmethod
    def _known_dtypes(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, flops in value.items():
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"unknown dtype '{dtype}'; allowed: {', '.join(DTYPE_BYTES)}")
            if flops <= 0:
                raise ValueError(f"peak for {dtype} must be > 0")
        return value

    @field_validator("peak_flops")
    @classmethod
    def _plausible_peaks(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        for dtype, flops in value.items():
            try:
                _plausible(flops, info)
            except ValueError as exc:
                raise ValueError(f"{dtype}: {exc}") from None
        return value

    _plausible_sizes = field_validator(
        "fp16_accumulate_flops", "hbm_bytes", "hbm_bandwidth_bytes_per_second", "link_bandwidth_bytes_per_second", "l2_bytes", "sram_bytes_per_sm",
        "network_bandwidth_bytes_per_second",
    )(_plausible)

    @model_validator(mode="after")
    def _network_complete(self) -> GPUSpec:
        # A network without its bandwidth (or the reverse) cannot be costed: say so when the file is read.
        if (self.network is None) != (self.network_bandwidth_bytes_per_second is None):
            raise ValueError("network and network_bandwidth_bytes_per_second go together: give both or neither")
        return self

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; InputError if the chip has none."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            have = ", ".join(sorted(self.peak_flops))
            raise InputError(f"{self.name} has no {dtype} peak (it has: {have}); choose another precision") from None

    def with_fp16_accumulation(self) -> GPUSpec:
        """This GPU as an engine sees it whose FP16 GEMMs accumulate in FP16 (llama.cpp's cuBLAS calls): the fp16
        peak is ``fp16_accumulate_flops`` where the chip has a faster one; else the GPU itself."""
        if self.fp16_accumulate_flops is None or "fp16" not in self.peak_flops:
            return self
        return self.model_copy(update={"peak_flops": {**self.peak_flops, "fp16": self.fp16_accumulate_flops}})

    def ridge_point(self, dtype: str = "fp16") -> float:
        """Peak FLOP/s divided by HBM bandwidth, in FLOP/byte."""
        return self.peak(dtype) / self.hbm_bandwidth_bytes_per_second

    def with_efficiency(self, **overrides: float | None) -> GPUSpec:
        """A copy with some efficiency factors replaced (``None`` values are ignored)."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        if not changes:
            return self
        eff = validate(Efficiency, {**self.efficiency.model_dump(), **changes}, "efficiency override")
        return self.model_copy(update={"efficiency": eff})


def _gpu_files() -> list[Path]:
    return config_files("gpus")


def list_gpus() -> list[GPUSpec]:
    """Every GPU config: $MEMWALL_CONFIG_DIR's first, then the shipped ones (registry.config_files)."""
    return [_load_gpu_file(path) for path in _gpu_files()]


def _load_gpu_file(path: Path) -> GPUSpec:
    return load_validated(GPUSpec, path)


def load_gpu(name_or_path: str) -> GPUSpec:
    """A shipped GPU by name or alias (case-insensitive), or a GPU YAML file by path.

    A measured overlay file may name a ``base`` GPU; its fields replace the base's.
    """
    if looks_like_path(name_or_path):
        return _load_gpu_path(Path(name_or_path), ())
    return _load_gpu_name(name_or_path)


def _load_gpu_path(path: Path, chain: tuple[Path, ...]) -> GPUSpec:
    """A GPU YAML file; ``chain`` holds the overlays that led here through ``base:`` (to stop cycles)."""
    here = path.resolve()
    if here in chain:
        loop = " -> ".join(str(p) for p in (*chain, here))
        raise InputError(f"{chain[-1]}: field 'base': the chain of base GPUs loops ({loop}); a base must not lead back to itself")
    data = read_mapping(path, "GPU config")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise InputError(f"{path}: field 'base': expected a GPU name or a path to a GPU YAML file (got {base!r})")
        if looks_like_path(base):
            parent = _load_gpu_path(Path(base), (*chain, here))  # its errors name its own file
        else:
            try:
                parent = _load_gpu_name(base)
            except InputError as exc:
                raise InputError(f"{path}: field 'base': {exc}") from None
        merged = parent.model_dump()
        for key, value in data.items():
            if key == "efficiency" and isinstance(value, dict):
                merged["efficiency"] = {**merged["efficiency"], **value}
            else:
                merged[key] = value
        data = merged
    return validate(GPUSpec, data, str(path), plausible=True)


def _load_gpu_name(name_or_path: str) -> GPUSpec:
    found = find_named("gpus", name_or_path, _load_gpu_file, lambda gpu: [gpu.name, *gpu.aliases])
    if found is not None:
        return found
    known = [n for gpu in list_gpus() for n in (gpu.name, *gpu.aliases)]
    raise InputError(
        f"--gpu: unknown GPU '{name_or_path}'{suggest(name_or_path, known)}; "
        f"known: {', '.join(g.name for g in list_gpus())} (or a path to a GPU YAML file)"
    )
