"""The 89 config.json files of current models in tests/data/hf_configs (aiconfigurator-core 0.12.0; README there).

Every one is either modelled, with total and active parameters within 2% of the publisher's figure and KV
bytes per token equal to a count by hand, or refused with one line naming the feature it lacks. No file may
be read silently as another architecture, and the quantisation configs are read per module.
"""

import json
import re
from pathlib import Path

import pytest

from simulator.cost.memory import kv_bytes_per_token, plan_memory, weight_bytes
from simulator.errors import InputError
from simulator.model.architecture import load_model_file
from simulator.model.gpu import load_gpu
from simulator.model.hf_config import from_hf_config
from simulator.model.layers import build_operators
from simulator.model.parameters import model_parameters
from simulator.model.precision import Precision, parse_precision

DATA = Path(__file__).parent / "data" / "hf_configs"
CONFIGS = sorted(p.name.removesuffix("_config.json") for p in DATA.glob("*_config.json")
                 if not p.name.endswith("_hf_quant_config.json"))


def load(stem: str):
    return load_model_file(DATA / f"{stem}_config.json")


# Refused: (config, the reason the one-line error must give).
# None is refused today: each of the 89 loads as the architecture it is (the last twenty refused were
# modelled in issue 35). A file that is refused must be added here with the reason its one-line error gives.
REFUSED: dict[str, str] = {
}

# Published parameter counts: (total, active, last printed digit, active convention, source).
# Conventions: "compute" counts what a token multiplies with but not the input embedding table (DeepSeek,
# OpenAI, Moonshot); "with embedding" adds the table (Mistral, Qwen's "activated", Meta, StepFun); "layers"
# counts the decoder layers only, neither the embedding table nor the LM head (Qwen's "non-embedding",
# MiniMax's activated count). Dense models give their non-embedding count as "active" where published.
MINIMAX = (229.9e9, 9.8e9, 0.1e9, "layers", "MiniMax-M2.5: 229.9B total, 9.8B activated (MiniMax M2.5 report; "
           "the MiniMax-M2 card: 230B total, 10B active)")
QWEN3_235B = (235e9, 22e9, 1e9, "with embedding", "Qwen3-235B-A22B card: 235B total, 22B activated")
QWEN3_30B = (30.5e9, 3.3e9, 0.1e9, "with embedding", "Qwen3-30B-A3B card: 30.5B total, 3.3B activated")
QWEN3_32B = (32.8e9, 31.2e9, 0.1e9, "layers", "Qwen3-32B card: 32.8B, 31.2B non-embedding")
QWEN3_8B = (8.2e9, 6.95e9, 0.1e9, "layers", "Qwen3-8B card: 8.2B, 6.95B non-embedding")
QWEN3_1_7B = (1.7e9, 1.4e9, 0.1e9, "layers", "Qwen3-1.7B card: 1.7B, 1.4B non-embedding")
QWEN3_4B = (4.0e9, 3.6e9, 0.1e9, "layers", "Qwen3-4B card: 4.0B, 3.6B non-embedding")
DEEPSEEK_V3 = (671e9, 37e9, 1e9, "compute", "DeepSeek-V3 README: 671B total (685B with the MTP module), 37B activated")
KIMI_K2 = (1.04e12, 32e9, 1e9, "compute", "Kimi K2 technical report (arXiv:2507.20534): 1.04T total, 32B activated; "
           "README: 1T / 32B")
# Kimi-K3: 69 Kimi Delta Attention and 24 MLA layers, 896 experts in a 3,584 latent (tests/test_kimi_delta_attention.py
# counts it by hand).
KIMI_K3 = (2.78e12, 104.2e9, 0.1e9, "compute", "Kimi K3 technical report's architecture table: 2.78T total, 104.2B "
           "activated (the moonshotai/Kimi-K3 card: 2.8T, 104B)")
LLAMA_70B = (70.6e9, None, 0.1e9, None, "Llama-3.1-70B card: 70.6B")
# DSA adds an indexer of 0.85B (DeepSeek-V3.2) to V3's layers; the V3.2 card's 685B counts the MTP module too (as V3's).
DEEPSEEK_V32 = (671e9, 37e9, 1e9, "compute", "DeepSeek-V3.2 (V3's 671B main model, 37B activated, plus the indexer; "
                "685B with the MTP module on the Hugging Face card)")
GLM5 = (744e9, 40e9, 1e9, "compute", "GLM-5 (Z.ai, GLM-5 release blog, February 2026): 744B total, 40B active")
# GLM-5.2/5.3 are GLM-5's layers with the indexer kept on 21 of 78 (57 x 9.37M = 0.53B fewer weights:
# tests/test_sparse_linear_attention.py); the Hugging Face card's 753B counts the MTP layer too.
GLM52 = (744e9, 40e9, 1e9, "compute", "GLM-5.2 (Z.ai, 744B-A40B, as GLM-5; the zai-org/GLM-5.2 card's safetensors "
         "count, 753B, includes the MTP layer)")
