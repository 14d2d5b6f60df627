"""The ``speedgate capacity`` report: a model (``config.json`` or preset) on a replica spec, per
tier, as a dict (``--json``) or a table.

The standard tier runs the model alone; the fast tier adds the speculative method's memory (a
draft model's weights, and its KV layers to the bytes per token, since vLLM allocates the draft's
layers from the same block pool; or a flat extra per GPU, e.g. 0 for ngram prompt lookup).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from typing import Any

from gateway.capacity.checks import check_layout, config_context, derived_context
from gateway.capacity.footprint import FootprintError, KvFootprint, kv_footprint, load_model_config
from gateway.capacity.planner import (
    CONTEXTS,
    GIB,
    ReplicaSpec,
    replica_capacity,
    replicas_needed,
    sessions_per_replica,
    weights_bytes,
    why_no_fit,
)
from gateway.capacity.presets import PRESETS, preset

_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_WORKLOAD = re.compile(r"(standard|fast)=(\d+)x(\d+(?:\.\d+)?[kKmM]?)")


def parse_size(text: str) -> int:
    """``'64M'`` → 67108864: vLLM's ``human_readable_int`` (``vllm/utils/argparse_utils.py``:
    lower-case suffixes decimal, upper-case binary). Raises ``ValueError``."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        if not text.strip().isdigit():
            raise ValueError(f"size {text!r} is not a byte count such as 64M, 1G or 1073741824")
        return int(text)
    number, suffix = m.groups()
    if suffix in _DEC:
        return int(float(number) * _DEC[suffix])
    return int(number) * _BIN[suffix]


def parse_workload(text: str) -> tuple[str, int, int]:
    """``'standard=20x1M'`` → ``('standard', 20, 1048576)``: tier, concurrent sessions, tokens
    per session (k/M suffixes binary-free: ``1M`` = 2**20, ``128k`` = 131072, as context lengths
    are quoted). Raises ``ValueError`` naming the expected form."""
    m = _WORKLOAD.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"workload {text!r} is not TIER=SESSIONSxTOKENS (e.g. standard=20x1M)")
    tier, sessions, tokens = m.groups()
    mult = {"k": 1024, "K": 1024, "m": 1 << 20, "M": 1 << 20}.get(tokens[-1], 1)
    n = int(float(tokens.rstrip("kKmM")) * mult)
    if int(sessions) < 1 or n < 1:
        raise ValueError(f"workload {text!r}: sessions and tokens must be >= 1")
    return tier, int(sessions), n


def estimate_params_b(cfg: dict[str, Any]) -> float:
    """Parameters (billions) of a dense decoder from its config: embeddings (twice unless tied)
    plus per layer the q/o projections (``2 × h × heads × head_dim``), k/v
    (``2 × h × kv_heads × head_dim``) and a gated MLP (``3 × h × intermediate``); norms ignored.
    Raises ``FootprintError`` for mixture-of-experts configs (pass ``--params-b``)."""
    if any(k in cfg for k in ("n_routed_experts", "num_local_experts", "num_experts")):
        raise FootprintError("mixture-of-experts config: give the parameter count (--params-b)")
    try:
        h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or h // heads
        inter = cfg["intermediate_size"]
    except (KeyError, TypeError) as e:
        raise FootprintError(f"cannot estimate parameters, config lacks {e} (--params-b)") from e
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    per_layer = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * inter
    return (embed + layers * per_layer) / 1e9


