"""Deterministic JSON values valid against a JSON schema: the simulator's tool arguments and
structured outputs. Pure.

Covers the subset tool and response schemas use (JSON Schema draft 2020-12 keywords, as OpenAI
function ``parameters``, Anthropic ``input_schema`` and pydantic's ``model_json_schema`` write
them): ``type`` (one or a list; ``null`` only when alone), ``enum``, ``const``, ``properties`` +
``required``, ``items``, ``minItems``/``maxItems``, ``minimum``/``maximum`` (and the exclusive
forms), ``minLength``/``maxLength``, ``anyOf``/``oneOf`` (first non-null branch), ``allOf``
(merged), local ``$ref`` (``#/$defs/...``, ``#/definitions/...``), ``default`` (used when
present). A ``number`` is written as an integer (``37``, never ``37.0``) so an integer field
accepts it too (Rust clients such as Codex parse ``usize`` strictly).
"""

from __future__ import annotations

import zlib
from typing import Any

from engines.sim.textgen import VOCAB

MAX_DEPTH = 8  # deeper than this: arrays as short as allowed, nullable branches null


def schema_value(schema: Any, key: int, *, all_properties: bool = False) -> Any:
    """A value valid against ``schema`` (a JSON-schema dict; anything else: an empty object
    at the top), the same for the same ``key`` (an int, e.g. a prompt key mixed with the
    replica's seed). ``all_properties``: fill every property, not only the ``required``
    ones. Never raises on an unknown keyword (it is ignored)."""
    root = schema if isinstance(schema, dict) else {}
    return _Gen(root, all_properties).value(root or {"type": "object"}, key, 0)


class _Gen:
    def __init__(self, root: dict[str, Any], all_properties: bool) -> None:
        self.root, self.all = root, all_properties

    def _resolve(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """``$ref``/``allOf``/``anyOf``/``oneOf`` reduced to one plain schema."""
        for _ in range(MAX_DEPTH):
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                node: Any = self.root
                for part in ref[2:].split("/"):
                    node = node.get(part, {}) if isinstance(node, dict) else {}
                schema = {**{k: v for k, v in schema.items() if k != "$ref"},
                          **(node if isinstance(node, dict) else {})}
                continue
            for key in ("anyOf", "oneOf"):
                options = schema.get(key)
                if isinstance(options, list) and options:
                    deep = depth >= MAX_DEPTH  # deep down, a null ends a recursive schema
                    pick = next((o for o in options if isinstance(o, dict)
                                 and (o.get("type") == "null") == deep), options[0])
                    rest = {k: v for k, v in schema.items() if k != key}
                    schema = {**rest, **(pick if isinstance(pick, dict) else {})}
                    break
            else:
                parts = schema.get("allOf")
                if not isinstance(parts, list):
                    return schema
                merged = {k: v for k, v in schema.items() if k != "allOf"}
                for p in parts:
                    if isinstance(p, dict):
                        merged = {**merged, **p}
                schema = merged
        return {k: v for k, v in schema.items() if k not in ("$ref", "anyOf", "oneOf", "allOf")}

    def value(self, schema: Any, key: int, depth: int) -> Any:
        if not isinstance(schema, dict):
            return self.word(key)
        schema = self._resolve(schema, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[key % len(enum)]
        if "default" in schema:
            return schema["default"]
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else (
                "string")
        if kind == "null":
            return None
        if kind == "boolean":
            return key % 2 == 0
        if kind in ("integer", "number"):
            return self.integer(schema, key)
        if kind == "array":
            return self.array(schema, key, depth)
        if kind == "object":
            return self.object(schema, key, depth)
        return self.string(schema, key)

    def integer(self, schema: dict[str, Any], key: int) -> int:
        low, high = 0, None
        if isinstance(schema.get("minimum"), int | float):
            low = int(-(-schema["minimum"] // 1))
        if isinstance(schema.get("exclusiveMinimum"), int | float):
            low = int(schema["exclusiveMinimum"] // 1) + 1
        if isinstance(schema.get("maximum"), int | float):
            high = int(schema["maximum"] // 1)
        if isinstance(schema.get("exclusiveMaximum"), int | float):
            high = int(-(-schema["exclusiveMaximum"] // 1)) - 1
        if high is not None and high < low:  # e.g. only a negative maximum
            low = high - 99
        span = 100 if high is None else high - low + 1
        return low + key % max(1, span)

    def word(self, key: int) -> str:
        return VOCAB[key % len(VOCAB)]

    def string(self, schema: dict[str, Any], key: int) -> str:
        text = self.word(key)
        low = schema.get("minLength")
        while isinstance(low, int) and len(text) < low:
            key = _mix(key, "more")
            text += " " + self.word(key)
        high = schema.get("maxLength")
        if isinstance(high, int) and high >= 0:
            text = text[:high]
        return text

    def array(self, schema: dict[str, Any], key: int, depth: int) -> list[Any]:
        low = schema.get("minItems") if isinstance(schema.get("minItems"), int) else 0
        high = schema.get("maxItems")
        count = low if depth >= MAX_DEPTH else max(low, 1)  # deep down: as few as allowed
        if isinstance(high, int):
            count = min(count, high)
        items = schema.get("items")
        return [self.value(items if isinstance(items, dict) else {}, _mix(key, str(i)), depth + 1)
                for i in range(count)]

    def object(self, schema: dict[str, Any], key: int, depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        if not isinstance(props, dict) or depth >= 2 * MAX_DEPTH:
            return {}
        required = schema.get("required")
        wanted = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        names = list(dict.fromkeys([*props, *wanted])) if self.all else wanted
        return {n: self.value(props.get(n, {}), _mix(key, n), depth + 1) for n in names}


def _mix(key: int, label: str) -> int:
    """A child key: CRC32 of ``label`` seeded with the parent key (stable across runs)."""
    return zlib.crc32(label.encode(), key & 0xFFFFFFFF)
