"""NVIDIA AIConfigurator's measured kernel database, read from the installed ``aiconfigurator-core`` package.

``pip install 'memwall[measured]'`` installs the package (Apache-2.0, NVIDIA); its tables live under
``aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/*.parquet`` and are read here
with pyarrow. Nothing is fetched at run time, and nothing here imports the package itself: only
its data files are read.

What a GEMM latency includes, from the collector's code (``collector/helper.py``,
``collector/<engine>/collect_gemm.py`` of ai-dynamo/aiconfigurator): the mean device time of
back-to-back CUDA-graph replays after warm-up, so no host launch cost, but each kernel's node in
the graph (the GPU-side launch) is in it; up to five copies of the weights rotate so they come
from HBM, not L2; a per-tensor FP8 row includes the dynamic quantisation of the activations
(computing the scale and quantising), an FP8 block row its 1 x 128 activation quantisation.
Latencies are stored in milliseconds; they are converted to seconds on reading.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from simulator.cost.kernel_tables.collective import MessageCurve, message_curve
from simulator.cost.kernel_tables.parquet import codes, numbers, read_parquet
from simulator.cost.kernel_tables.table import GemmTable, TableOrigin, gemm_table
from simulator.errors import InputError

PACKAGE = "aiconfigurator_core"
EXTRA_HINT = "pip install 'memwall[measured]' (aiconfigurator-core and pyarrow)"

SYSTEMS: dict[str, tuple[str, str]] = {
    "A100-SXM4-80GB": ("a100_sxm", "A100 SXM"),
    "H100-SXM5-80GB": ("h100_sxm", "H100 SXM"),
    "H200-SXM-141GB": ("h200_sxm", "H200 SXM"),
    "B200": ("b200_sxm", "B200 SXM"),
    "B300": ("b300_sxm", "B300 SXM"),
    "GB200": ("gb200", "GB200"),
    "GB300": ("gb300", "GB300"),
    "L40S": ("l40s", "L40S"),
    "RTX-PRO-6000": ("rtx_pro_6000_server", "RTX PRO 6000 Server"),
}
"""memwall GPU config name -> (the database's system folder, its display name). Only GPUs measured as
themselves: an A100 40 GB or H100 PCIe is another part (clocks, power, bandwidth) and gets none. The
database has no folder for H20, MI325X or MI355X (nor any AMD part), so those get none either."""

GEMM_DTYPES: dict[str, str] = {
    "bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
    "int8_wo": "int8_wo", "int4_wo": "int4_wo",
}
"""the database's gemm_dtype -> memwall's GEMM format (other formats, e.g. SmoothQuant's ``sq``, are not read)"""

GEMM_INCLUDES = ("CUDA-graph replay device time (no host launch); weights from HBM; FP8 rows include the "
                 "activation quantisation")

ENGINES = ("trtllm", "vllm", "sglang")


def data_root() -> Path | None:
    """The installed package's ``systems/data`` folder, or None when the extra is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location) / "systems" / "data"
        if root.is_dir():
            return root
    return None


def has_pyarrow() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def release(text: str) -> tuple[int, ...]:
    """(major, minor, patch, ...) of a release string: '1.3.0rc20' -> (1, 3, 0, 20), '0.5.6.post2' -> (0, 5, 6, 2)."""
    return tuple(int(part) for part in re.findall(r"\d+", text))


def measured_versions(root: Path, system: str, op: str, engine: str, filename: str) -> list[str]:
    """Releases with a ``filename`` table for this system, op and engine, oldest first."""
    folder = root / system / op / engine
    if not folder.is_dir():
        return []
    versions = [entry.name for entry in folder.iterdir() if (entry / filename).is_file()]
    return sorted(versions, key=release)


def nearest_release(versions: list[str], wanted: tuple[int, ...] | None) -> str:
    """The measured release nearest ``wanted`` (component by component; ties to the newer), or the newest."""
    if wanted is None:
        return versions[-1]

    def distance(version: str) -> tuple:
        have = release(version)
        width = max(len(have), len(wanted))
        have_padded, wanted_padded = have + (0,) * (width - len(have)), wanted + (0,) * (width - len(wanted))
        # Equally near: the newer release, compared component by component (1.6.4 before 1.4.6).
        return (*(abs(h - w) for h, w in zip(have_padded, wanted_padded)), *(-h for h in have_padded))

    return min(versions, key=distance)


@functools.lru_cache(maxsize=16)
def read_gemm_tables(path: str, gpu: str, engine: str, version: str) -> dict[str, GemmTable]:
    """Every GEMM format of one ``gemm_perf.parquet``, by memwall format name."""
    if not has_pyarrow():
        raise InputError(f"--kernels measured: reading {path} needs pyarrow; {EXTRA_HINT}")

    columns = ["gemm_dtype", "m", "n", "k", "latency"]
    try:
        table = read_parquet(path, columns, dictionary=["gemm_dtype"])
        dtype_code, dtype_names = codes(table, "gemm_dtype")
        m, n, k = (numbers(table.column(name)) for name in ("m", "n", "k"))
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the GEMM table ({exc})") from None
    seconds = numbers(table.column("latency")) * 1e-3  # the database stores milliseconds
    origin = TableOrigin(gpu, engine, version, path, GEMM_INCLUDES)
    out = {}
    for theirs, ours in GEMM_DTYPES.items():
        if theirs not in dtype_names:
            continue
        rows = dtype_code == dtype_names.index(theirs)
        if rows.any():
            out[ours] = gemm_table(origin, ours, m[rows], n[rows], k[rows], seconds[rows])
    return out


ALLREDUCE_INCLUDES = "CUDA-graph replay device time of the engine's custom all-reduce (no host launch)"
ALLREDUCE_BYTES_PER_ELEMENT = 2
"""the tables' all-reduces are of bf16 elements (``allreduce_dtype`` bfloat16); ``message_size`` counts elements"""


@functools.lru_cache(maxsize=16)
def read_allreduce_curves(path: str) -> dict[int, MessageCurve]:
    """The all-reduce curve of each measured group size in one ``custom_allreduce_perf.parquet``, by GPU count.

    vLLM's and SGLang's tables hold the kernel both eager (timed with its host launch) and captured in a CUDA
    graph; only the graph rows are read, as memwall charges host launches itself."""
    if not has_pyarrow():
        raise InputError(f"--kernels measured: reading {path} needs pyarrow; {EXTRA_HINT}")
    import numpy as np

    try:
        table = read_parquet(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the all-reduce table ({exc})") from None
    names = table.schema.names
    gpus = numbers(table.column("num_gpus"))
    elements = numbers(table.column("message_size")).astype(float)
    seconds = numbers(table.column("latency")) * 1e-3  # milliseconds in the database
    keep = np.ones(len(gpus), dtype=bool)
    if "backend" in names:
        keep &= np.array([str(b).endswith("_graph") for b in table.column("backend").to_pylist()])
    if "allreduce_dtype" in names:
        keep &= np.array([d == "bfloat16" for d in table.column("allreduce_dtype").to_pylist()])
    return _curves_by_gpu_count(gpus, elements * ALLREDUCE_BYTES_PER_ELEMENT, seconds, keep)


def _curves_by_gpu_count(gpus, message_bytes, seconds, keep) -> dict[int, MessageCurve]:
    """One message curve per GPU count over the rows ``keep`` (a boolean array) selects, from arrays of the table's
    GPU counts, message bytes and seconds (a count with fewer than two sizes has none)."""
    out = {}
    for count in sorted(set(int(g) for g in gpus[keep])):
        rows = keep & (gpus == count)
        curve = message_curve(count, message_bytes[rows], seconds[rows])
        if curve is not None:
            out[count] = curve
    return out


NCCL_BYTES_PER_ELEMENT = 2
"""the NCCL rows read are of half-precision elements (``nccl_dtype`` half); ``message_size`` counts elements"""

NCCL_OPERATIONS: dict[str, str] = {"allgather": "all_gather", "reducescatter": "reduce_scatter"}
"""memwall's collective -> the database's ``op_name``. ``message_size`` is nccl-tests' size, the buffer that the
test names: for an all-gather the gathered output, for a reduce-scatter the input that is summed (nccl-tests,
``AllGatherGetCollByteCount`` and ``ReduceScatterGetCollByteCount``), which are the bytes a memwall all-gather and
reduce-scatter carry (:class:`simulator.model.operators.AllReduce`)."""


@functools.lru_cache(maxsize=16)
def read_nccl_curves(path: str) -> dict[tuple[str, int], MessageCurve]:
    """The NCCL all-gather and reduce-scatter curves of one ``nccl_perf.parquet``, by (memwall collective, GPU count).

    What a latency includes, from the collector's code (``collector/network/collect_nccl.py`` of
    ai-dynamo/aiconfigurator): nccl-tests' out-of-place time, the mean over 100 back-to-back operations (60 above
    16 MiB) after 40 warm-up ones, timed by CUDA events, no CUDA graph; stored in milliseconds."""
    if not has_pyarrow():
        raise InputError(f"--kernels measured: reading {path} needs pyarrow; {EXTRA_HINT}")
    import numpy as np

    try:
        table = read_parquet(path)
        operations = table.column("op_name").to_pylist()
        dtypes = table.column("nccl_dtype").to_pylist()
        gpus = numbers(table.column("num_gpus"))
        elements = numbers(table.column("message_size")).astype(float)
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the NCCL table ({exc})") from None
    seconds = numbers(table.column("latency")) * 1e-3
    half = np.array([d == "half" for d in dtypes])
    out: dict[tuple[str, int], MessageCurve] = {}
    for ours, theirs in NCCL_OPERATIONS.items():
        of_op = half & np.array([o == theirs for o in operations])
        for count, curve in _curves_by_gpu_count(gpus, elements * NCCL_BYTES_PER_ELEMENT, seconds, of_op).items():
            out[ours, count] = curve
    return out