def _model(name: str) -> tuple[dict[str, Any], float | None, str | None, str]:
    """(config, params_b or None, checkpoint dtype or None, label) of a preset or a path."""
    p = preset(name)
    if p is not None:
        return p.config, p.params_b, p.weights_dtype, f"preset {name} ({p.source})"
    return load_model_config(name), None, None, name


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """The report for parsed ``speedgate capacity`` arguments: model, footprint, per tier the
    replica's capacity, sessions at 32k/128k/1M and for ``--workload`` the replicas needed.
    Raises ``FootprintError`` / ``PlanError`` / ``ValueError`` with a message for the user."""
    cfg, params_b, ckpt_dtype, label = _model(args.model)
    params_b = args.params_b if args.params_b is not None else params_b
    if params_b is None:
        params_b = estimate_params_b(cfg)
    dtype = args.dtype if args.dtype != "auto" else (
        ckpt_dtype or str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))
    kv_dtype = args.kv_cache_dtype
    if kv_dtype == "auto":  # vLLM: the cache follows the model's compute dtype
        kv_dtype = dtype if dtype in ("float32", "float16", "bfloat16") else "bfloat16"
    check_layout(cfg, args.tp, args.pp)
    fp = kv_footprint(cfg, kv_dtype=kv_dtype, tp=args.tp, pp=args.pp)
    max_len = args.max_model_len or config_context(cfg) or 1 << 20
    max_len_name = ("--max-model-len" if args.max_model_len else
                    "the model's max_position_embeddings" if config_context(cfg) else
                    "the default max_model_len (the config has no max_position_embeddings)")
    longest = derived_context(cfg)
    too_long = (f"--max-model-len {args.max_model_len:,} is above the model's longest context "
                f"{longest:,} (max_position_embeddings, with any rope_scaling factor): vLLM "
                f"does not start with it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
                if args.max_model_len and longest and args.max_model_len > longest else None)
    spec = ReplicaSpec(
        gpu_memory_gib=args.gpu_memory_gib, tp=args.tp, pp=args.pp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        weights_bytes=weights_bytes(params_b, dtype),
        reserved_gib_per_gpu=args.reserved_gib,
        kv_cache_memory_bytes=(parse_size(args.kv_cache_memory_bytes)
                               if args.kv_cache_memory_bytes else None),
        block_size=args.block_size, max_model_len=max_len,
    )
    tiers = {"standard": (fp, spec)}
    fast_fp, fast_spec = fp, replace(spec, extra_bytes_per_gpu=int(args.spec_extra_gib * GIB))
    if args.draft:
        dcfg, dparams, _, _ = _model(args.draft)
        dparams = args.draft_params_b if args.draft_params_b is not None else dparams
        # the draft runs in the target's dtype (vLLM loads both under one --dtype)
        dbytes = weights_bytes(dparams if dparams is not None else estimate_params_b(dcfg), dtype)
        dfp = kv_footprint(dcfg, kv_dtype=kv_dtype, tp=args.tp, pp=1)
        fast_fp = _with_draft(fp, dfp)
        fast_spec = replace(fast_spec, weights_bytes=spec.weights_bytes + dbytes)
    tiers["fast"] = (fast_fp, fast_spec)
    workloads = [parse_workload(w) for w in args.workload or ()]
    out: dict[str, Any] = {
        "model": label, "kind": fp.kind, "params_b": round(params_b, 3), "weights_dtype": dtype,
        "kv_cache_dtype": fp.kv_dtype, "tp": args.tp, "pp": args.pp,
        "gpu_memory_gib": args.gpu_memory_gib,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_bytes_per_token_unsharded": kv_footprint(cfg, kv_dtype=kv_dtype).bytes_per_token,
        "sliding_window": fp.window, "tiers": {},
    }
    for tier, (tfp, tspec) in tiers.items():
        cap = replica_capacity(tfp, tspec)
        row: dict[str, Any] = {
            "weights_gib_per_gpu": round(cap.weights_bytes_per_gpu / GIB, 2),
            "extra_gib_per_gpu": round(tspec.extra_bytes_per_gpu / GIB, 2),
            "kv_pool_gib_per_gpu": round(cap.kv_pool_bytes_per_gpu / GIB, 2),
            "kv_bytes_per_token_per_gpu": cap.bytes_per_token,
            "block_size": cap.block_size, "num_blocks": cap.num_blocks,
            "kv_tokens": cap.kv_tokens, "max_model_len": cap.max_model_len,
            "max_concurrency": round(cap.max_concurrency, 2),
            "starts": cap.fits_max_model_len and too_long is None,
            "starts_reason": too_long or why_no_fit(tfp, cap, cap.max_model_len, max_len_name),
            "sessions": {str(n): sessions_per_replica(tfp, cap, n) for n in CONTEXTS},
            "sessions_reasons": {str(n): r for n in CONTEXTS
                                 if (r := why_no_fit(tfp, cap, n, max_len_name)) is not None},
            "workload": [],
        }
        for wtier, sessions, tokens in workloads:
            if wtier == tier:
                row["workload"].append({"sessions": sessions, "tokens": tokens,
                                        "replicas": replicas_needed(tfp, cap, sessions, tokens),
                                        "reason": why_no_fit(tfp, cap, tokens, max_len_name)})
        out["tiers"][tier] = row
    return out