# Qwen3.5/3.6 cards count the vision encoder too (small beside the decoder: within 2% of the totals).
QWEN35_27B = (27e9, None, 1e9, None, "Qwen3.5-27B card: 27B")
QWEN35_35B = (35e9, 3e9, 1e9, "with embedding", "Qwen3.5-35B-A3B card: 35B total, 3B activated")
QWEN35_122B = (122e9, 10e9, 1e9, "with embedding", "Qwen3.5-122B-A10B card: 122B total, 10B activated")
QWEN35_397B = (397e9, 17e9, 1e9, "with embedding", "Qwen3.5-397B-A17B card: 397B total, 17B activated")
STEP = (196.81e9, 11e9, 0.01e9, "with embedding", "Step-3.5-Flash (the same layout): 196.81B total, 11B active "
        "(StepFun release notes)")
# Nemotron-H / Nemotron 3: Mamba-2, attention, MLP and MoE blocks (tests/test_mamba2.py counts them by hand).
NEMOTRON_3_NANO = (31.6e9, 3.2e9, 0.1e9, "compute", "Nemotron 3 Nano card: 31.6B total, 3.2B active (3.6B with "
                   "embeddings)")
# Super and Ultra: no card was reachable from here; the figures are their names' (120B-A12B, 550B-A55B), which the
# hand counts of tests/test_mamba2.py match within 1%.
NEMOTRON_3_SUPER = (120e9, 12e9, 1e9, "compute", "NVIDIA-Nemotron-3-Super-120B-A12B: 120B total, 12B active (name)")
NEMOTRON_3_ULTRA = (550e9, 55e9, 1e9, "compute", "NVIDIA-Nemotron-3-Ultra-550B-A55B: 550B total, 55B active (name)")
# DeepSeek-V4 (compressed attention, hyper-connections; tests/test_compressed_attention.py counts them by hand). The
# cards' totals leave out the multi-token-prediction layer, as DeepSeek-V3's 671B does.
DEEPSEEK_V4_FLASH = (284e9, 13e9, 1e9, "compute", "DeepSeek-V4-Flash card (huggingface.co/deepseek-ai/DeepSeek-V4-Flash): "
                     "284B total, 13B activated")
DEEPSEEK_V4_PRO = (1.6e12, 49e9, 0.1e12, "compute", "DeepSeek-V4-Pro card (huggingface.co/deepseek-ai/DeepSeek-V4-Pro): "
                   "1.6T total, 49B activated")
# Gemma 4: the model card's figures count the vision encoder (~0.55B) too, within 2% of the decoder's.
GEMMA4_26B = (25.2e9, 3.8e9, 0.1e9, "compute", "Gemma 4 model card (Model details): 26B A4B 25.2B total, 3.8B active")
GEMMA4_31B = (30.7e9, None, 0.1e9, None, "Gemma 4 model card: 31B 30.7B (NVIDIA's Gemma 4 31B IT card: Total "
              "Parameters 30.7B)")
