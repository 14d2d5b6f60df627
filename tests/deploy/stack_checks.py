"""What a user checks against a running speedgate stack, with the official ``openai`` client.

Used by ``deploy/test-stack.sh`` against the compose ``cpu`` profile under a real Docker engine
(``python -m tests.deploy.stack_checks URL STEP --session ID``), and by
tests/deploy/test_cpu_profile.py against the same profile's services run as host processes, so
the checks themselves are tested on every machine.

Steps (each prints ``ok: ...`` lines, raises ``AssertionError`` with the evidence otherwise):

- ``api``: both tiers answer (``x-speedgate-tier``), a stream ends with a usage chunk, usage
  counts are positive, ``/metrics`` has the GenAI token counter for both tiers, ``/readyz`` is
  ``ready`` with every replica healthy, and ``/v1/usage`` counts this session's requests.
- ``ledger``: ``/v1/usage`` of the session ``api`` used still counts its requests (run after the
  gateway container restarted: the totals live in Redis, not in the process).
- ``degraded``: with Redis stopped, requests still succeed and ``/readyz`` says ``degraded``.
- ``recovered``: with Redis back, requests succeed and ``/readyz`` returns to ``ready``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mymodel"
TIERS = {"mymodel": "standard", "mymodel-fast": "fast"}
API_REQUESTS = 3  # what `api` sends under its session: one per tier and one stream


def _client(base_url: str) -> openai.OpenAI:
    # The compose configs set no API keys; the client insists on one, the gateway ignores it.
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(client: openai.OpenAI, model: str, session: str) -> tuple[str, Any]:
    """One non-streamed completion: ``(x-speedgate-tier header, ChatCompletion)``."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "Hello from the stack"}],
        extra_headers={"x-session-id": session},
    )
    return raw.headers.get("x-speedgate-tier", ""), raw.parse()


def readyz(base_url: str) -> dict[str, Any]:
    """``GET /readyz`` as JSON (its body is JSON for 200 and 503 alike)."""
    return httpx.get(base_url + "/readyz", timeout=30).json()


def usage(base_url: str, session: str) -> dict[str, Any]:
    """``GET /v1/usage?session_id=...`` as JSON; raises on a non-200 answer."""
    r = httpx.get(base_url + "/v1/usage", params={"session_id": session}, timeout=30)
    assert r.status_code == 200, f"/v1/usage: {r.status_code} {r.text}"
    return r.json()


def check_api(base_url: str, session: str) -> None:
    """The ``api`` step (see the module docstring); its requests carry ``x-session-id: session``."""
    client = _client(base_url)
    for model, tier in TIERS.items():
        got_tier, resp = _chat(client, model, session)
        assert got_tier == tier, f"{model}: x-speedgate-tier {got_tier!r}, expected {tier!r}"
        assert resp.choices[0].message.content, f"{model}: empty answer"
        u = resp.usage
        assert u and u.prompt_tokens > 0 and u.completion_tokens > 0, f"{model}: usage {u}"
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"{model}: usage {u}"
        print(f"ok: {model} -> tier {tier}, {u.prompt_tokens}+{u.completion_tokens} tokens")

    stream = client.chat.completions.create(
        model="mymodel-fast", max_tokens=8, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Stream, please"}],
        extra_headers={"x-session-id": session},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, "stream: no content"
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens > 0, f"stream: {last}"
    print(f"ok: stream, {len(chunks)} chunks, usage {last.usage.completion_tokens} tokens")

    metrics = httpx.get(base_url + "/metrics", timeout=30)
    assert metrics.status_code == 200, metrics.text
    tiers_counted = set()
    for family in text_string_to_metric_families(metrics.text):
        for s in family.samples:
            if s.name.startswith("gen_ai_client_token_usage") and s.value > 0:
                tiers_counted.add(s.labels.get("tier"))
    assert {"standard", "fast"} <= tiers_counted, f"/metrics: token usage for {tiers_counted}"
    print("ok: /metrics counts tokens of both tiers")

    ready = readyz(base_url)
    assert ready["status"] == "ready", f"/readyz: {ready}"
    for tier, pool in ready["models"][MODEL].items():
        assert pool["healthy"] == pool["replicas"] > 0, f"/readyz {tier}: {pool}"
    print(f"ok: /readyz ready, {json.dumps(ready['models'][MODEL])}")

    check_ledger(base_url, session)


def check_ledger(base_url: str, session: str) -> None:
    """The ``ledger`` step: ``session``'s totals count the ``api`` step's requests."""
    totals = usage(base_url, session)
    assert totals["requests"] == API_REQUESTS, f"/v1/usage: {totals}"
    print(f"ok: /v1/usage of the session: {totals['requests']} requests")


def check_degraded(base_url: str, session: str) -> None:
    """The ``degraded`` step: Redis is stopped; requests keep succeeding, ``/readyz`` degrades
    once the shared-state breaker has seen enough failures (a few requests)."""
    client = _client(base_url)
    for i in range(1, 11):
        tier, resp = _chat(client, MODEL, session=f"{session}-degraded-{i}")
        assert tier == "standard" and resp.choices[0].message.content
        ready = readyz(base_url)
        if ready["status"] == "degraded":
            print(f"ok: Redis down: {i} requests answered, /readyz degraded (HTTP 200)")
            return
    raise AssertionError(f"/readyz never degraded with Redis stopped: {ready}")


def check_recovered(base_url: str, session: str, deadline_s: float = 90) -> None:
    """The ``recovered`` step: Redis is back; requests succeed and ``/readyz`` returns to
    ``ready`` once the breaker's cool-down has passed (``state.breaker_cooldown_s``)."""
    client = _client(base_url)
    end = time.monotonic() + deadline_s
    n = 0
    while True:
        n += 1
        tier, resp = _chat(client, MODEL, session=f"{session}-recovered-{n}")
        assert tier == "standard" and resp.choices[0].message.content
        ready = readyz(base_url)
        if ready["status"] == "ready":
            print(f"ok: Redis back: /readyz ready after {n} requests")
            return
        assert time.monotonic() < end, f"/readyz still {ready} after {deadline_s}s"
        time.sleep(1)


STEPS = {"api": check_api, "ledger": check_ledger, "degraded": check_degraded,
         "recovered": check_recovered}


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.deploy.stack_checks URL STEP --session ID``: exit status 0 when the
    step passes, 1 otherwise (the failed check on stderr)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the gateway, e.g. http://127.0.0.1:8080")
    p.add_argument("step", choices=sorted(STEPS))
    p.add_argument("--session", required=True,
                   help="x-session-id of the requests (unique per run: the ledger is shared)")
    args = p.parse_args(argv)
    try:
        STEPS[args.step](args.url.rstrip("/"), args.session)
    except (AssertionError, openai.APIError, httpx.HTTPError) as e:
        print(f"FAIL ({args.step}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
