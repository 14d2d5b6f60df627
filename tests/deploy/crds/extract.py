"""Extract one served version's ``openAPIV3Schema`` from a published CustomResourceDefinition
into the compact JSON the picker-mode manifest tests validate against.

Usage: ``python -m tests.deploy.crds.extract CRD.yaml VERSION OUT.json`` (the CRD as published by
its project; see README.md here for the sources and commits). Descriptions are dropped (they are
documentation, not constraints); every other keyword is kept as published, CEL rules
(``x-kubernetes-validations``) included, so a reader can see what the tests do not evaluate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strip_descriptions(node: Any) -> Any:
    """``node`` (a schema tree of dicts and lists) without its ``description`` keys; the
    ``properties`` maps keep a property that happens to be named ``description``."""
    if isinstance(node, dict):
        return {k: (strip_descriptions(v) if k != "properties"
                    else {p: strip_descriptions(s) for p, s in v.items()})
                for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def extract(crd_path: Path, version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` in the CRD at ``crd_path``, with ``group``,
    ``kind`` and ``version`` beside it. Raises ``KeyError`` when the CRD has no such version."""
    crd = yaml.safe_load(crd_path.read_text())
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version] or [None]
    if v is None:
        raise KeyError(f"{crd_path} has no version {version!r}")
    return {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"],
            "version": version, "schema": strip_descriptions(v["schema"]["openAPIV3Schema"])}


if __name__ == "__main__":
    src, ver, out = sys.argv[1:4]
    Path(out).write_text(json.dumps(extract(Path(src), ver), separators=(",", ":"),
                                    sort_keys=True) + "\n")
