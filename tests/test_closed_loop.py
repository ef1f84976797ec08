"""Closed loops at fixed concurrency (simulator.engine.closed_loop): N clients, each sending when its last request ends."""

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.plan.run import simulate_settings

BASE = {"model": "llama3-8b", "gpu": "h100", "prompt_tokens": "512", "output_tokens": "64"}


def loop(**extra):
    return simulate_settings({**BASE, **extra})


def new_requests_per_prefill(run, prompt: int = 512) -> list[int]:
    tokens = run.result.log["prefill_tokens"]
    return [int(t) // prompt for t in tokens[tokens > 0]]


def test_identical_requests_stay_in_lockstep_without_a_client_path_and_drift_apart_with_one():
    # Bare engine: 8 identical requests sent at once finish at once, so the next 8 are sent at once: every
    # prefill iteration holds all 8 (8 x 512 = 4,096 tokens fit the 8,192-token budget).
    bare = loop(requests=64, max_concurrency=8, client_path="off")
    assert new_requests_per_prefill(bare) == [8] * 8
    # With the client path each request reaches the engine after its own (jittered) HTTP and tokenisation
    # time, so the waves come apart: after a few waves prefill iterations hold fewer than 8 new requests.
    real = loop(requests=64, max_concurrency=8, seed=1)
    later = new_requests_per_prefill(real)[3:]
    assert later and max(later) < 8
    assert sum(new_requests_per_prefill(real)) == 64


def test_the_same_seed_gives_the_same_run():
    a, b = loop(requests=40, max_concurrency=6, seed=3), loop(requests=40, max_concurrency=6, seed=3)
    assert np.array_equal(a.result.first_token, b.result.first_token)
    assert np.array_equal(a.result.workload.arrival_seconds, b.result.workload.arrival_seconds)


def test_one_client_sends_one_request_after_another():
    # One client, bare engine: three requests back to back take three times one request alone.
    alone = loop(requests=1, client_path="off")
    serial = loop(requests=3, max_concurrency=1, client_path="off")
    e2e = alone.metrics.e2e.mean
    assert serial.metrics.duration_seconds == pytest.approx(3 * e2e, rel=1e-9)
    sent = serial.result.workload.arrival_seconds
    assert sent.tolist() == pytest.approx([0.0, e2e, 2 * e2e], rel=1e-9)


def test_each_request_after_the_first_n_is_sent_when_one_finishes_and_warm_up_is_not_scored():
    n, clients, warmup = 30, 4, 5
    run = loop(requests=n, max_concurrency=clients, warmup_requests=warmup, client_path="off")
    assert run.metrics.requests == n and run.metrics.completed == n  # the 5 warm-up requests are cut
    assert run.result.max_running <= clients
    # All 35 were sent: request k >= 4 when the (k - 3)-th request finished (no client path: at that instant).
    whole = loop(requests=n + warmup, max_concurrency=clients, client_path="off")
    finish = np.sort(whole.result.finish)
    sent = whole.result.workload.arrival_seconds
    assert sent[:clients].tolist() == [0.0] * clients
    assert sent[clients:].tolist() == pytest.approx(finish[: n + warmup - clients].tolist(), rel=1e-12)
    # The scored requests are the last 30 of that same run.
    assert run.result.first_token.tolist() == pytest.approx(whole.result.first_token[warmup:].tolist(), rel=1e-12)


@pytest.mark.parametrize(("extra", "message"), [
    ({"max_concurrency": 0}, "max-concurrency|max_concurrency"),
    ({"warmup_requests": 3}, "warmup_requests: applies only with max_concurrency"),
    ({"max_concurrency": 4, "qps": 2.0}, "does not apply with qps"),
    ({"max_concurrency": 4, "replicas": 2}, "one replica"),
    ({"max_concurrency": 4, "batch": 8}, "batch"),
    ({"max_concurrency": 4, "warmup_requests": -1}, "warmup"),
])
def test_settings_are_checked_with_one_line_errors(extra, message):
    with pytest.raises(InputError, match=message) as err:
        loop(requests=10, **extra)
    assert "\n" not in str(err.value)