# MiniMax-M3: 428B total, 23B activated (MiniMax's release on Hugging Face, June 2026); MiniMax counts activated
# parameters over the decoder layers (as for M2.5), and the total with its vision encoder and MTP modules.
MINIMAX_M3 = (428e9, 23e9, 1e9, "layers", "MiniMax-M3 release (Hugging Face, June 2026): 428B total, 23B activated")
# The VL models' cards count their vision encoder too; only the decoder is modelled, and it has the layer shapes
# of the Qwen3 text model named (asserted in test_qwen3_vl_decoders_are_the_qwen3_text_models).
PUBLISHED = {
    "MiniMaxAI--MiniMax-M2.5": MINIMAX, "MiniMaxAI--MiniMax-M2.7": MINIMAX,
    "nvidia--MiniMax-M2.5-NVFP4": MINIMAX, "nvidia--MiniMax-M2.7-NVFP4": MINIMAX,
    "Qwen--Qwen3-0.6B": (0.6e9, 0.44e9, 0.01e9, "layers", "Qwen3-0.6B card: 0.6B, 0.44B non-embedding"),
    "Qwen--Qwen3-1.7B": QWEN3_1_7B, "Qwen--Qwen3-8B": QWEN3_8B,
    "Qwen--Qwen3-32B": QWEN3_32B, "Qwen--Qwen3-32B-FP8": QWEN3_32B, "Qwen--Qwen3-32B-FP8-Static-PerTensor": QWEN3_32B,
    "Qwen--Qwen3-30B-A3B": QWEN3_30B, "Qwen--Qwen3-30B-A3B-FP8": QWEN3_30B,
    "Qwen--Qwen3-235B-A22B": QWEN3_235B, "Qwen--Qwen3-235B-A22B-FP8": QWEN3_235B,
    "nvidia--Qwen3-235B-A22B-NVFP4": QWEN3_235B,
    "Qwen--Qwen3-Coder-480B-A35B-Instruct": (480e9, 35e9, 1e9, "with embedding",
                                             "Qwen3-Coder-480B-A35B card: 480B total, 35B activated"),
    "Qwen--Qwen3-VL-2B-Instruct": QWEN3_1_7B, "Qwen--Qwen3-VL-4B-Instruct": QWEN3_4B,
    "Qwen--Qwen3-VL-8B-Instruct": QWEN3_8B, "Qwen--Qwen3-VL-32B-Instruct": QWEN3_32B,
    "Qwen--Qwen3-VL-32B-Thinking": QWEN3_32B, "Qwen--Qwen3-VL-30B-A3B-Instruct": QWEN3_30B,
    "Qwen--Qwen3-VL-235B-A22B-Instruct": QWEN3_235B,
    # MiMo-7B: the card gives no count ("7B"); worked out by hand in test_mimo_7b_counts_by_hand.
    "XiaomiMiMo--MiMo-7B-Base": (7_623_706_624, None, 1, None, "by hand (test_mimo_7b_counts_by_hand)"),
    "deepseek-ai--DeepSeek-V3": DEEPSEEK_V3, "deepseek-ai--DeepSeek-R1": DEEPSEEK_V3,
    "nvidia--DeepSeek-V3.1-NVFP4": DEEPSEEK_V3,
    "deepseek-ai--DeepSeek-V3.2": DEEPSEEK_V32, "nvidia--DeepSeek-V3.2-NVFP4": DEEPSEEK_V32,
    "deepseek-ai--DeepSeek-V4-Flash": DEEPSEEK_V4_FLASH, "nvidia--DeepSeek-V4-Flash-NVFP4": DEEPSEEK_V4_FLASH,
    "sgl-project--DeepSeek-V4-Flash-FP8": DEEPSEEK_V4_FLASH,
    "deepseek-ai--DeepSeek-V4-Pro": DEEPSEEK_V4_PRO, "nvidia--DeepSeek-V4-Pro-NVFP4": DEEPSEEK_V4_PRO,
    "sgl-project--DeepSeek-V4-Pro-FP8": DEEPSEEK_V4_PRO,
    "zai-org--GLM-5": GLM5, "zai-org--GLM-5-FP8": GLM5, "nvidia--GLM-5-NVFP4": GLM5, "zai-org--GLM-5.1": GLM5,
    "zai-org--GLM-5.1-FP8": GLM5, "nvidia--GLM-5.1-NVFP4": GLM5,
    "zai-org--GLM-5.2": GLM52, "zai-org--GLM-5.2-FP8": GLM52, "nvidia--GLM-5.2-NVFP4": GLM52,
    "zai-org--GLM-5.3": GLM52, "zai-org--GLM-5.3-FP8": GLM52, "nvidia--GLM-5.3-NVFP4": GLM52,
    "Qwen--Qwen3.5-27B": QWEN35_27B, "nvidia--Qwen3.6-27B-NVFP4": QWEN35_27B,
    "Qwen--Qwen3.5-35B-A3B": QWEN35_35B, "nvidia--Qwen3.6-35B-A3B-NVFP4": QWEN35_35B,
    "Qwen--Qwen3.5-122B-A10B": QWEN35_122B, "nvidia--Qwen3.5-122B-A10B-NVFP4": QWEN35_122B,
    "Qwen--Qwen3.5-397B-A17B": QWEN35_397B, "nvidia--Qwen3.5-397B-A17B-NVFP4": QWEN35_397B,
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct": (400e9, 17e9, 1e9, "with embedding",
                                                       "Llama 4 card: Maverick 400B total, 17B activated"),
    # Meta's 109B counts the vision encoder too (the decoder alone is 107.8B, within 2%).
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": (109e9, 17e9, 1e9, "with embedding",
                                                   "Llama 4 card: Scout 109B total, 17B activated"),
    "meta-llama--Meta-Llama-3.1-405B": (405.9e9, None, 0.1e9, None, "Llama-3.1-405B card: 405B (405.9B by count)"),
    # DeciLM's NAS-pruned Llama-3.3-70B: 49 attention layers, MLPs of six widths (tests/test_decilm_blocks.py).
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1": (49_867_145_216, None, 1, None, "Llama-3.3-Nemotron-Super-49B-v1 "
                                                 "card: 49,867,145,216 parameters"),
    "meta-llama--Meta-Llama-3.1-70B": LLAMA_70B, "nvidia--Llama-3.1-70B-Instruct-FP8": LLAMA_70B,
    "meta-llama--Meta-Llama-3.1-8B": (8.03e9, None, 0.01e9, None, "Llama-3.1-8B card: 8.03B"),
    "mistralai--Mixtral-8x22B-v0.1": (141e9, 39e9, 1e9, "with embedding",
                                      "Mistral, 'Cheaper, Better, Faster, Stronger' (2024): 39B active of 141B"),
    "mistralai--Mixtral-8x7B-v0.1": (46.7e9, 12.9e9, 0.1e9, "with embedding", "Mixtral of experts: 46.7B / 12.9B"),
    "moonshotai--Kimi-K2-Instruct": KIMI_K2, "moonshotai--Kimi-K2.5": KIMI_K2, "nvidia--Kimi-K2.5-NVFP4": KIMI_K2,
    "nvidia--Kimi-K2.6-NVFP4": KIMI_K2, "nvidia--Kimi-K2.7-Code-NVFP4": KIMI_K2, "moonshotai--Kimi-K3": KIMI_K3,
    "openai--gpt-oss-120b": (116.83e9, 5.13e9, 0.01e9, "compute", "gpt-oss model card: 116.83B total, 5.13B active"),
    "openai--gpt-oss-20b": (20.91e9, 3.61e9, 0.01e9, "compute", "gpt-oss model card: 20.91B total, 3.61B active"),
    "stepfun-ai--Step-3.7-Flash": STEP, "stepfun-ai--Step-3.7-Flash-FP8": STEP,
    "nvidia--Nemotron-H-56B-Base-8K": (56e9, None, 1e9, None, "Nemotron-H-56B-Base-8K card and the Nemotron-H "
                                       "report (arXiv:2504.03624): 56B"),
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": NEMOTRON_3_NANO,
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4": NEMOTRON_3_NANO,
    # Lightning's config has Nano's widths, experts and blocks field for field (its layers_block_type is Nano's
    # hybrid_override_pattern).
    "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": NEMOTRON_3_NANO,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8": NEMOTRON_3_SUPER,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4": NEMOTRON_3_SUPER,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": NEMOTRON_3_ULTRA,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8": NEMOTRON_3_ULTRA,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": NEMOTRON_3_ULTRA,
    "google--gemma-4-26B-A4B": GEMMA4_26B, "nvidia--Gemma-4-26B-A4B-NVFP4": GEMMA4_26B,
    "nvidia--Gemma-4-31B-IT-NVFP4": GEMMA4_31B,
    "XiaomiMiMo--MiMo-V2-Flash": (309e9, 15e9, 1e9, "compute", "MiMo-V2-Flash card (Xiaomi): 309B total, 15B active"),
    "MiniMaxAI--MiniMax-M3": MINIMAX_M3, "nvidia--MiniMax-M3-NVFP4": MINIMAX_M3,
}

