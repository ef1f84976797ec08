"""Fitting the calibrated ceilings per (GPU family, engine) class, and leave-one-source-out cross-validation.

The calibrated parameters are two per (GPU family, engine) class (families:
:data:`simulator.validation.replay.GPU_FAMILIES`; engine: :attr:`Row.runtime`, the engine that was
measured, told apart by the profile its release replays with: ``vllm:vllm-v0`` and ``vllm`` (V1),
``tgi:tgi-v1`` and ``tgi:tgi-v2``, ``lmdeploy:trtllm-v0``): the flat compute and memory efficiency
ceilings of ``GPUSpec.efficiency``.
One ceiling per family would mix engines of very different speed (llama.cpp and TensorRT-LLM
prefills on one Ada GPU), so DESIGN.md asks for parameters per family and engine. The rule
(:func:`fit`), the same for the shipped table and a user's benchmark:

1. A row *calibrates compute* when it is a static-batch TTFT of a dense model whose prefill step,
   at full efficiency (ceilings 1), spends more than half its whole time (launches, collectives
   and the row's engine's exposed host time included) in compute-bound operators (so its time
   says something about FLOP/s and little about bandwidth, the interconnect or fixed costs).
2. A row *calibrates memory* when it is a static-batch decode figure (TPOT, per-sequence decode
   rate, throughput, batch latency) of a dense model whose run is decode-dominated (decode >= 80%
   of the closed batch's roofline time) and whose last decode step spends more than half its
   whole time in memory-bound operators. MoE rows never calibrate these two: their expert GEMMs
   have a few rows per expert and their grouped kernels reach a kernel-dependent fraction of a
   dense kernel's rate, which rule 7 fits on its own (a user's own benchmark,
   ``include_serving``, fits its own model, MoE or not).
3. For each such row, the efficiency at which the engine replay reproduces the measurement
   exactly is solved (regula falsi on a monotone function; rows the bracket [0.05, 1] cannot
   reproduce are left out and listed).
4. Family-wide: compute = the median of the family's compute rows (memory held), memory = that
   of its memory rows (compute held), every engine together, **one vote per campaign** (each
   source's median, then the median of those: rows of one campaign share a machine, a build and
   a method, so 165 rows of one campaign are not 165 independent pieces of evidence); two rounds
   from the defaults (0.70 / 0.80), values rounded to 3 decimals.
5. Per class: the same medians over the rows of one (family, engine), starting from the
   family-wide values. A parameter with fewer than :data:`MIN_CLASS_ROWS` solved rows in the
   class falls back to the family-wide value (a median of one or two rows is one campaign's
   quirk, not an engine's speed).
6. A row is predicted with, per parameter, the first of (:func:`ceiling_for`): its class's own
   value; its family's; where the family has no calibrating row of that kind (a new GPU
   generation), its predecessor generation's (the same engine's class there, else that family's;
   :data:`~simulator.validation.replay.FAMILY_PREDECESSOR`); else the median of the engine's own class
   values on the other families; else the median of every fitted family; else the defaults,
   fitted on nothing.
7. The routed experts' grouped GEMMs (``Efficiency.expert``: the fraction of the compute and
   memory ceilings that an MoE layer's expert GEMMs reach) get one table-wide value. A row
   *calibrates experts* when it is a static-batch decode figure of an MoE model (as rule 2:
   decode-dominated) whose last decode step spends more than half its whole time, at full
   efficiency, in expert GEMMs. Each such row is solved for the fraction with its own class's
   ceilings held (rule 6); the value is the median over campaigns of each campaign's median
   (one vote per campaign), rounded to 3 decimals; with no such row, 1 (as dense GEMMs). Every
   row of an MoE model is predicted with it; dense models have no expert GEMMs. A user's own
   benchmark (``include_serving``) keeps its GPU's value: its MoE rows fit compute and memory.

8. The host seconds per sequence of the engine profiles in :data:`HOST_FIT_PROFILES` (TensorRT-LLM
   1.0's Python executor, of which no profile is published) are chosen from :data:`HOST_GRID`:
   every row replayed with such a profile is predicted at each grid value with its ceilings
   (rule 6), and the value with the smallest median over campaigns of each campaign's median
   |log(predicted / measured)| is kept (one vote per campaign; the smallest value on a tie). A
   fold with no other campaign of the profile uses :data:`HOST_PRIOR` (the C++ executor's
   estimate), never the shipped profile's own value, which is the in-sample fit.

Out of sample (:func:`cross_validate`): for each ``source_id``, the whole fit (family-wide, per
class, experts, host) uses every OTHER source's rows and predicts that source's rows; no row is ever
scored with parameters fitted on its own source. An engine measured by one source only on a
family therefore gets the family-wide ceilings of the other engines out of sample: the
fallback, not its own rows. In sample: one fit on every row. Per-row solutions are remembered
by (row, parameter, value held), so folds that agree on a class reuse them, and runs are
remembered by the replayer (which prepares a run once for all its trial efficiencies:
:mod:`simulator.validation.prepared`). With ``workers`` > 1 the in-sample fit and the folds run
side by side, their rows solved in worker processes (:mod:`simulator.validation.pool`), each
(row, parameter, value held) once: the same solutions, so the same fits, as one after another.

Why this module is over 600 lines: the fitting rules (1-8 above) and the leave-one-source-out
loop that re-applies them per fold are one procedure; split apart, a fold could no longer be read
as "the same rule with one source left out".
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.cost.step_cost import StepCost
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.engine_profile import load_engine_profile
from simulator.model.gpu_family import FAMILY_PREDECESSOR, GPU_FAMILIES, _gpu
from simulator.model.kernel_ceilings import CEILINGS, END_TO_END, with_ceilings
from simulator.model.operators import ExpertGemm
from simulator.model.precision import parse_precision
from simulator.model.step import Step
from simulator.plan.deployment_planner import plan_deployment
from simulator.validation import replay as replay_module
from simulator.validation.bands import Residual
from simulator.validation.pool import RunPool, relaxed_collection
from simulator.validation.replay import DEFAULT_EFFICIENCIES, Efficiencies, Prediction, Replayed, Replayer, _model

# BOUNDS and solve_increasing are re-exported: rule 3 names them here, and so do its tests
from simulator.validation.solving import BOUNDS as BOUNDS
from simulator.validation.solving import row_solution
from simulator.validation.solving import solve_increasing as solve_increasing
from simulator.validation.table import Row

ROUNDS = 2
DECIMALS = 3
MIN_CLASS_ROWS = 3
"""Fewest solved rows of a kind for a (family, engine) class to get its own ceiling (rule 5)."""
SOLVES_PER_JOB = 4
"""Rows a worker is handed to solve at a time (a dozen replays each): rows of one request are often of one campaign
and deployment, whose preparation the worker then shares, and the parent wakes up once per job, not per row."""
FIT_THREADS = 64
"""Most fits (in sample, folds) run side by side when a pool solves their rows (each waits on its solutions)."""
HOST_FIT_PROFILES: tuple[str, ...] = ("trtllm",)
"""Engine profiles whose host seconds per sequence are fitted (rule 8)."""
HOST_GRID: tuple[float, ...] = (0.0, 5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 60e-6)
"""Host seconds per sequence per iteration tried for them (0 to 60 us)."""
HOST_PRIOR = 2e-6
"""What a fold with no other campaign of such a profile uses: the C++ executor's estimate (trtllm-v0.yaml)."""
DECODE_METRICS = (
    "tpot_seconds", "decode_tokens_per_second_per_sequence", "output_tokens_per_second", "total_tokens_per_second",
    "e2e_seconds", "request_throughput",
)


