"""Per-kernel accuracy of the roofline path against measured GEMM tables, and a refit of its ceilings on them.

memwall times an operator that no measured table covers by its roofline path
(:func:`simulator.cost.step_cost.roofline` under the shape model):

    seconds = max(A / c, (S + L) / mu) + (1 - o) * min(R / c, (S + L) / mu) + t_launch

with, per GEMM of m rows, n output columns and depth k on one GPU (all in seconds):

- ``A`` = (FLOPs + padding) / (peak[dtype] * sustained_clock * shape(m, n, k)): the tensor time at a
  compute ceiling of 1, tile and wave quantisation included (:mod:`simulator.cost.kernels`);
- ``R`` = FLOPs / (peak[dtype] * sustained_clock): the same without the shape factor (the real MMAs);
- ``S`` = bytes / bandwidth: the streaming time at a memory ceiling of 1;
- ``c`` = ``efficiency.compute``, ``mu`` = ``efficiency.memory``, ``L`` = ``efficiency.memory_latency_seconds``
  (b_half = bandwidth * L), ``o`` = ``efficiency.overlap``, ``t_launch`` = ``efficiency.kernel_launch_seconds``.

``A``, ``R`` and ``S`` are taken from the simulator's own code (:func:`operator_rates` and
:func:`roofline` on a :class:`~simulator.model.operators.Gemm`, evaluated at unit ceilings), never
re-derived here; :func:`kernel_rows` checks that the form above, at the GPU's configured
parameters, reproduces the simulator's seconds row by row, so a change of the time model that this
decomposition no longer describes fails loudly instead of scoring something else.

Measured side: NVIDIA AIConfigurator's GEMM tables (:mod:`simulator.cost.kernel_tables`), the mean
CUDA-graph replay device time of one GEMM, its GPU-side launch included, weights rotated so they
come from HBM, a per-tensor FP8 row including the activation quantisation. The roofline's
``seconds`` hold one launch (a Gemm launches one kernel per step), so the two compare directly.

Fitting (:func:`fit`): the parameters of a model form (:data:`FORMS`) by least squares on
log(predicted / measured), each (GPU, dtype) group weighted equally, with a small
Levenberg-Marquardt loop in numpy on the logarithms of the parameters (so each stays positive).
Ceilings are fractions of each GPU's own data-sheet peak and bandwidth, so one parameter set
applies to several GPUs; :func:`held_out` fits on every GPU but one and scores the one left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.cost.kernel_tables import aiconfigurator
from simulator.cost.kernel_tables.table import GemmTable
from simulator.cost.step_cost import TimeModel, operator_rates, roofline
from simulator.model.gpu import GPUSpec
from simulator.model.operators import Gemm
from simulator.model.step import Step

DTYPES: tuple[str, ...] = ("bf16", "fp8")
"""GEMM formats scored: the dense formats memwall's roofline path models (bf16 weights, per-tensor FP8 W8A8)."""

WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}
"""bytes per weight of each format (memwall's DTYPE_BYTES; per-tensor FP8 has no per-weight scale bytes)"""

ACTIVATION_BYTES = 2.0
"""bytes per activation element: memwall stores activations as bf16 under both formats (model/precision.py)"""

ENGINES: tuple[str, ...] = ("trtllm", "vllm")
"""engine tables tried, in order: TensorRT-LLM's where present, else vLLM's"""

MIN_FEATURES = 256
"""least n and k scored: the grid's 32-128 columns are narrower than any projection of the models memwall
ships, even split eight ways, and would weigh the fit towards kernels no run charges"""

L2_RULE = ("rows whose weights (one copy) fit in the GPU's L2 are left out: the collector cycles five weight copies "
           "so that they come from HBM, but where one copy fits in L2 part of it stays there across the cycle "
           "(L2 replacement is not strict LRU)")
"""Why :func:`kernel_rows` drops L2-resident rows by default. Evidence: L40S (96 MiB L2, 864 GB/s GDDR6) bf16
rows at m = 1 with 21-84 MB of weights take the time of 1.2-2.4 TB/s, above its DRAM bandwidth, and fall to
0.77-0.96 TB/s above 100 MB; no layer of a served model finds its weights in L2 (the whole model streams
between two calls of one layer), so these rows would teach the memory ceiling an L2 bandwidth."""