# KV bytes per token at a 2-byte KV dtype, by hand: 2 L g d 2 (DESIGN.md), or (kv_lora_rank + rope) L 2 for MLA.
# DSA adds each layer's FP8 index key with its fp32 scale (128 + 4 bytes); a hybrid counts its full layers only.
MINIMAX_KV = 2 * 62 * 8 * 128 * 2
DSV32_KV = (512 + 64) * 61 * 2 + 61 * (128 + 4)
GLM5_KV = (512 + 64) * 78 * 2 + 78 * (128 + 4)
GLM52_KV = (512 + 64) * 78 * 2 + 21 * (128 + 4)  # index keys only where a layer has its own indexer (21 of 78)
KIMI_KV = (512 + 64) * 61 * 2
# DeepSeek-V4 per token, long-context rate: a 512-wide entry (bf16: 1,024 bytes) per 4 tokens on the CSA layers and per
# 128 on the HCA layers, and an index key (128 FP8 + a 4-byte scale) per 4 tokens on the CSA layers; the raw windows
# are a fixed amount per sequence. Flash: 21 CSA, 20 HCA (and 2 window-only) layers; Pro: 30 CSA, 31 HCA.
DSV4_FLASH_KV = 21 * 1024 // 4 + 20 * 1024 // 128 + 21 * (128 + 4) // 4  # 5,376 + 160 + 693 = 6,229
DSV4_PRO_KV = 30 * 1024 // 4 + 31 * 1024 // 128 + 30 * (128 + 4) // 4  # 7,680 + 248 + 990 = 8,918
# Gemma 4: the sliding layers' 2 g d (256 wide), the global layers' with their own KV heads and 512-wide heads, keys and
# values cached apart though the global layers compute their values from their keys (25 + 5 of 30; 50 + 10 of 60).
GEMMA4_26B_KV = 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2
GEMMA4_31B_KV = 50 * 2 * 16 * 256 * 2 + 10 * 2 * 4 * 512 * 2
# MiMo-V2-Flash: keys 192 wide, values 128; 9 full layers of 4 KV heads, 39 sliding of 8.
MIMO_V2_KV = 9 * 4 * (192 + 128) * 2 + 39 * 8 * (192 + 128) * 2
# MiniMax-M3: 60 layers of 4 KV heads, and a 128-wide bf16 index key in each of its 57 block-sparse layers.
MINIMAX_M3_KV = 2 * 60 * 4 * 128 * 2 + 57 * 128 * 2
KV_BY_HAND = {
    "MiniMaxAI--MiniMax-M2.5": MINIMAX_KV, "MiniMaxAI--MiniMax-M2.7": MINIMAX_KV,
    "nvidia--MiniMax-M2.5-NVFP4": MINIMAX_KV, "nvidia--MiniMax-M2.7-NVFP4": MINIMAX_KV,
    "Qwen--Qwen3-0.6B": 2 * 28 * 8 * 128 * 2, "Qwen--Qwen3-1.7B": 2 * 28 * 8 * 128 * 2,
    "Qwen--Qwen3-8B": 2 * 36 * 8 * 128 * 2, "Qwen--Qwen3-32B": 2 * 64 * 8 * 128 * 2,
    "Qwen--Qwen3-32B-FP8": 2 * 64 * 8 * 128 * 2, "Qwen--Qwen3-32B-FP8-Static-PerTensor": 2 * 64 * 8 * 128 * 2,
    "Qwen--Qwen3-30B-A3B": 2 * 48 * 4 * 128 * 2, "Qwen--Qwen3-30B-A3B-FP8": 2 * 48 * 4 * 128 * 2,
    "Qwen--Qwen3-235B-A22B": 2 * 94 * 4 * 128 * 2, "Qwen--Qwen3-235B-A22B-FP8": 2 * 94 * 4 * 128 * 2,
    "nvidia--Qwen3-235B-A22B-NVFP4": 2 * 94 * 4 * 128 * 2,
    "Qwen--Qwen3-Coder-480B-A35B-Instruct": 2 * 62 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-2B-Instruct": 2 * 28 * 8 * 128 * 2, "Qwen--Qwen3-VL-4B-Instruct": 2 * 36 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-8B-Instruct": 2 * 36 * 8 * 128 * 2, "Qwen--Qwen3-VL-32B-Instruct": 2 * 64 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-32B-Thinking": 2 * 64 * 8 * 128 * 2, "Qwen--Qwen3-VL-30B-A3B-Instruct": 2 * 48 * 4 * 128 * 2,
    "Qwen--Qwen3-VL-235B-A22B-Instruct": 2 * 94 * 4 * 128 * 2,
    "XiaomiMiMo--MiMo-7B-Base": 2 * 36 * 8 * 128 * 2,
    "deepseek-ai--DeepSeek-V3": (512 + 64) * 61 * 2, "deepseek-ai--DeepSeek-R1": (512 + 64) * 61 * 2,
    "nvidia--DeepSeek-V3.1-NVFP4": (512 + 64) * 61 * 2,
    "deepseek-ai--DeepSeek-V3.2": DSV32_KV, "nvidia--DeepSeek-V3.2-NVFP4": DSV32_KV,
    "deepseek-ai--DeepSeek-V4-Flash": DSV4_FLASH_KV, "nvidia--DeepSeek-V4-Flash-NVFP4": DSV4_FLASH_KV,
    "sgl-project--DeepSeek-V4-Flash-FP8": DSV4_FLASH_KV,
    "deepseek-ai--DeepSeek-V4-Pro": DSV4_PRO_KV, "nvidia--DeepSeek-V4-Pro-NVFP4": DSV4_PRO_KV,
    "sgl-project--DeepSeek-V4-Pro-FP8": DSV4_PRO_KV,
    "zai-org--GLM-5": GLM5_KV, "zai-org--GLM-5-FP8": GLM5_KV, "nvidia--GLM-5-NVFP4": GLM5_KV, "zai-org--GLM-5.1": GLM5_KV,
    "zai-org--GLM-5.1-FP8": GLM5_KV, "nvidia--GLM-5.1-NVFP4": GLM5_KV,
    "zai-org--GLM-5.2": GLM52_KV, "zai-org--GLM-5.2-FP8": GLM52_KV, "nvidia--GLM-5.2-NVFP4": GLM52_KV,
    "zai-org--GLM-5.3": GLM52_KV, "zai-org--GLM-5.3-FP8": GLM52_KV, "nvidia--GLM-5.3-NVFP4": GLM52_KV,
    # Qwen3.5/3.6: one layer in four is full attention (16 of 64, 10 of 40, 12 of 48, 15 of 60).
    "Qwen--Qwen3.5-27B": 2 * 16 * 4 * 256 * 2, "nvidia--Qwen3.6-27B-NVFP4": 2 * 16 * 4 * 256 * 2,
    "Qwen--Qwen3.5-35B-A3B": 2 * 10 * 2 * 256 * 2, "nvidia--Qwen3.6-35B-A3B-NVFP4": 2 * 10 * 2 * 256 * 2,
    "Qwen--Qwen3.5-122B-A10B": 2 * 12 * 2 * 256 * 2, "nvidia--Qwen3.5-122B-A10B-NVFP4": 2 * 12 * 2 * 256 * 2,
    "Qwen--Qwen3.5-397B-A17B": 2 * 15 * 2 * 256 * 2, "nvidia--Qwen3.5-397B-A17B-NVFP4": 2 * 15 * 2 * 256 * 2,
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct": 2 * 48 * 8 * 128 * 2,
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": 2 * 48 * 8 * 128 * 2,
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1": 2 * 49 * 8 * 128 * 2,  # 49 of its 80 layers have attention
    "meta-llama--Meta-Llama-3.1-405B": 2 * 126 * 8 * 128 * 2, "meta-llama--Meta-Llama-3.1-70B": 2 * 80 * 8 * 128 * 2,
    "nvidia--Llama-3.1-70B-Instruct-FP8": 2 * 80 * 8 * 128 * 2, "meta-llama--Meta-Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,
    "mistralai--Mixtral-8x22B-v0.1": 2 * 56 * 8 * 128 * 2, "mistralai--Mixtral-8x7B-v0.1": 2 * 32 * 8 * 128 * 2,
    "moonshotai--Kimi-K2-Instruct": KIMI_KV, "moonshotai--Kimi-K2.5": KIMI_KV, "nvidia--Kimi-K2.5-NVFP4": KIMI_KV,
    "nvidia--Kimi-K2.6-NVFP4": KIMI_KV, "nvidia--Kimi-K2.7-Code-NVFP4": KIMI_KV,
    "moonshotai--Kimi-K3": (512 + 64) * 24 * 2,  # its 24 MLA layers; the 69 KDA layers keep a state instead
    "openai--gpt-oss-120b": 2 * 36 * 8 * 64 * 2, "openai--gpt-oss-20b": 2 * 24 * 8 * 64 * 2,
    "stepfun-ai--Step-3.7-Flash": 2 * 45 * 8 * 128 * 2, "stepfun-ai--Step-3.7-Flash-FP8": 2 * 45 * 8 * 128 * 2,
    # Nemotron-H: only the '*' blocks cache keys and values (10 of 118; Nano 6 of 52, Super 8 of 88, Ultra 12 of 108).
    "nvidia--Nemotron-H-56B-Base-8K": 2 * 10 * 8 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 2 * 6 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4": 2 * 6 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": 2 * 6 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8": 2 * 8 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4": 2 * 8 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": 2 * 12 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8": 2 * 12 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": 2 * 12 * 2 * 128 * 2,
    "google--gemma-4-26B-A4B": GEMMA4_26B_KV, "nvidia--Gemma-4-26B-A4B-NVFP4": GEMMA4_26B_KV,
    "nvidia--Gemma-4-31B-IT-NVFP4": GEMMA4_31B_KV,
    "XiaomiMiMo--MiMo-V2-Flash": MIMO_V2_KV,
    "MiniMaxAI--MiniMax-M3": MINIMAX_M3_KV, "nvidia--MiniMax-M3-NVFP4": MINIMAX_M3_KV,
}


