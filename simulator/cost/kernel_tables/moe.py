"""MoE expert latency from NVIDIA AIConfigurator's measured ``moe/`` tables.

What a latency includes, from the collector's code (``collector/<engine>/collect_moe.py`` and
``collector/helper.py`` of ai-dynamo/aiconfigurator):

- One MoE layer's routed experts on one GPU, given the router's logits: the router GEMM (hidden ->
  experts logits) is *not* in it (the collector passes logits it made), nor any all-to-all or
  all-reduce (one GPU; TensorRT-LLM ``reduce_results=False``), nor shared experts.
- TensorRT-LLM 1.3 (``create_moe`` with ``RenormalizeMoeRoutingMethod``, CUTLASS backend on Hopper):
  ``moe.forward(hidden, logits, do_finalize=True)``: the routing kernel (softmax, top-k,
  renormalise), the permutation of the (token, expert) rows, the gate/up grouped GEMM, the SwiGLU,
  the down grouped GEMM and the finalize (un-permute and weighted sum of the k outputs); FP8 rows
  include the activation quantisation. vLLM 0.24: ``FusedMoE(hidden, logits)``, the production
  module: ``topk_softmax``, ``moe_align_block_size``, both grouped GEMMs (Triton, or FlashInfer
  CUTLASS for FP8), ``silu_and_mul`` and ``moe_sum``. SGLang 0.5: ``select_experts`` (top-k) then
  Triton ``fused_moe`` (align, both GEMMs, activation, sum); under expert parallelism the rank's
  rows are pre-routed, so top-k is not in those rows.
- Timed as the mean device time of CUDA-graph replays after warm-up (``benchmark_with_power``): no
  host launch, each kernel's GPU-side launch in it. One copy of the weights (not rotated as the
  GEMM collector does): a rank whose touched experts fit in L2 (50 MB on H100) may read part of
  them from L2.
- ``num_tokens``: the tokens the GPU holds before routing (attention is tensor-parallel, so every
  rank routes all of them), ``topk`` picks each. ``inter_size`` is an expert's whole intermediate
  size; ``moe_tp_size`` splits it (each GPU a 1/tp column/row slice of every expert) and
  ``moe_ep_size`` splits the experts (the GPU holds experts/ep whole experts, rank 0's, and
  computes only the rows routed to them). vLLM measures (tp, 1) or (1, ep) only.
- ``distribution``: ``balanced`` routes token i to experts (i + j * ceil(E / k)) mod E, j < k: every
  expert the same number of rows (``balanced_logits``); ``power_law_<alpha>`` draws per-expert
  token counts from a power law (``power_law_logits_v3``, the mean of 5 draws). Latencies are stored
  in milliseconds; they are converted to seconds on reading.
- ``moe_dtype``: bfloat16, fp8 (per-tensor), fp8_block (128 x 128 block scales), int4_wo
  (weight-only int4, Marlin/CUTLASS), nvfp4, w4a16_mxfp4 and others; activations are bf16 in.

A table is keyed by (experts' dtype, hidden size, expert intermediate size, experts, top-k, moe_tp,
moe_ep, distribution, gated): each key holds latencies at the measured token counts (1 to 16,384
on Hopper). Gated: TensorRT-LLM labels its non-gated (ReLU2) rows ``moe_torch_flow_nongated``;
other engines' rows are all gated (SwiGLU). Duplicate rows are averaged; then a latency above that
of a larger token count is cut to it (a step of fewer tokens can run as one of more: the excess is
the kernel choice's or the clock's noise); :meth:`MoeTable.rows` gives the largest such cut of a key.

How memwall charges it. An MoE layer is several operators (:meth:`simulator.model.layers._Builder.moe`):
the router GEMM, ``moe_topk``, ``moe_align``, (dispatch), the gate/up expert GEMM, the activation,
the down expert GEMM, ``experts_combine``, (combine), shared experts. The measured latency covers
exactly the *block* ``moe_topk``, ``moe_align``, gate/up, activation, down, ``experts_combine``
(:data:`BLOCK_OPERATORS`), so it is charged once, over those six: each gets the measured block time
times its share of the block's speed-of-light time (``max(flops / peak, bytes / bandwidth)`` plus
one GPU-side launch per kernel, at the datasheet peaks), so the six add up to the table's latency.
The router GEMM stays with the GEMM table, dispatch/combine with the collective model, shared
experts with the GEMM table.

Never a silent extrapolation: in tokens, the latency is interpolated linearly in (log tokens, log
seconds) between measured counts; beyond the largest it is the edge latency times the block's
speed-of-light ratio (the roofline scaled to agree with the table at its edge); a step below the
smallest (1 token) is scaled the same way at 1 token. A shape, dtype, layout (tp, ep) or routing skew no table
measures gets no curve, and the six operators are timed by the roofline path as before. Only
uniform routing (``--routing-skew 0``, the table's ``balanced``) is looked up: the collector's
power law is over per-expert token counts, not memwall's Zipf exponent over expert rank, so a
skewed run is not matched to it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from simulator.cost.kernel_tables.parquet import codes, numbers, read_parquet
from simulator.cost.kernel_tables.table import TableOrigin, mean_grid, suffix_minimum
from simulator.errors import InputError
from simulator.model.gpu import GPUSpec
from simulator.model.operators import ExpertGemm, Operator
from simulator.model.step import Number, Step

MOE_INCLUDES = ("CUDA-graph replay device time of one MoE layer's routed experts from router logits (no host "
                "launch): routing/top-k, row permutation, gate/up and down grouped GEMMs, activation, weighted sum")

BLOCK_OPERATORS: tuple[str, ...] = ("moe_topk", "moe_align", "experts_gate_up", "experts_up", "experts_activation",
                                    "experts_down", "experts_combine")
"""operator names (simulator.model.layers) whose work the measured MoE latency covers"""

DTYPES: dict[str, str] = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4_wo",
                          "nvfp4": "nvfp4"}
"""the database's moe_dtype -> memwall's expert format (others, e.g. w4a16_mxfp4, are not read)"""

MoeKey = tuple[str, int, int, int, int, int, int, str, bool]
"""(dtype, hidden size, expert intermediate size, experts, top-k, moe_tp, moe_ep, distribution, gated)"""


@dataclass(frozen=True, eq=False)
class MoeTable:
    """Measured MoE latencies of one engine release on one GPU, row by row; :meth:`rows` gathers one key's curve.

    ``keys`` are the distinct keys, ``code`` each row's index into them; a key's curve is built on first use
    (a file holds ~4,600 keys, a run uses one)."""

    origin: TableOrigin
    keys: tuple[MoeKey, ...]
    code: np.ndarray
    tokens: np.ndarray
    seconds: np.ndarray
    _curves: dict = field(default_factory=dict, compare=False, repr=False)

    def rows(self, key: MoeKey) -> tuple[np.ndarray, np.ndarray, float] | None:
        """(token counts, seconds, smoothing) of ``key``, or None where it is not measured: duplicate rows averaged,
        then each latency the least of its own and those of every larger count; ``smoothing`` is the largest
        relative cut that made (module docstring)."""
        if key not in self._curves:
            self._curves[key] = None
            if key in self.keys:
                where = self.code == self.keys.index(key)
                (counts,), mean = mean_grid(self.seconds[where], self.tokens[where])
                smoothed, cut = suffix_minimum(mean)
                self._curves[key] = (counts, smoothed, cut)
        return self._curves[key]


def moe_table(origin: TableOrigin, keys: list[MoeKey], tokens: np.ndarray, seconds: np.ndarray) -> MoeTable:
    """A :class:`MoeTable` from rows (key, tokens, seconds)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    seconds = np.asarray(seconds, dtype=float)
    if len(keys) != len(tokens) or len(tokens) != len(seconds):
        raise InputError(f"{origin.path}: MoE rows need as many keys, token counts and latencies")
    if (tokens < 1).any() or not np.isfinite(seconds).all() or (seconds <= 0).any():
        raise InputError(f"{origin.path}: MoE rows need num_tokens >= 1 and finite latencies > 0")
    index: dict[MoeKey, int] = {}
    code = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64, count=len(keys))
    return MoeTable(origin, tuple(index), code, tokens, seconds)


