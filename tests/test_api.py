"""The Python API: simulate() with keywords or Deployment + Workload, result attributes, per-request arrays."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator import Deployment, Workload, simulate


def test_keywords_and_grouped_settings_are_the_same_run():
    a = simulate(model="llama2-7b", gpu="a100", qps=4, requests=20, prompt_tokens=300, output_tokens=30)
    b = simulate(Deployment(model="llama2-7b", gpu="a100"), Workload(qps=4, requests=20, prompt_tokens=300, output_tokens=30))
    assert a.to_dict() == b.to_dict()


def test_result_carries_summaries_contract_and_per_request_arrays():
    result = simulate(model="llama2-7b", gpu="a100", batch=3, ctx=1024, gen=24)
    data = result.to_dict()
    assert data["batch"] == 3 and data["ctx"] == 1024 and data["gen"] == 24
    rows = result.per_request
    assert len(rows["request"]) == 3
    # prompt = ctx - gen = 1024 - 24 = 1000 tokens for every request of the closed batch
    assert rows["prompt_tokens"].tolist() == [1000, 1000, 1000]
    assert rows["output_tokens"].tolist() == [24, 24, 24]
    # Summaries are of the same per-request times: p50 of the TTFTs the arrays hold.
    assert result.ttft.p50 == pytest.approx(float(np.percentile(rows["ttft_seconds"], 50)))
    assert result.e2e.mean == pytest.approx(float(np.mean(rows["e2e_seconds"])))


def test_bad_settings_raise_input_error_naming_the_setting():
    with pytest.raises(simulator.InputError, match="batch: must be >= 1"):
        simulate(model="llama2-7b", gpu="a100", batch=0)


def test_to_frame_without_pandas_says_how_to_get_it(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *args, **kwargs)

    result = simulate(model="llama2-7b", gpu="a100", batch=1, ctx=512, gen=8)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(simulator.InputError, match="needs pandas"):
        result.to_frame()


def test_python_m_simulator_runs_the_cli():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "simulator", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_groups_take_vllm_spellings_and_raise_input_errors():
    ours = Workload(qps=4, requests=20, prompt_tokens=300, output_tokens=30)
    vllm = Workload(request_rate=4, num_prompts=20, input_len=300, output_len=30)
    assert ours == vllm
    with pytest.raises(simulator.InputError, match="tp: unknown setting"):
        Workload(tensor_parallel_size=2)  # parallelism belongs to the Deployment
    assert Deployment(model="llama2-7b", gpu="a100", tensor_parallel_size=2).tp == 2
