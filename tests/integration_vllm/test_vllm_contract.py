"""The gateway in front of real vLLM (CPU build, tiny random-weight Llama), through the official
``openai`` client: every engine behaviour the gateway relies on (its contract), proven against
the real engine, so a vLLM upgrade that changes one breaks this suite and not users.

The model's weights are scripted to repeat one sentence (``engines.vllm.tinymodel``), the same on
every CPU; the tests check shapes, counts and routing, and that sentence. ``ignore_eos`` (a vLLM
extra the gateway forwards untouched) makes output lengths exact.
"""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import orjson
import pytest
from openai import OpenAI

from engines.vllm.launcher import CPU_BLOCK_SIZE
from engines.vllm.tinymodel import CYCLE_TEXT
from gateway.demo import MODEL, demo_config
from tests.integration_vllm.stack import GHOST, VllmStack, scrape

# Setup (install, server start) is bounded by its own timeouts, not by the per-test one.
pytestmark = pytest.mark.timeout(120, func_only=True)

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GEN_TOKENS = "vllm:generation_tokens_total"
CACHE_HITS = "vllm:prefix_cache_hits_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
RUNNING = "vllm:num_requests_running"
SUCCESS = "vllm:request_success_total"
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(vllm_stack: VllmStack) -> OpenAI:
    return OpenAI(base_url=vllm_stack.base_url + "/v1", api_key="unused", max_retries=0,
                  timeout=60)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _salted(n_words: int) -> str:
    """A prompt no earlier request shares a prefix with (a fresh random first word)."""
    return " ".join([uuid.uuid4().hex, *(f"item{i}" for i in range(n_words))])


def _raw_stream(base_url: str, body: dict) -> list[bytes]:
    """The SSE ``data:`` payloads of a streamed request, read raw (no SDK in between)."""
    out: list[bytes] = []
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:].encode())
    return out


def _wait_for(cond, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_models_lists_tiers(client: OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {MODEL, f"{MODEL}-fast", f"{MODEL}-standard"} <= ids


def test_chat_non_streaming(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_user("Hello there"), max_tokens=8, extra_body=IGNORE_EOS
    )
    r = raw.parse()
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert raw.headers.get("x-request-id")
    assert r.object == "chat.completion"
    assert r.model == MODEL
    assert r.service_tier == "default"  # vLLM sends "service_tier": null; the gateway sets it
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_completions_non_streaming(client: OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="def parse(text):", max_tokens=5, extra_body=IGNORE_EOS
    )
    assert r.object == "text_completion"
    assert r.model == MODEL
    assert isinstance(r.choices[0].text, str)
    assert r.usage.completion_tokens == 5


def test_completions_streaming(client: OpenAI) -> None:
    chunks = list(client.completions.create(
        model=MODEL, prompt="import os", max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
    ))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].choices == []
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)


def test_stream_without_include_usage_strips_usage(vllm_stack: VllmStack) -> None:
    """The gateway asks vLLM for usage (to account) but the client did not: no usage reaches
    the client, and the stream still ends with [DONE]."""
    payloads = _raw_stream(vllm_stack.base_url, {
        "model": MODEL, "messages": _user("Stream to me"), "max_tokens": 6, "stream": True,
        **IGNORE_EOS,
    })
    assert payloads[-1] == b"[DONE]"
    events = [orjson.loads(p) for p in payloads[:-1]]
    assert events and all(e.get("usage") is None for e in events)
    assert all(e["choices"] for e in events)  # vLLM's usage-only chunk (choices: []) is gone
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["model"] == MODEL for e in events)


def test_stream_with_include_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=_user("Stream with usage"), max_tokens=7, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 7
    assert last.usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])