# --- which rows calibrate what -------------------------------------------------------------------

@functools.cache
def _roofline_system(model: str, gpu: str, tp: int, weights: str, kv: str, context: int, profile: str = "ideal"):
    """The row's system at full efficiency (ceilings 1), with the engine's launches, host time and collectives."""
    bare = _gpu(gpu).with_efficiency(compute=1.0, memory=1.0)
    spec = _model(model)
    deployment = plan_deployment(spec, bare, parse_precision(weights, kv), 1, min(context, spec.max_context), tp=tp,
                                 require_fit=False, engine=load_engine_profile(profile), collectives="auto")
    return deployment.system


def _shares(cost) -> tuple[float, float]:
    """(compute-bound share, memory-bound share) of a step's whole time at full efficiency.

    The whole time includes collectives, kernel launches and the engine's exposed host time, so a
    step that those fixed costs dominate calibrates nothing: solving a ceiling on it would fold
    the fixed costs into the ceiling (a batch-1 decode of a small model on a fast GPU).
    """
    compute, memory = float(cost.compute_bound_seconds), float(cost.memory_bound_seconds)
    total = float(cost.seconds) + float(cost.communication_seconds)
    return (compute / total, memory / total) if total > 0 else (0.0, 0.0)


def calibration_role(row: Row, include_serving: bool = False) -> str | None:
    """'compute', 'memory' or None for a row (rules 1-2 of the module docstring); None when it cannot be built.

    ``include_serving`` (a user's calibration, which may have no static batch) also lets serving
    rows calibrate: a TTFT mean/median whose batch-1 prefill is compute-bound, a TPOT/ITL
    mean/median (or a throughput of a run generating at least its prompt) whose batch-1 decode
    step at the final context is memory-bound. The running batch of a serving run is not known
    before it is simulated, so these tests are approximate.
    """
    if row.replicas > 1:
        return None
    try:
        spec = _model(row.model)
    except InputError:
        return None
    if spec.is_moe and not include_serving:
        # The ceilings are those of dense GEMMs and GEMVs. An MoE step's expert GEMMs have a few rows per
        # expert, and their grouped kernels reach a fraction of a dense kernel's rate that depends on the
        # kernel: one B200 deployment of Llama 4 Scout at batch 1 decodes in 7.60 or 12.84 ms per token
        # with two MoE kernels (flashinfer issue 1734, rows 3004-3005). MoE rows of the shipped table fit
        # that fraction only (rule 7); a user's own benchmark (include_serving) fits its own model, MoE or not.
        return None
    if not row.is_static_batch:
        return _serving_role(row) if include_serving else None
    try:
        if row.input_tokens + row.output_tokens > spec.max_context:
            return None  # the replay skips it
        system = _roofline_system(row.model, row.gpu, row.tp, row.weights, row.kv, row.input_tokens + row.output_tokens,
                                  row.profile[0])
    except InputError:
        return None
    if row.metric == "ttft_seconds":
        prefill = system.step_cost(Step.prefill(int(row.batch), row.input_tokens))  # type: ignore[arg-type]
        return "compute" if _shares(prefill)[0] > 0.5 else None
    last = _last_decode_step(row, system)
    return "memory" if last is not None and _shares(last)[1] > 0.5 else None