REGIMES: tuple[tuple[str, int, float], ...] = (("m<=16", 1, 16), ("m=17-256", 17, 256), ("m>256", 257, np.inf))
"""(name, least m, most m) of the row-count regimes: decode-like, small batches, prefill-like"""


@dataclass(frozen=True)
class KernelRows:
    """One GPU's measured GEMMs of one format, with the roofline path's terms for each (seconds).

    ``tensor_seconds`` (A), ``real_seconds`` (R) and ``stream_seconds`` (S) are the module docstring's
    terms at unit ceilings; ``predicted_seconds`` is the simulator's roofline path at the GPU's
    configured efficiencies, one launch included.
    """

    gpu: str
    dtype: str
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    measured_seconds: np.ndarray
    predicted_seconds: np.ndarray
    tensor_seconds: np.ndarray
    real_seconds: np.ndarray
    stream_seconds: np.ndarray


@dataclass(frozen=True)
class Params:
    """Parameters of the roofline path (ceilings as fractions of the data-sheet peak and bandwidth).

    ``floor_seconds``: a fixed time per kernel beyond ``launch_seconds`` by format (0 in the current form).
    """

    compute: float
    memory: float
    latency_seconds: float
    overlap: float = 0.0
    launch_seconds: float = 2e-6
    floor_seconds: dict[str, float] = field(default_factory=dict)

    def floor(self, dtype: str) -> float:
        return self.floor_seconds.get(dtype, 0.0)


def configured_params(gpu: GPUSpec) -> Params:
    """The parameters a GPU config gives its roofline path today."""
    eff = gpu.efficiency
    return Params(eff.compute, eff.memory, eff.memory_latency_seconds, eff.overlap, eff.kernel_launch_seconds)


def default_params() -> Params:
    """The shipped defaults of simulator.model.gpu.Efficiency: what a fit keeps for the parameters it does not fit."""
    return configured_params(GPUSpec(name="defaults", peak_flops={}, hbm_bytes=1.0, hbm_bandwidth_bytes_per_second=1.0,
                                     sram_bytes_per_sm=1.0, link_bandwidth_bytes_per_second=1.0))


def path_seconds(rows: KernelRows, params: Params) -> np.ndarray:
    """Seconds of each row under ``params``: the module docstring's form plus the format's floor."""
    memory = (rows.stream_seconds + params.latency_seconds) / params.memory
    busy = np.maximum(rows.tensor_seconds / params.compute, memory)
    busy = busy + (1.0 - params.overlap) * np.minimum(rows.real_seconds / params.compute, memory)
    return busy + params.launch_seconds + params.floor(rows.dtype)


def _gemm(n: int, k: int, dtype: str) -> Gemm:
    """One dense GEMM of an n-column, k-deep weight in ``dtype``, as the layer builder makes it (one launch)."""
    return Gemm(name="gemm", count=1, in_features=k, out_features=n, params=n * k, resident_bytes=n * k * WEIGHT_BYTES[dtype],
                weight_bytes_per_element=WEIGHT_BYTES[dtype], scale_bytes_per_weight=0.0, bias_elements=0,
                activation_bytes_per_element=ACTIVATION_BYTES, compute_dtype=dtype)


def _step(rows: np.ndarray) -> Step:
    return Step(tokens=rows, prefill_tokens=rows, sequences=1.0, logit_tokens=1.0, attention_pairs=0.0,
                prefill_attention_pairs=0.0, score_elements=0.0, context_tokens=0.0)


def _roofline_terms(op: Gemm, gpu: GPUSpec, rows: np.ndarray, shape: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, memory, total) seconds of ``op`` at ``rows`` rows through the simulator's own roofline."""
    model = TimeModel(shape=shape)
    step = _step(rows)
    work = op.work(step)
    rates = operator_rates(op, gpu, op.tokens(step), model)
    compute, memory, total, _, _ = roofline(work, rates, 1, op.tokens(step))
    return (np.asarray(compute, dtype=float), np.asarray(memory, dtype=float), np.asarray(total, dtype=float))