def test_ci_any_machine_scripted_model_answers_the_same_everywhere(client: OpenAI) -> None:
    """The tiny model's weights are scripted (``engines.vllm.tinymodel``): whatever the CPU, it
    answers the cycle text and stops at its end-of-sequence token; with ``ignore_eos`` the
    cycle repeats, so the fast tier's ngram drafter has n-grams to propose."""
    r = client.chat.completions.create(model=MODEL, messages=_user("Hello there"), max_tokens=64)
    assert r.choices[0].message.content.strip() == CYCLE_TEXT.strip()
    assert r.choices[0].finish_reason == "stop"
    sampled = client.chat.completions.create(  # temperature 1: the margin makes it certain
        model=MODEL, messages=_user("Hi"), max_tokens=64, temperature=1.0, seed=7)
    assert sampled.choices[0].message.content.strip() == CYCLE_TEXT.strip()
    looped = client.completions.create(model=MODEL, prompt="x", max_tokens=60,
                                       extra_body={**IGNORE_EOS, "temperature": 0})
    assert looped.choices[0].text.count(CYCLE_TEXT.strip().split()[-1]) >= 2


def test_tier_selection_proven_by_spec_decode_counters(
    client: OpenAI, vllm_stack: VllmStack
) -> None:
    """``mymodel-fast`` is served by the ngram-speculative replica: its draft counter moves and
    the standard replica generates nothing; the default model goes the other way."""
    names = (DRAFTS, ACCEPTED, GEN_TOKENS)
    # The scripted model repeats its cycle (ignore_eos) on every CPU, so ngram prompt lookup
    # proposes drafts and the target accepts them: drafts and acceptances prove the tier.
    repetitive = "hello hello hello hello"
    greedy = {**IGNORE_EOS, "temperature": 0}
    std0, fast0 = scrape(vllm_stack.standard, names), scrape(vllm_stack.fast, names)
    assert DRAFTS not in std0  # the standard replica has no speculative decoding
    # completions: a chat template would end the prompt with tokens seen nowhere before
    raw = client.completions.with_raw_response.create(
        model=f"{MODEL}-fast", prompt=repetitive, max_tokens=48, extra_body=greedy
    )
    assert raw.headers["x-speedgate-tier"] == "fast"
    assert raw.parse().service_tier == "priority"
    std1, fast1 = scrape(vllm_stack.standard, names), scrape(vllm_stack.fast, names)
    assert fast1[DRAFTS] > fast0[DRAFTS]
    assert fast1[ACCEPTED] > fast0[ACCEPTED]
    assert fast1[GEN_TOKENS] - fast0[GEN_TOKENS] == 48
    assert std1[GEN_TOKENS] == std0[GEN_TOKENS]

    r = client.completions.create(
        model=MODEL, prompt=repetitive, max_tokens=4, extra_body=greedy,
        extra_headers={"x-speedgate-tier": "standard"},
    )
    assert r.service_tier == "default"
    std2, fast2 = scrape(vllm_stack.standard, names), scrape(vllm_stack.fast, names)
    assert std2[GEN_TOKENS] - std1[GEN_TOKENS] == 4
    assert fast2 == fast1


def test_cached_tokens_on_repeated_prefix(client: OpenAI, vllm_stack: VllmStack) -> None:
    """A repeated long prompt hits vLLM's prefix cache; the gateway reports the cached tokens
    (whole 128-token CPU blocks) exactly as vLLM counted them."""
    prompt = _salted(300)
    first = client.chat.completions.create(
        model=MODEL, messages=_user(prompt), max_tokens=2, extra_body=IGNORE_EOS
    )
    assert first.usage.prompt_tokens > 2 * CPU_BLOCK_SIZE
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    hits0 = scrape(vllm_stack.standard, (CACHE_HITS,))[CACHE_HITS]
    again = client.chat.completions.create(
        model=MODEL, messages=_user(prompt), max_tokens=2, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
    )
    usage = list(again)[-1].usage
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached >= CPU_BLOCK_SIZE and cached % CPU_BLOCK_SIZE == 0
    assert cached > usage.prompt_tokens - CPU_BLOCK_SIZE - 1  # all whole blocks reused
    assert scrape(vllm_stack.standard, (CACHE_HITS,))[CACHE_HITS] - hits0 == cached


