"""What an engine profile changes in the kernels: attention kernel, quantised-weight expansion, passes, windows.

Numbers worked out by hand for Llama-2-7B (32 layers, 32 heads x 128, hidden 4096, fp16 activations) with
int4 weights in groups of 128 (0.5 bytes per weight + one fp16 scale per 128 weights = 0.015625 bytes).
"""

import pytest

from simulator.cost.system import System
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.operators import Attention, Gemm
from simulator.model.precision import parse_precision
from simulator.model.step import Step
from simulator.plan.deployment_planner import deployment_from_options
from simulator.plan.run import simulate_settings

LLAMA = load_model("llama2-7b")
INT4 = parse_precision("int4", "fp16", 128)
O_PROJ_PARAMS = 4096 * 4096  # 16,777,216


def op(system: System, name: str):
    return next(o for o in system.operators if o.name == name)


def test_llamacpp_expands_int4_weights_to_fp16_above_32_rows():
    system = System(LLAMA, load_gpu("a100"), INT4, engine=load_engine_profile("llamacpp"))
    o_proj = op(system, "o_proj")
    assert isinstance(o_proj, Gemm) and o_proj.expand_above_tokens == 32
    quantised = O_PROJ_PARAMS * (0.5 + 2 / 128)  # 8,650,752 bytes
    assert o_proj.work(Step.prefill(1, 32)).weight_bytes == pytest.approx(quantised)
    # 33 rows: the quantised matrix is read once, an fp16 copy written (2 bytes per weight) and read by
    # the dense GEMM (2 more): 8,650,752 + 67,108,864 = 75,759,616 bytes, in two kernels.
    wide = o_proj.work(Step.prefill(1, 33))
    assert wide.weight_bytes == pytest.approx(quantised + 4 * O_PROJ_PARAMS) == 75_759_616
    assert wide.launches == 2
    # the dequantisation is done once per weight (4 ops), not once per 16-row tile
    assert wide.dequant_ops == 4 * O_PROJ_PARAMS


def test_tgi_1_reconstructs_gptq_weights_from_eight_rows_as_exllama_does():
    # exllama (TGI 1.0.3): fewer than matmul_recons_thd = 8 rows run the fused q4 kernel, 8 or more
    # dequantise into an FP16 buffer and call cuBLAS.
    system = System(LLAMA, load_gpu("a100"), INT4, engine=load_engine_profile("tgi-v1"))
    o_proj = op(system, "o_proj")
    quantised = O_PROJ_PARAMS * (0.5 + 2 / 128)  # 8,650,752 bytes
    assert o_proj.work(Step.decode(7, 100)).weight_bytes == pytest.approx(quantised)
    # 8 rows: 8,650,752 + 4 x 16,777,216 = 75,759,616 bytes (the copy written, then read), two kernels.
    eight = o_proj.work(Step.decode(8, 100))
    assert eight.weight_bytes == pytest.approx(75_759_616) and eight.launches == 2


def test_engines_that_dequantise_in_the_gemm_keep_reading_int4():
    system = System(LLAMA, load_gpu("a100"), INT4, engine=load_engine_profile("vllm"))
    work = op(system, "o_proj").work(Step.prefill(1, 512))
    assert work.weight_bytes == pytest.approx(O_PROJ_PARAMS * (0.5 + 2 / 128))
    assert work.launches == 1


def test_fp16_weights_are_never_expanded():
    system = System(LLAMA, load_gpu("a100"), parse_precision("fp16", "fp16"), engine=load_engine_profile("llamacpp"))
    assert op(system, "o_proj").expand_above_tokens == 0
    assert op(system, "o_proj").work(Step.prefill(1, 512)).weight_bytes == 2 * O_PROJ_PARAMS


def test_llamacpp_attention_is_naive_with_f32_scores():
    deployment = deployment_from_options({"model": "llama2-7b", "gpu": "a100", "engine": "llamacpp"}, 1, 512)
    system = deployment.system
    assert system.attention_kernel == "naive"
    attention = op(system, "attention")
    assert isinstance(attention, Attention) and attention.score_bytes_per_element == 4.0
    # a 512-token prompt: a 512 x 512 score block per head, written, read and written by the softmax, and
    # read: 4 passes x 32 heads x 262,144 scores x 4 bytes = 134,217,728; q in and the output out:
    # 2 x 512 tokens x 32 x 128 x 2 bytes = 8,388,608.
    assert attention.work(Step.prefill(1, 512)).activation_bytes == 134_217_728 + 8_388_608


def test_a_run_setting_overrides_the_engine_attention_kernel():
    options = {"model": "llama2-7b", "gpu": "a100"}
    assert deployment_from_options({**options, "engine": "vllm"}, 1, 512).system.attention_kernel == "flash"
    flash = deployment_from_options({**options, "engine": "llamacpp", "attention_kernel": "flash"}, 1, 512)
    assert flash.system.attention_kernel == "flash"


def run_prompt(engine: str, prompt: int):
    return simulate_settings({"model": "llama3-8b", "gpu": "a100", "engine": engine, "scheduler": "static",
                              "batch": 1, "max_num_seqs": 1, "prompt_tokens": str(prompt), "output_tokens": "1"})


