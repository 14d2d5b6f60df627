"""The gateway's assembled non-stream answer (the engine streams, the gateway assembles) equals
real vLLM's own non-stream answer to the same greedy request, field by field: token ids,
logprobs with top_logprobs, ``n`` choices, stop reasons, usage. Fields vLLM answers ``null``
the assembled answer has ``null`` or leaves out (what a stream cannot carry: vLLM's
``kv_transfer_params``, ``routed_experts``); per-request values (``id``, ``created``,
``metrics`` timings) and ``service_tier`` (the gateway names the tier that served) differ."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.demo import MODEL
from tests.integration_vllm.stack import VllmStack

pytestmark = pytest.mark.timeout(120, func_only=True)
PER_REQUEST = frozenset({"id", "created", "metrics", "service_tier"})
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True, "seed": 1}
USER = [{"role": "user", "content": "Say something about the sea."}]


def _same(via: Any, direct: Any, where: str) -> None:
    """``via`` equals ``direct`` (recursively for objects; a null of vLLM may be absent)."""
    if isinstance(direct, dict):
        assert isinstance(via, dict), where
        for key, value in direct.items():
            if key in PER_REQUEST and where == "$":
                continue
            if value is None:
                assert via.get(key) is None, f"{where}.{key}"
            else:
                assert key in via, f"{where}.{key}"
                _same(via[key], value, f"{where}.{key}")
        return
    if isinstance(direct, list):
        assert isinstance(via, list) and len(via) == len(direct), where
        for i, (a, b) in enumerate(zip(via, direct, strict=True)):
            _same(a, b, f"{where}[{i}]")
        return
    if isinstance(direct, float):
        assert via == pytest.approx(direct, abs=1e-4), where
        return
    assert via == direct, where


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": USER}),
    ("/v1/chat/completions", {"messages": USER, "return_token_ids": True}),
    ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": USER, "n": 2, "temperature": 1, "seed": 3}),
    ("/v1/completions", {"prompt": "The sea is", "return_token_ids": True}),
    ("/v1/completions", {"prompt": "The sea is", "logprobs": 2, "stop": ["zzz"]}),
], ids=["chat", "chat-token-ids", "chat-logprobs", "chat-n2", "completion-token-ids",
        "completion-logprobs"])
def test_r3_assembled_answer_equals_vllms_own(vllm_stack: VllmStack, path: str,
                                               body: dict) -> None:
    body = {"model": MODEL, **GREEDY, **body}
    via = httpx.post(vllm_stack.base_url + path, json=body, timeout=60)
    assert via.status_code == 200, via.text
    assert via.headers["x-speedgate-tier"] == "standard"
    direct = httpx.post(vllm_stack.standard + path, json=body, timeout=60)
    assert direct.status_code == 200, direct.text
    _same(via.json(), direct.json(), "$")