def test_every_config_is_either_modelled_or_refused():
    assert len(CONFIGS) == 89
    assert set(REFUSED).isdisjoint(PUBLISHED)
    assert sorted(set(REFUSED) | set(PUBLISHED)) == CONFIGS
    assert set(KV_BY_HAND) == set(PUBLISHED)


def test_refused_with_one_line_naming_the_feature():
    # Each refused file names the feature it lacks in one line; a model the loader refuses, built from a current
    # one, stands in while no fixture is refused: Gemma 4's E2B/E4B layers reuse an earlier layer's KV cache.
    cases = {stem: (json.loads((DATA / f"{stem}_config.json").read_text()), reason) for stem, reason in REFUSED.items()}
    gemma = json.loads((DATA / "google--gemma-4-26B-A4B_config.json").read_text())
    text = gemma.get("text_config", gemma)
    text["num_kv_shared_layers"] = 20
    cases["gemma-4-kv-shared"] = (gemma, r"layers that reuse an earlier layer's KV cache.*num_kv_shared_layers = 20")
    for stem, (config, reason) in cases.items():
        with pytest.raises(InputError) as info:
            from_hf_config(config, name=stem)
        message = str(info.value)
        assert "\n" not in message and "Traceback" not in message
        assert re.search(reason, message), message
        assert stem in message  # names the file