def test_a_static_prompt_goes_through_in_passes_of_the_engine_pass_tokens():
    # llama.cpp's n_ubatch is 512: a 4096-token prompt is 4096 / 512 = 8 forward passes
    assert run_prompt("llamacpp", 4096).metrics.iterations == 8
    assert run_prompt("llamacpp", 4000).metrics.iterations == 8  # 7 x 512 + 416
    assert run_prompt("llamacpp", 512).metrics.iterations == 1
    # engines without a per-pass limit prefill a static batch in one pass
    assert run_prompt("trtllm-v0", 4096).metrics.iterations == 1


def test_a_static_batch_fills_each_pass_in_admission_order():
    run = simulate_settings({"model": "llama2-7b", "gpu": "a100", "engine": "llamacpp", "scheduler": "static",
                             "batch": 3, "max_num_seqs": 3, "prompt_tokens": "300", "output_tokens": "3"})
    # 3 x 300 = 900 prompt tokens: passes of 512 and 388, then 2 decode steps for the batch
    assert run.metrics.iterations == 2 + 2
    assert run.metrics.completed == 3


def test_tensorrt_engines_run_mistral_v01_with_full_attention():
    options = {"model": "mistral-7b", "gpu": "h100"}
    full = deployment_from_options({**options, "engine": "trtllm-v0"}, 1, 32768)
    windowed = deployment_from_options({**options, "engine": "trtllm"}, 1, 32768)
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes per token
    assert full.memory.kv_bytes == 32768 * 131_072 == 4_294_967_296
    assert windowed.memory.kv_bytes == 4096 * 131_072 == 536_870_912
    assert op(full.system, "attention").window is None
    assert op(windowed.system, "attention").window == 4096
    assert full.system.model.sliding_window is None


def test_models_without_a_window_are_the_same_under_either_engine():
    options = {"model": "llama2-7b", "gpu": "h100"}
    a = deployment_from_options({**options, "engine": "trtllm-v0"}, 1, 4096).system
    b = deployment_from_options({**options, "engine": "trtllm"}, 1, 4096).system
    assert a.model == b.model


def test_fp16_accumulation_doubles_the_tensor_peak_on_geforce_only():
    llamacpp = load_engine_profile("llamacpp")
    fp16 = parse_precision("fp16", "fp16")
    # RTX 4090: 165.2 TFLOP/s with FP32 accumulation, 330.3 with FP16 (Ada whitepaper, Table 2)
    assert System(LLAMA, load_gpu("rtx4090"), fp16, engine=llamacpp).peak_flops == 330.3e12
    assert System(LLAMA, load_gpu("rtx4090"), fp16, engine=load_engine_profile("vllm")).peak_flops == 165.2e12
    # RTX 3090: 71 and 142 (GA102 whitepaper); an A100 runs both at 312
    assert System(LLAMA, load_gpu("rtx3090"), fp16, engine=llamacpp).peak_flops == 142e12
    assert System(LLAMA, load_gpu("a100"), fp16, engine=llamacpp).peak_flops == 312e12
    # o_proj of a 512-token prompt: 2 x 512 x 16,777,216 FLOPs at twice the peak take half the compute time
    step = Step.prefill(1, 512)

    def o_proj_compute_seconds(engine: str) -> float:
        system = System(LLAMA, load_gpu("rtx4090"), fp16, engine=load_engine_profile(engine))
        return float(next(o for o in system.step_cost(step).operators if o.name == "o_proj").compute_seconds)

    assert o_proj_compute_seconds("llamacpp") == pytest.approx(o_proj_compute_seconds("vllm") * 165.2 / 330.3)


def test_a_static_batch_takes_a_budget_given_on_the_command_line():
    # --scheduler static --max-batched-tokens 1000: a 4000-token prompt is 4 passes (before: one, the budget ignored)
    run = simulate_settings({"model": "llama3-8b", "gpu": "a100", "engine": "vllm", "scheduler": "static",
                             "batch": 1, "max_num_seqs": 1, "prompt_tokens": "4000", "output_tokens": "1",
                             "max_batched_tokens": 1000})
    assert run.metrics.iterations == 4


def test_more_running_sequences_than_a_pass_carries_is_refused_with_the_way_out():
    from simulator.errors import InputError
    with pytest.raises(InputError, match=r"--max-num-seqs 1000: the llamacpp profile's forward pass carries at most 512"):
        simulate_settings({"model": "llama3-8b", "gpu": "a100", "engine": "llamacpp", "max_num_seqs": 1000,
                           "batch": 8, "ctx": 512})


def test_the_report_says_when_a_budget_was_cut_to_the_pass_size():
    from simulator.report.run_report import engine_run_text
    run = simulate_settings({"model": "llama3-8b", "gpu": "a100", "engine": "llamacpp", "max_batched_tokens": 4096,
                             "batch": 2, "ctx": 256, "gen": 4})
    assert run.config.max_batched_tokens == 512
    assert "--max-batched-tokens 4096 cut to the llamacpp profile's largest forward pass" in engine_run_text(run)
