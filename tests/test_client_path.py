"""The client path (simulator.cost.client_path): HTTP, tokenisation, hand-off and first chunk, charged to TTFT."""

import math

import numpy as np
import pytest
import yaml

from simulator.cost.client_path import breakdown, engine_arrivals, jitter, request_seconds, response_seconds
from simulator.model.engine_profile import ClientPath, load_engine_profile
from simulator.plan.result import engine_run_dict
from simulator.plan.run import simulate_settings

# A profile of our own with round numbers and no jitter, so the sums can be done by hand.
CLIENT = {"http_seconds": 3e-3, "tokenize_seconds_per_token": 2e-6, "first_chunk_seconds": 1e-3,
          "detokenize_seconds_per_token": 5e-4, "jitter_cv": 0.0}


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory):
    data = load_engine_profile("vllm").model_dump(mode="json")
    data.update(name="vllm-client-test", aliases=[], client=CLIENT)
    path = tmp_path_factory.mktemp("engines") / "vllm-client-test.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def run(engine: str, **extra):
    base = {"model": "llama3-8b", "gpu": "h100", "prompt_tokens": "1000", "output_tokens": "50", "requests": 1,
            "engine": engine}
    return simulate_settings({**base, **extra})


def test_one_request_on_an_idle_engine_waits_its_client_path(engine_file):
    # 3 ms of HTTP and hand-off + 1,000 tokens x 2 us of tokenisation before the engine sees it, then
    # 1 ms of first chunk + 0.5 ms of detokenisation before the client sees a token: 6.5 ms in all.
    added = 3e-3 + 1000 * 2e-6 + 1e-3 + 5e-4
    on, off = run(engine_file), run(engine_file, client_path="off")
    assert on.metrics.ttft.mean - off.metrics.ttft.mean == pytest.approx(added, abs=1e-12)
    assert on.metrics.e2e.mean - off.metrics.e2e.mean == pytest.approx(added, abs=1e-12)
    # Every token is delayed alike: the gaps between them are not.
    assert on.metrics.tpot.mean == pytest.approx(off.metrics.tpot.mean, rel=1e-12)
    client = engine_run_dict(on)["client_path"]
    assert client["on"] and client["total_seconds"] == pytest.approx(added, rel=1e-12)
    assert client["tokenize_seconds"] == pytest.approx(2e-3, rel=1e-12)
    assert engine_run_dict(off)["client_path"]["total_seconds"] == 0.0


def test_the_ideal_profile_has_no_client_path():
    on, off = run("ideal"), run("ideal", client_path="off")
    assert on.metrics.ttft.mean == off.metrics.ttft.mean
    assert load_engine_profile("ideal").client.is_zero


def test_the_cost_functions_by_hand():
    client = ClientPath(**CLIENT)
    assert request_seconds(client, np.array([0, 500])) == pytest.approx([3e-3, 3e-3 + 1e-3])
    assert response_seconds(client) == pytest.approx(1.5e-3)
    assert breakdown(client, 250.0) == pytest.approx(
        {"http_seconds": 3e-3, "tokenize_seconds": 5e-4, "response_seconds": 1.5e-3, "total_seconds": 5e-3})
    # First in, first out: the second request's path is shorter but it does not overtake the first.
    assert engine_arrivals(np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.2, 0.1])).tolist() == [0.5, 0.5, 1.1]


def test_jitter_has_mean_one_and_the_asked_coefficient_of_variation():
    factors = jitter(400_000, 0.38, np.random.default_rng(7))
    assert factors.mean() == pytest.approx(1.0, abs=0.005)
    assert factors.std() / factors.mean() == pytest.approx(0.38, rel=0.02)
    assert (jitter(5, 0.0, np.random.default_rng(0)) == 1.0).all()


def test_shipped_serving_profiles_carry_a_client_path_and_the_report_shows_it(capsys):
    for name in ("vllm", "sglang", "trtllm"):
        client = load_engine_profile(name).client
        assert client.http_seconds > 0 and client.tokenize_seconds_per_token > 0 and not math.isnan(client.jitter_cv)
    from simulator.report.run_report import client_path_line

    line = client_path_line(run("vllm"))
    assert line.startswith("  client path") and "tokenisation" in line and "1,000 tokens" in line


def test_the_setting_is_checked():
    from simulator.errors import InputError

    with pytest.raises(InputError, match="client_path"):
        run("vllm", client_path="sometimes")