def within_published(ours: float, published: float, last_digit: float) -> bool:
    """Within 2% of the published figure, widened by half a unit of its last printed digit (its own rounding)."""
    return abs(ours - published) <= 0.02 * published + last_digit / 2


@pytest.mark.parametrize("stem", sorted(PUBLISHED))
def test_modelled_with_published_parameters_and_kv_bytes_by_hand(stem):
    model = load(stem)
    total, active, digit, convention, _source = PUBLISHED[stem]
    counts = model_parameters(model)
    assert within_published(counts.total, total, digit), counts
    if active is not None:
        lm_head = model.hidden_size * model.vocab_size
        ours = {"compute": counts.active, "with embedding": counts.active_with_embedding,
                "layers": counts.active - lm_head}[convention]
        assert within_published(ours, active, digit), (convention, counts)
    assert kv_bytes_per_token(model, Precision(kv="bf16")) == KV_BY_HAND[stem]
    # No reading of another family's layers in silence: the only warnings left name what is not modelled.
    for line in model.warnings:
        assert "Llama-style" not in line and "not understood" not in line, line


def test_mimo_7b_counts_by_hand():
    # MiMo-7B (Qwen2 layers; attention_bias: biases on every linear as this simulator counts them):
    # per layer q, k, v, o: 4096 (32 + 2 * 8) 128 + 32 128 4096 = 41,943,040 weights, + (32 + 16) 128 + 4096 biases;
    # MLP 3 4096 11008 = 135,266,304 weights + 2 11008 + 4096 biases; 2 norms of 4096.
    layer = 41_943_040 + 6_144 + 4_096 + 135_266_304 + 2 * 11_008 + 4_096 + 2 * 4_096
    embeddings = 2 * 151_680 * 4_096  # untied embedding and LM head
    assert 36 * layer + embeddings + 4_096 == PUBLISHED["XiaomiMiMo--MiMo-7B-Base"][0]


