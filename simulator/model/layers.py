"""Layer specs: the operators of one forward pass, with weight shapes per GPU.

Why this module is over 600 lines: one builder makes every kind of layer (attention of each layer kind, block-sparse
attention with its index heads, MLA with DSA's indexer, Gated DeltaNet and Kimi Delta Attention, Mamba-2, MLP, MoE,
attention residuals), and its methods share the fusion, precision and tensor-parallel rules written here once.
DeepSeek-V4's attention and hyper-connections are built by :mod:`simulator.model.compressed_attention_layers` with
this builder's rules.

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
  reads and writes activations in HBM and pays a kernel launch, and so is the write of the new
  tokens' K/V into the cache (12 kernels per LLaMA layer with flash attention, 14 with naive).
- ``kernels``: the PyTorch engines' own elementwise kernels (vLLM, SGLang, TGI: their
  ``fused_add_rms_norm``, ``rotary_embedding`` and ``silu_and_mul`` CUDA ops, or the Triton
  kernels torch.compile makes of the same code in vLLM V1): each norm, rotary embedding and
  activation is a kernel of its own, and each residual add runs inside the next norm's kernel
  (which reads the residual and writes the updated one: 2H more elements per add) or rides on
  the all-reduce. cuBLAS GEMMs take no epilogue of theirs, so gate/up writes 2F wide. The new
  tokens' K and V go into the paged cache by a kernel of their own before attention reads it
  (vLLM's ``reshape_and_cache(_flash)``, TGI's ``reshape_and_cache``, SGLang's
  ``set_kv_buffer``; its bytes are the attention operator's ``kv_write_bytes``, only the
  launch is the kernel's own): 10 kernels per LLaMA layer with flash attention.
- ``elementwise``: those chains run in the neighbouring GEMM's prologue/epilogue (5 kernels; the
  cache write rides with rotary in the QKV epilogue, as TensorRT-LLM's attention preprocessing does):
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
  and FlashAttention-3). Those per-tile re-reads are the paper's count for the L2-less
  case: the row tiles of one head run at the same time and find each other's K/V in L2
  while it holds the K/V of the heads being worked on (``Attention.l2_reuse``), so a
  prefill whose keys fit reads each key once from HBM and is compute-bound, as measured
  for FlashAttention-2/3. The operators are built without it (the paper's upper bound);
  the shape-aware time model gives them the GPU's L2 size and SM count
  (simulator/cost/system.py).
- ``per-head``: ``flash`` for prefill; decode by a masked multi-head attention kernel with one
  thread block per (query head, sequence) that does not group the query heads sharing a K/V head
  (TensorRT-LLM's masked MHA, ``mmha_launch_kernel_ex``: grid (num_heads, batch_size); the docs'
  "vanilla implementation that uses a single CUDA thread-block per head", gpt-attention.md).
  Each of the n/g query heads of a GQA group loads the group's K/V, converts it (FP8 or INT8 to
  FP16/FP32) and runs its dot products on the CUDA cores by itself, so the K/V work of a decode
  step is n/g times a grouped kernel's. Charged as n/g passes over the step's K/V at the memory
  rate: a roofline stand-in for work the sources time but do not break down (the repeated loads
  mostly hit L2, next to each other in the grid; the conversions and CUDA-core math do not). XQA,
  the grouped kernel of TensorRT-LLM 0.8, "reducing data loading and conversion", gives "2.4x more
  Llama-70B throughput" on one H200 at 128/2048 (TensorRT-LLM blog, January 2024).
- Decode (one query row per sequence) reads the KV cache once with ``flash`` and ``naive``: the
  heads of a GQA group share one K/V stream.

Weight-only quantisation (int8/int4 weights, fp16 compute): every weight is dequantised
once per ``dequant_tile_tokens`` row tile, ``dequant_ops_per_weight`` integer/vector
operations each (simulator/model/precision.py). That work is ``Work.dequant_ops``, kept
apart from the model's FLOPs: :mod:`simulator.cost.step_cost` charges it to the CUDA cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.compressed_attention_layers import compressed_attention, hyper_connection
from simulator.model.gpu import GPUSpec
from simulator.model.operators import (
    ATTENTION_KERNELS,
    FUSIONS,
    AllReduce,
    AllToAll,
    Attention,
    AttentionKernel,
    Elementwise,
    Embedding,
    ExpertGemm,
    Fusion,
    Gemm,
    LatentAttention,
    Operator,
)
from simulator.model.parallelism import (
    check_attention_data_parallel,
    check_expert_parallel,
    check_tensor_parallel,
    kv_heads_per_gpu,
)
from simulator.model.precision import Precision
from simulator.model.routing import (
    busiest_share,
    expert_probabilities,
    local_probabilities,
    remote_gpus_per_token,
)
from simulator.model.sparse_linear_operators import BlockIndexer, GatedDeltaNet, Indexer, state_bytes_per_element
from simulator.model.state_space_operators import Mamba2
from simulator.model.work import (
    ACTIVATION_FLOPS_PER_ELEMENT,
    ADD_FLOPS_PER_ELEMENT,
    NORM_FLOPS_PER_ELEMENT,
    ROTARY_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_SCORE,
)


def attention_residual_candidates(first: int, layers: int, block: int) -> tuple[int, int, int]:
    """Attention Residuals' mixtures over layers ``first`` .. ``first + layers - 1`` of a model whose last layer is
    the last of them (a pipeline's last stage, or the whole model), blocks of ``block`` layers: (calls, candidates
    summed over the calls, snapshots written).

    vLLM's Kimi-K3 decoder layer: layer i's mixer mixes prev_valid_blocks = ceil(i / B) snapshots and the running
    sum (no call where that is 0), layer i writes a snapshot where i % B == 0 and its FFN then mixes one more, and
    the final norm mixes all ceil(end / B) snapshots and the sum.
    """
    calls = candidates = snapshots = 0
    for i in range(first, first + layers):
        before = -(-i // block)
        if before:
            calls, candidates = calls + 1, candidates + before + 1
        written = int(i % block == 0)
        snapshots += written
        calls, candidates = calls + 1, candidates + before + written + 1
    calls, candidates = calls + 1, candidates + -(-(first + layers) // block) + 1
    return calls, candidates, snapshots


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
    ep: int = 1,
    routing_skew: float = 0.0,
    dp_attention: bool = False,
) -> tuple[Operator, ...]:
    """Every operator of one forward pass, per GPU, in execution order (decoder ops repeat over their layers).

    ``ep``: expert-parallel degree (1 or ``tp``, see :func:`check_expert_parallel`);
    ``routing_skew``: Zipf-like exponent of expert popularity (0: uniform; simulator.model.routing).
    ``dp_attention``: attention data-parallel over the ``tp`` GPUs (:func:`check_attention_data_parallel`):
    each GPU runs the attention block with all heads and whole weights for 1/tp of the sequences,
    and holds only their KV cache; the MLP and experts stay tensor/expert-parallel.
    Layers differ only in their window (full or sliding attention) and MLP (dense or MoE); each
    kind is one operator whose ``count`` is the number of such layers.
    """
    check_tensor_parallel(model, tp)
    check_expert_parallel(model, tp, ep)
    check_attention_data_parallel(model, tp, dp_attention)
    if attention_kernel not in ATTENTION_KERNELS:
        raise InputError(f"--attention-kernel: '{attention_kernel}' is not one of {', '.join(ATTENTION_KERNELS)}")
    if fusion not in FUSIONS:
        raise InputError(f"--fusion: '{fusion}' is not one of {', '.join(FUSIONS)}")
    if fusion == "full" and attention_kernel != "flash":
        raise InputError(
            "--fusion full: fuses the attention block into one kernel, which needs --attention-kernel flash "
            f"(got {attention_kernel}: naive writes the score matrix to HBM, per-head decodes with a kernel of its "
            f"own); use --fusion elementwise with {attention_kernel} attention"
        )
    if (model.is_mla or model.compress_ratios) and attention_kernel != "flash":
        # MLA's attention is built from its own operators (the absorbed decode over the latent), which no
        # kernel choice changes: accepting one would report a kernel the simulation never ran.
        kind = "multi-head latent attention" if model.is_mla else "DeepSeek-V4's compressed attention"
        raise InputError(
            f"--attention-kernel {attention_kernel}: {model.name} uses {kind}, which runs its own kernels (over "
            "one shared key-value head, as FlashMLA); only flash applies"
        )
    if not (math.isfinite(routing_skew) and routing_skew >= 0.0):
        raise InputError(f"--routing-skew: must be a finite exponent >= 0 (got {routing_skew})")
    return _Builder(model, precision, gpu, tp, attention_kernel, fusion, ep, routing_skew, dp_attention).build()


@dataclass(frozen=True)
class _Builder:
    """The operator list of :func:`build_operators`, one block (attention, MLP, MoE, ...) per method."""

    model: ModelSpec
    precision: Precision
    gpu: GPUSpec
    tp: int
    attention_kernel: AttentionKernel
    fusion: Fusion
    ep: int
    routing_skew: float
    dp_attention: bool = False

    @property
    def attention_tp(self) -> int:
        """GPUs one attention block is split over: 1 under attention data parallelism, else tp."""
        return 1 if self.dp_attention else self.tp

    @property
    def attention_dp(self) -> int:
        """Ways the sequences are split for attention: tp under attention data parallelism, else 1."""
        return self.tp if self.dp_attention else 1

    @property
    def b_a(self) -> float:
        return self.precision.activation_bytes_per_element

    @property
    def fused_block(self) -> bool:
        return self.fusion == "full"

    def gemm(
        self,
        name: str,
        in_f: int,
        out_f: int,
        weight_params: int,
        bias_params: int,
        bias_gpu: int,
        count: int | None = None,
        module: str = "attention",
        token_source: Literal["all", "logits"] = "all",
        read: int | None = None,
        write: int | None = None,
        launches: float = 1.0,
        active_params: int | None = None,
        data_parallel: int = 1,
    ) -> Gemm:
        """``bias_params``: logical bias elements; ``bias_gpu``: bias elements each GPU holds."""
        p = self.precision.for_module(module)
        w_bytes, w_scale = p.weight_bytes_per_element, p.scale_bytes_per_weight
        bias = self.model.linear_bias
        bias_gpu = bias_gpu if bias else 0
        return Gemm(
            name=name,
            count=self.model.num_layers if count is None else count,
            in_features=in_f,
            out_features=out_f,
            params=weight_params + (bias_params if bias else 0),
            resident_bytes=in_f * out_f * (w_bytes + w_scale) + bias_gpu * self.b_a,
            weight_bytes_per_element=w_bytes,
            scale_bytes_per_weight=w_scale,
            bias_elements=bias_gpu,
            activation_bytes_per_element=self.b_a,
            compute_dtype=p.compute_dtype,
            dequant_ops_per_weight=p.dequant_ops_per_weight,
            dequant_tile_tokens=p.dequant_tile_tokens,
            token_source=token_source,
            active_params=active_params,
            input_read_elements=read,
            output_write_elements=write,
            launches_per_step=launches,
            data_parallel=data_parallel,
        )

    @property
    def separate_cache_write(self) -> bool:
        """Is writing the new tokens' K/V (or MLA latent) into the cache a kernel of its own (module docstring)?"""
        return self.fusion in ("none", "kernels")

    def fuses(self, residual: bool = False) -> bool:
        """Does this fusion level fold an elementwise op into a neighbour (``residual``: a residual add)?"""
        if self.fusion == "kernels":
            return residual
        return self.fusion != "none"

    def elementwise(
        self, name: str, read: float, write: float, flops: float, weights: int = 0, count: int | None = None,
        fused_read: int = 0, residual: bool = False,
    ) -> Elementwise:
        if residual and self.fusion == "kernels":
            fused_read = 2 * fused_read  # the norm kernel reads the residual and writes the updated one
        return Elementwise(
            name=name,
            count=self.model.num_layers if count is None else count,
            read_elements_per_token=read,
            write_elements_per_token=write,
            flops_per_token=flops,
            weight_elements=weights,
            params=weights,
            resident_bytes=weights * self.b_a,
            activation_bytes_per_element=self.b_a,
            compute_dtype=self.precision.activation_dtype,
            fused=self.fuses(residual),
            fused_read_elements_per_token=fused_read,
        )

    def unfused(self, name: str, read: float, write: float, flops: float, count: int) -> Elementwise:
        """An elementwise kernel no engine fuses into a GEMM (its launch and traffic always count)."""
        return replace(self.elementwise(name, read, write, flops, count=count), fused=False)

    def norm(self, name: str, count: int | None = None, width: int | None = None) -> Elementwise:
        width = self.model.hidden_size if width is None else width
        params = width * (2 if self.model.norm == "layernorm" else 1)
        return self.elementwise(name, width, width, NORM_FLOPS_PER_ELEMENT * width, weights=params, count=count)

    def allreduce(self, name: str, count: int | None = None,
                  collective: Literal["allreduce", "allgather", "reducescatter"] = "allreduce") -> AllReduce:
        return AllReduce(name=name, count=self.model.num_layers if count is None else count,
                         width=self.model.hidden_size, tp=self.tp,
                         activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype,
                         collective=collective)

    def tensor_parallel_collectives(self, mixers: int, ffns: int) -> tuple[AllReduce, AllReduce]:
        """The collectives on the hidden state of each layer: after the attention (or mixer) and after the MLP.

        Tensor-parallel attention: two all-reduces of the step's tokens. Attention data parallelism: each GPU's
        attention output is whole for its own sequences, so nothing is reduced after it; the MLP or experts,
        split over the same GPUs, need every rank's tokens, gathered before them and reduce-scattered after
        (TensorRT-LLM's attention-DP MoE: allgather, then reducescatter, ``fused_moe_cutlass.py``; SGLang:
        ``dp_gather`` as an all-gather under CUDA graphs, ``dp_reduce_scatter_tensor`` after the MLP when
        tp == dp, ``layers/dp_attention.py`` and ``layers/communicator.py``).
        """
        if self.dp_attention:
            return (self.allreduce("dp_gather", count=ffns, collective="allgather"),
                    self.allreduce("dp_reduce_scatter", count=ffns, collective="reducescatter"))
        return self.allreduce("attn_allreduce", count=mixers), self.allreduce("mlp_allreduce", count=ffns)

    def build(self) -> tuple[Operator, ...]:
        model, tp, H = self.model, self.tp, self.model.hidden_size
        position_tables = 2 if model.position_embedding == "learned" else 1
        embed_b = self.precision.for_module("embedding").weight_bytes_per_element
        ops: list[Operator] = [
            Embedding(
                name="embedding",
                count=1,
                width=H,
                tables=position_tables,
                params=H * (model.vocab_size + (model.learned_position_rows if position_tables == 2 else 0)),
                resident_bytes=H * (model.vocab_size + model.learned_position_rows * (position_tables - 1))
                * embed_b / tp,
                activation_bytes_per_element=embed_b,
                compute_dtype=self.precision.activation_dtype,
            ),
        ]
        # A Nemotron-H model's layers are blocks of one mixer or one FFN, each with its own norm and residual add
        # (NemotronHBlock): the mixer's norm, all-reduce and add count its mixer blocks, the FFN's its FFN blocks.
        mixers, ffns = model.mixer_layers, model.ffn_layers
        after_attention, after_mlp = self.tensor_parallel_collectives(mixers, ffns)
        hyper = model.hc_mult > 1  # hyper-connections take the residual adds' place (compressed_attention_layers)
        if hyper:
            ops.append(hyper_connection(self, "hc_attn", mixers))
        ops.append(self.norm("attn_norm", count=mixers))
        if model.is_mla:
            ops += self.latent_attention()
        else:
            ops += compressed_attention(self) if model.compress_ratios else self.attention()
        if model.linear_layers:
            ops += self.linear_attention()
        if model.mamba_layers:
            ops += self.mamba()
        if not model.parallel_attention:
            if tp > 1:
                ops.append(after_attention)
            if model.norms_per_layer == 4:
                ops.append(self.norm("post_attn_norm"))
            if hyper:
                ops.append(hyper_connection(self, "hc_ffn", ffns))
            else:
                ops.append(self.elementwise("attn_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H,
                                            residual=True, count=mixers))
            if model.norms_per_layer >= 2:
                ops.append(self.norm("mlp_norm", count=ffns))
        widths = model.dense_mlp_widths
        for F, layers in widths.items():
            if F % tp:
                raise InputError(f"--tp: {tp} does not divide the FFN size {F} of {model.name}")
            # DeciLM's NAS-pruned layers: one MLP per width, named by it (ModelSpec.ffn_sizes).
            ops += self.mlp(f"mlp{F}_" if len(widths) > 1 else "", F, F // tp, layers, "mlp")
        if model.moe_layers:
            ops += self.moe()
        if model.moe_parallel_mlp:
            ops += self.parallel_mlp_norms()
        if tp > 1:
            ops.append(after_mlp)
        if model.parallel_attention:
            # x + attention(x) + mlp(x): one add reading three vectors.
            ops.append(self.elementwise("residual", 3 * H, H, 2 * ADD_FLOPS_PER_ELEMENT * H, fused_read=2 * H,
                                        residual=True))
        else:
            if model.norms_per_layer == 4:
                ops.append(self.norm("post_mlp_norm"))
            if hyper:
                ops.append(hyper_connection(self, "hc_head", 1, final=True))
            else:
                ops.append(self.elementwise("mlp_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H,
                                            residual=True, count=ffns))
        if model.attention_residual_block:
            ops.append(self.attention_residuals())
        ops.append(self.norm("final_norm", count=1))
        vocab_gpu = -(-model.vocab_size // tp)
        tied = model.tied_embeddings
        lm_head = self.gemm("lm_head", H, vocab_gpu, 0 if tied else H * model.vocab_size, 0, 0, count=1,
                            module="lm_head", token_source="logits", active_params=H * model.vocab_size if tied else None)
        if tied:
            # The LM head reads the embedding table, which is stored once.
            lm_head = replace(lm_head, resident_bytes=0.0)
        ops.append(lm_head)
        return tuple(ops)

    def attention(self) -> list[Operator]:
        """QKV projection, q/k (and v) norms, rotary, attention (full, sliding-window and block-sparse layers apart),
        output projection.

        Where the sliding-window layers have widths of their own (ModelSpec.attention_shape: Gemma 4, MiMo-V2-Flash)
        their projections are operators of their own too (suffix ``_local``); else one set serves every layer.
        """
        model = self.model
        # A hybrid model's linear layers have no attention of this kind (linear_attention).
        L, sliding, sparse = model.attention_layers, model.sliding_layers, model.block_sparse_layers
        kinds: list[tuple[Literal["full", "sliding"], int, str]] = [("full", L, "")]
        if model.per_kind_attention:
            kinds = [("full", L - sliding, ""), ("sliding", sliding, "_local")]
            kinds = [group for group in kinds if group[1]]
        ops: list[Operator] = []
        for kind, count, suffix in kinds:
            ops += self.attention_inputs(kind, count, suffix)
        window = model.sliding_window
        if sliding == L:
            ops.append(self.attention_op("attention", L, window, "sliding"))
        else:
            if L - sliding - sparse:
                ops.append(self.attention_op("attention", L - sliding - sparse, None, "full"))
            if sliding:
                ops.append(self.attention_op("attention_local", sliding, window, "sliding"))
            if sparse:
                ops.append(self.attention_op("attention_sparse", sparse, None, "full", topk=model.block_sparse_keys))
                ops += self.block_indexer()
        for kind, count, suffix in kinds:
            ops += self.attention_outputs(kind, count, suffix)
        return ops

    def attention_inputs(self, kind: Literal["full", "sliding"], count: int, suffix: str) -> list[Operator]:
        """The QKV projection, q/k (and v) norms and rotary of ``count`` attention layers shaped as ``kind``.

        A layer whose values are its keys (K = V, Gemma 4's global layers) stores no v_proj, but vLLM loads k_proj
        into the V slot of its fused QKV projection too (gemma4.py, Gemma4Attention: "K weights into both K and V
        slots"): its GEMM computes and holds the V columns, its parameters do not count them.
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, n, n_gpu = model.hidden_size, model.num_heads, model.num_heads // tp
        g, d, d_v, k_eq_v = model.attention_shape(kind)
        g_gpu = kv_heads_per_gpu(model, tp, kind)
        # Qwen3-Next/3.5's output gate: q_proj yields n d_v more columns, sigmoid(gate) * output before o_proj.
        gate, gate_gpu = (n * d_v, n_gpu * d_v) if model.attention_output_gate else (0, 0)
        columns = n * d + g * (d + d_v) + gate
        stored = columns - (g * d_v if k_eq_v else 0)
        columns_gpu = n_gpu * d + g_gpu * (d + d_v) + gate_gpu
        # Under full fusion q stays on chip and k, v go straight into the KV cache (charged by attention).
        ops: list[Operator] = [self.gemm(f"qkv_proj{suffix}", H, columns_gpu, H * stored, stored, columns_gpu,
                                         count=count, write=0 if self.fused_block else None, data_parallel=dp)]
        # per-token elementwise work: all heads for 1/dp of the tokens = 1/dp of the heads for all of them
        width = (n_gpu + g_gpu) * d // dp
        if model.qk_norm:
            # Per-head RMSNorm of q and k (one weight vector of d each), in the QKV epilogue when fused; Gemma 4 also
            # norms each value head, without a weight (Gemma4Attention.v_norm).
            normed = width + (g_gpu * d_v // dp if model.v_norm else 0)
            ops.append(self.elementwise(f"qk_norm{suffix}", normed, normed, NORM_FLOPS_PER_ELEMENT * normed,
                                        weights=2 * d, count=count))
        if model.position_embedding == "rotary":
            ops.append(self.elementwise(f"rotary{suffix}", width, width, ROTARY_FLOPS_PER_ELEMENT * width, count=count))
        return ops

    def attention_outputs(self, kind: Literal["full", "sliding"], count: int, suffix: str) -> list[Operator]:
        """The output gate (Qwen3-Next/3.5) and the output projection of ``count`` attention layers shaped as ``kind``."""
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, n, n_gpu = model.hidden_size, model.num_heads, model.num_heads // tp
        d_v = model.attention_shape(kind).value_dim
        ops: list[Operator] = []
        if model.attention_output_gate:
            ops.append(self.output_gate(n_gpu * d_v // dp, count, suffix))
        # Row-parallel projections: every GPU holds the whole bias, added after the all-reduce.
        ops.append(self.gemm(f"o_proj{suffix}", n_gpu * d_v, H, n * d_v * H, H, H, read=0 if self.fused_block else None,
                             launches=0.0 if self.fused_block else 1.0, data_parallel=dp, count=count))
        return ops

    def output_gate(self, out: int, count: int, suffix: str = "") -> Elementwise:
        """sigmoid(gate) x the attention output, ``out`` elements per token: reads both, writes the gated output."""
        return self.elementwise(f"attn_output_gate{suffix}", 2 * out, out, (ACTIVATION_FLOPS_PER_ELEMENT + 1) * out,
                                count=count)

    def attention_op(self, name: str, count: int, window: int | None, kind: Literal["full", "sliding"],
                     topk: int = 0) -> Attention:
        model, tp = self.model, self.attention_tp
        shape = model.attention_shape(kind)
        # gpt-oss's attention sinks (MiMo-V2-Flash's in its sliding layers): one learned logit per head, added to
        # each softmax denominator.
        sinks = model.num_heads if model.attention_sinks or (model.sliding_attention_sinks and kind == "sliding") else 0
        return Attention(
            name=name,
            count=count,
            q_heads=model.num_heads // tp,
            kv_heads=kv_heads_per_gpu(model, tp, kind),
            head_dim=shape.head_dim,
            kv_bytes_per_element=self.precision.kv_bytes_per_element,
            activation_bytes_per_element=self.b_a,
            compute_dtype=self.precision.activation_dtype,
            kernel=self.attention_kernel,
            query_tile_rows=flash_query_tile_rows(self.gpu, shape.head_dim, self.b_a),
            io_fused=self.fusion == "full",
            cache_write_kernel=self.separate_cache_write,
            params=sinks,
            resident_bytes=sinks // tp * self.b_a,
            window=window,
            data_parallel=self.attention_dp,
            value_head_dim=0 if shape.value_dim == shape.head_dim else shape.value_dim,
            topk=topk,
        )

    def block_indexer(self) -> list[Operator]:
        """The index branch of MiniMax-M3's block-sparse layers, as TensorRT-LLM's ``MiniMaxM3Attention`` builds it:
        index_q_proj (hidden -> n_i x d_i) split by index heads like the KV heads, index_k_proj (hidden -> one key of
        d_i) replicated, per-head RMSNorms of both (one weight vector of d_i each) and rotary, then the selection."""
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, n_i, d_i, count = model.hidden_size, model.index_heads, model.index_head_dim, model.block_sparse_layers
        i_gpu = max(1, n_i // tp)
        width = (i_gpu + 1) * d_i // dp
        return [
            self.gemm("index_q_proj", H, i_gpu * d_i, H * n_i * d_i, 0, 0, count=count, data_parallel=dp),
            self.gemm("index_k_proj", H, d_i, H * d_i, 0, 0, count=count, data_parallel=dp),
            self.elementwise("index_norm", width, width, NORM_FLOPS_PER_ELEMENT * width, weights=2 * d_i, count=count),
            self.elementwise("index_rotary", width, width, ROTARY_FLOPS_PER_ELEMENT * width, count=count),
            BlockIndexer(name="block_indexer", count=count, heads=i_gpu, head_dim=d_i,
                         topk=model.block_sparse_topk_blocks, block_size=model.block_sparse_block_size,
                         activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype,
                         data_parallel=dp, cache_write_kernel=self.separate_cache_write),
        ]

    def latent_attention(self) -> list[Operator]:
        """MLA's projections and attention (DeepSeek-V2/V3), split over ``tp`` GPUs as vLLM does.

        q_a_proj and kv_a_proj (down-projections to the query and KV latents) are replicated on every
        GPU (vLLM's ReplicatedLinear); q_b_proj (or q_proj) and kv_b_proj are split by heads, o_proj by rows.
        A hybrid's linear layers have none of this (Kimi-K3: MLA on its full-attention layers only), and a model
        without rotary embedding skips the rotation (Kimi-K3's NoPE MLA: KimiMLAAttention.rotary_emb is None). Kimi-K3's
        output gate is a g_proj of its own, column-parallel, whose sigmoid scales the heads' outputs before o_proj.
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, L, n = model.hidden_size, model.attention_layers, model.num_heads
        n_gpu = n // tp
        r, r_q = model.kv_lora_rank, model.q_lora_rank
        d_r, d_n, d_v = model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim
        qk = d_n + d_r
        ops: list[Operator] = []
        if r_q:
            ops.append(self.gemm("q_a_proj", H, r_q, H * r_q, r_q, r_q, count=L, data_parallel=dp))
            ops.append(self.norm("q_a_norm", count=L, width=r_q))
            ops.append(self.gemm("q_b_proj", r_q, n_gpu * qk, r_q * n * qk, n * qk, n_gpu * qk, count=L,
                                 data_parallel=dp))
        else:
            ops.append(self.gemm("q_proj", H, n_gpu * qk, H * n * qk, n * qk, n_gpu * qk, count=L, data_parallel=dp))
        ops.append(self.gemm("kv_a_proj", H, r + d_r, H * (r + d_r), r + d_r, r + d_r, count=L, data_parallel=dp))
        ops.append(self.norm("kv_a_norm", count=L, width=r))
        if model.position_embedding == "rotary":
            rotary_width = (n_gpu + 1) * d_r // dp
            ops.append(self.elementwise("rotary", rotary_width, rotary_width, ROTARY_FLOPS_PER_ELEMENT * rotary_width,
                                        count=L))
        if model.attention_output_gate:
            ops.append(self.gemm("attn_gate_proj", H, n_gpu * d_v, H * n * d_v, n * d_v, n_gpu * d_v, count=L,
                                 data_parallel=dp))
        if model.index_topk:
            ops += self.indexer()
        p = self.precision.for_module("attention")
        ops.append(
            LatentAttention(
                name="attention",
                count=L,
                q_heads=n_gpu,
                kv_lora_rank=r,
                rope_dim=d_r,
                nope_dim=d_n,
                v_dim=d_v,
                kv_bytes_per_element=self.precision.kv_bytes_per_element,
                activation_bytes_per_element=self.b_a,
                weight_bytes_per_element=p.weight_bytes_per_element,
                scale_bytes_per_weight=p.scale_bytes_per_weight,
                compute_dtype=self.precision.activation_dtype,
                query_tile_rows=flash_query_tile_rows(self.gpu, qk, self.b_a),
                io_fused=self.fusion == "full",
                params=r * n * (d_n + d_v),
                resident_bytes=r * n_gpu * (d_n + d_v) * (p.weight_bytes_per_element + p.scale_bytes_per_weight),
                data_parallel=dp,
                cache_write_kernel=self.separate_cache_write,
                topk=model.index_topk,
            )
        )
        if model.attention_output_gate:
            ops.append(self.output_gate(n_gpu * d_v // dp, L))
        ops.append(self.gemm("o_proj", n_gpu * d_v, H, n * d_v * H, H, H, read=0 if self.fused_block else None,
                             launches=0.0 if self.fused_block else 1.0, count=L, data_parallel=dp))
        return ops

    def indexer(self) -> list[Operator]:
        """DSA's lightning indexer (DeepSeek-V3.2's ``Indexer``): its projections and the scoring, replicated on every
        GPU as vLLM runs it (ReplicatedLinear), for the sequences this GPU attends.

        wq_b maps the query latent (or the hidden state without one) to n_i x d_i index queries, wk the hidden state
        to one d_i key, normed by a LayerNorm (weight and bias), weights_proj the hidden state to n_i head weights.
        """
        model, dp = self.model, self.attention_dp
        H, n_i, d_i = model.hidden_size, model.index_heads, model.index_head_dim
        source, count = model.q_lora_rank or H, model.index_layers
        # The scores run on FP8 tensor cores where the GPU has them (DeepGEMM's fp8_mqa_logits), else at the
        # activation dtype.
        dtype = "fp8" if "fp8" in self.gpu.peak_flops else self.precision.activation_dtype
        return [
            self.gemm("indexer_q_proj", source, n_i * d_i, source * n_i * d_i, 0, 0, count=count, data_parallel=dp),
            self.gemm("indexer_k_proj", H, d_i, H * d_i, 0, 0, count=count, data_parallel=dp),
            self.elementwise("indexer_k_norm", d_i, d_i, NORM_FLOPS_PER_ELEMENT * d_i, weights=2 * d_i, count=count),
            self.gemm("indexer_weights_proj", H, n_i, H * n_i, 0, 0, count=count, data_parallel=dp),
            Indexer(name="indexer", count=count, heads=n_i, head_dim=d_i, topk=model.index_topk,
                    activation_bytes_per_element=self.b_a, compute_dtype=dtype, data_parallel=dp,
                    cache_write_kernel=self.separate_cache_write),
        ]

    def linear_attention(self) -> list[Operator]:
        """The Gated DeltaNet layers of a hybrid model (Qwen3-Next, Qwen3.5), split by heads over ``tp`` as vLLM does.

        in_proj_qkvz (hidden -> q, k of key heads x d_k, v and the output gate z of value heads x d_v) and in_proj_ba
        (the per-value-head write strength b and decay a) are column-parallel, out_proj row-parallel; the convolution
        weights (one K-wide filter per q/k/v channel), A_log and dt_bias (one per value head) and the gated norm's
        weight (d_v) belong to the recurrence operator.
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, count = model.hidden_size, model.linear_layers
        n_k, n_v = model.linear_key_heads, model.linear_value_heads
        d_k, d_v, K = model.linear_key_head_dim, model.linear_value_head_dim, model.linear_conv_kernel
        if n_k % tp:
            raise InputError(f"--tp: {tp} does not divide the {n_k} linear-attention key heads of {model.name}")
        key, value = n_k * d_k, n_v * d_v
        conv = 2 * key + value
        kda = model.linear_kind == "kda"
        # Per head: A_log, and dt_bias per value head (Gated DeltaNet) or per key channel of it (KDA's dt_bias is
        # n_v d_k wide: vLLM's KimiDeltaAttention); the convolution filters; the gated norm's weight (d_v).
        decay = n_v * d_k if kda else n_v
        params = conv * K + n_v + decay + d_v
        b_state = state_bytes_per_element(model.linear_state_dtype, self.b_a)
        projections = self.kda_projections() if kda else [
            self.gemm("linear_in_proj_qkvz", H, (conv + value) // tp, H * (conv + value), 0, 0, count=count,
                      data_parallel=dp),
            self.gemm("linear_in_proj_ba", H, 2 * n_v // tp, H * 2 * n_v, 0, 0, count=count, data_parallel=dp),
        ]
        return [
            *projections,
            GatedDeltaNet(name="linear_attention", count=count, key_heads=n_k // tp, value_heads=n_v // tp,
                          key_head_dim=d_k, value_head_dim=d_v, conv_kernel=K, state_bytes_per_element=b_state,
                          activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype, params=params,
                          resident_bytes=((conv * K + n_v + decay) // tp + d_v) * self.b_a, data_parallel=dp,
                          decay_channels=d_k if kda else 1),
            self.gemm("linear_out_proj", value // tp, H, value * H, 0, 0, count=count, data_parallel=dp),
        ]

    def kda_projections(self) -> list[Operator]:
        """Kimi Delta Attention's input projections (vLLM's KimiDeltaAttention; Kimi-K3's modeling_kimi_linear.py).

        q, k and v (n heads x d each) and the output gate g are column-parallel, the gate full rank (Kimi-K3's
        use_full_rank_gate: g_proj) or through a rank-r bottleneck (Kimi Linear: g_a_proj replicated, g_b_proj
        column-parallel); the per-channel decay comes through f_a_proj (hidden -> d_k, replicated) and f_b_proj
        (d_k -> n d_k, column-parallel), the write strength beta from b_proj (one per head).
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, count, r = model.hidden_size, model.linear_layers, model.linear_gate_rank
        n, d_k, d_v = model.linear_value_heads, model.linear_key_head_dim, model.linear_value_head_dim
        conv, value = 2 * n * d_k + n * d_v, n * d_v
        ops: list[Operator] = [
            self.gemm("linear_in_proj_qkv", H, conv // tp, H * conv, 0, 0, count=count, data_parallel=dp),
        ]
        if r:
            ops += [self.gemm("linear_gate_a_proj", H, r, H * r, 0, 0, count=count, data_parallel=dp),
                    self.gemm("linear_gate_b_proj", r, value // tp, r * value, 0, 0, count=count, data_parallel=dp)]
        else:
            ops.append(self.gemm("linear_gate_proj", H, value // tp, H * value, 0, 0, count=count, data_parallel=dp))
        return ops + [
            self.gemm("linear_decay_a_proj", H, d_k, H * d_k, 0, 0, count=count, data_parallel=dp),
            self.gemm("linear_decay_b_proj", d_k, n * d_k // tp, d_k * n * d_k, 0, 0, count=count, data_parallel=dp),
            self.gemm("linear_beta_proj", H, n // tp, H * n, 0, 0, count=count, data_parallel=dp),
        ]

    def mamba(self) -> list[Operator]:
        """The Mamba-2 mixers of a Nemotron-H model, split by heads and groups over ``tp`` as vLLM's ``MambaMixer2``.

        in_proj (hidden -> z, x of I each, B, C of G x N each, dt of one per head) is column-parallel, out_proj
        (I -> hidden) row-parallel; the convolution (K weights and a bias per channel), A_log, D and dt_bias (one per
        head) and the gated norm's weight (I) belong to the scan operator (transformers' ``NemotronHMamba2Mixer``;
        state-spaces/mamba ``Mamba2``).
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, count = model.hidden_size, model.mamba_layers
        heads, P, N, G = model.mamba_heads, model.mamba_head_dim, model.mamba_state_size, model.mamba_groups
        if heads % tp or G % tp:
            raise InputError(f"--tp: {tp} does not divide the {heads} Mamba-2 heads and {G} groups of {model.name}")
        inner, conv = model.mamba_inner_size, model.mamba_conv_channels
        projection = inner + conv + heads  # z, then x B C (the convolution's channels), then dt
        params = conv * (model.mamba_conv_kernel + 1) + 3 * heads + inner
        b_state = state_bytes_per_element(model.mamba_state_dtype, self.b_a)
        return [
            self.gemm("mamba_in_proj", H, projection // tp, H * projection, 0, 0, count=count, data_parallel=dp),
            Mamba2(name="mamba", count=count, heads=heads // tp, head_dim=P, state_size=N, groups=G // tp,
                   conv_kernel=model.mamba_conv_kernel, state_bytes_per_element=b_state,
                   activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype,
                   params=params, resident_bytes=params // tp * self.b_a, chunk_tokens=model.mamba_chunk_size,
                   data_parallel=dp),
            self.gemm("mamba_out_proj", inner // tp, H, inner * H, 0, 0, count=count, data_parallel=dp),
        ]

    def attention_residuals(self) -> Elementwise:
        """Attention Residuals (Kimi-K3; Moonshot's modeling_kimi_linear.py ``_apply_attn_res``, vLLM's Kimi-K3
        decoder layer): every B = ``attention_residual_block`` layers the running sum of the layers' outputs is kept
        as a block snapshot, and the input of each mixer, each FFN and the final norm is a softmax mixture of the
        snapshots so far and the running sum, scored by a learned vector against each candidate's RMS-normed self.

        Per call over m candidates of H: the squares' mean (2 H), the normalised score (3 H: scale, multiply by the
        vector, sum), m softmax terms and the weighted sum (2 H): 7 H + 5 FLOPs per candidate, m H elements read
        (the snapshots are in HBM; fp32 math in the reference), H written; each snapshot is written once
        (vLLM copies it into a preallocated buffer). One kernel per call, not fused into a neighbour (vLLM's
        ``apply_attn_res``). Layer i's mixer sees ceil(i / B) snapshots (none at layer 0, where vLLM skips the call)
        and the running sum, its FFN one more where i % B == 0, the final norm ceil(L / B) and the sum
        (:func:`attention_residual_candidates`). Weights: a norm and a score vector of H per call; layer 0's unused
        mixer-side pair (2 H) is left out.
        """
        model = self.model
        H, B = model.hidden_size, model.attention_residual_block
        calls, candidates, snapshots = attention_residual_candidates(
            model.attention_residual_offset, model.num_layers, B)
        per_call = candidates / calls
        flops = (7.0 * H + SOFTMAX_FLOPS_PER_SCORE) * per_call
        return replace(self.unfused("attention_residuals", per_call * H, H + snapshots * H / calls, flops, calls),
                       weight_elements=2 * H, params=2 * H, resident_bytes=2 * H * self.b_a)

    def mlp(self, prefix: str, F: int, F_gpu: int, count: int, module: str) -> list[Operator]:
        """A dense MLP (or the shared experts, ``prefix`` 'shared_') of width F, F_gpu per GPU, on ``count`` layers."""
        H = self.model.hidden_size
        fused = self.fuses()
        act = ACTIVATION_FLOPS_PER_ELEMENT * F_gpu
        if self.model.gated_mlp:
            # Fused SiLU(gate) * up in the epilogue: the GEMM writes F wide, not 2F.
            return [
                self.gemm(f"{prefix}gate_up_proj", H, 2 * F_gpu, 2 * H * F, 2 * F, 2 * F_gpu, count=count,
                          module=module, write=F_gpu if fused else None),
                self.elementwise(f"{prefix}activation", 2 * F_gpu, F_gpu, act, count=count),
                self.gemm(f"{prefix}down_proj", F_gpu, H, F * H, H, H, count=count, module=module),
            ]
        return [
            self.gemm(f"{prefix}up_proj", H, F_gpu, H * F, F, F_gpu, count=count, module=module),
            self.elementwise(f"{prefix}activation", F_gpu, F_gpu, act, count=count),
            self.gemm(f"{prefix}down_proj", F_gpu, H, F * H, H, H, count=count, module=module),
        ]

    def parallel_mlp_norms(self) -> list[Operator]:
        """What a Gemma 4 MoE layer adds around its two branches (transformers' and vLLM's Gemma4DecoderLayer): the
        dense MLP's output and the experts' input and output each get an RMSNorm of their own
        (post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2), the router its
        input's weightless RMSNorm times a learned scale (Gemma4Router: H weights, and a per-expert output scale of E),
        and the two branches are added before the layer's post-FFN norm."""
        model = self.model
        H, E, count = model.hidden_size, model.moe_experts, model.moe_layers
        return [
            self.norm("mlp_post_norm_1", count=count),
            self.norm("moe_pre_norm", count=count),
            self.norm("moe_post_norm", count=count),
            self.elementwise("router_norm", H, H, (NORM_FLOPS_PER_ELEMENT + 1) * H, weights=H + E, count=count),
            self.elementwise("moe_branch_add", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, count=count),
        ]

    def moe(self) -> list[Operator]:
        """Router and routing kernels, (dispatch), routed experts, their weighted sum, (combine), shared experts of the
        MoE layers (simulator.model.routing)."""
        model, tp, ep = self.model, self.tp, self.ep
        H, E, k = model.hidden_size, model.moe_experts, model.moe_top_k
        # Latent MoE (Nemotron-3 Super/Ultra: NemotronHMoE.fc1_latent_proj): the routed experts read and write a
        # latent of D = moe_latent_size, projected from the hidden state before dispatch and back after the combine;
        # the router and the shared experts read the hidden state.
        D = model.moe_latent_size or H
        count = model.moe_layers
        expert_tp = tp // ep  # ep is 1 (experts split by columns/rows over tp) or tp (whole experts per GPU)
        F_e = model.expert_ffn_size
        if F_e % expert_tp:
            raise InputError(f"--tp: {tp} does not divide the expert FFN size {F_e} of {model.name} (or use --ep {tp})")
        F_gpu = F_e // expert_tp
        q_all = expert_probabilities(E, k, self.routing_skew)
        q = local_probabilities(q_all, ep)
        rows = float(q.sum())  # (token, expert) rows per step token on this GPU: k / ep when uniform
        p = self.precision.for_module("experts")
        bias = 1 if model.linear_bias else 0
        fused = self.fuses()

        def experts(name: str, in_f: int, out_f: int, weights: int, biases: int, write: int | None = None) -> ExpertGemm:
            per_expert = weights + bias * biases
            return ExpertGemm(
                name=name,
                count=count,
                in_features=in_f,
                out_features=out_f,
                params=E * per_expert,
                active_params=k * per_expert,
                resident_bytes=len(q) * (in_f * out_f * (p.weight_bytes_per_element + p.scale_bytes_per_weight)
                                         + bias * out_f * self.b_a),
                weight_bytes_per_element=p.weight_bytes_per_element,
                scale_bytes_per_weight=p.scale_bytes_per_weight,
                bias_elements=bias * out_f,
                activation_bytes_per_element=self.b_a,
                compute_dtype=p.compute_dtype,
                experts=E,
                top_k=k,
                probabilities=tuple(float(x) for x in q),
                dequant_ops_per_weight=p.dequant_ops_per_weight,
                dequant_tile_tokens=p.dequant_tile_tokens,
                output_write_elements=write,
            )

        ops: list[Operator] = [
            self.gemm("router", H, E, H * E, E, E, count=count, module="router"),
        ]
        if model.moe_latent_size:
            # Replicated, whole on every GPU (vLLM's NemotronHMoE: ReplicatedLinear; TensorRT-LLM likewise).
            ops.append(self.gemm("moe_latent_in_proj", H, D, H * D, D, D, count=count, module="mlp"))
        ops += [
            # Routing runs as kernels of its own in every engine (vLLM/SGLang: topk_softmax, then
            # moe_align_block_size sorting the (token, expert) rows by expert; TensorRT-LLM: its routing
            # kernel, then the expert maps): a softmax and top-k over the E logits, writing k ids and k
            # weights, then the sort of the rows.
            self.unfused("moe_topk", E, 2 * k, SOFTMAX_FLOPS_PER_SCORE * E, count),
            self.unfused("moe_align", k, k, 0.0, count),
        ]
        # Under attention data parallelism every GPU already holds the step's gathered tokens
        # (tensor_parallel_collectives), and runs its own experts on them: no all-to-all (TensorRT-LLM without
        # enable_alltoall, SGLang without a DeepEP backend).
        all_to_all = ep > 1 and not self.dp_attention
        if all_to_all:
            share = remote_gpus_per_token(E, k, ep) if self.routing_skew == 0 else busiest_share(q_all, ep)
            dispatch = AllToAll(name="moe_dispatch", count=count, width=D, tp=tp, ep=ep, remote_share=share,
                                activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype)
            ops.append(dispatch)
        act = ACTIVATION_FLOPS_PER_ELEMENT * F_gpu * rows
        if model.gated_mlp:
            ops.append(experts("experts_gate_up", D, 2 * F_gpu, 2 * D * F_e, 2 * F_e, write=F_gpu if fused else None))
            ops.append(self.elementwise("experts_activation", 2 * F_gpu * rows, F_gpu * rows, act, count=count))
        else:
            ops.append(experts("experts_up", D, F_gpu, D * F_e, F_e))
            ops.append(self.elementwise("experts_activation", F_gpu * rows, F_gpu * rows, act, count=count))
        ops.append(experts("experts_down", F_gpu, D, F_e * D, D))
        # The k expert outputs of a token are weighted and summed by a kernel of their own (vLLM's and
        # SGLang's moe_sum, TensorRT-LLM's finalizeMoeRouting): it reads the rows the down GEMM wrote.
        ops.append(self.unfused("experts_combine", rows * D, D, 2.0 * rows * D, count))
        if all_to_all:
            ops.append(replace(dispatch, name="moe_combine"))  # the same bytes back to the tokens' GPUs
        if model.moe_latent_norm:
            # Kimi-K3's routed_expert_norm: an RMSNorm of the combined latent before it goes back to the hidden width.
            ops.append(self.norm("moe_latent_norm", count=count, width=D))
        if model.moe_latent_size:
            ops.append(self.gemm("moe_latent_out_proj", D, H, D * H, H, H, count=count, module="mlp"))
        if model.moe_shared_experts:
            F_s = model.moe_shared_experts * model.shared_expert_ffn_size
            if F_s % tp:
                raise InputError(f"--tp: {tp} does not divide the shared-expert FFN size {F_s} of {model.name}")
            # The shared experts take the routed experts' format, or the dense MLP's where the checkpoint stores
            # them so (ModelSpec.shared_expert_module).
            ops += self.mlp("shared_", F_s, F_s // tp, count, model.shared_expert_module)
        return ops