def test_vllm_404_passes_through_openai_shaped(client: OpenAI) -> None:
    """``ghost`` is a gateway model; vLLM does not serve its name and answers 404."""
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model=GHOST, messages=_user("hi"), max_tokens=2)
    assert e.value.status_code == 404
    err = e.value.body
    # vLLM's message and param; the OpenAI type (vLLM sends "NotFoundError")
    assert err["type"] == "invalid_request_error" and err["param"] == "model"
    assert f"The model `{GHOST}` does not exist" in err["message"]
    assert e.value.response.headers.get("x-request-id")


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_400_passes_through_openai_shaped(client: OpenAI, stream: bool) -> None:
    """A request over the engine's context is refused by the gateway at once in OpenAI's
    shape (``context_length_exceeded``, the numbers named), from the ``max_model_len`` that
    real vLLM reports on ``/v1/models``: the engine never sees it."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=_user("hi"), max_tokens=100_000, stream=stream
        )
    assert e.value.status_code == 400
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["code"] == "context_length_exceeded"
    assert "is too large: 100000. This model's maximum context length is 2048 tokens" in \
        err["message"] and err["param"] == "max_tokens"


def test_prompt_plus_max_tokens_over_context_is_refused_before_the_engine(
    client: OpenAI,
) -> None:
    """vLLM 0.32 itself caps the output at ``max_model_len - prompt`` instead of a 400; the
    gateway follows OpenAI's rule instead (prompt + requested output within the context, or
    400 ``context_length_exceeded``: docs/capacity.md), counted before any replica."""
    prompt_ids = [10 + i % 1000 for i in range(2000)]  # token ids: an exact prompt length
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL, prompt=prompt_ids, max_tokens=1000, extra_body=IGNORE_EOS
        )
    assert e.value.body["code"] == "context_length_exceeded"
    assert "maximum context length is 2048 tokens" in e.value.body["message"]
    r = client.completions.create(  # within the context: served in full
        model=MODEL, prompt=prompt_ids, max_tokens=48, extra_body=IGNORE_EOS
    )
    assert r.usage.prompt_tokens == 2000 and r.usage.completion_tokens == 48


def test_client_disconnect_aborts_generation(vllm_stack: VllmStack) -> None:
    """Closing the client's stream mid-generation makes the gateway close the upstream
    connection and vLLM abort the request: it leaves the running batch and its generation stops
    far short of ``max_tokens``. (vLLM 0.32 does not count such client aborts in
    ``vllm:request_success_total{finished_reason="abort"}``, nor in any other finished reason.)"""
    names = (RUNNING, GEN_TOKENS, SUCCESS)
    before = scrape(vllm_stack.standard, names)
    body = {"model": MODEL, "messages": _user("long story"), "max_tokens": 2000,
            "stream": True, **IGNORE_EOS}
    with httpx.stream("POST", vllm_stack.base_url + "/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            n += line.startswith("data: ")
            if n >= 3:
                break  # leaving the block closes the connection mid-stream
    _wait_for(lambda: scrape(vllm_stack.standard, names)[RUNNING] == 0)
    stopped = scrape(vllm_stack.standard, names)
    time.sleep(1.0)
    after = scrape(vllm_stack.standard, names)
    assert after == stopped  # nothing generates any more
    assert after[GEN_TOKENS] - before[GEN_TOKENS] < 500  # ~100 tokens/s on 2 shared cores
    finished = {k: v for k, v in after.items() if k.startswith(SUCCESS)}
    assert finished == {k: v for k, v in before.items() if k.startswith(SUCCESS)}
    _wait_for(lambda: any(
        "status=499" in k for k in scrape(vllm_stack.base_url, ("speedgate_requests_total",))
    ))


def test_gateway_reads_vllm_metrics(vllm_stack: VllmStack) -> None:
    """The gateway's engine-metrics parser (load signals for routing) reads real vLLM."""
    from gateway.upstream import load_scraper as load

    text = httpx.get(vllm_stack.fast + "/metrics", timeout=10).text
    values = load.parse_engine_metrics(text)
    assert set(values) == {load.RUNNING, load.WAITING, load.KV_USAGE,
                           load.SPEC_DRAFTS, load.SPEC_ACCEPTED, load.SPEC_DRAFT_TOKENS,
                           load.PREFIX_QUERIES, load.PREFIX_HITS,  # the ngram fast server
                           load.PREEMPTIONS, load.KV_BLOCKS, load.KV_BLOCK_SIZE}
    assert 0.0 <= values[load.KV_USAGE] <= 1.0


