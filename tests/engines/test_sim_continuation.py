"""The simulator continues a final assistant message (vLLM's ``continue_final_message``)
exactly where it stops: the same words an uninterrupted turn has at that offset."""

from __future__ import annotations

import httpx
import pytest

from engines.sim.testing import SimProcess, start_sim

pytestmark = pytest.mark.e2e
MSGS = [{"role": "user", "content": "Tell me about rivers."}]


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m", output_tokens=40) as s:
        yield s


def chat(sim: SimProcess, **body) -> httpx.Response:
    return httpx.post(sim.url + "/v1/chat/completions", json={"model": "m", **body}, timeout=10)


def continued(sim: SimProcess, prefix: str, **extra) -> dict:
    msgs = [*MSGS, {"role": "assistant", "content": prefix}]
    r = chat(sim, messages=msgs, continue_final_message=True, add_generation_prompt=False,
             **extra)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("cut", [0, 1, 5, 17, 39])
def test_continuation_reads_like_the_uninterrupted_turn(sim: SimProcess, cut: int) -> None:
    whole = chat(sim, messages=MSGS).json()
    text = whole["choices"][0]["message"]["content"]
    words = text.split(" ")
    prefix = " ".join(words[:cut]) + (" " if 0 < cut < len(words) else "")
    prefix = prefix if cut else ""
    rest = continued(sim, prefix)
    assert prefix + rest["choices"][0]["message"]["content"] == text
    assert rest["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_cut_inside_a_word_and_max_tokens_left(sim: SimProcess) -> None:
    whole = chat(sim, messages=MSGS, max_tokens=20).json()
    text = whole["choices"][0]["message"]["content"]
    assert whole["choices"][0]["finish_reason"] == "length"
    prefix = text[: len(text) // 2]
    out = continued(sim, prefix, max_tokens=12)
    joined = prefix + out["choices"][0]["message"]["content"]
    assert text.startswith(joined) or joined.startswith(text)
    assert out["choices"][0]["finish_reason"] == "length"
    # the continuation's prompt holds the prefix: it is prefilled (and billed) again
    assert out["usage"]["prompt_tokens"] > whole["usage"]["prompt_tokens"]


def test_stream_continuation_has_the_same_text(sim: SimProcess) -> None:
    text = chat(sim, messages=MSGS).json()["choices"][0]["message"]["content"]
    prefix = text[:30]
    body = {"model": "m", "stream": True, "continue_final_message": True,
            "add_generation_prompt": False,
            "messages": [*MSGS, {"role": "assistant", "content": prefix}]}
    with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, timeout=10) as r:
        raw = r.read().decode()
    import json

    parts = []
    for line in raw.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                parts.append(c["delta"].get("content") or "")
    assert prefix + "".join(parts) == text


def test_refused_like_vllm(sim: SimProcess) -> None:
    with_prompt = chat(sim, messages=[*MSGS, {"role": "assistant", "content": "Rivers"}],
                       continue_final_message=True)
    assert with_prompt.status_code == 400
    assert "add_generation_prompt" in with_prompt.json()["error"]["message"]
    no_assistant = chat(sim, messages=MSGS, continue_final_message=True,
                        add_generation_prompt=False)
    assert no_assistant.status_code == 400
    assert "final message" in no_assistant.json()["error"]["message"]


def test_tokenize_counts_generated_text_as_it_was_generated(sim: SimProcess) -> None:
    """vLLM's ``POST /tokenize``: the count of a generated text is the number of tokens that
    produced it (the answer's ``completion_tokens``), so a continuation's ``max_tokens`` can be
    shrunk by the engine's own count."""
    whole = chat(sim, messages=MSGS).json()
    text = whole["choices"][0]["message"]["content"]
    r = httpx.post(sim.url + "/tokenize", json={"model": "m", "prompt": text,
                                                "add_special_tokens": False})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["count"] == len(doc["tokens"]) == whole["usage"]["completion_tokens"]
    assert set(doc) == {"count", "max_model_len", "tokens", "token_strs"}
    chat_count = httpx.post(sim.url + "/tokenize", json={"messages": MSGS}).json()["count"]
    assert chat_count > 0
    assert httpx.post(sim.url + "/tokenize", json={"model": "x", "prompt": "a"}).status_code == 404
    assert httpx.post(sim.url + "/tokenize", json={"model": "m"}).status_code == 400