def kernel_rows(gpu: GPUSpec, table: GemmTable, min_features: int = MIN_FEATURES,
                keep_l2_resident: bool = False, every: int = 1) -> KernelRows:
    """The measured rows of ``table`` (n, k >= ``min_features``) with the roofline path's terms on ``gpu``.

    Rows whose weights fit in ``gpu.l2_bytes`` are left out unless ``keep_l2_resident`` (:data:`L2_RULE`);
    ``every``: only every so many n and k of the grid (every m), to sample a large table.

    Raises AssertionError when the decomposition of the module docstring does not reproduce the
    simulator's seconds (to 1e-9 relative): the study would otherwise score another formula.
    """
    # Unit ceilings, no DRAM latency and no launch: the simulator's compute and memory seconds are then A and S.
    unit = gpu.with_efficiency(compute=1.0, memory=1.0, memory_latency_seconds=0.0, kernel_launch_seconds=0.0)
    parts: dict[str, list[np.ndarray]] = {key: [] for key in ("m", "n", "k", "meas", "pred", "a", "r", "s")}
    rows = table.m.astype(float)
    for j, n in enumerate(table.n):
        for lk, k in enumerate(table.k):
            if n < min_features or k < min_features or j % every or lk % every:
                continue
            if not keep_l2_resident and n * k * WEIGHT_BYTES[table.dtype] <= gpu.l2_bytes:
                continue
            seconds = table.seconds[:, j, lk]
            valid = np.isfinite(seconds)
            if not valid.any():
                continue
            m = rows[valid]
            op = _gemm(int(n), int(k), table.dtype)
            tensor, stream, _ = _roofline_terms(op, unit, m, shape=True)
            real, _, _ = _roofline_terms(op, unit, m, shape=False)  # no shape factor: the real MMAs alone
            _, _, predicted = _roofline_terms(op, gpu, m, shape=True)
            for key, value in (("m", m), ("n", np.full(len(m), n)), ("k", np.full(len(m), k)),
                               ("meas", seconds[valid]), ("pred", predicted), ("a", tensor), ("r", real),
                               ("s", stream)):
                parts[key].append(value)
    cat = {key: np.concatenate(value) if value else np.zeros(0) for key, value in parts.items()}
    out = KernelRows(gpu.name, table.dtype, cat["m"], cat["n"], cat["k"], cat["meas"], cat["pred"], cat["a"],
                     cat["r"], cat["s"])
    rebuilt = path_seconds(out, configured_params(gpu))
    if not np.allclose(rebuilt, out.predicted_seconds, rtol=1e-9, atol=0.0):
        worst = float(np.max(np.abs(rebuilt / out.predicted_seconds - 1.0)))
        raise AssertionError(f"{gpu.name} {table.dtype}: the roofline decomposition is off the simulator by {worst:.3g}")
    return out


def measured_tables(gpu_name: str) -> tuple[str, dict[str, GemmTable]] | None:
    """(``engine release``, tables by format) of a memwall GPU in the installed database, or None.

    TensorRT-LLM's newest release where it has one, else vLLM's (:data:`ENGINES`); only :data:`DTYPES`.
    """
    root = aiconfigurator.data_root()
    system = aiconfigurator.SYSTEMS.get(gpu_name)
    if root is None or system is None or not aiconfigurator.has_pyarrow():
        return None
    folder, display = system
    for engine in ENGINES:
        versions = aiconfigurator.measured_versions(root, folder, "gemm", engine, "gemm_perf.parquet")
        if versions:
            version = versions[-1]
            path = root / folder / "gemm" / engine / version / "gemm_perf.parquet"
            tables = aiconfigurator.read_gemm_tables(str(path), display, engine, version)
            return f"{engine} {version}", {d: t for d, t in tables.items() if d in DTYPES}
    return None


# --- statistics -------------------------------------------------------------------------------------------


def error_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float | int | None]:
    """Median and p90 of |predicted / measured - 1|, the median ratio and the row count (None where no rows)."""
    if not len(measured):
        return {"rows": 0, "median_abs_error": None, "p90_abs_error": None, "median_ratio": None}
    ratio = predicted / measured
    error = np.abs(ratio - 1.0)
    return {"rows": int(len(measured)), "median_abs_error": float(np.median(error)),
            "p90_abs_error": float(np.quantile(error, 0.9)), "median_ratio": float(np.median(ratio))}


