"""CPU to count the prompt of turn N+1 of a ~1M-token session: a full encode (no cache) against
the per-prefix-block cache (``gateway.telemetry.block_count``), side by side in one run.

Two session shapes: an agent's conversation (many messages: turn N+1 appends a tool result and
a reply) and one growing prompt string (``/v1/completions``: turn N+1 appends text to the same
string, which a per-message cache cannot reuse). For each, turn N+1 is counted ``--repeats``
times, without a cache and after a fresh cache was filled by turn N (outside the timing);
figures are medians of ``time.process_time`` (CPU seconds of this process) and the characters
the tokenizer was handed.

Run::

    .venv/bin/python -m loadtests.bench_token_count
    .venv/bin/python -m loadtests.bench_token_count --tokens 1000000 --repeats 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from gateway.telemetry import tokencount
from gateway.telemetry.block_count import BlockCounts

_WORDS = "the model reads the tool output and decides which file to open next ".split()


def _chunk(i: int, chars: int) -> str:
    words = [f"{_WORDS[(i + k) % len(_WORDS)]}{k % 97}" if k % 7 == 0 else _WORDS[(i + k) %
             len(_WORDS)] for k in range(chars // 5)]
    return " ".join(words)[:chars]


def sessions(tokens: int) -> dict[str, tuple[dict[str, Any], dict[str, Any], str]]:
    """``shape → (turn N doc, turn N+1 doc, kind)`` of about ``tokens`` prompt tokens (~4.5
    characters a token for this text)."""
    chars = tokens * 9 // 2
    per_turn = 40_000
    msgs: list[dict[str, Any]] = [{"role": "system", "content": _chunk(0, 4000)}]
    i = 1
    while sum(len(m["content"]) for m in msgs) < chars:
        msgs += [{"role": "user", "content": _chunk(i, per_turn)},
                 {"role": "assistant", "content": _chunk(i + 1, 2000)}]
        i += 2
    nxt = [*msgs, {"role": "user", "content": _chunk(i, per_turn)},
           {"role": "assistant", "content": _chunk(i + 1, 2000)}]
    prompt = _chunk(7, chars)
    return {
        "conversation": ({"messages": msgs}, {"messages": nxt}, "chat"),
        "growing_prompt": ({"prompt": prompt}, {"prompt": prompt + " " + _chunk(9, per_turn)},
                           "completion"),
    }


def _encoded_chars(fn: Any) -> tuple[Any, int]:
    """``fn()`` with the characters handed to the tokenizer counted."""
    real = tokencount.get_encoding()
    seen = [0]

    class Counting:
        def encode_ordinary(self, text: str) -> list[int]:
            seen[0] += len(text)
            return real.encode_ordinary(text)

    saved = tokencount.get_encoding
    tokencount.get_encoding = lambda name="cl100k_base": Counting()  # type: ignore[assignment]
    try:
        return fn(), seen[0]
    finally:
        tokencount.get_encoding = saved  # type: ignore[assignment]


def run(tokens: int, repeats: int) -> dict[str, Any]:
    """``shape → {tokens, before/after: {cpu_s, encoded_chars}, cpu_ratio}``."""
    tokencount.get_encoding()
    out: dict[str, Any] = {}
    for shape, (turn_n, turn_n1, kind) in sessions(tokens).items():
        rows: dict[str, list[tuple[float, int, int]]] = {"before": [], "after": []}
        for _ in range(repeats):
            for mode in ("before", "after"):  # interleaved: the same noise for both
                tokencount.BLOCKS = BlockCounts(max_entries=1 << 20)
                if mode == "after":  # the cache as turn N left it (filled outside the timing)
                    tokencount.count_prompt(turn_n, kind)  # type: ignore[arg-type]
                t0 = time.process_time()
                n, chars = _encoded_chars(
                    lambda d=turn_n1, k=kind: tokencount.count_prompt(d, k))  # type: ignore[misc]
                rows[mode].append((time.process_time() - t0, chars, n))
        counts = {n for r in rows.values() for _, _, n in r}
        assert len(counts) == 1, f"counts differ: {counts}"
        med = {m: {"cpu_s": round(statistics.median(c for c, _, _ in r), 4),
                   "encoded_chars": r[0][1]} for m, r in rows.items()}
        out[shape] = {"tokens": counts.pop(), **med,
                      "cpu_ratio": round(med["before"]["cpu_s"] / max(med["after"]["cpu_s"],
                                                                       1e-6), 1)}
    tokencount.BLOCKS = BlockCounts()
    return out


def main() -> None:
    """Command line: print the table (or ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000, help="session size, tokens")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args.tokens, args.repeats)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{'shape':<16}{'tokens':>10}{'before cpu_s':>14}{'after cpu_s':>13}"
          f"{'before chars':>14}{'after chars':>13}{'ratio':>8}")
    for shape, r in res.items():
        print(f"{shape:<16}{r['tokens']:>10}{r['before']['cpu_s']:>14}{r['after']['cpu_s']:>13}"
              f"{r['before']['encoded_chars']:>14}{r['after']['encoded_chars']:>13}"
              f"{r['cpu_ratio']:>7}x")


if __name__ == "__main__":
    main()
