"""The KV pool of one simulated replica, from a token count or from a real deployment: a
``speedgate capacity`` preset on one node of H200s (``gateway.capacity.report``'s figures).

``speedgate demo`` sizes each simulator's pool this way, so the capacity, fit and placement the
console shows are those of a real replica. Its default, ``llama-3-70b:tp8``, is Llama-3.1-70B
(GQA, 8 KV heads, 80 layers, bf16 weights and cache) on 8 × H200 (141 GiB, tensor parallel 8,
``gpu_memory_utilization`` 0.9): 180,981 blocks of 16 tokens, 2,895,696 tokens per replica,
room for 2 sequences of 1,048,576 tokens at once (the presets on one H200 hold less than one:
llama-3-8b 917,024 tokens; gpt-oss-120b 1,054,656 but only through its 128-token sliding window).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.capacity.presets import PRESETS, preset

#: The demo's deployment: a preset on one 8 × H200 node (module docstring).
DEFAULT_KV_SIZE = "llama-3-70b:tp8"
#: The demo's context length: a million-token model (2**20, as vLLM's ``--max-model-len 1M``).
DEMO_MAX_MODEL_LEN = 1 << 20
BLOCK_SIZE = 16  # tokens per KV block: vLLM's default on GPU
_TOKENS = re.compile(r"(\d+(?:\.\d+)?)([kKmM]?)")
_PRESET = re.compile(r"([A-Za-z0-9._-]+?)(?::tp(\d+))?")


@dataclass(frozen=True)
class KvSize:
    """A replica's KV pool: ``num_blocks`` blocks of ``block_size`` tokens; ``source`` says
    where the figure comes from (a preset's deployment, or the count given)."""

    num_blocks: int
    block_size: int
    source: str

    @property
    def tokens(self) -> int:
        """Tokens the pool holds (``num_blocks × block_size``)."""
        return self.num_blocks * self.block_size


def parse_tokens(text: str) -> int | None:
    """``'2895696'``, ``'512k'`` (524,288), ``'3M'`` (3 × 2**20): context lengths as quoted
    (binary suffixes, as ``speedgate capacity --workload``); None when ``text`` is no count."""
    m = _TOKENS.fullmatch(text.strip())
    if m is None:
        return None
    number, suffix = m.groups()
    return int(float(number) * {"k": 1 << 10, "m": 1 << 20}.get(suffix.lower(), 1))


def kv_size(spec: str, max_model_len: int) -> KvSize:
    """The pool ``spec`` names: a token count (``parse_tokens``), or a capacity preset with an
    optional tensor-parallel size (``llama-3-70b:tp8``; default tp 8, one H200 node) whose
    standard tier's ``kv_tokens`` at ``max_model_len`` it takes. Raises ``ValueError`` naming
    the accepted forms, or the planner's reason when the preset leaves no KV memory."""
    tokens = parse_tokens(spec)
    if tokens is not None:
        if tokens < BLOCK_SIZE:
            raise ValueError(f"KV size {spec!r}: at least one block of {BLOCK_SIZE} tokens")
        return KvSize(tokens // BLOCK_SIZE, BLOCK_SIZE, f"{tokens:,} tokens as given")
    m = _PRESET.fullmatch(spec.strip())
    if m is None or preset(m.group(1)) is None:
        raise ValueError(f"KV size {spec!r} is neither a token count (2895696, 512k, 3M) nor "
                         f"a preset[:tpN] ({', '.join(PRESETS)})")
    import argparse

    from gateway.capacity.report import add_arguments, build_report

    name, tp = m.group(1).lower(), int(m.group(2) or 8)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([name, "--tp", str(tp), "--max-model-len", str(max_model_len),
                              "--block-size", str(BLOCK_SIZE)])
    row = build_report(args)["tiers"]["standard"]
    return KvSize(row["num_blocks"], row["block_size"],
                  f"{name} on {tp} x H200: `speedgate capacity {name} --tp {tp}`")