@functools.lru_cache(maxsize=16)
def read_moe_table(path: str, gpu: str, engine: str, version: str) -> MoeTable:
    """The MoE rows of one ``moe_perf.parquet`` whose dtype memwall times (:data:`DTYPES`)."""
    from simulator.cost.kernel_tables.aiconfigurator import EXTRA_HINT, has_pyarrow

    if not has_pyarrow():
        raise InputError(f"--kernels measured: reading {path} needs pyarrow; {EXTRA_HINT}")
    columns = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
               "moe_ep_size", "distribution", "latency"]
    strings = ["moe_dtype", "distribution", "kernel_source"]
    try:
        table = read_parquet(path, [*columns, "kernel_source"], dictionary=strings)
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the MoE table ({exc})") from None
    names = set(table.column_names)
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputError(f"{path}: the MoE table lacks column(s) {', '.join(missing)}")

    dtype_code, dtype_names = codes(table, "moe_dtype")
    dist_code, dist_names = codes(table, "distribution")
    if "kernel_source" in names:
        source_code, source_names = codes(table, "kernel_source")
        gated = ~np.isin(source_code, [i for i, name in enumerate(source_names) if "nongated" in str(name)])
    else:
        gated = np.ones(table.num_rows, dtype=bool)
    ints = np.column_stack([numbers(table.column(c)).astype(np.int64) for c in columns[2:8]]
                           + [dtype_code, dist_code, gated.astype(np.int64)])
    tokens = numbers(table.column("num_tokens")).astype(np.int64)
    seconds = numbers(table.column("latency")).astype(float) * 1e-3  # milliseconds in the database
    keep = np.isin(dtype_code, [i for i, name in enumerate(dtype_names) if name in DTYPES])
    if (tokens[keep] < 1).any() or not np.isfinite(seconds[keep]).all() or (seconds[keep] <= 0).any():
        raise InputError(f"{path}: MoE rows need num_tokens >= 1 and finite latencies > 0")
    ints = ints[keep]
    origin = TableOrigin(gpu, engine, version, path, MOE_INCLUDES)
    if not len(ints):  # a release that measures only formats memwall does not read (B200, TensorRT-LLM 1.3.0rc23)
        return MoeTable(origin, (), np.zeros(0, dtype=np.int64), tokens[keep], seconds[keep])
    # The distinct keys and each row's: a lexicographic sort, then a new key wherever a column changes.
    order = np.lexsort(ints.T[::-1])
    change = np.r_[True, (np.diff(ints[order], axis=0) != 0).any(axis=1)]
    code = np.empty(len(order), dtype=np.int64)
    code[order] = np.cumsum(change) - 1
    distinct = ints[order][change]
    keys = tuple((DTYPES[dtype_names[d]], h, i, e, k, tp, ep, dist_names[dist], bool(g))
                 for h, i, k, e, tp, ep, d, dist, g in distinct.tolist())
    return MoeTable(origin, keys, code.reshape(-1), tokens[keep], seconds[keep])


