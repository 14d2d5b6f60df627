"""tiktoken counting from the bundled encodings, offline (no download is ever attempted)."""

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import tiktoken_ext.openai_public as openai_public

from gateway.telemetry import tokencount as tc

# The example of OpenAI's cookbook "How to count tokens with tiktoken": the API reported 129
# prompt tokens for gpt-4-0613 (cl100k_base) and the cookbook's function 124 for gpt-4o
# (o200k_base).
COOKBOOK_MESSAGES = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that "
     "translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user",
     "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user",
     "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
     "for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for "
     "the client deliverable."},
]


def test_cookbook_token_ids_and_counts():
    # cookbook: "tiktoken is great!" → [83, 1609, 5963, 374, 2294, 0] (cl100k_base)
    assert tc.get_encoding("cl100k_base").encode_ordinary("tiktoken is great!") == [
        83, 1609, 5963, 374, 2294, 0]
    assert tc.get_encoding("o200k_base").encode_ordinary("tiktoken is great!") == [
        83, 8251, 2488, 382, 2212, 0]
    assert tc.count_chat_prompt({"messages": COOKBOOK_MESSAGES}, "cl100k_base") == 129
    assert tc.count_chat_prompt({"messages": COOKBOOK_MESSAGES}, "o200k_base") == 124


@pytest.mark.parametrize(
    ("text", "cl100k", "o200k"),
    [
        ("", 0, 0),
        ("hello world", 2, 2),
        ("Hello, world!", 4, 4),
        ("antidisestablishmentarianism", 6, 6),
        ("こんにちは世界", 4, 2),
        ("<|endoftext|>", 7, 7),  # special-token text in user input is plain text
    ],
)
def test_count_text(text, cl100k, o200k):
    assert tc.count_text(text, "cl100k_base") == cl100k
    assert tc.count_text(text, "o200k_base") == o200k


def test_specs_match_tiktoken_constructors():
    """Our copies of pat_str / special tokens / hashes equal tiktoken's own (no download)."""
    for name, ctor in (("cl100k_base", openai_public.cl100k_base),
                       ("o200k_base", openai_public.o200k_base)):
        with mock.patch.object(openai_public, "load_tiktoken_bpe") as load:
            load.return_value = {}
            spec = ctor()
        assert load.call_args.kwargs["expected_hash"] == tc._SPECS[name]["sha256"]
        assert spec["pat_str"] == tc._SPECS[name]["pat_str"]
        assert spec["special_tokens"] == tc._SPECS[name]["special_tokens"]
        assert tc.get_encoding(name).n_vocab == max(spec["special_tokens"].values()) + 1


def test_works_with_no_network_in_a_fresh_process(tmp_path):
    """A fresh interpreter whose sockets all fail, with an empty tiktoken cache dir, counts."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network disabled in this test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from gateway.telemetry import tokencount as tc
        print(tc.count_text("tiktoken is great!"), tc.count_text("hello world", "o200k_base"))
    """)
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["6", "2"]
    assert not (tmp_path / "cache").exists()  # tiktoken's download cache was never touched


def test_no_socket_is_opened_in_process(monkeypatch):
    tc._cache.pop("o200k_base", None)

    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert tc.count_text("hello world", "o200k_base") == 2


def test_chat_prompt_with_tool_calls_parts_and_tools():
    enc = tc.get_encoding()
    n = lambda s: len(enc.encode_ordinary(s))  # noqa: E731
    args = '{"city": "Paris", "unit": "celsius"}'
    doc = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
        ],
    }
    expected = (
        3 * 3 + 3
        + n("user") + n("Weather in Paris?")
        + n("assistant") + n("call_1") + n("get_weather") + n(args)
        + n("tool") + n("call_1") + n("18C, cloudy")
    )
    assert tc.count_chat_prompt(doc) == expected
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with_tools = tc.count_chat_prompt({**doc, "tools": tools})
    assert with_tools == expected + n(
        '[{"type":"function","function":{"name":"get_weather","parameters":{}}}]')


def test_completion_prompt_shapes():
    assert tc.count_completion_prompt({"prompt": "hello world"}) == 2
    assert tc.count_completion_prompt({"prompt": ["hello world", "tiktoken is great!"]}) == 8
    assert tc.count_completion_prompt({"prompt": [1, 2, 3]}) == 3
    assert tc.count_completion_prompt({"prompt": [[1, 2], [3]]}) == 3
    assert tc.count_completion_prompt({}) == 0
    assert tc.count_prompt({"prompt": "hello world"}, "completion") == 2


def test_large_inputs_are_counted_off_the_event_loop():
    small = {"messages": [{"role": "user", "content": "hi"}]}
    big_text = "word " * 10_000  # "word", then " word" ×9,999, then " "
    big = {"messages": [{"role": "user", "content": big_text}]}

    async def main():
        with mock.patch("asyncio.to_thread", wraps=asyncio.to_thread) as spy:
            a = await tc.count_prompt_async(small, "chat", size_hint=60)
            assert spy.call_count == 0
            b = await tc.count_prompt_async(big, "chat", size_hint=len(big_text) + 60)
            assert spy.call_count == 1
            c = await tc.count_text_async(big_text)
            assert spy.call_count == 2
        return a, b, c

    a, b, c = asyncio.run(main())
    assert a == tc.count_chat_prompt(small)
    assert b == tc.count_chat_prompt(big) and b == c + 3 + 1 + 3  # role "user" = 1 token
    assert c == 10_001  # 10,000 × " word"-style tokens + the trailing space


def test_output_text_of_relayed_chunks():
    chunks = [
        b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Hello"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":", world!"}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        b'{"name":"f","arguments":"{}"}}]}}]}',
        b'{"choices":[{"index":0,"text":" more"}]}',
        b"[DONE]",
        b'{"error":{"message":"x"}}',
    ]
    text = tc.completion_text(chunks)
    assert text == "Hello, world!f{} more"
    assert tc.count_text(tc.completion_text(chunks[:3])) == 4


def test_bad_data_is_refused(monkeypatch):
    with pytest.raises(KeyError):
        tc.get_encoding("p50k_base")  # type: ignore[arg-type]
    tc._cache.pop("cl100k_base", None)
    monkeypatch.setitem(tc._SPECS["cl100k_base"], "sha256", "0" * 64)
    with pytest.raises(tc.EncodingDataError):
        tc.get_encoding("cl100k_base")
    monkeypatch.undo()
    assert tc.count_text("hello world") == 2


def test_estimated_usage_of_a_broken_stream_and_of_a_json_response():
    doc = {"messages": COOKBOOK_MESSAGES}
    chunks = [b'{"choices":[{"index":0,"delta":{"content":"tiktoken"}}]}',
              b'{"choices":[{"index":0,"delta":{"content":" is great!"}}]}']
    usage = asyncio.run(tc.estimate_usage(doc, "chat", tc.completion_text(chunks), size_hint=900))
    assert (usage.prompt, usage.completion, usage.cached) == (129, 6, 0)
    with mock.patch("asyncio.to_thread", wraps=asyncio.to_thread) as spy:
        big = asyncio.run(tc.estimate_usage(doc, "chat", "word " * 2000, size_hint=900))
    assert big.completion == 2001 and big.prompt == 129
    assert spy.call_count == 1  # 10 kB of output: counted in a worker thread
    resp = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello world",
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}},
                        {"index": 1, "text": "!"}]}
    assert tc.response_text(resp) == "hello worldf{}!"