def _last_decode_step(row: Row, system: System) -> StepCost | None:
    """The last decode step's cost at full efficiency of a static row whose figure is a decode one and whose
    run is decode-dominated (rule 2: decode >= 80% of the closed batch's roofline time, or a TPOT), else None."""
    if row.metric not in DECODE_METRICS or row.output_tokens < 2:
        return None
    batch = int(row.batch)  # type: ignore[arg-type]
    prefill = system.step_cost(Step.prefill(batch, row.input_tokens))
    contexts = row.input_tokens + np.arange(1, row.output_tokens, dtype=float)
    decode = float(np.sum(system.step_cost(Step.decode(float(batch), contexts)).seconds))
    if row.metric != "tpot_seconds" and decode < 0.8 * (decode + float(prefill.seconds)):
        return None
    return system.step_cost(Step.decode(batch, row.input_tokens + row.output_tokens - 1))


def _serving_role(row: Row) -> str | None:
    context = row.input_tokens + row.output_tokens
    try:
        system = _roofline_system(row.model, row.gpu, row.tp, row.weights, row.kv, context,
                                  row.profile[0])
        limit = _model(row.model).max_context
    except InputError:
        return None
    if row.metric in ("ttft_mean_seconds", "ttft_p50_seconds"):
        prefill = system.step_cost(Step.prefill(1, min(row.input_tokens, limit - 1)))
        return "compute" if _shares(prefill)[0] > 0.5 else None
    decode_metric = row.metric.startswith(("tpot_mean", "tpot_p50", "itl_mean", "itl_p50"))
    throughput = row.kind == "throughput" and row.output_tokens >= row.input_tokens
    if not (decode_metric or throughput):
        return None
    last = system.step_cost(Step.decode(1, min(context, limit) - 1))
    return "memory" if _shares(last)[1] > 0.5 else None


def expert_role(row: Row) -> bool:
    """Does ``row`` calibrate the expert GEMMs' fraction (rule 7 of the module docstring)?"""
    if row.replicas > 1 or not row.is_static_batch or row.metric not in DECODE_METRICS or row.output_tokens < 2:
        return False
    try:
        spec = _model(row.model)
        if not spec.is_moe or row.input_tokens + row.output_tokens > spec.max_context:
            return False
        system = _roofline_system(row.model, row.gpu, row.tp, row.weights, row.kv, row.input_tokens + row.output_tokens,
                                  row.profile[0])
    except InputError:
        return False
    last = _last_decode_step(row, system)
    if last is None:
        return False
    experts = sum(float(cost.seconds) for op, cost in zip(system.operators, last.operators) if isinstance(op, ExpertGemm))
    total = float(last.seconds) + float(last.communication_seconds)
    return total > 0 and experts / total > 0.5


# --- solving one row -----------------------------------------------------------------------------

