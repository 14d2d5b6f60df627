"""Fit at admission, end to end: replicas of different context and KV capacity behind one
model. A request goes only to replicas it fits (the fast tier too small: fallback to standard,
and within standard only the large replica); one that fits no replica is refused at once with a
400 ``context_length_exceeded`` in the API's shape naming the numbers, and no replica sees it."""

from __future__ import annotations

import re
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
              pool_overrides={"routing": {"load_scrape_interval_s": 0.2}},
              # the refusals of prompt + cap: what `lower` (the default) does instead is
              # tests/e2e/test_output_cap_lower.py
              model_overrides={"output_cap_overflow": "refuse"})
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


def _numbers(pattern: str, message: str) -> list[int]:
    m = re.fullmatch(pattern, message)
    assert m is not None, message
    return [int(g) for g in m.groups()]


VLLM_PROMPT = (r"This model's maximum context length is (\d+) tokens\. However, your request "
               r"has (?:at least )?(\d+) input tokens\. Please reduce the length of the input "
               r"messages\.")
VLLM_CAP = (r"'max_tokens' or 'max_completion_tokens' is too large: (\d+)\. This model's "
            r"maximum context length is (\d+) tokens and your request has (\d+) input tokens "
            r"\((\d+) > (\d+) - (\d+)\)\.")
ANTHROPIC_PROMPT = r"prompt is too long: (\d+) tokens > (\d+) maximum"
ANTHROPIC_CAP = (r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+), "
                 r"decrease input length or `max_tokens` and try again")


def test_fits_nowhere_is_refused_at_once_in_each_apis_words(stack: Stack) -> None:
    urls = stack.sim_urls  # type: ignore[attr-defined]
    before = [_served(u) for u in urls]
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=1000,
                                       messages=[{"role": "user", "content": _prompt(70_000)}])
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == "context_length_exceeded"
    assert err["type"] == "invalid_request_error" and err["param"] == "messages"
    limit, prompt = _numbers(VLLM_PROMPT, err["message"])
    assert limit == LARGE and LARGE < prompt < 70_100  # counted up to past the largest limit
    # the output cap counts: a prompt that fits, asking for more output than room is left
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_completion_tokens=60_000,
                                       messages=[{"role": "user", "content": _prompt(10_000)}])
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "max_completion_tokens"
    cap, limit, prompt, cap2, limit2, prompt2 = _numbers(VLLM_CAP, e.value.body["message"])
    assert (cap, limit, cap2, limit2, prompt2) == (60_000, LARGE, 60_000, LARGE, prompt)
    assert 10_000 <= prompt < 10_100 and prompt + cap > LARGE
    ac = anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        ac.messages.create(model=MODEL, max_tokens=100,
                           messages=[{"role": "user", "content": _prompt(70_000)}])
    assert ae.value.status_code == 400 and ae.value.body["type"] == "error"
    assert ae.value.body["error"]["type"] == "invalid_request_error"
    prompt, limit = _numbers(ANTHROPIC_PROMPT, ae.value.body["error"]["message"])
    assert limit == LARGE and LARGE < prompt < 70_100  # a lower bound past the limit
    assert ae.value.body["error"]["message"] in str(ae.value)  # what an agent matches on
    with pytest.raises(anthropic.BadRequestError) as ae:  # Claude Code's shape: a big cap
        ac.messages.create(model=MODEL, max_tokens=20_000,
                           messages=[{"role": "user", "content": _prompt(50_000)}])
    prompt, cap, limit = _numbers(ANTHROPIC_CAP, ae.value.body["error"]["message"])
    assert (cap, limit) == (20_000, LARGE) and 50_000 <= prompt < 50_100
    # what Claude Code does with it: max_tokens = limit - prompt - 1000, and that is served
    r = ac.messages.create(model=MODEL, max_tokens=limit - prompt - 1000,
                           messages=[{"role": "user", "content": _prompt(50_000)}])
    assert r.content
    assert [_served(u) for u in urls][:1] == before[:1] and _served(urls[2]) == before[2]


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/responses", {"input": "x", "max_output_tokens": 1048576}, "max_output_tokens",
     VLLM_CAP),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1048576}, "max_tokens", VLLM_CAP),
    ("/v1/responses", {"input": _prompt(70_000)}, "input", VLLM_PROMPT),
    ("/v1/completions", {"prompt": _prompt(70_000)}, "prompt", VLLM_PROMPT),
])
def test_context_length_exceeded_names_this_apis_field(
    stack: Stack, path: str, body: dict, param: str, words: str
) -> None:
    """The fit-at-admission refusal names the field of the API it answers that is to change:
    the prompt's (Responses ``input``, completions ``prompt``, not chat's ``messages``, a
    field neither sends) when the prompt alone is too long, else the output cap's."""
    r = httpx.post(stack.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert re.fullmatch(words, err["message"]), err["message"]


def test_models_carry_the_smallest_max_model_len_a_request_may_reach(stack: Stack) -> None:
    """``/v1/models`` says each name's limit in vLLM's field: the smallest learned limit among
    the replicas a request for it may reach (a tier's entry: that tier's pool; the model and
    its ``auto`` alias: every tier)."""
    doc = httpx.get(stack.base_url + "/v1/models", timeout=5).json()
    limits = {m["id"]: m.get("max_model_len") for m in doc["data"]}
    assert limits == {MODEL: FAST, f"{MODEL}-fast": FAST, f"{MODEL}-auto": FAST}
    one = httpx.get(f"{stack.base_url}/v1/models/{MODEL}-fast", timeout=5).json()
    assert one["max_model_len"] == FAST and one["tier"] == "fast"
    fast = stack.sim_urls[2]  # type: ignore[attr-defined]
    engine = httpx.get(fast + "/v1/models", timeout=5).json()["data"][0]["max_model_len"]
    assert engine == FAST  # the same field as the engine's own
    c = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    assert c.models.retrieve(f"{MODEL}-fast").model_extra["max_model_len"] == FAST


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
    found = re.search(r"your request has at least (\d+) input tokens", err["message"])
    assert found is not None, err["message"]
    counted = int(found[1])
    assert LARGE < counted < LARGE + 2 * 2048  # stopped within a block or two past 64k
