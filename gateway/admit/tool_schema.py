"""A tool's parameter schema checked for the shape of a JSON Schema before any replica sees it.

An engine compiles a tool's ``parameters`` (OpenAI) or ``input_schema`` (Anthropic) into a
grammar when the tool call is constrained (vLLM's structured outputs: xgrammar / guidance) and
renders it into the chat template otherwise; a schema that is not a JSON Schema (``"enum": 5``,
``"items": [1]``, ``"type": 7``) made the simulator, and can make an engine, answer 500, which
the gateway would count against the replica. So the schema's keywords must have the types the
JSON Schema specification gives them (draft 2020-12, "JSON Schema Core" §10 and "JSON Schema
Validation" §6, plus the draft 4-7 forms agents still send: ``items`` as an array of schemas,
``dependencies``, ``definitions``, boolean ``exclusiveMinimum``/``exclusiveMaximum``):

- subschemas (``items``, ``not``, ``additionalProperties``...) are objects or booleans, arrays
  of them (``allOf``, ``anyOf``, ``oneOf``, ``prefixItems``) are non-empty arrays, maps of them
  (``properties``, ``$defs``...) are objects of schemas;
- ``type`` is a type name or an array of them; ``enum`` an array; ``required`` an array of
  strings; counts (``minLength``, ``maxItems``...) non-negative integers; bounds numbers;
  ``multipleOf`` a number above 0; ``pattern``, ``format``, ``$ref``, ``title``,
  ``description`` strings; ``uniqueItems`` a boolean.

Unknown keywords are allowed (the specification ignores them). What is checked is the shape,
not the meaning (a ``$ref`` that resolves nowhere, a ``pattern`` that is not a regex pass: the
engine's 4xx is the client's answer and never counts). The ``jsonschema`` meta-schema check
gives the same verdicts on these (``tests/unit/admit/test_body_schema.py`` holds the walk to
it) but costs ~14 ms per 10-property schema where this walk costs ~40 µs (2-core machine under
a load average of 6: ``loadtests/fuzz_front_doors.py --bench``), so the walk runs on every
request without a cache. Iterative: no recursion.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.errors import InvalidRequest

TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_SUBSCHEMA = frozenset({
    "additionalItems", "additionalProperties", "contains", "propertyNames", "not", "if", "then",
    "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
})
_SCHEMA_ARRAYS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_COUNTS = frozenset({"maxLength", "minLength", "maxItems", "minItems", "maxProperties",
                     "minProperties", "maxContains", "minContains"})
_BOUNDS = frozenset({"maximum", "minimum"})
_EXCLUSIVE = frozenset({"exclusiveMaximum", "exclusiveMinimum"})  # draft 4: booleans
_STRINGS = frozenset({"pattern", "format", "$ref", "$id", "$schema", "$anchor", "title",
                      "description", "contentEncoding", "contentMediaType", "$comment"})


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> bool:
    return _number(v) and float(v).is_integer() and v >= 0


def _type_ok(v: Any) -> bool:
    if isinstance(v, str):
        return v in TYPE_NAMES
    return (isinstance(v, list) and bool(v)
            and all(isinstance(t, str) and t in TYPE_NAMES for t in v))


def _keyword_problem(key: str, value: Any, push: Any, path: str) -> str | None:
    """Why ``value`` cannot be keyword ``key``'s (None: it can); pushes its subschemas."""
    if key in _SUBSCHEMA:
        push(value, f"{path}/{key}")
    elif key == "items":  # a schema, or (drafts 4-7) an array of schemas
        if isinstance(value, list):
            for i, s in enumerate(value):
                push(s, f"{path}/items/{i}")
        else:
            push(value, f"{path}/items")
    elif key in _SCHEMA_ARRAYS:
        if not isinstance(value, list) or not value:
            return "must be a non-empty array of schemas"
        for i, s in enumerate(value):
            push(s, f"{path}/{key}/{i}")
    elif key in _SCHEMA_MAPS:
        if not isinstance(value, dict):
            return "must be an object of schemas"
        for name, s in value.items():
            push(s, f"{path}/{key}/{name}")
    elif key == "dependencies":  # draft 7: a schema or an array of property names each
        if not isinstance(value, dict):
            return "must be an object"
        for name, s in value.items():
            if isinstance(s, list):
                if not all(isinstance(p, str) for p in s):
                    return "must hold schemas or arrays of strings"
            else:
                push(s, f"{path}/dependencies/{name}")
    elif key == "type":
        if not _type_ok(value):
            return f"must be one of {sorted(TYPE_NAMES)} or a non-empty array of them"
    elif key == "enum":
        if not isinstance(value, list):
            return "must be an array"
    elif key == "required":
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            return "must be an array of strings"
    elif key == "dependentRequired":
        if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(p, str) for p in v) for v in value.values()
        ):
            return "must be an object of arrays of strings"
    elif key in _COUNTS:
        if not _count(value):
            return "must be a non-negative integer"
    elif key in _BOUNDS:
        if not _number(value):
            return "must be a number"
    elif key in _EXCLUSIVE:
        if not (_number(value) or isinstance(value, bool)):
            return "must be a number"
    elif key == "multipleOf":
        if not _number(value) or value <= 0:
            return "must be a number above 0"
    elif key == "uniqueItems":
        if not isinstance(value, bool):
            return "must be a boolean"
    elif key in _STRINGS:
        if not isinstance(value, str):
            return "must be a string"
    elif key == "examples":
        if not isinstance(value, list):
            return "must be an array"
    return None


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` (a parsed JSON value) is not shaped like a JSON Schema (module
    docstring), as ``"<json pointer>: <reason>"``; None when it is."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    push = lambda s, p: stack.append((s, p))  # noqa: E731 - the walk's one callback
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return f"{path or '/'}: a schema must be an object or a boolean"
        for key, value in node.items():
            problem = _keyword_problem(key, value, push, path)
            if problem is not None:
                return f"{path}/{key}: {problem}"
    return None


def check_tool_schema(schema: Any, param: str) -> None:
    """Raise ``InvalidRequest`` (400, ``param``, code ``invalid_tool_schema``) when ``schema``
    (None: absent, passes) is not a JSON object shaped like a JSON Schema."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param,
                             code="invalid_tool_schema")
    problem = schema_problem(schema)
    if problem is not None:
        raise InvalidRequest(f"'{param}' is not a valid JSON Schema: {problem}", param=param,
                             code="invalid_tool_schema")
