"""API keys, entitlements and global rate limits end to end: three gateway processes sharing one
Redis in front of simulator pools (cases tpm-global, body-shapes auth parts; entitlement matrix
through every field; no concurrency-slot leak after hundreds of aborted requests)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.admit.auth import new_key
from tests.e2e.helpers import CHAT, wait_for
from tests.e2e.stack import MODEL, Stack

REDIS_URL = "redis://127.0.0.1:6379/0"
PREFIX = f"test:e2e-rl:{uuid.uuid4().hex}:"


def _key(key_id: str, **entry) -> tuple[str, dict]:
    key, digest = new_key()
    return key, {"id": key_id, "hash": digest, **entry}


KEYS = {
    "admin": _key("admin", admin=True),
    "std": _key("std", tiers=["standard"]),
    "fast": _key("fastonly", tiers=["fast"]),
    "other": _key("other", models=["some-other-model"]),
    "tpm": _key("tpm", limits={"tokens_per_min": 1000}),
    "conc": _key("conc", limits={"concurrent": 20}),
}


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name][0]}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except Exception:
        pytest.skip("no Redis on 127.0.0.1:6379")
    s = Stack(
        tmp_path_factory.mktemp("auth"),
        replicas_per_tier=1,
        pool_overrides={"outlier": {"enabled": False}},  # the failure storm must not eject
        config_extra={
            "state": {"redis_url": REDIS_URL},
            "auth": {"keys": [entry for _, entry in KEYS.values()]},
            "rate_limits": {"redis_prefix": PREFIX, "fail_mode": "closed"},
            "responses": {"redis_prefix": PREFIX + "resp:"},
        },
    )
    try:
        s.start()
        s.gateways = [s.base_url, s.add_gateway(), s.add_gateway()]  # type: ignore[attr-defined]
        yield s
    finally:
        s.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=PREFIX + "*"))
        if keys:
            client.delete(*keys)
        client.close()


def chat(model: str = MODEL, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            **extra}


def test_missing_and_bad_keys_are_401_without_echoing_the_key(stack: Stack):
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        r = c.post(CHAT, json=chat())
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "missing_api_key"
        assert r.json()["error"]["type"] == "authentication_error"
        bad = "sg-" + "x" * 43
        r = c.post(CHAT, json=chat(), headers={"authorization": f"Bearer {bad}"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert bad not in r.text and "x-request-id" in r.headers
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers=auth("std")).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes stay open
    assert bad not in stack.log()
    assert '"event":"auth_failed"' in stack.log()


# (how the tier is named, body extras, header) for each field that can name a tier
FAST = [
    ("header", {}, {"x-speedgate-tier": "fast"}),
    ("alias", {"model": f"{MODEL}-fast"}, {}),
    ("service_tier", {"service_tier": "priority"}, {}),
]
AUTO = [
    ("header", {}, {"x-speedgate-tier": "auto"}),
    ("alias", {"model": f"{MODEL}-auto"}, {}),
    ("service_tier", {"service_tier": "auto"}, {}),
]
STANDARD = [
    ("header", {}, {"x-speedgate-tier": "standard"}),
    ("service_tier", {"service_tier": "default"}, {}),
    ("service_tier", {"service_tier": "flex"}, {}),
    ("default", {}, {}),
]


def _post(stack: Stack, key: str, extra: dict, headers: dict, params: dict | None = None):
    body = chat(**{k: v for k, v in extra.items() if k != "model"})
    body["model"] = extra.get("model", MODEL)
    return httpx.post(stack.base_url + CHAT, json=body, headers={**auth(key), **headers},
                      params=params, timeout=20)


@pytest.mark.parametrize("field,extra,headers", FAST)
def test_matrix_explicit_fast_is_403_for_a_standard_only_key(stack, field, extra, headers):
    r = _post(stack, "std", extra, headers)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "tier_not_allowed"
    assert _post(stack, "fast", extra, headers).headers["x-speedgate-tier"] == "fast"
    assert _post(stack, "admin", extra, headers).headers["x-speedgate-tier"] == "fast"


@pytest.mark.parametrize("field,extra,headers", AUTO)
def test_matrix_auto_is_narrowed_to_the_keys_tiers(stack, field, extra, headers):
    r = _post(stack, "std", extra, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-speedgate-tier"] == "standard"
    assert r.json()["service_tier"] == "default"
    assert _post(stack, "fast", extra, headers).headers["x-speedgate-tier"] == "fast"


@pytest.mark.parametrize("field,extra,headers", STANDARD)
def test_matrix_standard(stack, field, extra, headers):
    assert _post(stack, "std", extra, headers).headers["x-speedgate-tier"] == "standard"
    r = _post(stack, "fast", extra, headers)
    if field == "default":  # the model's default is not an explicit ask: served on fast
        assert r.status_code == 200 and r.headers["x-speedgate-tier"] == "fast"
    else:
        assert r.status_code == 403 and r.json()["error"]["code"] == "tier_not_allowed"


@pytest.mark.parametrize("field,extra,headers", FAST + AUTO + STANDARD)
def test_matrix_model_not_allowed_through_every_field(stack, field, extra, headers):
    r = _post(stack, "other", extra, headers)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"


def test_query_string_cannot_override_model_or_tier(stack):
    params = {"model": f"{MODEL}-fast", "service_tier": "priority", "x-speedgate-tier": "fast"}
    r = _post(stack, "std", {}, {}, params=params)
    assert r.status_code == 200 and r.headers["x-speedgate-tier"] == "standard"


def test_fallback_never_lands_on_a_tier_the_key_lacks(stack):
    fail = {"sim_faults": {"status": 503}}
    r = _post(stack, "fast", {**fail, "model": f"{MODEL}-fast"}, {})
    assert r.status_code >= 500
    assert stack.sim_requests("standard") == []  # fast → standard fallback was dropped
    stack.reset_sims()
    _post(stack, "admin", {**fail, "model": f"{MODEL}-fast"}, {})
    assert len(stack.sim_requests("standard")) >= 1  # an entitled key does fall back


def test_tpm_global_across_three_gateways(stack):
    """Case tpm-global: 1,000 tokens/min on one key, ~400-token requests, two per replica then
    20 concurrent spread over the replicas: about 2-3 admitted in total, the rest 429."""
    gateways = stack.gateways
    prompt = "hello " * 395  # ~400 tokens with cl100k_base (and with the simulator)
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    statuses: list[int] = []
    limited: list[httpx.Response] = []
    with httpx.Client(timeout=20, headers=auth("tpm")) as c:
        for url in gateways:
            for _ in range(2):
                r = c.post(url + CHAT, json=body)
                statuses.append(r.status_code)
                if r.status_code == 429:
                    limited.append(r)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=20, headers=auth("tpm")) as ac:
            return await asyncio.gather(
                *(ac.post(gateways[i % 3] + CHAT, json=body) for i in range(20))
            )

    for r in asyncio.run(burst()):
        statuses.append(r.status_code)
        if r.status_code == 429:
            limited.append(r)
    admitted = statuses.count(200)
    assert 2 <= admitted <= 3, statuses
    assert statuses.count(429) == len(statuses) - admitted
    for r in limited:
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["x-ratelimit-limit-tokens"] == "1000"
        assert int(r.headers["x-ratelimit-remaining-tokens"]) < 420
        assert r.headers["x-ratelimit-reset-tokens"].endswith("s")


def test_admitted_responses_carry_ratelimit_headers(stack):
    r = httpx.post(stack.gateways[1] + CHAT, json=chat(), headers=auth("conc"), timeout=20)
    assert r.status_code == 200
    assert "x-ratelimit-limit-tokens" not in r.headers  # no token limit on this key
    _, entry = KEYS["tpm"]
    assert entry["hash"] not in r.text


def _inflight(key_id: str) -> int:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        now = client.time()
        return int(client.zcount(f"{PREFIX}{{{key_id}}}:slots", now[0] * 1000, "+inf"))
    finally:
        client.close()


def test_no_slot_leak_after_hundreds_of_aborted_requests(stack):
    """200 client disconnects (before the response, and mid-stream) and 100 upstream failures
    on a key limited to 20 concurrent requests: every slot comes back."""
    slow = chat(sim_faults={"headers_delay_s": 3})
    stream = chat(stream=True, max_tokens=200, sim_faults={"chunk_interval_s": 0.2})
    failing = chat(sim_faults={"status": 500})

    async def abort(ac: httpx.AsyncClient, url: str, i: int) -> None:
        try:
            if i % 2:
                await ac.post(url + CHAT, json=slow, timeout=0.3)
            else:
                async with ac.stream("POST", url + CHAT, json=stream, timeout=5) as r:
                    async for _ in r.aiter_raw():
                        break  # first bytes, then close the connection
        except httpx.TimeoutException:
            pass

    async def run() -> list[int]:
        codes: list[int] = []
        async with httpx.AsyncClient(headers=auth("conc")) as ac:
            for batch in range(10):
                await asyncio.gather(*(abort(ac, stack.gateways[i % 3], batch * 20 + i)
                                       for i in range(20)))
            for _ in range(5):
                rs = await asyncio.gather(*(ac.post(stack.gateways[i % 3] + CHAT, json=failing,
                                                    timeout=20) for i in range(20)))
                codes += [r.status_code for r in rs]
        return codes

    codes = asyncio.run(run())
    assert all(c >= 500 or c == 429 for c in codes), codes
    assert wait_for(lambda: _inflight("conc") == 0, timeout_s=15, interval_s=0.2), _inflight("conc")

    async def full() -> list[int]:  # all 20 slots usable again at once
        async with httpx.AsyncClient(headers=auth("conc"), timeout=20) as ac:
            rs = await asyncio.gather(*(ac.post(stack.gateways[i % 3] + CHAT, json=chat())
                                        for i in range(20)))
            return [r.status_code for r in rs]

    assert asyncio.run(full()) == [200] * 20


def test_usage_endpoint_is_admin_protected(stack):
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        assert c.get("/v1/usage", params={"key_id": "std"}).status_code == 401
        r = c.get("/v1/usage", params={"key_id": "admin"}, headers=auth("std"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
        assert c.get("/v1/usage", params={"key_id": "std"}, headers=auth("std")).status_code == 200
        r = c.get("/v1/usage", params={"key_id": "std"}, headers=auth("admin"))
        assert r.status_code == 200 and r.json()["requests"] >= 1
    assert '"event":"admin_action"' in stack.log()


def test_anthropic_clients_authenticate_with_x_api_key(stack):
    """Anthropic's SDK sends ``x-api-key``; the gateway accepts it (and Bearer) on every
    endpoint, and refuses a bad one with an Anthropic-shaped 401 that never echoes it."""
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=KEYS["std"][0], max_retries=0)
    m = client.messages.create(model=MODEL, max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert m.usage.service_tier == "standard"
    bearer = anthropic.Anthropic(base_url=stack.base_url, auth_token=KEYS["std"][0],
                                 max_retries=0)
    assert bearer.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]).input_tokens > 0
    with pytest.raises(anthropic.PermissionDeniedError) as denied:  # std key, fast alias
        client.messages.create(model=f"{MODEL}-fast", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "permission_error"
    bad = "sg-" + "y" * 43
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=stack.base_url, api_key=bad, max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    assert bad not in e.value.response.text and bad not in stack.log()
    r = httpx.get(stack.base_url + "/v1/models", headers={"x-api-key": KEYS["std"][0]})
    assert r.status_code == 200


def test_stored_responses_belong_to_the_key_that_made_them(stack):
    """A response stored under one key is invisible to another (404 for GET, DELETE and as
    ``previous_response_id``), on any gateway replica (the store is in Redis)."""
    mine = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=KEYS["std"][0],
                         max_retries=0)
    theirs = openai.OpenAI(base_url=stack.gateways[1] + "/v1", api_key=KEYS["admin"][0],
                           max_retries=0)
    r = mine.responses.create(model=MODEL, input="secret plan", max_output_tokens=4)
    again = openai.OpenAI(base_url=stack.gateways[2] + "/v1", api_key=KEYS["std"][0],
                          max_retries=0)
    assert again.responses.retrieve(r.id).id == r.id  # same key, another gateway replica
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model=MODEL, input="more", previous_response_id=r.id)
    follow = again.responses.create(model=MODEL, input="more", previous_response_id=r.id,
                                    max_output_tokens=4)
    assert follow.previous_response_id == r.id

