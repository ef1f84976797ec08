"""The Mamba-2 mixer (state-space duality, SSD) of a hybrid model's 'M' layers, and the work it does.

Split from :mod:`simulator.model.operators` as :mod:`simulator.model.sparse_linear_operators` is; that module's
``Operator`` union includes :class:`Mamba2`. Formulas and sources are collected in docs/time-model.md ("Mamba-2").

**Mamba-2** (Dao and Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured
State Space Duality", ICML 2024; state-spaces/mamba ``mamba_ssm/modules/mamba2.py``; Nemotron-H:
transformers' ``NemotronHMamba2Mixer``). With I = heads x P the inner width, G groups and N the state width:

- ``in_proj`` maps the hidden state to [z (I), x (I), B (G N), C (G N), dt (heads)]: 2 I + 2 G N + heads columns;
- a depthwise causal convolution of width K (with a bias) runs over the conv_dim = I + 2 G N channels of x, B, C;
- per head a scalar decay A (``A_log``), a skip D and a time-step bias ``dt_bias``;
- the scan: per head a P x N state h, updated per token as h <- exp(dt A) h + dt x B^T and read out as y = h C + D x
  (B and C are shared by the heads of a group);
- a gated RMSNorm of y by SiLU(z) (weight I) and ``out_proj`` back to the hidden state (I x H).

The state does not grow with the context; each sequence also keeps the last K - 1 inputs of the convolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from simulator.model.step import Number, Step
from simulator.model.work import Work, active

# The SSD prefill scan's chunk when a config gives none: state-spaces/mamba's Mamba2(chunk_size=256). Nemotron-H's
# configs give chunk_size 128, which vLLM passes to its mamba_chunk_scan_combined.
SSD_CHUNK_TOKENS = 256

# The SSD kernels keep the chunk states and C B^T in fp32 (state-spaces/mamba ssd_combined.py:
# _chunk_state_fwd states_in_fp32=True, _bmm_chunk_fwd output_dtype=torch.float32).
SSD_SCRATCH_BYTES = 4.0


def mamba2_state_bytes(heads: int, head_dim: int, state_size: int, conv_channels: int, conv_kernel: int,
                       state_bytes: float, conv_bytes: float) -> float:
    """Bytes one sequence keeps in one Mamba-2 layer: the P x N SSM state of each head at the state dtype, and the
    last ``conv_kernel - 1`` inputs of the convolution over ``conv_channels`` channels at the model dtype (vLLM's
    ``MambaStateShapeCalculator.mamba2_state_shape``: conv (conv_kernel - 1, conv_dim), temporal (heads, head_dim,
    state_size); ``MambaStateDtypeCalculator``: the temporal state at ``mamba_ssm_cache_dtype``)."""
    return heads * head_dim * state_size * state_bytes + (conv_kernel - 1) * conv_channels * conv_bytes


@dataclass(frozen=True)
class Mamba2:
    """The convolution, SSD scan and gated norm of one Mamba-2 layer, for the heads on one GPU (projections are
    GEMMs). ``heads`` and ``groups`` are this GPU's (vLLM's ``MambaMixer2`` splits heads and groups over tp).

    FLOPs per token (P head width, N state width, G groups, Q chunk, K convolution width, c = heads P + 2 G N):

    - every token: the depthwise convolution, 2 K c; the skip D x, 2 P per head.
    - decode (recurrent, state-spaces/mamba ``selective_state_update``): per head the decay exp(dt A) h, the outer
      product dt x B^T and its add (3 P N), and the read-out h C (2 P N): 5 P N.
    - prefill (chunked SSD, ``mamba_chunk_scan_combined``; Dao and Gu 2024, section 6, its four steps): C B^T within
      each chunk per group (2 Q N G per token); the masked intra-chunk outputs (C B^T o L) X per head (2 Q P); the
      chunk states B^T X (2 N P); passing the states across chunks (2 N P / Q); the outputs from the passed states
      C h (2 N P): 2 Q N G + heads (2 Q P + 4 N P + 2 N P / Q).

    Every sequence in the step reads its state (and convolution window) once and writes it once, whatever its token
    count (``state_bytes``, counted as KV-cache traffic). Activation traffic per token: the convolution reads and
    writes its c channels, the scan reads them and dt and writes y, the gated norm reads y and z and writes the
    result: 3 c + heads + 4 I elements; prefill adds the fp32 chunk states (written by the chunk-state kernel, read
    and written by state passing, read by the chunk scan: 4 heads P N per chunk) and C B^T (written and read:
    2 G Q per token).
    """

    name: str
    count: int
    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    state_bytes_per_element: float
    activation_bytes_per_element: float
    compute_dtype: str
    params: int
    resident_bytes: float
    chunk_tokens: int = SSD_CHUNK_TOKENS
    data_parallel: int = 1
    """attention data parallelism: this GPU holds and runs 1/data_parallel of the step's sequences"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the step's sequences and prefill tokens"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    @property
    def inner_size(self) -> int:
        """I on this GPU: heads x head width."""
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution on this GPU: x (I), B and C (G N each)."""
        return self.inner_size + 2 * self.groups * self.state_size

    @property
    def state_bytes(self) -> float:
        """Bytes one sequence keeps in this layer on this GPU (SSM state and convolution window)."""
        return mamba2_state_bytes(self.heads, self.head_dim, self.state_size, self.conv_channels, self.conv_kernel,
                                  self.state_bytes_per_element, self.activation_bytes_per_element)

    def work(self, step: Step) -> Work:
        P, N, G, Q, h = self.head_dim, self.state_size, self.groups, self.chunk_tokens, self.heads
        b_a = self.activation_bytes_per_element
        prefill = step.prefill_tokens
        decode = step.tokens - prefill
        flops = (decode * h * 5.0 * P * N
                 + prefill * (2.0 * Q * N * G + h * (2.0 * Q * P + 4.0 * N * P + 2.0 * N * P / Q))
                 + step.tokens * (2.0 * self.conv_kernel * self.conv_channels + 2.0 * h * P))
        per_token = 3 * self.conv_channels + h + 4 * self.inner_size
        scratch = prefill * (4.0 * h * P * N / Q + 2.0 * G * Q) * SSD_SCRATCH_BYTES
        sequences = step.sequences * active(step.tokens)
        share = 1.0 / self.data_parallel
        return Work(
            flops=flops * share,
            kv_read_bytes=sequences * self.state_bytes * share,
            kv_write_bytes=sequences * self.state_bytes * share,
            activation_bytes=(step.tokens * per_token * b_a + scratch) * share,
            # decode: causal_conv1d_update, selective_state_update, the gated norm; prefill: causal_conv1d_fn, the
            # five SSD kernels (chunk cumsum, chunk state, state passing, C B^T, chunk scan) and the gated norm
            launches=3.0 * active(decode) + 7.0 * active(prefill),
        )