class Solver:
    """Per-row solutions through a Replayer, remembered by (row, parameter, value held).

    With a :class:`~simulator.validation.pool.RunPool`, rows are solved in its worker processes:
    :meth:`request` starts solving rows there, :meth:`solve` waits for a row's solution; one row's
    (parameter, held) is solved once however many threads ask for it. A solution is a pure function of
    (row, parameter, held), so the values are the same as solved here, one after another.
    """

    def __init__(self, replayer: Replayer, include_serving: bool = False, pool: RunPool | None = None) -> None:
        self.replayer = replayer
        self.include_serving = include_serving
        self.pool = pool
        self._solved: dict[tuple, float | None] = {}
        self._pending: dict[tuple, tuple[Future[list[tuple[float | None, list[tuple]]]], int]] = {}
        """key -> (the pool's job solving it, its place among the job's solutions)"""
        self._lock = threading.Lock()
        self._cancelled = False
        self._roles: dict[Row, str | None] = {}
        self._expert_roles: dict[Row, bool] = {}

    def role(self, row: Row) -> str | None:
        if row not in self._roles:
            self._roles[row] = calibration_role(row, self.include_serving)
        return self._roles[row]

    def expert_role(self, row: Row) -> bool:
        """Does ``row`` calibrate the expert GEMMs (never for a user's own benchmark, rule 7)?"""
        if self.include_serving:
            return False
        if row not in self._expert_roles:
            self._expert_roles[row] = expert_role(row)
        return self._expert_roles[row]

    def cancel(self) -> None:
        """Give up: solutions not started are cancelled, and any thread asking for one gets CancelledError."""
        with self._lock:
            self._cancelled = True
            for job, _ in self._pending.values():
                job.cancel()

    def request(self, jobs: Iterable[tuple[Row, str, float | Efficiencies]]) -> None:
        """Start solving ``jobs`` (row, parameter, held) in the pool's workers (without a pool: nothing to do yet)."""
        if self.pool is None:
            return
        with self._lock:
            if self._cancelled:
                raise CancelledError("the validation was stopped")
            self._submit([key for key in dict.fromkeys(jobs) if key not in self._solved and key not in self._pending])

    def _submit(self, keys: list[tuple]) -> None:
        """Hand ``keys`` to the pool, :data:`SOLVES_PER_JOB` to a job (the caller holds the lock)."""
        assert self.pool is not None
        for start in range(0, len(keys), SOLVES_PER_JOB):
            chunk = keys[start:start + SOLVES_PER_JOB]
            job = self.pool.solve(chunk)
            for index, key in enumerate(chunk):
                self._pending[key] = (job, index)

    def solve(self, row: Row, parameter: str, held: float | Efficiencies) -> float | None:
        """The ``parameter`` efficiency reproducing ``row``: 'compute'/'memory' with the other held at ``held``,
        or 'expert' with both ceilings held at ``held`` (an :class:`Efficiencies`)."""
        key = (row, parameter, held)
        if self.pool is not None:
            return self._pooled(key)
        if key not in self._solved:
            self._solved[key] = self._solve(row, parameter, held)
        return self._solved[key]

    def _pooled(self, key: tuple) -> float | None:
        if key in self._solved:  # solutions are only ever added: a solved key (most are, by another fit) needs no lock
            return self._solved[key]
        with self._lock:
            if self._cancelled:
                raise CancelledError("the validation was stopped")
            if key in self._solved:
                return self._solved[key]
            if key not in self._pending:
                self._submit([key])
            job, index = self._pending[key]
        value, ran = job.result()[index]
        with self._lock:
            if key not in self._solved:
                self._solved[key] = value
                self._pending.pop(key, None)
                self.replayer.count_runs(ran)
        return value

    def _solve(self, row: Row, parameter: str, held: float | Efficiencies) -> float | None:
        return row_solution(self.replayer, row, parameter, held)


# --- fitting -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FamilyFit:
    """One family's (``engine`` None) or one (family, engine) class's ceilings, the rows each came from,
    and rows whose solution fell outside the bracket.

    For a class, ``compute_from_family``/``memory_from_family`` say the parameter had fewer than
    :data:`MIN_CLASS_ROWS` rows and is the family-wide value (its rows are then empty).
    """

    family: str
    compute: float
    memory: float
    compute_rows: tuple[str, ...] = ()
    memory_rows: tuple[str, ...] = ()
    unsolved_rows: tuple[str, ...] = ()
    engine: str | None = None
    compute_from_family: bool = False
    memory_from_family: bool = False

    @property
    def efficiencies(self) -> Efficiencies:
        return Efficiencies(self.compute, self.memory)

    @property
    def compute_is_default(self) -> bool:
        return not self.compute_rows and not self.compute_from_family

    @property
    def memory_is_default(self) -> bool:
        return not self.memory_rows and not self.memory_from_family


class Fit(dict[str, FamilyFit]):
    """family -> the family-wide fit, plus ``classes``: (family, engine) -> that class's fit.

    Only classes with at least one calibrating row are listed; a row of any other class is
    predicted with its family-wide fit (:func:`efficiencies_for`).
    """

    def __init__(self, families: dict[str, FamilyFit] | None = None,
                 classes: dict[tuple[str, str], FamilyFit] | None = None) -> None:
        super().__init__(families or {})
        self.classes: dict[tuple[str, str], FamilyFit] = dict(classes or {})
        self.expert: float | None = None
        """the expert GEMMs' fraction of the ceilings (rule 7); None: no row calibrates it"""
        self.expert_rows: tuple[str, ...] = ()
        self.expert_unsolved: tuple[str, ...] = ()
        self.host: dict[str, float] = {}
        """engine profile -> its fitted host seconds per sequence (rule 8; set by :func:`cross_validate`)"""
        self.host_rows: dict[str, tuple[str, ...]] = {}


def _median(solver: Solver, rows: list[Row], parameter: str, held: float | Callable[[Row], Efficiencies],
            default: float, least: int = 1) -> tuple[float, tuple[str, ...], tuple[str, ...]]:
    """(median over sources of each source's median solution, rows used, rows unsolved).

    ``held``: the other ceiling, or (for 'expert') a row's ceilings. ``default`` when fewer than
    ``least`` rows solve. One vote per campaign: rows of one campaign share its machine, build and
    method, so they are not independent evidence, and a pooled median would let the largest
    campaign (165 LMDeploy rows on A100) decide a whole family's ceiling.
    """
    helds = [held(row) if callable(held) else held for row in rows]
    request = getattr(solver, "request", None)  # all at once, where a pool solves them (any object with solve will do)
    if request is not None:
        request((row, parameter, h) for row, h in zip(rows, helds))
    solved = [(row, solver.solve(row, parameter, h)) for row, h in zip(rows, helds)]
    kept = [(row, v) for row, v in solved if v is not None]
    unsolved = tuple(row.id for row, v in solved if v is None)
    if len(kept) < least or not kept:
        return default, (), unsolved
    return round(_campaign_median(kept), DECIMALS), tuple(row.id for row, _ in kept), unsolved


