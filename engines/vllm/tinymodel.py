"""A tiny Llama with random weights for real vLLM on CPU: tests and ``speedgate demo --engine
vllm`` (no weights can be downloaded on the machines this project runs on).

The model is built, not fetched: a byte-level BPE tokenizer (``VOCAB_SIZE`` tokens) trained with
``tokenizers`` on a fixed list of the Python standard library's sources, wrapped as a
``transformers`` fast tokenizer with a chat template, and a ``LlamaForCausalLM`` (2 layers,
hidden 128, 4 heads) with seeded random weights; both ``save_pretrained`` into one folder
(about 3 MB, a few seconds). Every engine code path the gateway relies on (tokenization, chat
template, prefill, decode, prefix cache, speculative decoding, usage, metrics) runs for real.

**Scripted output, the same on every CPU.** Random weights make greedy output depend on the
CPU's floating-point numerics (a test once saw ngram speculation propose drafts on one machine
and none on another). So the weights are then *scripted*: each layer's output projections
(attention ``o_proj``, MLP ``down_proj``) are zeroed, so the residual stream is the token
embedding itself; each token's embedding carries a large value (``SIGNAL``) in one "slot"
dimension, and the LM head maps slot ``i`` to the next token of ``CYCLE_TEXT`` (any token outside
the cycle maps to its first token). The model therefore answers every prompt with the cycle's
tokens, the end-of-sequence token last (so a request without ``ignore_eos`` stops after one
cycle, and with it the cycle repeats), with a logit margin of about ``LM_GAIN * sqrt(HIDDEN)``
(~45) over every other token: no rounding on any hardware, in bf16 or fp32, changes the argmax,
and sampling at temperature 1 picks the same tokens (probability of another token < 1e-15).
Repeated n-grams in the output are what ngram prompt lookup proposes as drafts, so the fast
tier's spec-decode counters move on every machine.

Two halves:

- this module's top-level functions (``model_dir``, ``ensure_model``) run anywhere with only the
  standard library: they compute the cache folder and, when it is missing, run this same file as
  a script with the vLLM venv's Python, which has ``tokenizers``, ``transformers`` and ``torch``;
- ``build(out)`` (the script half) does the work.

The cache folder is ``~/.cache/speedgate/tiny-llama-<hash>`` (``SPEEDGATE_CACHE`` overrides
``~/.cache/speedgate``), the hash covering this file's source, so a change to the recipe builds
a new model. Deterministic: the same corpus, a seeded ``torch`` generator, single-threaded
tokenizer training. Written to a temporary folder and renamed, so a half-built model is never
used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

VOCAB_SIZE = 2048
HIDDEN = 128
LAYERS = 2
HEADS = 4
MAX_POSITIONS = 4096
SEED = 0
# The scripted answer (see the module docstring): distinct tokens, end-of-sequence appended.
CYCLE_TEXT = " speedgate tiny model answers from the fast lane"
SIGNAL = 16.0  # embedding value in a token's slot dimension (noise elsewhere: ~0.02 * 0.01)
LM_GAIN = 4.0  # LM-head weight from slot i to its next token: logit ~ LM_GAIN * sqrt(HIDDEN)
# Standard-library sources the tokenizer is trained on (present in every CPython >= 3.11).
CORPUS_MODULES = (
    "argparse", "asyncio/base_events", "collections/__init__", "dataclasses", "difflib",
    "email/message", "functools", "http/client", "inspect", "json/decoder", "logging/__init__",
    "pathlib", "pydoc", "smtplib", "string", "subprocess", "textwrap", "threading", "typing",
    "unittest/case", "urllib/parse", "zipfile",
)  # fmt: skip
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>")


def cache_root() -> Path:
    """``$SPEEDGATE_CACHE`` or ``~/.cache/speedgate``: where the model and the vLLM venv live."""
    env = os.environ.get("SPEEDGATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "speedgate"


def recipe_hash() -> str:
    """12 hex digits of SHA-256 over this file's source: the model's cache key."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def model_dir() -> Path:
    """The folder the tiny model is (or will be) cached in."""
    return cache_root() / f"tiny-llama-{recipe_hash()}"


def is_built(path: Path) -> bool:
    """True when ``path`` holds a finished build (weights, config and tokenizer)."""
    return all(
        (path / f).is_file()
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    )


def ensure_model(python: str | Path, timeout_s: float = 300) -> Path:
    """The cached model's folder, built first with ``python`` (the vLLM venv's interpreter, which
    has ``tokenizers``/``transformers``/``torch``) when missing. Raises ``RuntimeError`` with the
    builder's output when the build fails."""
    out = model_dir()
    if is_built(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(
        [str(python), __file__, str(tmp)],
        capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
    )
    if r.returncode != 0 or not is_built(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"building the tiny model failed ({r.returncode}):\n{r.stderr[-4000:]}")
    try:
        tmp.rename(out)
    except OSError:  # another process finished first; theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_built(out):
            raise
    return out


def _corpus() -> list[str]:
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    return [(lib / f"{m}.py").read_text(encoding="utf-8") for m in CORPUS_MODULES]


def build(out: Path) -> None:
    """Train the tokenizer, create the random-weight model, save both to ``out``. Needs
    ``tokenizers``, ``transformers`` and ``torch`` (the vLLM venv)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    script_output(model, cycle_tokens(tok))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


def cycle_tokens(tok: object) -> list[int]:
    """Token ids of ``CYCLE_TEXT`` (``tok``: a ``tokenizers.Tokenizer``), duplicates dropped,
    then the end-of-sequence id: the sequence the scripted model repeats."""
    ids: list[int] = []
    for t in tok.encode(CYCLE_TEXT).ids:  # type: ignore[attr-defined]
        if t not in ids:
            ids.append(t)
    eos = tok.token_to_id("</s>")  # type: ignore[attr-defined]
    return [*(t for t in ids if t != eos), eos]


def script_output(model: object, cycle: list[int]) -> None:
    """Rewrite ``model``'s weights in place so that greedy (and temperature-1) decoding emits
    ``cycle`` over and over, independently of the CPU's numerics (module docstring). Needs
    ``len(cycle) + 1 <= HIDDEN`` slot dimensions; raises ``ValueError`` otherwise."""
    import torch

    n = len(cycle)
    if n + 1 > HIDDEN:
        raise ValueError(f"cycle of {n} tokens needs more than {HIDDEN} hidden dimensions")
    other = n  # the slot of every token outside the cycle
    with torch.no_grad():
        for layer in model.model.layers:  # type: ignore[attr-defined]
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight  # type: ignore[attr-defined]  # (vocab, hidden)
        head = model.lm_head.weight  # type: ignore[attr-defined]  # (vocab, hidden)
        emb.mul_(0.01)
        head.mul_(0.01)
        emb[:, other] += SIGNAL
        for i, t in enumerate(cycle):
            emb[t, other] -= SIGNAL
            emb[t, i] += SIGNAL
            head[cycle[(i + 1) % n], i] += LM_GAIN
        head[cycle[0], other] += LM_GAIN


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR  (run with the vLLM venv's python)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    build(Path(sys.argv[1]))