def summarise(groups: list[KernelRows], predictions: list[np.ndarray]) -> dict[str, dict]:
    """Error statistics of ``predictions`` (one array per group) overall, by regime of m and by format."""
    measured = np.concatenate([g.measured_seconds for g in groups]) if groups else np.zeros(0)
    predicted = np.concatenate(predictions) if groups else np.zeros(0)
    m = np.concatenate([g.m for g in groups]) if groups else np.zeros(0)
    dtype = np.concatenate([np.full(len(g.m), g.dtype) for g in groups]) if groups else np.zeros(0, dtype=str)
    out: dict[str, dict] = {"all": error_summary(predicted, measured)}
    for name, low, high in REGIMES:
        inside = (m >= low) & (m <= high)
        out[name] = error_summary(predicted[inside], measured[inside])
    for name in DTYPES:
        out[name] = error_summary(predicted[dtype == name], measured[dtype == name])
    return out


# --- fitting ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """A model form: which parameters are fitted (the rest keep the base values, e.g. overlap 0, a 2 us launch)."""

    name: str
    description: str
    floors: bool = False
    """fit a fixed time per kernel and format, on top of the launch"""
    overlap: bool = False
    """fit ``efficiency.overlap`` (else it keeps the base value)"""


FORMS: tuple[Form, ...] = (
    Form("roofline", "today's form; compute ceiling, memory ceiling and DRAM latency refitted (overlap 0)"),
    Form("roofline+floor", "today's form plus a fixed time per kernel and format (prologue, epilogue, and for fp8 "
         "the activation quantisation kernels)", floors=True),
    Form("roofline+floor+overlap", "the above with the overlap of a kernel's loads and MMAs fitted too",
         floors=True, overlap=True),
)

LATENCY_BOUNDS_SECONDS = (1e-9, 1e-4)
FLOOR_BOUNDS_SECONDS = (1e-9, 1e-3)
OVERLAP_BOUNDS = (1e-6, 1.0)
CEILING_BOUNDS = (1e-3, 2.0)
"""bounds of the fitted values: wide enough not to bind on real tables (a ceiling above 1 is reported as such);
the lower ones stand for 0 (the parameters are fitted as logarithms)"""


def _names(form: Form, dtypes: tuple[str, ...]) -> list[str]:
    """The fitted parameters of ``form``, in the order of the parameter vector."""
    return (["compute", "memory", "latency"] + (["overlap"] if form.overlap else [])
            + ([f"floor:{d}" for d in dtypes] if form.floors else []))


def _unpack(theta: np.ndarray, form: Form, base: Params, dtypes: tuple[str, ...]) -> Params:
    values = dict(zip(_names(form, dtypes), np.exp(theta).tolist()))
    floors = {d: values[f"floor:{d}"] for d in dtypes} if form.floors else dict(base.floor_seconds)
    return Params(values["compute"], values["memory"], values["latency"], values.get("overlap", base.overlap),
                  base.launch_seconds, floors)


def _bounds(form: Form, dtypes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    table = {"compute": CEILING_BOUNDS, "memory": CEILING_BOUNDS, "latency": LATENCY_BOUNDS_SECONDS,
             "overlap": OVERLAP_BOUNDS}
    pairs = [table.get(name, FLOOR_BOUNDS_SECONDS) for name in _names(form, dtypes)]
    return np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])


def _residuals(theta: np.ndarray, groups: list[KernelRows], form: Form, base: Params, dtypes: tuple[str, ...],
               weights: np.ndarray) -> np.ndarray:
    params = _unpack(theta, form, base, dtypes)
    logs = [np.log(path_seconds(g, params) / g.measured_seconds) for g in groups]
    return np.concatenate(logs) * weights


RELATIVE_TOLERANCE = 1e-7
"""a fit stops when a step lowers the cost by less than this fraction (the parameters then move < 0.1%)"""