def expert_format(op: ExpertGemm) -> str | None:
    """The measured MoE dtype that times an expert GEMM's format, or None (no table holds it)."""
    if op.dequant_ops_per_weight:
        return "int4_wo" if op.weight_bytes_per_element <= 0.5 else None
    if op.compute_dtype == "fp8":
        # Block-scaled FP8 stores scales per weight block; per-tensor FP8 one scale (0 bytes per weight).
        return "fp8_block" if op.scale_bytes_per_weight > 0 else "fp8"
    return {"fp16": "bf16", "bf16": "bf16", "fp4": "nvfp4"}.get(op.compute_dtype)


def block_key(gate_up: ExpertGemm, down: ExpertGemm) -> MoeKey | None:
    """The table key of a layer's routed experts from its two expert GEMMs, or None (skewed routing, or a format no
    table holds).

    The GPU holds len(q) of the ``experts`` (so ep = experts / len(q)); ``down`` is F_gpu x H, and its ``params``
    count all experts' F x H weights (plus an H bias each), so moe_tp = F / F_gpu."""
    dtype = expert_format(down)
    q = np.asarray(down.probabilities)
    if dtype is None or expert_format(gate_up) != dtype or not len(q) or not np.all(q == q[0]):
        return None
    hidden, f_gpu = down.out_features, down.in_features
    f_expert = (down.params // down.experts - down.bias_elements) // hidden
    if f_expert % f_gpu or down.experts % len(q):
        return None
    gated = gate_up.out_features == 2 * f_gpu
    return (dtype, hidden, f_expert, down.experts, down.top_k, f_expert // f_gpu, down.experts // len(q), "balanced",
            gated)


def _token_step(tokens: Number) -> Step:
    """A step of ``tokens`` tokens and nothing else: all the block's operators read (they are token-only)."""
    return Step(tokens=tokens, prefill_tokens=0.0, sequences=0.0, logit_tokens=tokens, attention_pairs=0.0,
                prefill_attention_pairs=0.0, score_elements=0.0, context_tokens=0.0)


@dataclass(frozen=True, eq=False)
class MoeBlock:
    """One MoE layer's measured block: its latency curve in tokens and the operators it is shared over."""

    operators: tuple[Operator, ...]
    log_tokens: np.ndarray
    log_seconds: np.ndarray
    peaks: tuple[float, ...]
    """FLOP/s each operator's speed of light uses (tensor peak of its dtype for the GEMMs, fp32 otherwise)"""
    bandwidth_bytes_per_second: float
    launch_seconds: float
    origin: TableOrigin | None = None
    key: MoeKey | None = None
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def last_tokens(self) -> float:
        return float(np.exp(self.log_tokens[-1]))

    def speed_of_light(self, tokens: Number) -> list[Number]:
        """Each operator's speed-of-light seconds for one layer at ``tokens``: max(flops/peak, bytes/bw) + launches."""
        # The operators take a float or a 1-d array of token counts (not a 0-d array).
        step = _token_step(float(tokens) if np.ndim(tokens) == 0 else np.asarray(tokens, dtype=float))
        out = []
        for op, peak in zip(self.operators, self.peaks):
            work = op.work(step)
            moved = work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
            out.append(np.maximum((work.flops + work.padding_flops) / peak, moved / self.bandwidth_bytes_per_second)
                       + work.launches * self.launch_seconds)
        return out

    def block_seconds(self, tokens: Number) -> Number:
        """Measured seconds of the whole block for one layer at ``tokens`` (0 for none; module docstring beyond)."""
        t = np.asarray(tokens, dtype=float)
        last = self.last_tokens
        clipped = np.clip(t, 1.0, last)
        inside = np.exp(np.interp(np.log(clipped), self.log_tokens, self.log_seconds))
        beyond = (t > last) | ((t > 0) & (t < 1.0))
        if beyond.any():
            # Outside the measured counts: the block's speed of light scaled to the table at its edge.
            ratio = sum(self.speed_of_light(np.where(beyond, t, clipped))) / sum(self.speed_of_light(clipped))
            inside = np.where(beyond, inside * ratio, inside)
        out = np.where(t > 0, inside, 0.0)
        return float(out) if out.ndim == 0 else out

    def shares(self, tokens: Number) -> list[Number]:
        """Each operator's share of the block's speed-of-light time at ``tokens`` (they sum to 1)."""
        if isinstance(tokens, float | int):
            hit = self._memo.get(tokens)
            if hit is not None:
                return hit
        times = self.speed_of_light(tokens)
        total = sum(times)
        fractions = [np.where(total > 0, s / np.where(total > 0, total, 1.0), 0.0) for s in times]
        out: list[Number] = [float(f) if np.ndim(f) == 0 else f for f in fractions]
        if isinstance(tokens, float | int):
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[tokens] = out
        return out


@dataclass(frozen=True, eq=False)
class MoeShareCurve:
    """One block operator's part of the measured MoE latency: ``seconds(tokens)`` for one layer."""

    block: MoeBlock
    index: int

    def seconds(self, rows: Number) -> Number:
        """Seconds of this operator for one layer at a step of ``rows`` tokens: block latency x its share."""
        return self.block.block_seconds(rows) * self.block.shares(rows)[self.index]


def _peak(op: Operator, gpu: GPUSpec) -> float:
    if isinstance(op, ExpertGemm):
        return gpu.peak_flops.get(op.compute_dtype) or gpu.peak(op.compute_dtype)
    return gpu.peak_flops.get("fp32") or max(gpu.peak_flops.values())


def moe_curves(table: MoeTable | None, operators: tuple[Operator, ...], gpu: GPUSpec) -> dict[int, MoeShareCurve]:
    """The measured curve of each MoE block operator in ``operators``, by index; {} where the table does not measure
    the layer (no table, another shape, dtype, layout or routing) or the block is not the one measured."""
    if table is None:
        return {}
    where = {op.name: i for i, op in enumerate(operators) if op.name in BLOCK_OPERATORS}
    gate_name = "experts_gate_up" if "experts_gate_up" in where else "experts_up"
    if gate_name not in where or "experts_down" not in where:
        return {}
    gate_up, down = operators[where[gate_name]], operators[where["experts_down"]]
    if not isinstance(gate_up, ExpertGemm) or not isinstance(down, ExpertGemm):
        return {}
    key = block_key(gate_up, down)
    rows = table.rows(key) if key else None
    if rows is None or len(rows[0]) < 2:
        return {}
    indices = sorted(where.values())
    ops = tuple(operators[i] for i in indices)
    tokens, seconds, _ = rows
    block = MoeBlock(ops, np.log(tokens.astype(float)), np.log(seconds), tuple(_peak(op, gpu) for op in ops),
                     gpu.hbm_bandwidth_bytes_per_second, gpu.efficiency.kernel_launch_seconds, table.origin, key)
    return {i: MoeShareCurve(block, n) for n, i in enumerate(indices)}


def measured_moe(root, folder: str, display: str, family: str, version: str) -> tuple[MoeTable | None, str]:
    """The MoE table of the release nearest ``version`` (the GEMM tables'), and that release ("" where none)."""
    from simulator.cost.kernel_tables import aiconfigurator

    versions = aiconfigurator.measured_versions(root, folder, "moe", family, "moe_perf.parquet")
    if not versions:
        return None, ""
    chosen = aiconfigurator.nearest_release(versions, aiconfigurator.release(version))
    path = root / folder / "moe" / family / chosen / "moe_perf.parquet"
    return read_moe_table(str(path), display, family, chosen), chosen