@pytest.mark.parametrize("vl,text", [
    ("Qwen--Qwen3-VL-2B-Instruct", "Qwen--Qwen3-1.7B"), ("Qwen--Qwen3-VL-8B-Instruct", "Qwen--Qwen3-8B"),
    ("Qwen--Qwen3-VL-32B-Instruct", "Qwen--Qwen3-32B"), ("Qwen--Qwen3-VL-30B-A3B-Instruct", "Qwen--Qwen3-30B-A3B"),
    ("Qwen--Qwen3-VL-235B-A22B-Instruct", "Qwen--Qwen3-235B-A22B"),
])
def test_qwen3_vl_decoders_are_the_qwen3_text_models(vl, text):
    ours, theirs = load(vl), load(text)
    shapes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size", "vocab_size",
              "moe_experts", "moe_top_k", "moe_ffn_size", "qk_norm", "tied_embeddings")
    assert {k: getattr(ours, k) for k in shapes} == {k: getattr(theirs, k) for k in shapes}
    assert any("vision" in w for w in ours.warnings)


def test_kimi_k2_is_read_as_deepseek_v3_mla_moe_without_a_warning():
    m = load("moonshotai--Kimi-K2-Instruct")
    assert m.warnings == []
    assert m.attention_kind == "MLA" and (m.kv_lora_rank, m.q_lora_rank, m.qk_rope_head_dim) == (512, 1536, 64)
    assert (m.moe_experts, m.moe_top_k, m.moe_shared_experts, m.moe_layers) == (384, 8, 1, 60)


def test_kimi_k25_routed_experts_int4_the_rest_bf16():
    m = load("moonshotai--Kimi-K2.5")
    # ignore: lm_head, re:.*self_attn.*, re:.*shared_experts.*, re:.*mlp\.(gate|up|gate_up|down)_proj.* (dense MLP):
    # only the routed experts are int4, in groups of 32 weights per fp16 scale.
    assert m.default_weights == "bf16,experts=int4,group_size=32"
    assert m.shared_expert_module == "mlp"
    precision = parse_precision(m.default_weights, "bf16")
    assert precision.module_weights("experts") == "int4" and precision.module_weights("mlp") == "bf16"
    assert precision.module_weights("attention") == "bf16"


def test_kimi_k25_int4_fits_on_8_h200_at_batch_1():
    model = load("moonshotai--Kimi-K2.5")
    precision = parse_precision(model.default_weights, "bf16")
    gpu = load_gpu("h200")
    operators = build_operators(model, precision, gpu, tp=8)
    # Weights per GPU by hand, bytes (tp = 8; H 7168, vocab 163840, 61 layers: 1 dense, 60 MoE):
    H, V = 7168, 163840
    embedding_and_head = 2 * V * H * 2 // 8  # both split by vocabulary
    # MLA: q_a (H x 1536) and kv_a (H x 576) replicated, q_b (1536 x 64*192), kv_b (512 x 64*256) and
    # o (64*128 x H) split by heads; its two norms (1536 + 512) replicated.
    attention = (H * 1536 + H * 576) * 2 + (1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * H) * 2 // 8 + 2048 * 2
    norms = 2 * H * 2
    dense_mlp = 3 * H * 18432 * 2 // 8
    # Routed experts: 384 of 3 x H x 2048 int4 weights (0.5 bytes) plus one fp16 scale per 32 (2/32 bytes).
    routed = 384 * 3 * H * 2048 * (0.5 + 2 / 32) / 8
    shared = 3 * H * 2048 * 2 // 8  # bf16, as the dense MLP
    router = H * 384 * 2  # replicated
    by_hand = embedding_and_head + 61 * (attention + norms) + dense_mlp + 60 * (routed + shared + router) + H * 2
    assert by_hand == 76_182_501_376  # 70.95 GiB: routed experts 71.3 GB of it
    assert weight_bytes(operators) == pytest.approx(by_hand, rel=1e-12)
    plan = plan_memory(model, precision, gpu, tp=8, batch=1, context_tokens=1100, operators=operators)
    assert plan.fits, plan


