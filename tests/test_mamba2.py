"""Mamba-2 layers (Nemotron-H, Nemotron 3), counted by hand from the real config.json files in tests/data/hf_configs.

Nemotron-H-56B-Base-8K's config: hidden 8192; Mamba-2 with 256 heads of P = 64, state N = 256, G = 8 groups,
convolution K = 4, chunk_size 128; 64 attention heads, 8 KV heads of 128; MLP 32768 (up and down, relu2);
vocabulary 131072, untied. Its state dtype is not in the file: float32, transformers' NemotronHConfig default and
vLLM's (NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE); the convolution window is at the model dtype.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.cost.memory import kv_bytes_per_sequence, kv_bytes_per_token, linear_state_bytes_per_sequence
from simulator.cost.pipeline import stage_model
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec, load_model_file
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.layers import build_operators
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision
from simulator.model.state_space_operators import Mamba2
from simulator.model.step import Step

DATA = Path(__file__).parent / "data" / "hf_configs"
H56 = "nvidia--Nemotron-H-56B-Base-8K"
NANO = "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
SUPER = "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"
BF16 = Precision(weights="bf16", kv="bf16")

# One Mamba-2 layer of Nemotron-H-56B, by hand from its config's numbers.
HEADS, P, N, G, K, Q, HIDDEN = 256, 64, 256, 8, 4, 128, 8192
INNER = HEADS * P  # 16,384
CONV = INNER + 2 * G * N  # 16,384 + 4,096 = 20,480 channels (x, B, C)
SSM_STATE_BYTES = HEADS * P * N * 4  # fp32: 16,777,216
CONV_STATE_BYTES = (K - 1) * CONV * 2  # bf16: 122,880


def config(stem: str) -> dict:
    return json.loads((DATA / f"{stem}_config.json").read_text().replace("Infinity", "1e999"))


def load(stem: str) -> ModelSpec:
    return load_model_file(DATA / f"{stem}_config.json")


def named(ops, name):
    return next(op for op in ops if op.name == name)


def mamba_op(stem: str = H56, tp: int = 1) -> Mamba2:
    op = named(build_operators(load(stem), BF16, load_gpu("h100"), tp=tp), "mamba")
    assert isinstance(op, Mamba2)
    return op


def test_fields_and_blocks_are_read_from_the_config():
    c = config(H56)
    assert (c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["n_groups"], c["conv_kernel"],
            c["chunk_size"]) == (HEADS, P, N, G, K, Q)
    m = load(H56)
    assert (m.mamba_heads, m.mamba_head_dim, m.mamba_state_size, m.mamba_groups, m.mamba_conv_kernel,
            m.mamba_chunk_size) == (HEADS, P, N, G, K, Q)
    assert "mamba_ssm_cache_dtype" not in c and m.mamba_state_dtype == "fp32"
    # The pattern, read off by hand: "M-M-M-M*-" then "M-M-M-M-M*-" nine times, then "M-M-M-M-M-": 4 + 9 x 5 + 5 = 54
    # Mamba blocks, each followed by an MLP ("-"), and 10 attention blocks (each also followed by an MLP).
    assert c["hybrid_override_pattern"] == "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-"
    assert (m.num_layers, m.mamba_layers, m.attention_layers, m.dense_mlp_layers, m.moe_layers) == (118, 54, 10, 54, 0)
    assert m.position_embedding == "none" and not m.gated_mlp  # NoPE attention; relu2 up/down MLP
    # Nemotron 3 Nano gives its state dtype, and its blocks as MoE ('E') instead of MLP.
    nano = load(NANO)
    assert config(NANO)["mamba_ssm_cache_dtype"] == "float32" and nano.mamba_state_dtype == "fp32"
    assert (nano.mamba_layers, nano.attention_layers, nano.moe_layers, nano.dense_mlp_layers) == (23, 6, 23, 0)


def test_state_bytes_per_sequence_by_hand():
    # Per layer: 256 heads x 64 x 256 fp32 = 16,777,216 bytes of SSM state, and the convolution window
    # (4 - 1) x 20,480 bf16 = 122,880 bytes; 54 Mamba layers; nothing grows with the context.
    assert (SSM_STATE_BYTES, CONV_STATE_BYTES) == (16_777_216, 122_880)
    per_sequence = 54 * (SSM_STATE_BYTES + CONV_STATE_BYTES)
    assert per_sequence == 912_605_184  # 870 MiB
    m = load(H56)
    assert linear_state_bytes_per_sequence(m, BF16) == per_sequence
    # Heads, groups and channels split over 4 GPUs.
    assert linear_state_bytes_per_sequence(m, BF16, tp=4) == per_sequence / 4
    assert mamba_op().state_bytes == SSM_STATE_BYTES + CONV_STATE_BYTES
    assert mamba_op(tp=4).state_bytes == (SSM_STATE_BYTES + CONV_STATE_BYTES) / 4
    # A sequence's bytes: its tokens' KV in the 10 attention layers, plus the fixed state.
    kv = 2 * 10 * 8 * 128 * 2
    assert kv_bytes_per_sequence(m, BF16, 4096) == 4096 * kv + per_sequence


def test_kv_bytes_per_token_count_the_attention_blocks_only():
    # 10 attention blocks x (K and V) x 8 KV heads x 128 x 2 bytes = 40,960 bytes per token.
    assert kv_bytes_per_token(load(H56), BF16) == 10 * 2 * 8 * 128 * 2 == 40_960
    # Nano: 6 attention blocks of 2 KV heads x 128.
    assert kv_bytes_per_token(load(NANO), BF16) == 6 * 2 * 2 * 128 * 2 == 6_144


def test_decode_reads_and_writes_the_state_once_with_flops_by_hand():
    op = mamba_op()
    assert op.count == 54
    # Recurrent step per head: decay, outer product and add (3 P N), read-out h C (2 P N): 5 x 64 x 256 = 81,920;
    # x 256 heads = 20,971,520. The convolution: 2 x 4 x 20,480 = 163,840; the skip D x: 2 x 16,384 = 32,768.
    flops = 5 * P * N * HEADS + 2 * K * CONV + 2 * INNER
    assert flops == 21_168_128
    for context in (100, 8000):  # nothing depends on the context
        work = op.work(Step.decode(1, context))
        assert work.flops == flops
        assert work.kv_read_bytes == work.kv_write_bytes == SSM_STATE_BYTES + CONV_STATE_BYTES == 16_900_096
    # Eight sequences: eight states read and written.
    work = op.work(Step.decode(8, 4096))
    assert work.kv_read_bytes == work.kv_write_bytes == 8 * 16_900_096 and work.flops == 8 * flops
    # Activations per token: the convolution reads and writes 20,480 channels, the scan reads them and 256 dt and
    # writes y (16,384), the gated norm reads y and z and writes 16,384: 3 x 20,480 + 256 + 4 x 16,384 = 127,232
    # bf16 elements.
    assert op.work(Step.decode(1, 4096)).activation_bytes == (3 * CONV + HEADS + 4 * INNER) * 2 == 254_464


def test_prefill_runs_the_chunked_ssd_scan_with_flops_by_hand():
    op = mamba_op()
    assert op.chunk_tokens == Q == 128  # the config's chunk_size
    # Per token (Dao and Gu 2024, section 6): C B^T per group 2 Q N G = 524,288; per head 2 Q P (intra-chunk
    # outputs) + 2 N P (chunk states) + 2 N P / Q (state passing) + 2 N P (outputs from states)
    # = 16,384 + 32,768 + 256 + 32,768 = 82,176, x 256 heads = 21,037,056; plus the convolution and the skip.
    per_token = 2 * Q * N * G + HEADS * (2 * Q * P + 4 * N * P + 2 * N * P // Q) + 2 * K * CONV + 2 * INNER
    assert per_token == 524_288 + 21_037_056 + 163_840 + 32_768 == 21_757_952
    work = op.work(Step.prefill(1, 4096))
    assert work.flops == 4096 * per_token
    # One sequence: its state written once (and read: a chunked prefill resumes from it).
    assert work.kv_read_bytes == work.kv_write_bytes == 16_900_096


def test_parameters_by_hand_and_within_2_percent_of_published():
    # One Mamba layer: in_proj 8192 x (2 x 16,384 + 2 x 8 x 256 + 256) = 304,087,040; conv 20,480 x (4 + 1 bias)
    # = 102,400; A_log, D, dt_bias 3 x 256; gated-norm weight 16,384; out_proj 16,384 x 8192 = 134,217,728.
    mamba = 304_087_040 + 102_400 + 768 + 16_384 + 134_217_728
    assert mamba == 438_424_320
    mlp = 2 * 8192 * 32768  # up, down
    attention = 8192 * 64 * 128 * 2 + 8192 * 8 * 128 * 2  # q, o; k, v
    norm = 8192  # one RMSNorm per block, and the final one
    total = 54 * (mamba + norm) + 54 * (mlp + norm) + 10 * (attention + norm) + 2 * 131_072 * 8192 + norm
    assert total == 56_324_350_464
    counts = model_parameters(load(H56))
    assert counts.total == total
    assert abs(total - 56e9) < 0.02 * 56e9  # Nemotron-H-56B-Base-8K card, Nemotron-H report: 56B


def test_nano_parameters_by_hand_and_published():
    # H 2688; Mamba 64 heads x 64 (I 4096), G 8, N 128: conv 4096 + 2048 = 6144 channels; 23 blocks each of Mamba
    # and MoE (128 experts of up/down 2688 x 1856, top 6, a shared expert of 3712, a 128 x 2688 router); 6 attention
    # blocks of 32 heads, 2 KV heads of 128.
    mamba = 2688 * (2 * 4096 + 2 * 8 * 128 + 64) + 6144 * 5 + 3 * 64 + 4096 + 4096 * 2688
    expert = 2 * 2688 * 1856
    shared, router = 2 * 2688 * 3712, 128 * 2688
    attention = 2 * 2688 * 32 * 128 + 2 * 2688 * 2 * 128
    norms = 52 * 2688 + 2688
    head = 131_072 * 2688
    total = 23 * (mamba + 128 * expert + shared + router) + 6 * attention + norms + 2 * head
    active = 23 * (mamba + 6 * expert + shared + router) + 6 * attention + norms + head  # without the input table
    counts = model_parameters(load(NANO))
    assert (counts.total, counts.active) == (total, active)
    # Nemotron 3 Nano card: 31.6B total, 3.2B active (3.6B with embeddings).
    assert abs(total - 31.6e9) < 0.02 * 31.6e9 and abs(active - 3.2e9) < 0.02 * 3.2e9 + 0.05e9
    assert abs(counts.active_with_embedding - 3.6e9) < 0.02 * 3.6e9 + 0.05e9


def test_super_routed_experts_work_in_the_latent():
    # Super: 512 experts of up/down 1024 (the latent) x 2688 per MoE block, projected from and back to the hidden
    # 4096 by replicated latent projections (4096 x 1024 each).
    ops = build_operators(load(SUPER), BF16, load_gpu("h100"), tp=4)
    up, latent_in = named(ops, "experts_up"), named(ops, "moe_latent_in_proj")
    assert (up.in_features, up.params, up.count) == (1024, 512 * 1024 * 2688, 40)
    assert (latent_in.in_features, latent_in.out_features, latent_in.params) == (4096, 1024, 4096 * 1024)
    assert named(ops, "shared_up_proj").in_features == 4096  # the shared expert reads the hidden state


def test_state_pool_caps_the_running_sequences():
    from simulator.plan.engine_run import prepare

    path = str(DATA / f"{H56}_config.json")
    prep = prepare({"model": path, "gpu": "h100", "tp": 4, "batch": 8, "ctx": 4096, "max_num_seqs": 1024})
    state = 912_605_184 / 4  # per GPU at tp 4, by hand above
    assert linear_state_bytes_per_sequence(prep.deployment.system.model, prep.deployment.system.precision,
                                           tp=4) == state
    # 1,024 states of 228 MB would take 234 GB per GPU: the pool holds what half the budget allows, and the
    # scheduler runs no more sequences than that.
    budget = prep.capacity.budget_bytes_per_gpu + prep.capacity.state_bytes_per_gpu
    assert prep.capacity.state_sequences == int(budget / 2 // state) < 1024
    assert prep.capacity.state_bytes_per_gpu == prep.capacity.state_sequences * state
    assert prep.config.max_num_seqs == prep.capacity.state_sequences
    small = prepare({"model": path, "gpu": "h100", "tp": 4, "batch": 8, "ctx": 4096, "max_num_seqs": 8})
    assert small.config.max_num_seqs == small.capacity.state_sequences == 8


def test_simulate_runs_nemotron_h_56b_on_4_h100():
    args = ["--model", str(DATA / f"{H56}_config.json"), "--gpu", "h100", "--tp", "4", "--batch", "8",
            "--ctx", "4096"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Mamba-2 on 54" in result.output and "40,960 bytes/token" in result.output
    assert "completed    8 of 8" in result.output


def test_pipeline_stage_keeps_its_blocks():
    m = load(H56)
    stage = stage_model(m, 2)  # the last 59 layers
    assert stage.block_pattern == m.block_pattern[59:]
    assert (stage.mamba_layers, stage.attention_layers) == (m.block_pattern[59:].count("M"),
                                                            m.block_pattern[59:].count("*"))
    with pytest.raises(InputError, match="without an attention layer"):
        stage_model(m, 12)  # the last 10 layers are "M-M-M-M-M-"


def test_other_state_space_layouts_stay_refused():
    c = config(H56)
    # A block pattern is read for nemotron_h only; another model_type with one is refused as before.
    with pytest.raises(InputError, match="Mamba-2"):
        from_hf_config({**c, "model_type": "zamba2"}, "other")
    with pytest.raises(InputError, match="state-space"):
        from_hf_config({**c, "mamba_d_state": 16}, "jamba-like")
    with pytest.raises(InputError, match="hybrid_override_pattern"):
        from_hf_config({**c, "hybrid_override_pattern": c["hybrid_override_pattern"].replace("*", "X")}, "odd")