def _campaign_median(values: list[tuple[Row, float]]) -> float:
    """The median over sources of each source's median value: one vote per campaign (``values`` not empty)."""
    by_source: dict[str, list[float]] = {}
    for row, value in values:
        by_source.setdefault(row.source_id, []).append(value)
    return statistics.median(statistics.median(v) for v in by_source.values())


def fit(rows: Iterable[Row], solver: Solver, rounds: int = ROUNDS,
        fallback: Efficiencies = DEFAULT_EFFICIENCIES) -> Fit:
    """Family-wide and per-(family, engine) ceilings from ``rows`` (rules 4-5 of the module docstring).

    ``fallback`` is used where a family has no row of a kind.
    """
    rows = list(rows)
    fits = Fit()
    by_family: dict[str | None, list[Row]] = {}
    for row in rows:
        by_family.setdefault(row.family, []).append(row)
    for family in GPU_FAMILIES:
        members = by_family.get(family, [])
        compute_rows = [row for row in members if solver.role(row) == "compute"]
        memory_rows = [row for row in members if solver.role(row) == "memory"]
        wide = _fit_rows(solver, family, None, compute_rows, memory_rows, fallback, rounds)
        fits[family] = wide
        by_class: dict[str, tuple[list[Row], list[Row]]] = {}
        for kind, calibrating in enumerate((compute_rows, memory_rows)):
            for row in calibrating:
                by_class.setdefault(row.runtime, ([], []))[kind].append(row)
        for engine, (compute_of, memory_of) in sorted(by_class.items()):
            fits.classes[(family, engine)] = _fit_rows(solver, family, engine, compute_of, memory_of, fallback,
                                                       rounds, wide)
    expert_rows = [row for row in rows if solver.expert_role(row)]
    if expert_rows:
        # each row solved with its own class's ceilings (rule 6), the expert fraction free
        value, used, unsolved = _median(solver, expert_rows, "expert", lambda row: efficiencies_for(fits, row, fallback),
                                        fallback.expert)
        fits.expert = value if used else None
        fits.expert_rows, fits.expert_unsolved = used, unsolved
    return fits


def _fit_rows(solver: Solver, family: str, engine: str | None, compute_rows: list[Row], memory_rows: list[Row],
              fallback: Efficiencies, rounds: int, wide: FamilyFit | None = None) -> FamilyFit:
    """One family-wide fit (``wide`` None) or one class fit falling back to ``wide`` per parameter."""
    least = 1 if wide is None else MIN_CLASS_ROWS
    start = fallback if wide is None else wide.efficiencies
    compute, memory = start.compute, start.memory
    used_c: tuple[str, ...] = ()
    used_m: tuple[str, ...] = ()
    bad_c: tuple[str, ...] = ()
    bad_m: tuple[str, ...] = ()
    # a class with fewer candidate rows than `least` cannot reach it: no solve is spent on it
    fit_c, fit_m = len(compute_rows) >= least, len(memory_rows) >= least
    for _ in range(rounds if fit_c and fit_m else 1):
        if fit_c:
            compute, used_c, bad_c = _median(solver, compute_rows, "compute", memory, start.compute, least)
        if fit_m:
            memory, used_m, bad_m = _median(solver, memory_rows, "memory", compute, start.memory, least)
    from_family_c = wide is not None and not used_c and not wide.compute_is_default
    from_family_m = wide is not None and not used_m and not wide.memory_is_default
    return FamilyFit(family, compute, memory, used_c, used_m, bad_c + bad_m, engine, from_family_c, from_family_m)


def ceiling_for(fits: Fit, family: str | None, engine: str, parameter: str,
                fallback: Efficiencies = DEFAULT_EFFICIENCIES) -> tuple[float, str]:
    """(``parameter`` ceiling, where it came from) for a (family, engine): the first of

    - ``class``: the class's own value (at least :data:`MIN_CLASS_ROWS` rows);
    - ``family``: the family-wide value, every engine of the family voting;
    - ``predecessor class`` / ``predecessor``: the family has no row of this kind (a new GPU
      generation), so its predecessor's (:data:`~simulator.validation.replay.FAMILY_PREDECESSOR`, walked
      back while a generation has none): the same engine's class there, else that family's value;
    - ``engine elsewhere``: no predecessor has such a row, so the median of the engine's own class
      values on the other families: an engine's kernels reach a similar fraction of a GPU's peak from
      one generation to the next more closely than 0.70 / 0.80 fitted on nothing;
    - ``all families``: none of these, so the median of every family-wide value;
    - ``default``: nothing fitted at all (``fallback``).
    """
    def fitted(f: FamilyFit) -> bool:
        return bool(f.compute_rows if parameter == "compute" else f.memory_rows)

    own = fits.classes.get((family, engine)) if family is not None else None
    if own is not None and fitted(own):
        return getattr(own, parameter), "class"
    wide = fits.get(family) if family is not None else None
    if wide is not None and fitted(wide):
        return getattr(wide, parameter), "family"
    ancestor = FAMILY_PREDECESSOR.get(family) if family is not None else None
    while ancestor is not None:
        older_class = fits.classes.get((ancestor, engine))
        if older_class is not None and fitted(older_class):
            return getattr(older_class, parameter), "predecessor class"
        older = fits.get(ancestor)
        if older is not None and fitted(older):
            return getattr(older, parameter), "predecessor"
        ancestor = FAMILY_PREDECESSOR.get(ancestor)
    same_engine = [getattr(c, parameter) for (_, e), c in fits.classes.items() if e == engine and fitted(c)]
    if same_engine:
        return round(statistics.median(same_engine), DECIMALS), "engine elsewhere"
    families = [getattr(f, parameter) for f in fits.values() if fitted(f)]
    if families:
        return round(statistics.median(families), DECIMALS), "all families"
    return getattr(fallback, parameter), "default"