def _with_draft(fp: KvFootprint, draft: KvFootprint) -> KvFootprint:
    """The target's footprint with a draft model's KV layers added (same page size per layer
    assumed, as vLLM requires of layers sharing one pool; the draft's bytes are folded in as
    extra full-attention layers of the target's layer size, rounded up)."""
    extra = -(-draft.bytes_per_token // fp.layer_bytes) if fp.layer_bytes else 0
    return replace(fp, full_layers=fp.full_layers + extra)


def _fmt_tokens(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def format_table(report: dict[str, Any]) -> str:
    """The report as a table for people: one column per tier."""
    tiers = list(report["tiers"])
    lines = [
        f"model: {report['model']} ({report['kind']}, {report['params_b']:g}B params, weights "
        f"{report['weights_dtype']}, KV {report['kv_cache_dtype']})",
        f"replica: {report['tp'] * report['pp']} GPU(s) of {report['gpu_memory_gib']:g} GiB "
        f"(tp={report['tp']}, pp={report['pp']}), gpu_memory_utilization "
        f"{report['gpu_memory_utilization']:g}",
        f"KV bytes per token (whole model): {report['kv_bytes_per_token_unsharded']:,}"
        + (f"; sliding window {report['sliding_window']}" if report["sliding_window"] else ""),
        "",
    ]
    rows: list[tuple[str, list[str]]] = [
        ("weights per GPU (GiB)", [f"{report['tiers'][t]['weights_gib_per_gpu']:.2f}"
                                   for t in tiers]),
        ("draft/spec extra per GPU (GiB)", [f"{report['tiers'][t]['extra_gib_per_gpu']:.2f}"
                                            for t in tiers]),
        ("KV pool per GPU (GiB)", [f"{report['tiers'][t]['kv_pool_gib_per_gpu']:.2f}"
                                   for t in tiers]),
        ("KV bytes per token per GPU", [f"{report['tiers'][t]['kv_bytes_per_token_per_gpu']:,}"
                                        for t in tiers]),
        ("KV blocks x block size", [f"{report['tiers'][t]['num_blocks']:,} x "
                                    f"{report['tiers'][t]['block_size']}" for t in tiers]),
        ("KV tokens per replica", [f"{report['tiers'][t]['kv_tokens']:,}" for t in tiers]),
        ("max concurrency at max_model_len", [
            f"{report['tiers'][t]['max_concurrency']:.2f}x @ "
            f"{report['tiers'][t]['max_model_len']:,}"
            + ("" if report["tiers"][t]["starts"] else " (will not start)")
            for t in tiers]),
    ]
    for n in CONTEXTS:
        rows.append((f"sessions of {_fmt_tokens(n)} tokens",
                     [str(report["tiers"][t]["sessions"][str(n)]) for t in tiers]))
    for t in tiers:
        for w in report["tiers"][t]["workload"]:
            need = w["replicas"]
            cells = ["" for _ in tiers]
            cells[tiers.index(t)] = str(need) if need is not None else "does not fit"
            rows.append((f"replicas for {w['sessions']} x {_fmt_tokens(w['tokens'])}", cells))
    width = max(len(r[0]) for r in rows) + 2
    col = max(14, *(len(c) + 2 for _, cells in rows for c in cells))
    lines.append(" " * width + "".join(t.rjust(col) for t in tiers))
    lines += [name.ljust(width) + "".join(c.rjust(col) for c in cells) for name, cells in rows]
    return "\n".join(lines + _why_not(report))


def _why_not(report: dict[str, Any]) -> list[str]:
    """The notes under the table: for each "will not start", "does not fit" and 0 sessions,
    which limit stops it, with the numbers (one line per reason, naming the tiers)."""
    notes: dict[tuple[str, str], list[str]] = {}
    for t, row in report["tiers"].items():
        if row["starts_reason"] is not None:
            notes.setdefault(("will not start", row["starts_reason"]), []).append(t)
        for n, reason in row["sessions_reasons"].items():
            notes.setdefault((f"0 sessions of {_fmt_tokens(int(n))} tokens", reason),
                             []).append(t)
        for w in row["workload"]:
            if w["reason"] is not None:
                what = f"replicas for {w['sessions']} x {_fmt_tokens(w['tokens'])}: does not fit"
                notes.setdefault((what, w["reason"]), []).append(t)
    if not notes:
        return []
    return ["", "why:"] + [f"  {what} ({', '.join(tiers)}): {reason}"
                           for (what, reason), tiers in notes.items()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``speedgate capacity`` options (vLLM's flag names where one exists)."""
    p.add_argument("model", help="a config.json (or model folder) or a preset: "
                   + ", ".join(PRESETS))
    p.add_argument("--gpu-memory-gib", type=float, default=141.0,
                   help="memory of one GPU in GiB (default 141, an H200)")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1)
    p.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto",
                   help="weights dtype (auto: the preset's checkpoint or config torch_dtype)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto, bfloat16, float16, float32, fp8, fp8_e4m3, fp8_e5m2, fp8_ds_mla")
    p.add_argument("--params-b", type=float, help="parameters in billions (default: preset "
                   "or estimated from a dense config)")
    p.add_argument("--kv-cache-memory-bytes", help="KV pool per GPU as vLLM's flag (64M, 1G; "
                   "CPU: VLLM_CPU_KVCACHE_SPACE GiB); overrides the GPU memory figures")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (GPU 16, "
                   "CPU 128)")
    p.add_argument("--max-model-len", type=int, help="default: max_position_embeddings")
    p.add_argument("--reserved-gib", type=float, default=0.0,
                   help="activation/other memory per GPU (vLLM profiles it; default 0)")
    p.add_argument("--draft", help="fast tier: draft model (config.json or preset)")
    p.add_argument("--draft-params-b", type=float, help="draft parameters in billions")
    p.add_argument("--spec-extra-gib", type=float, default=0.0,
                   help="fast tier: extra memory per GPU of the speculative method")
    p.add_argument("--workload", action="append", metavar="TIER=SESSIONSxTOKENS",
                   help="sessions resident at once per tier, e.g. standard=20x1M (repeat)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