def fit(groups: list[KernelRows], form: Form, base: Params | None = None, iterations: int = 50) -> Params:
    """Least-squares fit of ``form``'s parameters on ``groups`` in log space, each group weighted equally.

    ``base`` gives the parameters the form does not fit (overlap, launch, floors; default:
    :func:`default_params`, overlap 0 and a 2 us launch). Levenberg-Marquardt on log parameters with a
    finite-difference Jacobian, from a few starting points (the max makes the problem non-convex).
    """
    groups = [g for g in groups if len(g.m)]
    if not groups:
        raise ValueError("no kernel rows to fit")
    base = base or default_params()
    dtypes = tuple(sorted({g.dtype for g in groups}))
    # Each (GPU, format) group weighs the same whatever its row count (each row's squared residual / its rows);
    # the groups of one format are then pooled into one array each, so a residual costs a few numpy calls.
    members = [[g for g in groups if g.dtype == dtype] for dtype in dtypes]
    weights = np.concatenate([np.full(len(g.m), 1.0 / np.sqrt(len(g.m))) for same in members for g in same])
    groups = [_pooled(same) for same in members]
    low, high = _bounds(form, dtypes)
    best: tuple[float, np.ndarray] | None = None
    for compute, memory, latency, overlap, floor in ((0.7, 0.8, 5e-7, 0.5, 3e-6), (0.4, 0.5, 3e-6, 0.1, 1e-5),
                                                     (0.9, 0.9, 1e-7, 0.9, 1e-7)):
        start = ([compute, memory, latency] + ([overlap] if form.overlap else [])
                 + ([floor] * len(dtypes) if form.floors else []))
        theta = _levenberg_marquardt(np.log(start), low, high, groups, form, base, dtypes, weights, iterations)
        cost = float(np.sum(_residuals(theta, groups, form, base, dtypes, weights) ** 2))
        if best is None or cost < best[0]:
            best = (cost, theta)
    assert best is not None
    return _unpack(best[1], form, base, dtypes)


def _pooled(groups: list[KernelRows]) -> KernelRows:
    """Rows of several GPUs of one format as one :class:`KernelRows` (named after the first GPU)."""
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(g, name) for g in groups])

    return KernelRows(groups[0].gpu, groups[0].dtype, cat("m"), cat("n"), cat("k"), cat("measured_seconds"),
                      cat("predicted_seconds"), cat("tensor_seconds"), cat("real_seconds"), cat("stream_seconds"))


def _levenberg_marquardt(theta: np.ndarray, low: np.ndarray, high: np.ndarray, groups: list[KernelRows], form: Form,
                         base: Params, dtypes: tuple[str, ...], weights: np.ndarray, iterations: int) -> np.ndarray:
    """Damped Gauss-Newton steps on the log parameters, kept inside their bounds."""
    theta = np.clip(theta, low, high)
    residual = _residuals(theta, groups, form, base, dtypes, weights)
    cost = float(residual @ residual)
    damping = 1e-3
    step_size = 1e-4  # in log space: a 0.01% change, far above float noise, far below the curvature scale
    for _ in range(iterations):
        # One row per parameter (the transposed Jacobian): contiguous rows keep the products cheap.
        jacobian_t = np.empty((len(theta), len(residual)))
        for i in range(len(theta)):
            shifted = theta.copy()
            shifted[i] += step_size
            jacobian_t[i] = (_residuals(shifted, groups, form, base, dtypes, weights) - residual) / step_size
        normal = np.einsum("in,jn->ij", jacobian_t, jacobian_t)
        gradient = jacobian_t @ residual
        # A parameter at a bound whose descent direction leaves the box is held there (projected steps): a
        # clipped step would otherwise stall the others (e.g. a bf16 floor that the data want at 0).
        held = ((theta <= low) & (gradient > 0)) | ((theta >= high) & (gradient < 0))
        normal[held, :] = 0.0
        normal[:, held] = 0.0
        normal[held, held] = 1.0
        gradient = np.where(held, 0.0, gradient)
        improved = False
        while damping < 1e10:
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            trial = np.clip(theta + step, low, high)
            trial_residual = _residuals(trial, groups, form, base, dtypes, weights)
            trial_cost = float(trial_residual @ trial_residual)
            if trial_cost < cost:
                improved = cost - trial_cost > RELATIVE_TOLERANCE * cost
                theta, residual, cost = trial, trial_residual, trial_cost
                damping = max(damping / 10.0, 1e-12)
                break
            damping *= 10.0
        if not improved:
            break
    return theta


def held_out(groups: list[KernelRows], form: Form, base: Params | None = None) -> dict[str, Params]:
    """For each GPU among ``groups``, the parameters of ``form`` fitted on every OTHER GPU's rows."""
    gpus = sorted({g.gpu for g in groups})
    return {gpu: fit([g for g in groups if g.gpu != gpu], form, base) for gpu in gpus}


