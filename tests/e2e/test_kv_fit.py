"""Fit at admission, end to end: replicas of different context and KV capacity behind one
model. A request goes only to replicas it fits (the fast tier too small: fallback to standard,
and within standard only the large replica); one that fits no replica is refused at once with a
400 ``context_length_exceeded`` in the API's shape naming the numbers, and no replica sees it."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from engines.procs import stop_processes
from engines.sim.spawn import start_simulator
from tests.e2e.helpers import wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
SMALL, LARGE, FAST = 4096, 65536, 2048  # max_model_len = KV pool of each replica, in tokens


def _sim(mode: str, seed: int, tokens: int) -> object:
    return start_simulator(mode, 1.0, seed, ("--time-scale", "0", "--max-model-len", str(tokens),
                                             "--kv-cache-tokens", str(tokens)), model=MODEL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sims = [_sim("standard", 1, SMALL), _sim("standard", 2, LARGE), _sim("speculative", 3, FAST)]
    s = Stack(tmp_path_factory.mktemp("kvfit"), replicas_per_tier=0,
              extra_endpoints={"standard": [sims[0].url, sims[1].url], "fast": [sims[2].url]},
              pool_overrides={"routing": {"load_scrape_interval_s": 0.2}})
    s.procs.extend(sim.proc for sim in sims)
    try:
        s.start()
        s.sim_urls = [sim.url for sim in sims]  # type: ignore[attr-defined]
        assert wait_for(lambda: _learned(s), timeout_s=20), "gateway never learned the limits"
        yield s
    finally:
        s.stop()
        stop_processes([sim.proc for sim in sims])


def _learned(s: Stack) -> bool:
    state = httpx.get(s.base_url + "/v1/console/state", timeout=5).json()
    reps = [r for p in state["models"][0]["pools"] for r in p["replicas"]]
    return len(reps) == 3 and all(r["engine"]["max_model_len"] and r["engine"]["kv_tokens"]
                                  for r in reps)


def _served(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("sim_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _prompt(tokens: int) -> str:
    return "word " * tokens  # ~1 token per word for tiktoken and the simulator


def test_request_goes_only_where_it_fits_falling_back_to_standard(stack: Stack) -> None:
    small, large, fast = stack.sim_urls  # type: ignore[attr-defined]
    before = {u: _served(u) for u in (small, large, fast)}
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=f"{MODEL}-fast", max_tokens=8,
            messages=[{"role": "user", "content": _prompt(10_000)}])
        assert raw.headers["x-speedgate-tier"] == "standard"
        assert "context-does-not-fit" in raw.headers.get("x-speedgate-fallback", "")
        assert raw.parse().choices[0].message.content
    after = {u: _served(u) for u in (small, large, fast)}
    assert after[large] - before[large] == 4
    assert after[small] == before[small] and after[fast] == before[fast]
    # a short request still goes to the fast tier
    raw = client.chat.completions.with_raw_response.create(
        model=f"{MODEL}-fast", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-speedgate-tier"] == "fast"


def test_fits_nowhere_is_refused_at_once_with_the_numbers(stack: Stack) -> None:
    urls = stack.sim_urls  # type: ignore[attr-defined]
    before = [_served(u) for u in urls]
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=1000,
                                       messages=[{"role": "user", "content": _prompt(70_000)}])
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == "context_length_exceeded"
    assert err["type"] == "invalid_request_error" and f"the largest takes {LARGE} tokens" in \
        err["message"]
    # the output cap counts: a prompt that fits, asking for more output than room is left
    with pytest.raises(openai.BadRequestError, match="the largest takes 65536"):
        client.chat.completions.create(model=MODEL, max_tokens=60_000,
                                       messages=[{"role": "user", "content": _prompt(10_000)}])
    ac = anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        ac.messages.create(model=MODEL, max_tokens=100,
                           messages=[{"role": "user", "content": _prompt(70_000)}])
    assert ae.value.body["type"] == "error"
    assert ae.value.body["error"]["type"] == "invalid_request_error"
    assert f"the largest takes {LARGE} tokens" in ae.value.body["error"]["message"]
    assert [_served(u) for u in urls] == before  # no replica saw any of them


@pytest.mark.parametrize("path,body,param", [
    ("/v1/responses", {"input": "x", "max_output_tokens": 1048576}, "input"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1048576}, "prompt"),
])
def test_context_length_exceeded_names_this_apis_field(
    stack: Stack, path: str, body: dict, param: str
) -> None:
    """The fit-at-admission refusal names the prompt field of the API it answers (Responses
    ``input``, completions ``prompt``), not chat's ``messages``, a field neither sends."""
    r = httpx.post(stack.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == param, err


def test_a_prompt_that_cannot_fit_is_counted_only_up_to_the_largest_context(stack: Stack) -> None:
    """~1.2M tokens (5 MiB, sent gzip'd) against 64k at most: the refusal's count is a lower
    bound just past the largest context, so the gateway encoded ~64k tokens, not 1.2M; the
    count named is at least the largest context and says so."""
    import gzip
    import json
    import re

    text = "stop " * 1_200_000  # not a prefix another test sent (counts are cached by block)
    body = gzip.compress(json.dumps({"model": MODEL, "max_tokens": 8,
                                     "messages": [{"role": "user", "content": text}]}).encode())
    r = httpx.post(stack.base_url + "/v1/chat/completions", content=body, timeout=60,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    counted = int(re.search(r"needs at least (\d+) tokens", err["message"])[1])  # type: ignore[index]
    assert LARGE < counted < LARGE + 2 * 2048  # stopped within a block or two past 64k
