"""Fixed: "the simulator is an instrument: it must answer bad input as vLLM does": ``stop``
as a number or a boolean and an absurd ``n`` are 400s in vLLM's shape, never a 500 or a
generation that grows without bound."""

from __future__ import annotations

import time

import httpx
import pytest

from engines.sim.testing import start_sim

pytestmark = pytest.mark.e2e
MSGS = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("extra, param, fragment", [
    ({"stop": 5}, "body.stop", "a string or a list of strings"),
    ({"stop": True}, "body.stop", "a string or a list of strings"),
    ({"stop": ["ok", 1]}, "body.stop", "a string or a list of strings"),
    ({"stop": {"a": 1}}, "body.stop", "a string or a list of strings"),
    ({"stop": ["x", ""]}, None, "stop cannot contain an empty string"),
    ({"n": 467_752_472}, None, "n must be at most 16384"),
    ({"n": 0}, None, "n must be at least 1"),
    ({"n": 2.5}, "body.n", "a valid integer"),
    ({"n": "many"}, "body.n", "a valid integer"),
    ({"n": 2, "temperature": 0}, None, "greedy sampling"),
])
def test_sim_answers_bad_stop_and_absurd_n_with_400(sim, path, extra, param, fragment):
    body = {"model": "m", **extra}
    body.update({"messages": MSGS} if path.endswith("chat/completions") else {"prompt": "Hi"})
    for stream in (False, True):
        t0 = time.monotonic()
        r = httpx.post(sim.url + path, json={**body, "stream": stream}, timeout=10)
        assert r.status_code == 400, r.text
        assert time.monotonic() - t0 < 5  # answered, not generated
        err = r.json()["error"]
        assert fragment in err["message"] and err["param"] == param and err["code"] == 400
        assert err["type"] == ("Bad Request" if param else "BadRequestError")
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("n, choices", [(True, 1), (2.0, 2), ("3", 3), (None, 1)])
def test_sim_coerces_n_like_vllm_lax_schema(sim, n, choices):
    r = httpx.post(sim.url + "/v1/chat/completions", timeout=10,
                   json={"model": "m", "messages": MSGS, "n": n, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == choices


def test_limits_follow_vllm_max_n_sequences(monkeypatch):
    from engines.sim.params import InvalidParam, check_n, check_stop

    monkeypatch.setenv("VLLM_MAX_N_SEQUENCES", "4")
    assert check_n({"n": 4}) == 4
    with pytest.raises(InvalidParam, match="at most 4"):
        check_n({"n": 5})
    assert check_stop({"stop": "x"}) == ["x"] and check_stop({"stop": None}) == []