def efficiencies_for(fits: Fit, row: Row, fallback: Efficiencies = DEFAULT_EFFICIENCIES) -> Efficiencies:
    """The ceilings a row is predicted with, each parameter from the first source :func:`ceiling_for` finds."""
    compute, _ = ceiling_for(fits, row.family, row.runtime, "compute", fallback)
    memory, _ = ceiling_for(fits, row.family, row.runtime, "memory", fallback)
    return Efficiencies(compute, memory, fallback.expert if fits.expert is None else fits.expert)


# --- scoring -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scored:
    """A row with its in-sample and out-of-sample predictions (values None when skipped)."""

    row: Row
    in_sample: Prediction
    out_of_sample: Prediction
    role: str | None = None

    @staticmethod
    def _error(prediction: Prediction, measured: float) -> float | None:
        return None if prediction.value is None else (prediction.value - measured) / measured

    @property
    def error_in(self) -> float | None:
        """Signed relative error (predicted - measured) / measured, in sample."""
        return self._error(self.in_sample, self.row.measured)

    @property
    def error_out(self) -> float | None:
        """Signed relative error out of sample (parameters fitted without this row's source)."""
        return self._error(self.out_of_sample, self.row.measured)

    @property
    def skipped(self) -> str:
        return self.out_of_sample.skipped or self.in_sample.skipped


@dataclass(frozen=True)
class Validation:
    """The whole table scored: rows, the in-sample fit, and each source's fold fit."""

    scored: tuple[Scored, ...]
    in_sample_fit: Fit
    fold_fits: dict[str, Fit] = field(default_factory=dict)
    engine_runs: int = 0
    ceilings: str = END_TO_END
    """``end-to-end``: the ceilings fitted on the table (rules 1-8); ``kernels``: every row predicted with its GPU's
    kernel-fitted parameters, nothing fitted on the table (:func:`predict_with_kernel_ceilings`)"""


def kernel_efficiencies(row: Row) -> Efficiencies:
    """The parameters a row is predicted with under ``--ceilings kernels``: its GPU's fit on measured GEMM kernels
    (simulator.model.kernel_ceilings), routed experts as dense GEMMs, and for the profiles whose host time rule 8
    fits on this table, :data:`HOST_PRIOR` (the shipped profile's value is that in-sample fit)."""
    host = HOST_PRIOR if row.profile[0] in HOST_FIT_PROFILES else None
    try:
        gpu = with_ceilings(_gpu(row.gpu), CEILINGS)
    except InputError:  # an unknown GPU, or one the file does not cover: the replay skips the row and says why
        return replace(DEFAULT_EFFICIENCIES, host_per_sequence=host, ceilings=CEILINGS)
    return Efficiencies(gpu.efficiency.compute, gpu.efficiency.memory, 1.0, host, CEILINGS)


def predict_with_kernel_ceilings(rows: list[Row], replayer: Replayer, progress: Callable[[str], None] | None = None,
                                 workers: int = 1) -> Validation:
    """Every row predicted with :func:`kernel_efficiencies`: no parameter is fitted on the table, so the in-sample
    and out-of-sample predictions are one, and the error is that of the kernels (fitted on kernel tables) plus
    everything else the time model charges (issue 33, item 4)."""
    wanted = {row.id: kernel_efficiencies(row) for row in rows}
    if progress is not None:
        progress("predicting every row with the kernel-fitted ceilings")
    with relaxed_collection():
        replayer.prefetch([(row, wanted[row.id]) for row in rows], workers)
        predictions = {row.id: replayer.predict(row, wanted[row.id]) for row in rows}
    scored = tuple(Scored(row, predictions[row.id], predictions[row.id]) for row in rows)
    return Validation(scored, Fit(), {}, replayer.engine_runs, ceilings=CEILINGS)


