"""API keys and entitlements: who is calling, and what it may be served.

Keys are ``sg-`` + 43 URL-safe base64 characters (32 random bytes from ``secrets``, 256 bits).
Only their SHA-256 is stored (``sha256:<hex>``). A fast unsalted hash is enough for keys of this
entropy: a slow, salted KDF (bcrypt, argon2) protects *guessable* secrets from a dictionary
search, but no dictionary covers 2^256 random keys, so an attacker holding the hashes learns
nothing; a fast hash also keeps the per-request check at ~1 µs instead of ~50-300 ms. (The same
reasoning as GitHub's and Stripe's token storage; OWASP Password Storage Cheat Sheet scopes its
slow-hash advice to user-chosen passwords.) Lookup is a dict keyed by the digest, so response
timing depends on the digest, never on how many characters of a key were right.

Entitlements are checked on what is actually sent upstream: ``check_request`` runs after tier
resolution (alias, header, ``service_tier``, default); an *explicit* tier the key lacks is 403,
while ``auto`` and the model's default are narrowed to the key's tiers by the planner
(``plan.plan_request(..., allowed_tiers=...)``), which also drops forbidden fallbacks.
Pure, apart from reading ``auth.keys_file`` once at startup (``load_keys``).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from gateway.config import ApiKeyConfig, AuthConfig, ConfigError
from gateway.errors import GatewayError
from gateway.plan.tiers import TierRequest

KEY_PREFIX = "sg-"
MAX_KEY_CHARS = 256  # longer Authorization values are refused without hashing them
_EXPLICIT_SOURCES = frozenset({"header", "alias", "service_tier"})


class AuthenticationError(GatewayError):
    """401: no API key, or one that matches no configured hash."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    """403: a valid key asking for a model, tier or endpoint it is not entitled to."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An authenticated key: its ``id`` (the only name ever logged) and its entitlements."""

    config: ApiKeyConfig

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def tiers(self) -> frozenset[str]:
        return frozenset(self.config.tiers)

    def may_use_model(self, model_name: str) -> bool:
        """Whether the key may call ``model_name`` (a configured model, aliases resolved)."""
        models = self.config.models
        return "*" in models or model_name in models


def new_key() -> tuple[str, str]:
    """A new random key and its stored form: ``("sg-…", "sha256:…")``."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    key = KEY_PREFIX + raw
    return key, hash_key(key)


def hash_key(key: str) -> str:
    """The stored form of ``key``: ``sha256:`` + hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def fingerprint(key: str) -> str:
    """First 8 hex digits of the key's SHA-256, for audit lines about unknown keys (never the
    key itself; 32 bits of a hash of a 256-bit secret reveal nothing usable)."""
    return hash_key(key)[7:15]


def load_keys(auth: AuthConfig) -> list[ApiKeyConfig]:
    """``auth.keys`` plus the entries of ``auth.keys_file`` (YAML ``{keys: [...]}``).

    Raises ``ConfigError`` (naming the file, never a key) when the file is unreadable or
    invalid, or when two entries share an id or a hash."""
    keys = list(auth.keys)
    if auth.keys_file is not None:
        path = Path(auth.keys_file)
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise ConfigError(f"auth.keys_file {path}: cannot read: {e.strerror}") from None
        except yaml.YAMLError:
            raise ConfigError(f"auth.keys_file {path}: not valid YAML") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"auth.keys_file {path}: top level must be a mapping")
        try:
            keys += TypeAdapter(list[ApiKeyConfig]).validate_python(doc.get("keys") or [])
        except ValidationError as e:
            where = "; ".join(".".join(map(str, x["loc"])) + ": " + x["msg"] for x in e.errors())
            raise ConfigError(f"auth.keys_file {path}: keys.{where}") from None
    for attr in ("id", "hash"):
        seen: set[str] = set()
        for k in keys:
            v = getattr(k, attr)
            if v in seen:
                shown = v if attr == "id" else "(a hash)"
                raise ConfigError(f"auth: duplicate key {attr} {shown}")
            seen.add(v)
    return keys


class KeyRing:
    """The configured keys by hash. ``enabled`` False: every request is anonymous."""

    def __init__(self, auth: AuthConfig, keys: list[ApiKeyConfig] | None = None) -> None:
        self.enabled = auth.is_enabled
        loaded = load_keys(auth) if keys is None else keys
        self._by_hash = {k.hash: ApiKey(k) for k in loaded}

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, authorization: str | None, api_key: str | None = None) -> ApiKey:
        """The key named by an ``Authorization: Bearer <key>`` header value or, without one,
        by an ``x-api-key`` header value (``api_key``: how Anthropic's SDKs send it).

        Raises ``AuthenticationError``: code ``missing_api_key`` without either,
        ``invalid_api_key`` when it matches no key. Messages never repeat the token."""
        token = presented_key(authorization, api_key)
        if token is None:
            raise AuthenticationError(
                "Missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                code="missing_api_key",
            )
        key = self._by_hash.get(hash_key(token)) if len(token) <= MAX_KEY_CHARS else None
        if key is None:
            raise AuthenticationError("Incorrect API key provided.", code="invalid_api_key")
        return key


def bearer_token(authorization: str | None) -> str | None:
    """The token of a ``Bearer`` credential (scheme case-insensitive, RFC 6750 §2.1), else
    None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key a request presents: the ``Bearer`` token of ``Authorization`` (OpenAI's SDKs),
    else the ``x-api-key`` value (Anthropic's SDKs), stripped; None when neither is there."""
    token = bearer_token(authorization)
    if token is None and api_key is not None:
        token = api_key.strip() or None
    return token


def check_request(key: ApiKey, req: TierRequest, model_tiers: frozenset[str]) -> frozenset[str]:
    """Check ``key`` may be served ``req``; return the tiers the planner may use.

    403 ``model_not_allowed`` when the model is not the key's; 403 ``tier_not_allowed`` when the
    request named a tier explicitly (header, alias or ``service_tier``) that the key lacks, or
    when none of the model's tiers (``model_tiers``) is the key's. ``auto`` and a model's
    default tier are narrowed to the returned set instead (no 403)."""
    if not key.may_use_model(req.model_name):
        raise PermissionDenied(
            f"This API key is not allowed to use the model `{req.model_name}`.",
            code="model_not_allowed",
            param="model",
        )
    allowed = key.tiers & model_tiers
    if req.source in _EXPLICIT_SOURCES and req.tier != "auto" and req.tier not in key.tiers:
        raise PermissionDenied(
            f"This API key is not allowed to use the {req.tier} tier.",
            code="tier_not_allowed",
            param="service_tier" if req.source == "service_tier" else (
                "x-speedgate-tier" if req.source == "header" else "model"
            ),
        )
    if not allowed:
        raise PermissionDenied(
            f"This API key has no tier of the model `{req.model_name}`.",
            code="tier_not_allowed",
            param="model",
        )
    return allowed