def test_gateway_telemetry_and_cost_match_vllm_counters(
    client: OpenAI, vllm_stack: VllmStack
) -> None:
    """Per tier, the gateway's token metrics equal vLLM's own prompt/generation/cache-hit
    counters over the same requests, and its cost equals the price list applied to them."""
    engine_names = (PROMPT_TOKENS, GEN_TOKENS, CACHE_HITS)
    urls = {"standard": vllm_stack.standard, "fast": vllm_stack.fast}

    def gateway_totals() -> dict[str, float]:
        m = scrape(vllm_stack.base_url,
                   ("gen_ai_client_token_usage_sum", "speedgate_cost_usd_total"))
        out: dict[str, float] = {}
        for k, v in m.items():
            if f"gen_ai_request_model={MODEL}," not in k and f"model={MODEL}," not in k:
                continue
            tier = "fast" if "tier=fast" in k else "standard"
            kind = "cost"
            for t in ("cached_input", "input", "output"):
                if f"gen_ai_token_type={t}" in k:
                    kind = t
            out[f"{tier}/{kind}"] = out.get(f"{tier}/{kind}", 0.0) + v
        return out

    def engine_totals() -> dict[str, float]:
        out = {}
        for tier, url in urls.items():
            m = scrape(url, engine_names)
            out.update({f"{tier}/{k}": v for k, v in m.items()})
        return out

    gw0, en0 = gateway_totals(), engine_totals()
    shared = _salted(150)
    for model in (MODEL, f"{MODEL}-fast"):
        client.chat.completions.create(model=model, messages=_user(shared), max_tokens=5,
                                       extra_body=IGNORE_EOS)
        client.chat.completions.create(model=model, messages=_user(shared), max_tokens=3,
                                       extra_body=IGNORE_EOS)  # cached prefix
        list(client.chat.completions.create(model=model, messages=_user("no usage asked"),
                                            max_tokens=4, stream=True, extra_body=IGNORE_EOS))
        client.completions.create(model=model, prompt="x = [1, 2, 3]", max_tokens=6,
                                  extra_body=IGNORE_EOS)
    want_requests = 8
    _wait_for(lambda: sum(
        v for k, v in scrape(vllm_stack.base_url, ("speedgate_requests_total",)).items()
        if "outcome=ok" in k
    ) >= want_requests)
    time.sleep(0.5)  # accounting runs after the last byte
    gw1, en1 = gateway_totals(), engine_totals()
    d_gw = {k: gw1.get(k, 0.0) - gw0.get(k, 0.0) for k in gw1}
    d_en = {k: en1[k] - en0.get(k, 0.0) for k in en1}
    prices = demo_config(["http://a"], ["http://b"], "127.0.0.1", 1).models[MODEL].tiers
    for tier in ("standard", "fast"):
        prompt, gen, hits = (d_en[f"{tier}/{n}"] for n in engine_names)
        assert prompt > 0 and gen == 5 + 3 + 4 + 6
        assert d_gw[f"{tier}/input"] == prompt
        assert d_gw[f"{tier}/output"] == gen
        assert d_gw[f"{tier}/cached_input"] == hits > 0
        p = prices[tier].prices
        want = ((prompt - hits) * p.input_per_mtok_usd + hits * p.cached_input_per_mtok_usd
                + gen * p.output_per_mtok_usd) / 1e6
        assert d_gw[f"{tier}/cost"] == pytest.approx(want, rel=1e-9, abs=1e-12)
