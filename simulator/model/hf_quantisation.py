"""A HuggingFace ``quantization_config`` -> the checkpoint's weight formats as ``--weights`` text.

Split from :mod:`simulator.model.hf_config` because reading a quantisation config is a concept of its
own (formats of five toolkits, and lists of modules left unquantised) and together they passed 600 lines.

Formats read (weights only; a KV-cache scheme is the run's ``--kv``):
- ``fp8`` / ``fbgemm_fp8`` (transformers' fine-grained FP8): fp8, ``weight_block_size`` -> ``fp8_block``.
- ``mxfp4`` (gpt-oss): mxfp4.
- ``compressed-tensors`` (llm-compressor): the ``weights`` of its ``config_groups``: int 4/8 bits -> int4/int8
  with their ``group_size``; float 8 -> fp8 (``block_structure`` -> ``fp8_block``); float 4 -> mxfp4 when
  its scales are 8-bit (``mxfp4-pack-quantized``, ``scale_dtype`` uint8, or groups of 32), else NVFP4 (fp4).
- ``modelopt`` (NVIDIA ModelOpt, in ``quantization_config`` or a sibling ``hf_quant_config.json``):
  ``quant_algo`` NVFP4 -> fp4, FP8 -> fp8, W4A16_AWQ / W4A8_AWQ -> int4.
- ``awq`` / ``gptq``: ``bits`` 4/8 -> int4/int8 with ``group_size``.

Modules left unquantised (``modules_to_not_convert``, ``ignore``, ``exclude_modules``) are matched the way
each toolkit matches them, against the checkpoint's own module names of every layer: ``re:`` entries as
regular expressions from the start of the name (compressed-tensors), entries with ``*`` as globs of the
whole name (ModelOpt), and plain entries as a run of whole dot-separated name parts (transformers).
Only linear layers can be quantised: entries naming norms, biases, routers, the vision tower or the
multi-token-prediction layers change nothing here and are read silently.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

# The linear layers of each module as a checkpoint names them (after the layer prefix), one list per
# naming scheme: DeepSeek/Qwen/Llama ``mlp``, Mixtral/MiniMax ``block_sparse_moe``, Llama 4 ``feed_forward``,
# gpt-oss's fused experts. A module is excluded when every linear of one scheme is.
_ATTENTION_MHA = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),)
_MLP = (("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"), ("mlp.gate_up_proj", "mlp.down_proj"),
        ("feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj"),
        ("mixer.up_proj", "mixer.down_proj"))
_EXPERTS = (("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj"),
            ("block_sparse_moe.experts.0.w1", "block_sparse_moe.experts.0.w2", "block_sparse_moe.experts.0.w3"),
            ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
            ("feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj"),
            ("mixer.experts.0.up_proj", "mixer.experts.0.down_proj"))
# Gemma 4's experts (Gemma4TextExperts) hang on the layer itself, beside its dense ``mlp``: the only names its
# experts have (the schemes above would read an excluded ``mlp*`` as excluding them).
_PARALLEL_EXPERTS = (("experts.gate_up_proj", "experts.down_proj"),)
_SHARED = (("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"),
           ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj"),
           ("feed_forward.shared_expert.gate_proj", "feed_forward.shared_expert.up_proj",
            "feed_forward.shared_expert.down_proj"),
           ("mixer.shared_experts.up_proj", "mixer.shared_experts.down_proj"))

# Layer prefixes of the checkpoints in use: a multimodal checkpoint nests its decoder.
_PREFIXES = ("language_model.model.layers.", "model.language_model.layers.", "model.layers.", "backbone.layers.",
             "layers.")

# Entries that name something other than a quantisable linear of the decoder: read silently.
_NOT_A_LINEAR = re.compile(r"norm|bias|gate$|gate\*?$|\.gate\b|router|embed|vision|visual|mm_projector|"
                           r"multi_modal_projector|patch_merge|mtp|eh_proj|shared_head|indexer|lm_head|head$|conv1d")


def _matcher(patterns: list[str]) -> Callable[[str], bool]:
    """One test ``name -> excluded?`` for all entries (module docstring: how each kind matches)."""
    plain = {p for p in patterns if not p.startswith("re:") and "*" not in p and "?" not in p}
    regex = [p[3:] for p in patterns if p.startswith("re:")]
    # A glob names a module and everything inside it (transformers matches ``key\\.`` from the start too).
    regex += [fnmatch.translate(p).removesuffix(r"\Z").removesuffix(")") + r")(?:\.|\Z)"
              for p in patterns if not p.startswith("re:") and ("*" in p or "?" in p)]
    combined = re.compile("|".join(f"(?:{r})" for r in regex)) if regex else None

    def excluded(name: str) -> bool:
        if plain:
            parts = name.split(".")
            runs = {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
            if plain & runs:
                return True
        return bool(combined and combined.match(name))

    return excluded


def _prefix(patterns: list[str]) -> str:
    """The layer prefix most entries use (``model.layers.`` when none says)."""
    counts = Counter(next((p for p in _PREFIXES if p in entry), "model.layers.") for entry in patterns)
    return counts.most_common(1)[0][0] if counts else "model.layers."


def _is_moe_layer(spec: dict[str, Any], index: int) -> bool:
    """ModelSpec.layer_is_moe on the spec's fields before the ModelSpec exists."""
    if int(spec.get("moe_experts") or 1) <= 1:
        return False
    pattern = spec.get("block_pattern")
    if pattern:
        return str(pattern)[index] == "E"  # Nemotron-H: the pattern's MoE blocks
    if index < int(spec.get("moe_first_dense_layers") or 0) or index in (spec.get("moe_dense_layer_indices") or []):
        return False
    return (index + 1) % int(spec.get("moe_layer_step") or 1) == 0


