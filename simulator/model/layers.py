"""Layer specs: the operators of one forward pass, with weight shapes per GPU.

``build_operators`` turns a ModelSpec + Precision + tensor-parallel degree into a tuple of
operators. Each operator knows *what it does* for a :class:`~simulator.model.step.Step`
(``work``: FLOPs and bytes by kind); :mod:`simulator.cost.step_cost` alone turns that into seconds.

Tensor parallelism follows Megatron-LM: QKV and gate/up projections are split by columns,
output and down projections by rows, heads are split across GPUs, the LM head and the
embedding are split by vocabulary, norms are replicated. When the model has fewer KV heads
than GPUs, each GPU keeps one KV head (replicated), as vLLM does.

Activation traffic is counted per producer/consumer edge: a tensor that goes through HBM
costs its producer a write and its consumer a read; a tensor kept on chip costs neither.

Fusion levels (``fusion``; kernels and activation elements per token per layer for a
LLaMA layer at tp = 1 are worked out in docs/readme-effects.md):
- ``none``: every norm, rotary embedding, activation and residual add is its own kernel that
  reads and writes activations in HBM and pays a kernel launch (11 kernels per LLaMA layer
  with flash attention, 13 with naive attention).
- ``elementwise``: those chains run in the neighbouring GEMM's prologue/epilogue (5 kernels):
  a norm folds into the next GEMM (its per-row 1/rms scales the GEMM's output rows), rotary
  into the QKV epilogue, SiLU(gate) * up into the gate/up epilogue (which then writes F
  wide instead of 2F), and a residual add into the epilogue of the GEMM before it (which
  still reads the H-wide residual; charged to the fused add so GEMM intensities stay the
  textbook ones). Their FLOPs remain; the rest of their traffic and their launches vanish.
  With tp > 1 the add rides on the all-reduce (as TensorRT-LLM fuses them); same bytes.
  Per token per layer this saves 8H + 2(n+g)d + 4F activation elements (LLaMA, tp = 1).
- ``full``: as ``elementwise``, and the attention block (QKV projection, attention, output
  projection) is one fused kernel: q and the attention output never reach HBM, k and v
  go straight into the KV cache. An idealised limit (as a megakernel would), and it needs
  ``flash`` attention: a naive kernel materialises the scores, so it cannot be fused.

Attention kernels (``attention_kernel``):
- ``naive``: three kernels (QK^T, softmax, PV); the score matrix S and the probabilities P
  (one element per query, key and head, the full p x k block) are written to HBM and read
  back: 4 n p k activation elements. Softmax is its own kernel whatever ``fusion`` says.
- ``flash``: one kernel; scores stay in SRAM. Queries are processed in row tiles of ``B_r``
  rows, and K/V are streamed once per row tile, so prefill K/V traffic is
  ~ (pairs / B_r) * 2*g*d*b_kv, on top of one read of every key. The tile rule is
  FlashAttention's (Dao et al. 2022, Algorithm 1): with M the shared memory per SM in
  elements of the activation dtype, B_c = ceil(M / (4 d)) and B_r = min(B_c, d), so tiles
  shrink when the head dimension grows or SRAM is small, giving HBM traffic
  Theta(T^2 d^2 / M) per KV head (= the paper's n T^2 d^2 / M for MHA) while B_r < d.
  The heads of a GQA group share one K/V stream (GQA-packed kernels such as FlashInfer
  and FlashAttention-3); L2 reuse between row tiles is ignored, so this is the paper's
  HBM count, an upper bound on traffic.
- Decode (one query row per sequence) reads the KV cache once with either kernel.

Weight-only quantisation (int8/int4 weights, fp16 compute): every weight is dequantised
once per ``dequant_tile_tokens`` row tile, ``dequant_ops_per_weight`` integer/vector
operations each (simulator/model/precision.py). That work is ``Work.dequant_ops``, kept
apart from the model's FLOPs: :mod:`simulator.cost.step_cost` charges it to the CUDA cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, NamedTuple

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.gpu import GPUSpec
from simulator.model.precision import DTYPE_BYTES, Precision
from simulator.model.step import Number, Step

AttentionKernel = Literal["flash", "naive"]
Fusion = Literal["none", "elementwise", "full"]
ATTENTION_KERNELS: tuple[str, ...] = ("flash", "naive")
FUSIONS: tuple[str, ...] = ("none", "elementwise", "full")

# Approximate vector FLOPs per element of the elementwise operators (they are always
# memory-bound, so these only matter for FLOP totals): RMSNorm/LayerNorm ~4 (square,
# sum, scale, weight), rotary 3 (two multiplies and an add), residual add 1,
# activation 4 (SiLU/GELU: exp, add, divide, multiply), softmax 5 (max, subtract, exp, sum, divide).
NORM_FLOPS_PER_ELEMENT = 4.0
ROTARY_FLOPS_PER_ELEMENT = 3.0
ADD_FLOPS_PER_ELEMENT = 1.0
ACTIVATION_FLOPS_PER_ELEMENT = 4.0
SOFTMAX_FLOPS_PER_SCORE = 5.0


class Work(NamedTuple):
    """What an operator computes and moves in one step, on one GPU, per instance.

    A NamedTuple rather than a dataclass: the engine builds ~15 of these per simulated
    iteration, and tuple construction is several times cheaper.
    """

    flops: Number
    weight_bytes: Number = 0.0
    kv_read_bytes: Number = 0.0
    kv_write_bytes: Number = 0.0
    activation_bytes: Number = 0.0
    link_bytes: Number = 0.0
    launches: Number = 0.0
    dequant_ops: Number = 0.0
    """weight-only dequantisation operations (CUDA-core work, not model FLOPs)"""


def _active(tokens: Number) -> Number:
    """1 where a step has tokens for this operator, else 0 (a kernel that does not run costs nothing)."""
    return 1.0 * (tokens > 0)


def _ceil_div(a: Number, b: float) -> Number:
    return -((-a) // b)


@dataclass(frozen=True)
class Gemm:
    """A weight matrix multiply: (tokens x in_features) @ (in_features x out_features), per GPU.

    ``token_source`` is 'all' (every new token) or 'logits' (LM head: one row per emitting sequence).
    Mixture-of-experts GEMMs hold ``experts`` matrices; each token uses ``top_k`` of them and a
    step reads the expected number of distinct experts its tokens route to.

    Activation traffic per routed token: ``input_read_elements`` read (None: ``in_features``;
    0 when the input is on chip) and ``output_write_elements`` written (None: ``out_features``;
    less when an epilogue shrinks it, 0 when it stays on chip). ``launches_per_step`` is 0
    when the GEMM runs inside a fused block whose launch is counted elsewhere.
    """

    name: str
    count: int
    in_features: int
    out_features: int
    params: int
    resident_bytes: float
    weight_bytes_per_element: float
    scale_bytes_per_weight: float
    bias_elements: int
    activation_bytes_per_element: float
    compute_dtype: str
    dequant_ops_per_weight: float = 0.0
    dequant_tile_tokens: int = 16
    token_source: Literal["all", "logits"] = "all"
    experts: int = 1
    top_k: int = 1
    input_read_elements: int | None = None
    output_write_elements: int | None = None
    launches_per_step: float = 1.0
    kind: str = "gemm"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.logit_tokens if self.token_source == "logits" else step.tokens

    def work(self, step: Step) -> Work:
        tokens = self.tokens(step)
        active = _active(tokens)
        matrix = self.in_features * self.out_features
        if self.experts > 1:
            untouched = (1.0 - self.top_k / self.experts) ** tokens
            matrices_read = self.experts * (1.0 - untouched)
        else:
            matrices_read = active
        weights_read = matrix * matrices_read
        dequant = 0.0
        if self.dequant_ops_per_weight:
            dequant = weights_read * _ceil_div(tokens, self.dequant_tile_tokens) * self.dequant_ops_per_weight
        routed_tokens = tokens * self.top_k
        read = self.in_features if self.input_read_elements is None else self.input_read_elements
        write = self.out_features if self.output_write_elements is None else self.output_write_elements
        b_a = self.activation_bytes_per_element
        return Work(
            flops=2.0 * routed_tokens * matrix,
            weight_bytes=weights_read * (self.weight_bytes_per_element + self.scale_bytes_per_weight)
            + self.bias_elements * b_a * matrices_read,
            activation_bytes=routed_tokens * (read + write) * b_a,
            launches=self.launches_per_step * active,
            dequant_ops=dequant,
        )


@dataclass(frozen=True)
class Attention:
    """Scaled dot-product attention over the KV cache for the heads on one GPU."""

    name: str
    count: int
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_element: float
    activation_bytes_per_element: float
    compute_dtype: str
    kernel: AttentionKernel
    query_tile_rows: int
    io_fused: bool
    """q arrives on chip from the QKV projection and the output stays on chip for o_proj (fusion 'full')"""
    params: int = 0
    resident_bytes: float = 0.0
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads other fields of the step than ``tokens(step)`` (the context, attention pairs)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        n, g, d = self.q_heads, self.kv_heads, self.head_dim
        b_a, b_kv = self.activation_bytes_per_element, self.kv_bytes_per_element
        kv_token_bytes = 2.0 * g * d * b_kv
        io = 0.0 if self.io_fused else 2.0 * step.tokens * n * d * b_a
        if self.kernel == "flash":
            scores = step.attention_pairs
            kv_reads = step.context_tokens + step.prefill_attention_pairs / self.query_tile_rows
            score_traffic = 0.0
            # Under full fusion the kernel is part of the fused attention block launched by qkv_proj.
            launches = 0.0 * step.tokens if self.io_fused else _active(step.tokens)
        else:
            scores = step.score_elements
            kv_reads = step.context_tokens
            score_traffic = 4.0 * n * scores * b_a
            launches = 3.0 * _active(step.tokens)
        return Work(
            flops=4.0 * n * d * scores + SOFTMAX_FLOPS_PER_SCORE * n * scores,
            kv_read_bytes=kv_token_bytes * kv_reads,
            kv_write_bytes=kv_token_bytes * step.tokens,
            activation_bytes=io + score_traffic,
            launches=launches,
        )


@dataclass(frozen=True)
class Elementwise:
    """A norm, rotary embedding, activation or residual add: reads and writes activations.

    When ``fused`` it runs inside a neighbouring GEMM: its FLOPs remain, its launch and its
    traffic vanish except ``fused_read_elements_per_token``, the operand the fused epilogue
    still reads from HBM (a residual add reads the H-wide residual stream).
    """

    name: str
    count: int
    read_elements_per_token: int
    write_elements_per_token: int
    flops_per_token: float
    weight_elements: int
    params: int
    resident_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    fused: bool
    fused_read_elements_per_token: int = 0
    kind: str = "elementwise"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        flops = step.tokens * self.flops_per_token
        b_a = self.activation_bytes_per_element
        if self.fused:
            return Work(flops=flops, activation_bytes=step.tokens * self.fused_read_elements_per_token * b_a)
        return Work(
            flops=flops,
            weight_bytes=self.weight_elements * b_a * _active(step.tokens),
            activation_bytes=step.tokens * (self.read_elements_per_token + self.write_elements_per_token) * b_a,
            launches=_active(step.tokens),
        )


@dataclass(frozen=True)
class Embedding:
    """Token (and learned position) embedding lookup: reads one table row per token per table."""

    name: str
    count: int
    width: int
    tables: int
    params: int
    resident_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    kind: str = "embedding"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        b_a = self.activation_bytes_per_element
        return Work(
            flops=step.tokens * self.width * (self.tables - 1),
            weight_bytes=step.tokens * self.width * self.tables * b_a,
            activation_bytes=step.tokens * self.width * b_a,
            launches=_active(step.tokens),
        )


@dataclass(frozen=True)
class AllReduce:
    """Tensor-parallel all-reduce of the hidden state (tokens x hidden) across ``tp`` GPUs."""

    name: str
    count: int
    width: int
    tp: int
    activation_bytes_per_element: float
    params: int = 0
    resident_bytes: float = 0.0
    compute_dtype: str = "fp16"
    kind: str = "allreduce"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        return Work(
            flops=0.0 * step.tokens,
            link_bytes=step.tokens * self.width * self.activation_bytes_per_element,
            launches=_active(step.tokens),
        )


Operator = Gemm | Attention | Elementwise | Embedding | AllReduce


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU holds: g / tp, or 1 (replicated) when there are fewer KV heads than GPUs."""
    return max(1, model.num_kv_heads // tp)


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """TP must divide the heads, and divide or be a multiple of the KV heads."""
    if tp < 1:
        raise InputError(f"--tp: must be >= 1 (got {tp})")
    if model.num_heads % tp:
        divisors = [d for d in range(1, model.num_heads + 1) if model.num_heads % d == 0 and d <= 64]
        raise InputError(
            f"--tp: {tp} does not divide the {model.num_heads} attention heads of {model.name}; "
            f"allowed: {', '.join(map(str, divisors))}"
        )
    g = model.num_kv_heads
    if g % tp and tp % g:
        raise InputError(
            f"--tp: {tp} neither divides nor is a multiple of the {g} KV heads of {model.name}"
        )


def flash_query_tile_rows(gpu: GPUSpec, head_dim: int, activation_bytes: float) -> int:
    """FlashAttention row tile B_r = min(ceil(M / (4 d)), d), M = SRAM per SM in elements."""
    sram_elements = gpu.sram_bytes_per_sm / activation_bytes
    column_tile = math.ceil(sram_elements / (4 * head_dim))
    return max(1, min(column_tile, head_dim))


def build_operators(
    model: ModelSpec,
    precision: Precision,
    gpu: GPUSpec,
    tp: int = 1,
    attention_kernel: AttentionKernel = "flash",
    fusion: Fusion = "elementwise",
) -> tuple[Operator, ...]:
    """Every operator of one forward pass, per GPU, in execution order (decoder ops repeat ``num_layers`` times)."""
    check_tensor_parallel(model, tp)
    if attention_kernel not in ATTENTION_KERNELS:
        raise InputError(f"--attention-kernel: '{attention_kernel}' is not one of {', '.join(ATTENTION_KERNELS)}")
    if fusion not in FUSIONS:
        raise InputError(f"--fusion: '{fusion}' is not one of {', '.join(FUSIONS)}")
    if fusion == "full" and attention_kernel != "flash":
        raise InputError(
            "--fusion full: fuses the attention block into one kernel, which needs --attention-kernel flash "
            "(a naive kernel writes the score matrix to HBM); use --fusion elementwise with naive attention"
        )
    H, d, L = model.hidden_size, model.head_dim, model.num_layers
    n, g = model.num_heads, model.num_kv_heads
    n_gpu, g_gpu = n // tp, kv_heads_per_gpu(model, tp)
    F = model.ffn_size
    if F % tp:
        raise InputError(f"--tp: {tp} does not divide the FFN size {F} of {model.name}")
    F_gpu = F // tp
    b_w, b_a = precision.weight_bytes_per_element, precision.activation_bytes_per_element
    scale = precision.scale_bytes_per_weight
    act_dtype, gemm_dtype = precision.activation_dtype, precision.compute_dtype
    embed_b = DTYPE_BYTES[act_dtype] if b_w < 2 else b_w
    fused_elementwise = fusion != "none"
    fused_block = fusion == "full"
    bias = model.linear_bias
    norm_params = H * (2 if model.norm == "layernorm" else 1)

    def gemm(
        name: str,
        in_f: int,
        out_f: int,
        weight_params: int,
        bias_params: int,
        bias_gpu: int,
        count: int = L,
        experts: int = 1,
        quantised: bool = True,
        token_source: Literal["all", "logits"] = "all",
        read: int | None = None,
        write: int | None = None,
        launches: float = 1.0,
    ) -> Gemm:
        """``bias_params``: logical bias elements; ``bias_gpu``: bias elements each GPU holds."""
        w_bytes, w_scale = (b_w, scale) if quantised else (embed_b, 0.0)
        bias_gpu = bias_gpu if bias else 0
        return Gemm(
            name=name,
            count=count,
            in_features=in_f,
            out_features=out_f,
            params=experts * (weight_params + (bias_params if bias else 0)),
            resident_bytes=experts * (in_f * out_f * (w_bytes + w_scale) + bias_gpu * b_a),
            weight_bytes_per_element=w_bytes,
            scale_bytes_per_weight=w_scale,
            bias_elements=bias_gpu,
            activation_bytes_per_element=b_a,
            compute_dtype=gemm_dtype if quantised else act_dtype,
            dequant_ops_per_weight=precision.dequant_ops_per_weight if quantised else 0.0,
            dequant_tile_tokens=precision.dequant_tile_tokens,
            token_source=token_source,
            experts=experts,
            top_k=model.moe_top_k if experts > 1 else 1,
            input_read_elements=read,
            output_write_elements=write,
            launches_per_step=launches,
        )

    def elementwise(
        name: str, read: int, write: int, flops: float, weights: int = 0, count: int = L, fused_read: int = 0
    ) -> Elementwise:
        return Elementwise(
            name=name,
            count=count,
            read_elements_per_token=read,
            write_elements_per_token=write,
            flops_per_token=flops,
            weight_elements=weights,
            params=weights,
            resident_bytes=weights * b_a,
            activation_bytes_per_element=b_a,
            compute_dtype=act_dtype,
            fused=fused_elementwise,
            fused_read_elements_per_token=fused_read,
        )

    def norm(name: str, count: int = L) -> Elementwise:
        return elementwise(name, H, H, NORM_FLOPS_PER_ELEMENT * H, weights=norm_params, count=count)

    def allreduce(name: str) -> AllReduce:
        return AllReduce(name=name, count=L, width=H, tp=tp, activation_bytes_per_element=b_a, compute_dtype=act_dtype)

    position_tables = 2 if model.position_embedding == "learned" else 1
    ops: list[Operator] = [
        Embedding(
            name="embedding",
            count=1,
            width=H,
            tables=position_tables,
            params=H * (model.vocab_size + (model.learned_position_rows if position_tables == 2 else 0)),
            resident_bytes=H * (model.vocab_size + model.learned_position_rows * (position_tables - 1)) * embed_b / tp,
            activation_bytes_per_element=embed_b,
            compute_dtype=act_dtype,
        ),
        norm("attn_norm"),
        # Under full fusion q stays on chip and k, v go straight into the KV cache (charged by attention).
        gemm("qkv_proj", H, (n_gpu + 2 * g_gpu) * d, H * (n + 2 * g) * d, (n + 2 * g) * d, (n_gpu + 2 * g_gpu) * d,
             write=0 if fused_block else None),
    ]
    if model.position_embedding == "rotary":
        rotary_width = (n_gpu + g_gpu) * d
        ops.append(elementwise("rotary", rotary_width, rotary_width, ROTARY_FLOPS_PER_ELEMENT * rotary_width))
    ops.append(
        Attention(
            name="attention",
            count=L,
            q_heads=n_gpu,
            kv_heads=g_gpu,
            head_dim=d,
            kv_bytes_per_element=precision.kv_bytes_per_element,
            activation_bytes_per_element=b_a,
            compute_dtype=act_dtype,
            kernel=attention_kernel,
            query_tile_rows=flash_query_tile_rows(gpu, d, b_a),
            io_fused=fusion == "full",
        )
    )
    # Row-parallel projections: every GPU holds the whole bias, added after the all-reduce.
    ops.append(gemm("o_proj", n_gpu * d, H, n * d * H, H, H,
                    read=0 if fused_block else None, launches=0.0 if fused_block else 1.0))
    if not model.parallel_attention:
        if tp > 1:
            ops.append(allreduce("attn_allreduce"))
        ops.append(elementwise("attn_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H))
        if model.norms_per_layer == 2:
            ops.append(norm("mlp_norm"))
    experts = model.moe_experts
    if model.gated_mlp:
        # Fused SiLU(gate) * up in the epilogue: the GEMM writes F wide, not 2F.
        ops.append(gemm("gate_up_proj", H, 2 * F_gpu, 2 * H * F, 2 * F, 2 * F_gpu, experts=experts,
                        write=F_gpu if fused_elementwise else None))
        ops.append(elementwise("activation", 2 * F_gpu * model.moe_top_k, F_gpu * model.moe_top_k,
                               ACTIVATION_FLOPS_PER_ELEMENT * F_gpu * model.moe_top_k))
    else:
        ops.append(gemm("up_proj", H, F_gpu, H * F, F, F_gpu, experts=experts))
        ops.append(elementwise("activation", F_gpu * model.moe_top_k, F_gpu * model.moe_top_k,
                               ACTIVATION_FLOPS_PER_ELEMENT * F_gpu * model.moe_top_k))
    ops.append(gemm("down_proj", F_gpu, H, F * H, H, H, experts=experts))
    if tp > 1:
        ops.append(allreduce("mlp_allreduce"))
    if model.parallel_attention:
        # x + attention(x) + mlp(x): one add reading three vectors.
        ops.append(elementwise("residual", 3 * H, H, 2 * ADD_FLOPS_PER_ELEMENT * H, fused_read=2 * H))
    else:
        ops.append(elementwise("mlp_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H))
    ops.append(norm("final_norm", count=1))
    vocab_gpu = -(-model.vocab_size // tp)
    lm_head = gemm(
        "lm_head",
        H,
        vocab_gpu,
        0 if model.tied_embeddings else H * model.vocab_size,
        0,
        0,
        count=1,
        quantised=False,
        token_source="logits",
    )
    if model.tied_embeddings:
        # The LM head reads the embedding table, which is stored once.
        lm_head = replace(lm_head, resident_bytes=0.0)
    ops.append(lm_head)
    return tuple(ops)


def parameter_count(operators: tuple[Operator, ...]) -> int:
    """Parameters of the whole model (all GPUs): sum of count x params over operators."""
    return int(sum(op.count * op.params for op in operators))