def cross_validate(rows: list[Row], replayer: Replayer, progress: Callable[[str], None] | None = None,
                   out_of_sample: bool = True, group: Callable[[Row], str] | None = None,
                   include_serving: bool = False, fallback: Efficiencies = DEFAULT_EFFICIENCIES,
                   workers: int = 1) -> Validation:
    """In-sample and leave-one-group-out predictions of every row (groups: ``source_id`` unless ``group`` says).

    The fits come first (they share per-row solutions); the predictions they call for are then
    simulated. With ``workers`` > 1 one pool of that many processes (:class:`RunPool`) does both:
    the in-sample fit and every fold's run side by side (a thread each), their rows solved in the
    pool, each (row, parameter, held) once; then the predictions. The results are those of one
    process, which solves and simulates the same things one after another. ``progress`` is told
    what is being done, now and then. ``include_serving`` and ``fallback`` are for a user's
    calibration (see :func:`calibration_role`, :func:`fit`).
    """
    group = group or (lambda row: row.source_id)
    groups = sorted({group(row) for row in rows}) if out_of_sample else []
    with relaxed_collection():
        solver = Solver(replayer, include_serving)
        if workers > 1 and len(rows) >= replay_module.PARALLEL_MIN_RUNS:
            # Every row's roles worked out here, once, before the fit threads read them, and before the workers
            # fork: they start with the configs and deployments these looked up.
            for row in rows:
                solver.role(row)
                solver.expert_role(row)
            solver.pool = RunPool(replayer, workers)
        try:
            return _cross_validate(rows, solver, groups, group, progress, include_serving, fallback, workers)
        finally:
            if solver.pool is not None:
                solver.pool.close()


def _cross_validate(rows: list[Row], solver: Solver, groups: list[str], group: Callable[[Row], str],
                    progress: Callable[[str], None] | None, include_serving: bool, fallback: Efficiencies,
                    workers: int) -> Validation:
    replayer = solver.replayer
    full, fold_fits = _fits(rows, solver, groups, group, fallback, progress)
    wanted = {row.id: efficiencies_for(full, row, fallback) for row in rows}
    held_out: dict[str, Efficiencies] = {}
    for name, fold in fold_fits.items():
        for row in rows:
            if group(row) == name:
                held_out[row.id] = efficiencies_for(fold, row, fallback)
    if not include_serving:
        _fit_host(rows, solver, replayer, full, fold_fits, group, fallback, workers, progress)
        for row in rows:
            profile = row.profile[0]
            if profile in HOST_FIT_PROFILES:
                wanted[row.id] = replace(wanted[row.id], host_per_sequence=full.host.get(profile, HOST_PRIOR))
                if row.id in held_out:
                    fold = fold_fits[group(row)]
                    held_out[row.id] = replace(held_out[row.id], host_per_sequence=fold.host.get(profile, HOST_PRIOR))
    by_id = {row.id: row for row in rows}
    if progress is not None:
        progress("predicting every row in and out of sample")
    replayer.prefetch([(row, wanted[row.id]) for row in rows] + [(by_id[i], e) for i, e in held_out.items()], workers,
                      _pool_replay(solver, progress, "predicting every row in and out of sample"))
    in_sample = {row.id: replayer.predict(row, wanted[row.id]) for row in rows}
    outside = {i: replayer.predict(by_id[i], e) for i, e in held_out.items()}
    scored = tuple(
        Scored(row, in_sample[row.id], outside.get(row.id, Prediction(None, "out-of-sample not computed")),
               solver.role(row) or ("expert" if solver.expert_role(row) else None))
        for row in rows
    )
    return Validation(scored, full, fold_fits, replayer.engine_runs)


def _fits(rows: list[Row], solver: Solver, groups: list[str], group: Callable[[Row], str], fallback: Efficiencies,
          progress: Callable[[str], None] | None) -> tuple[Fit, dict[str, Fit]]:
    """(the in-sample fit, each group's fold fit on the other groups' rows, in ``groups`` order).

    With a pool the fits run in threads side by side, which read the rows' roles: :func:`cross_validate` has worked
    them out before."""
    def fold(name: str) -> Fit:
        return fit([row for row in rows if group(row) != name], solver, fallback=fallback)

    folds: dict[str, Fit] = {}
    if solver.pool is None:
        if progress is not None:
            progress("fitting in sample")
        full = fit(rows, solver, fallback=fallback)
        for number, name in enumerate(groups, start=1):
            if progress is not None:
                progress(f"fold {number}/{len(groups)}: holding out {name}")
            folds[name] = fold(name)
        return full, folds
    if progress is not None:
        progress(f"fitting in sample and {len(groups)} folds side by side")
    threads = ThreadPoolExecutor(max_workers=min(len(groups) + 1, FIT_THREADS), thread_name_prefix="fold")
    try:
        whole = threads.submit(fit, rows, solver, fallback=fallback)
        jobs = {threads.submit(fold, name): name for name in groups}
        for number, job in enumerate(as_completed(jobs), start=1):
            folds[jobs[job]] = job.result()
            if progress is not None:
                progress(f"fold {number}/{len(groups)} fitted (held out {jobs[job]})")
        full = whole.result()
    except BaseException:
        solver.cancel()  # an error or Ctrl-C: the other fits stop at their next solution, not at their end
        raise
    finally:
        threads.shutdown(wait=True)
    return full, {name: folds[name] for name in groups}


def _pool_replay(solver: Solver, progress: Callable[[str], None] | None,
                 doing: str) -> Callable[[list[tuple[Row, Efficiencies]]], Iterator[tuple[int, Replayed]]] | None:
    """The pool's ``replay`` for ``Replayer.prefetch`` (None without a pool), telling ``progress`` how far it got."""
    pool = solver.pool
    if pool is None:
        return None

    def replay(pairs: list[tuple[Row, Efficiencies]]) -> Iterator[tuple[int, Replayed]]:
        for done, ran in enumerate(pool.replay(pairs), start=1):
            if progress is not None and (done % 25 == 0 or done == len(pairs)):
                progress(f"{doing}: {done}/{len(pairs)} runs")
            yield ran

    return replay


