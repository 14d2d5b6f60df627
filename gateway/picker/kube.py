"""Endpoints from the Kubernetes API: the pods of an InferencePool's label selector, watched.

``KubePods`` lists ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` and then watches
from the list's ``resourceVersion`` (``watch=true``, bookmarks on; the API server ends a
watch after ``timeoutSeconds`` and the watcher resumes from the last version seen; a ``410
Gone`` — the version expired — or any error relists, after ``retry_s`` seconds). A pod is an
endpoint while it has a ``podIP``, its ``Ready`` condition is ``True`` and it is not being
deleted; its URL is ``http://{podIP}:{target_port}``.

One InferencePool may hold both tiers' pods: a pod's tier is its ``tier_label`` label
(``standard`` or ``fast``), else ``default_tier``. Each tier's pool of ``model`` gets its pods
(``Pool.set_endpoints``: replicas that stay keep their in-flight counts, health and ejection
state); a tier with no ready pod is an empty pool (its requests fall back along the chain).

In a cluster the API address, the service account token and its CA come from the standard
in-pod locations (``KUBERNETES_SERVICE_HOST``/``_PORT``, ``/var/run/secrets/kubernetes.io/
serviceaccount``); RBAC: ``get``, ``list`` and ``watch`` on ``pods`` in the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

log = logging.getLogger("speedgate.picker.kube")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIER_LABEL = "speedgate.io/tier"


def in_cluster_api() -> tuple[str, str | None, ssl.SSLContext | None]:
    """``(API base URL, bearer token, TLS context)`` of the pod's service account. Raises
    ``RuntimeError`` outside a cluster."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset); "
                           "pass --k8s-api")
    token = (SA_DIR / "token").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    return f"https://{host}:{port}", token, ctx


def pod_ready(pod: dict[str, Any]) -> bool:
    """True when ``pod`` (a Pod object) has an IP, is ``Ready`` and is not terminating."""
    status = pod.get("status") or {}
    if not status.get("podIP") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def endpoints_by_tier(
    pods: list[dict[str, Any]], target_port: int, tier_label: str, default_tier: str
) -> dict[str, list[str]]:
    """Ready pods' base URLs grouped by tier (label value, else ``default_tier``), sorted so
    the replica order is the same in every picker."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        if not pod_ready(pod):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        tier = labels.get(tier_label, default_tier)
        ip = pod["status"]["podIP"]
        host = f"[{ip}]" if ":" in ip else ip
        out.setdefault(tier, []).append(f"http://{host}:{target_port}")
    return {t: sorted(urls) for t, urls in out.items()}


class KubePods:
    """Watches the pods of ``selector`` in ``namespace``; ``on_change(by_tier)`` is called
    with every tier's endpoint URLs (``endpoints_by_tier``) after the list and each change.
    ``synced`` is set once the first list is applied."""

    def __init__(
        self, api: str, namespace: str, selector: str, target_port: int,
        on_change: Callable[[dict[str, list[str]]], None], *,
        tier_label: str = TIER_LABEL, default_tier: str = "standard",
        token: str | None = None, ssl_context: ssl.SSLContext | None = None,
        watch_timeout_s: int = 300, retry_s: float = 1.0,
    ) -> None:
        self.base = api.rstrip("/") + f"/api/v1/namespaces/{namespace}/pods"
        self.selector = selector
        self.target_port = target_port
        self.on_change = on_change
        self.tier_label, self.default_tier = tier_label, default_tier
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        # aiohttp's default verification (True) when no context is given
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        self.pods: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.relists = 0  # lists after the first (expired versions, errors)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Start listing and watching in the background."""
        self._session = aiohttp.ClientSession(headers=self.headers,
                                              timeout=aiohttp.ClientTimeout(connect=5))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        first = True
        while True:
            try:
                version: str | None = await self._list()
                if not first:
                    self.relists += 1
                first = False
                while version is not None:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server away, a bad answer: relist later
                log.warning("kubernetes pods %s: %s; relisting in %.1fs", self.selector, e,
                            self.retry_s)
            await asyncio.sleep(self.retry_s)

    async def _list(self) -> str:
        assert self._session is not None
        async with self._session.get(self.base, params={"labelSelector": self.selector},
                                     ssl=self.ssl) as r:
            if r.status != 200:
                raise RuntimeError(f"list pods: HTTP {r.status}")
            doc = orjson.loads(await r.read())
        self.pods = {p["metadata"]["name"]: p for p in doc.get("items") or []}
        self._apply()
        self.synced.set()
        return str((doc.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self, version: str) -> str | None:
        """Apply watch events from ``version``; the version to resume from when the server
        ended the watch, None to relist (410 Gone)."""
        assert self._session is not None
        params = {"labelSelector": self.selector, "watch": "true", "resourceVersion": version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(self.watch_timeout_s)}
        async with self._session.get(self.base, params=params, ssl=self.ssl) as r:
            if r.status == 410:
                return None
            if r.status != 200:
                raise RuntimeError(f"watch pods: HTTP {r.status}")
            async for line in r.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise RuntimeError(f"watch pods: {obj.get('message', obj)}")
                version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = obj
                self._apply()
        return version

    def _apply(self) -> None:
        self.on_change(endpoints_by_tier(list(self.pods.values()), self.target_port,
                                         self.tier_label, self.default_tier))
