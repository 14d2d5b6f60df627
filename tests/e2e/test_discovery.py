"""A pool found by DNS (``localhost``) serves requests, end to end."""

import hashlib

import httpx
import pytest

from tests.e2e.helpers import CHAT
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


def test_pool_discovered_by_dns_name(tmp_path):
    s = Stack(tmp_path, replicas_per_tier=1)
    s.start()
    try:
        port = int(s.sims["fast"][0].rsplit(":", 1)[1])
        s.config["models"][MODEL]["tiers"]["fast"] = {
            "served_model_name": MODEL,
            "discovery": {"host": "localhost", "port": port, "family": "ipv4"},
        }
        url = s.add_gateway()
        r = httpx.post(url + CHAT, json={"model": f"{MODEL}-fast", "max_tokens": 3,
                                         "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        assert r.headers["x-speedgate-tier"] == "fast"
        name = hashlib.sha256(f"http://127.0.0.1:{port}".encode()).hexdigest()[:8]
        assert r.headers["x-speedgate-replica"] == f"{MODEL}/fast/{name}"  # not the address
        ready = httpx.get(url + "/readyz").json()["models"][MODEL]["fast"]
        assert ready["replicas"] == 1 and ready["healthy"] == 1
    finally:
        s.stop()