def params_dict(params: Params) -> dict[str, object]:
    """JSON-ready parameters, SI units in the names."""
    return {"compute": params.compute, "memory": params.memory, "memory_latency_seconds": params.latency_seconds,
            "overlap": params.overlap, "kernel_launch_seconds": params.launch_seconds,
            "floor_seconds": dict(params.floor_seconds)}


# --- the study ---------------------------------------------------------------------------------------------


SAMPLE_EVERY = 2
"""the study scores every other n and every other k of a table's grid (all its m): a quarter of the rows, the same
range of shapes (AIConfigurator's grid steps by 1.2-1.5x in n and k), so the study runs in seconds"""


def tabled_groups(gpu_names: list[str] | None = None, every: int = SAMPLE_EVERY,
                  keep_l2_resident: bool = False) -> tuple[list[KernelRows], dict[str, str]]:
    """Every memwall GPU config with measured GEMM tables: its rows by format, and the table each came from.

    ``gpu_names`` (default: every GPU in :data:`aiconfigurator.SYSTEMS` that memwall has a config for).
    """
    from simulator.model.gpu import list_gpus

    configs = {gpu.name: gpu for gpu in list_gpus()}
    names = gpu_names if gpu_names is not None else [name for name in aiconfigurator.SYSTEMS if name in configs]
    groups: list[KernelRows] = []
    sources: dict[str, str] = {}
    for name in names:
        found = measured_tables(name)
        if found is None or name not in configs:
            continue
        release, tables = found
        sources[name] = f"{aiconfigurator.SYSTEMS[name][0]} {release}"
        for dtype in DTYPES:
            if dtype in tables:
                rows = kernel_rows(configs[name], tables[dtype], every=every, keep_l2_resident=keep_l2_resident)
                if len(rows.m):
                    groups.append(rows)
    return groups, sources


def family_fits(groups: list[KernelRows], form: Form) -> dict[str, Params]:
    """``form`` fitted on the tabled GPUs of each memwall GPU family (simulator.model.gpu_family), and on all
    of them together (``all``: the values of a family with no tables)."""
    from simulator.model.gpu_family import family_of

    out = {"all": fit(groups, form)}
    families: dict[str, list[KernelRows]] = {}
    for g in groups:
        families.setdefault(family_of(g.gpu) or g.gpu, []).append(g)
    for family, members in sorted(families.items()):
        out[family] = fit(members, form)
    return out


CHOSEN = "roofline+floor+overlap"
"""the form the study recommends (docs/kernel-accuracy.md says why): the lowest held-out error on every GPU but L40S"""


def study(groups: list[KernelRows], forms: tuple[Form, ...] = FORMS) -> dict[str, object]:
    """Before (today's configs) and held-out after (each form fitted on the other GPUs), per GPU; the fits.

    ``before``/``after``: by GPU, :func:`summarise`'s statistics; ``gpu_fits``: each form fitted on each GPU
    alone (in sample, what its own config would take; the chosen form only); ``family_fits``: each form per
    family and pooled.
    """
    gpus = sorted({g.gpu for g in groups})
    before = {gpu: summarise([g for g in groups if g.gpu == gpu], [g.predicted_seconds for g in groups if g.gpu == gpu])
              for gpu in gpus}
    after: dict[str, dict] = {}
    held: dict[str, dict] = {}
    own: dict[str, dict] = {}
    families: dict[str, dict] = {}
    for form in forms:
        fits = held_out(groups, form)
        held[form.name] = {gpu: params_dict(p) for gpu, p in fits.items()}
        after[form.name] = {}
        own[form.name] = {}
        for gpu in gpus:
            mine = [g for g in groups if g.gpu == gpu]
            after[form.name][gpu] = summarise(mine, [path_seconds(g, fits[gpu]) for g in mine])
            if form.name == CHOSEN:  # in-sample fits per GPU: only for the recommended form (each costs a fit)
                own[form.name][gpu] = params_dict(fit(mine, form))
        families[form.name] = {name: params_dict(p) for name, p in family_fits(groups, form).items()}
    return {"before": before, "after": after, "held_out_fits": held, "gpu_fits": own, "family_fits": families,
            "forms": {form.name: form.description for form in forms}, "l2_rule": L2_RULE,
            "min_features": MIN_FEATURES}