# Gated DeltaNet's linears (Qwen3.5's checkpoint names, and the fused ones of Qwen3-Next), costed as 'attention':
# in a linear layer these are what a quantisation config excludes or keeps.
_LINEAR_ATTENTION = (("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                      "linear_attn.in_proj_a", "linear_attn.out_proj"),
                     ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj"))


# Nemotron-H's mixers (NemotronHBlock.mixer), costed as 'attention': the attention blocks' and the Mamba-2 blocks'
# projections (the convolution is not a linear).
_NEMOTRON_H = (("mixer.q_proj", "mixer.k_proj", "mixer.v_proj", "mixer.o_proj"), ("mixer.in_proj", "mixer.out_proj"))


def _present(spec: dict[str, Any], module: str, index: int) -> bool:
    """Does layer ``index`` hold ``module`` ('attention', 'mlp', 'experts', 'shared')?"""
    pattern = spec.get("block_pattern")
    moe = _is_moe_layer(spec, index)
    if module == "shared" and not spec.get("moe_shared_experts"):
        return False
    if pattern:
        # Nemotron-H: one mixer ('M', '*') or one FFN ('-' dense, 'E' MoE) per layer.
        return str(pattern)[index] in {"attention": "M*", "mlp": "-", "experts": "E", "shared": "E"}[module]
    if module == "mlp" and spec.get("moe_parallel_mlp"):
        return True  # Gemma 4: the dense MLP in every layer, beside the experts
    return not ((module == "mlp" and moe) or (module in ("experts", "shared") and not moe))


def _attention_names(spec: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    if spec.get("block_pattern"):
        return _NEMOTRON_H
    if spec.get("linear_value_heads"):
        return _ATTENTION_MHA + _LINEAR_ATTENTION
    if not spec.get("kv_lora_rank"):
        return _ATTENTION_MHA
    query = ("self_attn.q_a_proj", "self_attn.q_b_proj") if spec.get("q_lora_rank") else ("self_attn.q_proj",)
    return ((*query, "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.o_proj"),)


def _weights(spec: dict[str, Any]) -> dict[str, float]:
    """Parameters of each attention linear (a module partly excluded is judged by the share of its weights)."""
    H, n = int(spec["hidden_size"]), int(spec["num_heads"])
    d = int(spec.get("head_dim") or H // n)
    g = int(spec.get("num_kv_heads") or n)
    r, r_q = int(spec.get("kv_lora_rank") or 0), int(spec.get("q_lora_rank") or 0)
    d_r, d_n, d_v = (int(spec.get(k) or 0) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    if r:
        return {"self_attn.q_a_proj": H * r_q, "self_attn.q_b_proj": r_q * n * (d_n + d_r),
                "self_attn.q_proj": H * n * (d_n + d_r), "self_attn.kv_a_proj_with_mqa": H * (r + d_r),
                "self_attn.kv_b_proj": r * n * (d_n + d_v), "self_attn.o_proj": n * d_v * H}
    d_v = d_v or d  # values narrower than keys outside MLA (MiMo-V2-Flash)
    return {"self_attn.q_proj": H * n * d, "self_attn.k_proj": H * g * d, "self_attn.v_proj": H * g * d_v,
            "self_attn.o_proj": n * d_v * H}


def _excluded_layers(spec: dict[str, Any], patterns: list[str]) -> dict[str, tuple[float, int]]:
    """For attention, mlp, experts and shared experts: (layers where excluded, counting a layer whose module is
    partly excluded by the share of its weights left unquantised; layers where present)."""
    excluded = _matcher(patterns)
    prefix = _prefix(patterns)
    layers = int(spec["num_layers"])
    experts = _PARALLEL_EXPERTS if spec.get("moe_parallel_mlp") else _EXPERTS
    modules = {"attention": _attention_names(spec), "mlp": _MLP, "experts": experts, "shared": _SHARED}
    sizes = _weights(spec)
    counts: dict[str, tuple[float, int]] = {}
    for module, schemes in modules.items():
        hits, present = 0.0, 0
        for i in range(layers):
            if not _present(spec, module, i):
                continue
            present += 1
            shares = []
            for scheme in schemes:
                size = {name: sizes.get(name, 2.0 if "gate_up" in name else 1.0) for name in scheme}
                left = sum(size[name] for name in scheme if excluded(f"{prefix}{i}.{name}"))
                shares.append(left / sum(size.values()))
            hits += max(shares)
        counts[module] = (hits, present)
    return counts


def _unmatched(spec: dict[str, Any], patterns: list[str]) -> list[str]:
    """Entries that match no linear of the decoder and do not name a known non-linear either."""
    prefix = _prefix(patterns)
    layers = int(spec["num_layers"])
    experts = _PARALLEL_EXPERTS if spec.get("moe_parallel_mlp") else _EXPERTS
    suffixes = [name for schemes in (_attention_names(spec), _MLP, experts, _SHARED) for scheme in schemes
                for name in scheme]
    unknown = []
    for pattern in patterns:
        if _NOT_A_LINEAR.search(pattern.lower()):
            continue
        numbers = [int(n) for n in re.findall(r"layers\.(\d+)", pattern)]
        if numbers and numbers[0] >= layers:
            continue  # a layer past the decoder's: the multi-token-prediction layers (DeepSeek's layout)
        # An entry naming one layer can only match that layer's linears.
        indices = numbers[:1] if numbers else range(layers)
        test = _matcher([pattern])
        if not any(test(f"{prefix}{i}.{name}") for i in indices for name in suffixes):
            unknown.append(pattern)
    return unknown


def _float4(weights: dict[str, Any], qc: dict[str, Any]) -> str:
    """NVFP4 (fp4: 16 values per fp8 scale) or MXFP4 (32 values per 8-bit scale)."""
    text = f"{qc.get('format', '')} {weights.get('format', '')} {weights.get('scale_dtype', '')}".lower()
    if "mxfp4" in text or "uint8" in text or weights.get("group_size") == 32:
        return "mxfp4"
    return "fp4"


def _format(method: str, qc: dict[str, Any]) -> tuple[str, int] | None:
    """(weight format, group size for int formats or fp8 block) of a config, or None when not modelled."""
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        return "fp8", int(block[0]) if isinstance(block, list) and block else 0
    if method == "mxfp4":
        return "mxfp4", 0
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if "NVFP4" in algo:
            return "fp4", 0
        if "AWQ" in algo and "W4" in algo:
            return "int4", int(qc.get("group_size") or 128)
        if algo.startswith("FP8"):
            return "fp8", 0
        return None
    if method in ("awq", "gptq"):
        bits = qc.get("bits") or qc.get("w_bit")
        fmt = {4: "int4", 8: "int8"}.get(int(bits)) if isinstance(bits, int) else None
        return (fmt, int(qc.get("group_size") or qc.get("q_group_size") or 128)) if fmt else None
    if method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            bits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
            if kind == "float" and bits == 8:
                block = weights.get("block_structure")
                return "fp8", int(block[0]) if isinstance(block, list) and block else 0
            if kind == "float" and bits == 4:
                return _float4(weights, qc), 0
            if kind == "int" and bits in (4, 8):
                return {4: "int4", 8: "int8"}[bits], int(weights.get("group_size") or 128)
    return None


def _method(qc: dict[str, Any]) -> str:
    method = str(qc.get("quant_method", "")).lower()
    producer = qc.get("producer")
    if not method and isinstance(producer, dict) and str(producer.get("name", "")).lower() == "modelopt":
        method = "modelopt"  # ModelOpt's hf_quant_config.json and some copies of it omit quant_method
    if method == "fp8" and str(qc.get("quant_algo", "")).upper() == "MIXED_PRECISION":
        method = "modelopt"
    return method


def quantisation_fields(config: dict[str, Any], spec: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """``quantization_config`` -> ModelSpec fields: ``default_weights``, ``quantization``, ``shared_expert_module``.

    ``spec`` holds the ModelSpec fields read so far (layers, MoE layout, MLA), which say which modules
    each layer has. Warnings are one line each, whatever the number of entries behind them.
    """
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return {}
    method = _method(qc)
    if method == "modelopt" and str(qc.get("quant_algo", "")).upper() == "MIXED_PRECISION":
        algos = Counter(str(v.get("quant_algo", "")) for v in (qc.get("quantized_layers") or {}).values()
                        if isinstance(v, dict))
        if len(algos) == 1:
            qc = {**qc, "quant_algo": next(iter(algos))}
    found = _format(method, qc)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    default = _TORCH_DTYPES.get(dtype, "bf16")
    if found is None:
        algo = qc.get("quant_algo")
        what = f"quant_method '{method}'" + (f" (quant_algo '{algo}')" if algo else "")
        # Nothing is set, so the run takes the unquantised default (fp16, plan.deployment_planner.weights_format).
        warnings.append(f"quantization_config {what} is not modelled: weights taken as fp16 unless --weights "
                        "says otherwise (allowed: fp8, fbgemm_fp8, mxfp4, compressed-tensors, modelopt NVFP4/FP8, "
                        "awq, gptq)")
        return {}
    fmt, size = found
    patterns = [str(p) for key in ("modules_to_not_convert", "ignore", "exclude_modules") for p in qc.get(key) or []]
    if method == "fbgemm_fp8" and not patterns:
        patterns = ["self_attn", "lm_head"]  # FbgemmFp8Config's default: attention and LM head stay bf16
    counts = _excluded_layers(spec, patterns) if patterns else {}
    unknown = _unmatched(spec, patterns) if patterns else []
    if unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        warnings.append(f"quantization_config: {len(unknown)} unquantised-module entries name no module the "
                        f"simulator models ('{unknown[0]}'{more}); taken as quantised")
    quantised: dict[str, bool] = {}
    for module in ("attention", "mlp", "experts", "shared"):
        hits, present = counts.get(module, (0, 0))
        quantised[module] = hits * 2 < present or present == 0
        if 0 < hits < present:
            costed = "quantised" if quantised[module] else "unquantised"
            warnings.append(f"quantization_config leaves {hits / present:.0%} of the '{module}' weights unquantised "
                            f"(by layer and linear); costed as {costed} in all layers")
    has_dense = counts.get("mlp", (0, 0))[1] > 0
    if not has_dense:
        quantised["mlp"] = quantised["experts"]  # no dense MLP: 'mlp' only carries the experts' fallback
    shared_module = "experts"
    if spec.get("moe_shared_experts") and quantised["shared"] != quantised["experts"]:
        if has_dense and quantised["shared"] != quantised["mlp"]:
            warnings.append("quantization_config quantises the shared experts unlike both the routed experts and "
                            "the dense MLP; costed as the routed experts")
        else:
            shared_module = "mlp"  # the shared experts are stored like the dense MLP
            if not has_dense:
                quantised["mlp"] = quantised["shared"]
    parts = [default]
    if quantised["attention"]:
        parts.append(f"attention={fmt}")
    if quantised["mlp"] and quantised["experts"]:
        parts.append(f"mlp={fmt}")
    elif quantised["experts"]:
        parts.append(f"experts={fmt}")
    elif quantised["mlp"]:
        parts += [f"mlp={fmt}", f"experts={default}"]
    if fmt == "fp8" and size:
        parts.append(f"fp8_block={size}")
    if fmt in ("int4", "int8") and size:
        parts.append(f"group_size={size}")
    label = fmt if method == fmt else f"{method} ({fmt})"
    fields: dict[str, Any] = {"default_weights": ",".join(parts), "quantization": label}
    if shared_module != "experts":
        fields["shared_expert_module"] = shared_module
    return fields


# DeepSeek-V4's routed-expert formats by its config's ``expert_dtype``: 'fp4' is MXFP4, values in groups of 32 with an
# E8M0 (ue8m0) scale (DeepSeek's inference/model.py: fp4 experts with fp4_block_size 32; vLLM's DeepseekV4FP8Config
# runs them with Mxfp4MoEMethod), 'fp8' (and no field: SGLang's FP8 copies) the checkpoint's FP8 blocks.
_V4_EXPERT_DTYPES = {"fp4": "mxfp4", "fp8": "fp8", None: "fp8"}


def compressed_attention_quantisation(config: dict[str, Any], spec: dict[str, Any],
                                      warnings: list[str]) -> dict[str, Any]:
    """A DeepSeek-V4 checkpoint's formats: FP8 in 128 x 128 blocks for every linear but the routed experts, which take
    ``expert_dtype``, or NVFP4 where a ModelOpt config quantises them (NVIDIA's NVFP4 copies: ``quantized_layers``
    ``layers.N.ffn.experts`` NVFP4, attention and shared experts excluded from it and left FP8).

    DeepSeek-V4 names its modules ``attn``, ``ffn.experts``, ``ffn.shared_experts`` (inference/model.py), not the
    names :func:`quantisation_fields` matches, and mixes two formats in one checkpoint, hence this reader. The
    compressors' projections and the indexer's head weights stay bf16 in every checkpoint (costed as the router:
    :mod:`simulator.model.compressed_attention_layers`).
    """
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return {}
    if str(qc.get("quant_method", "")).lower() != "fp8":
        return quantisation_fields(config, spec, warnings)
    block = qc.get("weight_block_size")
    size = int(block[0]) if isinstance(block, list) and block else 0
    dtype = config.get("expert_dtype")
    if dtype not in _V4_EXPERT_DTYPES:
        warnings.append(f"expert_dtype '{dtype}' is not one DeepSeek-V4's code reads (allowed: fp4, fp8): routed "
                        "experts taken as fp8")
    experts = _V4_EXPERT_DTYPES.get(dtype, "fp8")
    layers = qc.get("quantized_layers")
    if isinstance(layers, dict) and layers:
        algos = {str(v.get("quant_algo", "")).upper() for v in layers.values() if isinstance(v, dict)}
        others = [key for key in layers if not str(key).endswith("ffn.experts")]
        if others:
            warnings.append(f"quantization_config quantized_layers names {len(others)} modules besides the routed "
                            f"experts ('{others[0]}'); costed as the checkpoint's fp8")
        if algos == {"NVFP4"}:
            experts = "fp4"
    parts = ["bf16", "attention=fp8", "mlp=fp8"]
    if experts != "fp8":
        parts.append(f"experts={experts}")
    if size:
        parts.append(f"fp8_block={size}")
    fields: dict[str, Any] = {"default_weights": ",".join(parts),
                              "quantization": "fp8" if experts == "fp8" else f"fp8, experts {experts}"}
    if experts != "fp8" and spec.get("moe_shared_experts"):
        fields["shared_expert_module"] = "mlp"  # the shared experts are FP8, like the dense linears
    return fields