def _fit_host(rows: list[Row], solver: Solver, replayer: Replayer, full: Fit, fold_fits: dict[str, Fit],
              group: Callable[[Row], str], fallback: Efficiencies, workers: int,
              progress: Callable[[str], None] | None = None) -> None:
    """Rule 8: each fit's host seconds per sequence for the profiles of :data:`HOST_FIT_PROFILES` (in place).

    A fold predicts the rows of the others with its own ceilings; where the held-out campaign has no
    calibrating row those are the in-sample ceilings, and the runs are shared.
    """
    members = {p: [row for row in rows if row.profile[0] == p] for p in HOST_FIT_PROFILES}
    members = {p: m for p, m in members.items() if m}
    if not members:
        return
    calibrating = {group(row) for row in rows if solver.role(row) is not None or solver.expert_role(row)}
    # a fold's value matters only for the held-out campaign's own rows of such a profile
    fits: dict[str | None, Fit] = {None: full}
    held_out = {group(row) for m in members.values() for row in m}
    fits.update({name: fold for name, fold in fold_fits.items() if name in held_out})

    def ceilings(fit_key: str | None, row: Row) -> Efficiencies:
        own = fits[fit_key] if fit_key is None or fit_key in calibrating else full
        return efficiencies_for(own, row, fallback)

    needed = {(row.id, ceilings(key, row), value): row for key in fits for m in members.values() for row in m
              if key is None or group(row) != key for value in HOST_GRID}
    trials = {k: replace(k[1], host_per_sequence=k[2]) for k in needed}
    doing = f"fitting the host time per sequence of {', '.join(members)}"
    if progress is not None:
        progress(doing)
    replayer.prefetch([(needed[k], trials[k]) for k in needed], workers, _pool_replay(solver, progress, doing))

    def error(row: Row, eff: Efficiencies) -> float | None:
        value = replayer.predict(row, eff).value
        return None if value is None else abs(math.log(value / row.measured))

    for key, fit in fits.items():
        for profile, m in members.items():
            used = [row for row in m if key is None or group(row) != key]
            best: tuple[float, float] | None = None
            for value in HOST_GRID:
                errors = [(row, e) for row in used
                          if (e := error(row, trials[(row.id, ceilings(key, row), value)])) is not None]
                if not errors:
                    break
                score = _campaign_median(errors)
                if best is None or score < best[0] - 1e-12:
                    best = (score, value)
            if best is not None:
                fit.host[profile] = best[1]
                fit.host_rows[profile] = tuple(row.id for row in used)


# --- summaries -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ErrorSummary:
    """median, 90th percentile and max of |error| over ``rows`` rows (fractions; None when no row)."""

    rows: int
    median: float | None
    p90: float | None
    max: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"rows": self.rows, "median": self.median, "p90": self.p90, "max": self.max}


def summarise(errors: Iterable[float | None]) -> ErrorSummary:
    """|error| statistics; p90 is numpy's linear-interpolation percentile of the absolute errors."""
    values = np.abs(np.array([e for e in errors if e is not None], dtype=float))
    if len(values) == 0:
        return ErrorSummary(0, None, None, None)
    return ErrorSummary(len(values), float(np.median(values)), float(np.percentile(values, 90)), float(values.max()))


def grouped(scored: Iterable[Scored], key: Callable[[Row], str | None], which: str) -> dict[str, ErrorSummary]:
    """Summaries by ``key(row)`` of the ``which`` ('in'/'out') errors, keys sorted."""
    groups: dict[str, list[float | None]] = {}
    for s in scored:
        name = key(s.row) or "unknown"
        groups.setdefault(name, []).append(s.error_in if which == "in" else s.error_out)
    return {name: summarise(groups[name]) for name in sorted(groups)}


def report_block(scored: Iterable[Scored], which: str) -> dict[str, object]:
    """The ``in_sample``/``out_of_sample`` object of ``simulate validate --json``."""
    scored = list(scored)
    overall = summarise(s.error_in if which == "in" else s.error_out for s in scored)
    serving = summarise((s.error_in if which == "in" else s.error_out) for s in scored if s.row.mode == "serving")
    return {
        **overall.as_dict(),
        "by_engine": {k: v.as_dict() for k, v in grouped(scored, lambda r: r.engine, which).items()},
        "by_family": {k: v.as_dict() for k, v in grouped(scored, lambda r: r.family, which).items()},
        "by_regime": {k: v.as_dict() for k, v in grouped(scored, lambda r: r.regime, which).items()},
        "serving": serving.as_dict(),
    }


def residuals(scored: Iterable[Scored]) -> list[Residual]:
    """The out-of-sample signed errors of the rows that ran, with their classes (for error bands)."""
    out = []
    for s in scored:
        error = s.error_out
        if error is not None and s.row.family is not None:
            out.append(Residual(s.row.family, s.row.engine, s.row.regime, s.row.kind, error))
    return out