def test_qwen3_235b_fp8_warns_at_most_once_about_unconverted_modules():
    m = load("Qwen--Qwen3-235B-A22B-FP8")
    # 94 input_layernorm + 94 post_attention_layernorm + 94 mlp.gate (the router) + lm_head: none is a linear
    # this simulator quantises, so nothing to warn about; attention and experts are fp8 in 128 x 128 blocks.
    assert sum("modules_to_not_convert" in w or "unquantised" in w for w in m.warnings) <= 1
    assert m.warnings == []
    assert m.default_weights == "bf16,attention=fp8,mlp=fp8,fp8_block=128"


def test_modelopt_nvfp4_from_a_sibling_hf_quant_config():
    # nvidia/Qwen3-235B-A22B-NVFP4 keeps its quantisation in hf_quant_config.json (NVFP4, routers excluded).
    m = load("nvidia--Qwen3-235B-A22B-NVFP4")
    assert m.default_weights == "bf16,attention=fp4,mlp=fp4" and "modelopt" in m.quantization


def test_modelopt_ignore_globs_keep_attention_and_shared_experts_bf16():
    # Kimi-K2.6-NVFP4 ignores layers.0* (the dense layer), every layer's self_attn* and mlp.shared_experts*.
    m = load("nvidia--Kimi-K2.6-NVFP4")
    assert m.default_weights == "bf16,experts=fp4" and m.shared_expert_module == "mlp"
    assert [w for w in m.warnings if "quantization_config" in w] == []


def test_a_module_partly_excluded_is_one_warning_line():
    # DeepSeek-V3.1-NVFP4 leaves q_a, q_b, kv_a and kv_b of each layer in bf16 but quantises o_proj (63% of the
    # attention weights): one line, costed by the majority of the weights.
    m = load("nvidia--DeepSeek-V3.1-NVFP4")
    lines = [w for w in m.warnings if "quantization_config" in w]
    assert len(lines) == 1 and "37%" in lines[0] and "'attention'" in lines[0]
    assert m.default_weights == "bf16,attention=fp4,mlp=fp4"


def test_gpt_oss_glob_entries_and_mxfp4():
    m = load("openai--gpt-oss-120b")
    assert m.default_weights == "bf16,mlp=mxfp4" and m.warnings == []


def test_compressed_tensors_float4_with_8_bit_scales_is_mxfp4():
    config = json.loads((DATA / "moonshotai--Kimi-K2.5_config.json").read_text())
    kimi_k3 = json.loads((DATA / "moonshotai--Kimi-K3_config.json").read_text())
    config["text_config"]["quantization_config"] = kimi_k3["text_config"]["quantization_config"]
    spec = from_hf_config(config, "k2.5-mxfp4")
    assert spec["default_weights"] == "bf16,experts=mxfp4"


def test_repeated_warnings_are_one_line_with_a_count():
    config = json.loads((DATA / "Qwen--Qwen3-8B_config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                     "modules_to_not_convert": [f"model.layers.{i}.mystery" for i in range(36)]}
    warnings = from_hf_config(config, "q")["warnings"]
    assert len(warnings) == 1 and "36 unquantised-module entries" in warnings[0]


def test_an_unknown_field_is_named_in_the_warning():
    config = json.loads((DATA / "Qwen--Qwen3-8B_config.json").read_text())
    config["attention_output_gate"] = True
    config["brand_new_trick"] = 3
    warnings = from_hf_config(config, "q")["warnings"]
    assert len(warnings) == 1 and "attention_output_gate = True" in warnings[0] and "brand_new_trick" in warnings[0]


def test_a_config_with_infinity_is_read_for_its_layers_not_refused_for_its_json():
    # Python's json writes Infinity (Nemotron-H's time_step_limit, a training clamp nothing costs): the file loads,
    # its Mamba-2 layers modelled.
    model = load("nvidia--Nemotron-H-56B-Base-8K")
    assert model.mamba_layers == 54 and model.warnings == []
