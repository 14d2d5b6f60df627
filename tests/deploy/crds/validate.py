"""Validate a custom resource against its published CRD schema, as strictly as the API server
does for what JSON Schema can express.

The schemas (``*-v1.json`` beside this module, made by ``extract.py``) are structural OpenAPI v3
schemas; the API server (``kubectl apply --validate=strict``) rejects a field the schema does not
declare, so an object schema with ``properties`` gets ``additionalProperties: false`` unless it
says ``x-kubernetes-preserve-unknown-fields``. ``metadata`` is the API server's own (ObjectMeta)
and only its type is checked. Not evaluated: the CEL rules (``x-kubernetes-validations``) and
``format`` values; see README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

HERE = Path(__file__).parent

# (apiVersion, kind) -> schema file beside this module
SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway-v1.json",
}


def strict(node: Any) -> Any:
    """``node`` (a structural schema) with unknown fields refused wherever the API server
    prunes or (in strict validation) refuses them."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: (strict(v) if k != "properties" else {p: strict(s) for p, s in v.items()})
           for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def schema_for(api_version: str, kind: str) -> dict[str, Any]:
    """The strict schema of ``kind`` at ``api_version``. Raises ``KeyError`` for a kind
    without a stored CRD schema."""
    doc = json.loads((HERE / SCHEMAS[(api_version, kind)]).read_text())
    return strict(doc["schema"])


def errors(obj: dict[str, Any]) -> list[str]:
    """Every violation of ``obj``'s CRD schema, as ``path: message`` lines (empty: valid)."""
    validator = jsonschema.Draft7Validator(schema_for(obj["apiVersion"], obj["kind"]))
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
                  for e in validator.iter_errors(obj))
