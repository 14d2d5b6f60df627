"""The configuration reference (docs/configuration.md) is generated from the schema and checked
against it: every field is named, the checked-in page is the generator's output (so no type or
default can drift), and the generator refuses a field without a meaning or a stale meaning."""

import html
import importlib.util
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.config import GatewayConfig, ModelConfig, PoolConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "configuration.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_configuration",
                                                  DOCS / "gen_configuration.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def _text() -> str:
    """The page as a reader sees its names: field cells without their break hints, as code."""
    page = PAGE.read_text().replace("<wbr>", "")
    return html.unescape(re.sub(r'<code class="field">(.*?)</code>', r"`\1`", page))


def test_every_config_field_is_documented():
    section = _text()
    missing = []
    for name, field in GatewayConfig.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            missing += [f"{name}.{f}" for f in _fields(sub) if f"{name}.{f}" not in section
                        and f"`{f}`" not in section]
    for f in _fields(ModelConfig):
        if f != "tiers" and f"models.<name>.{f}" not in section:
            missing.append(f"models.<name>.{f}")
    for f, field in PoolConfig.model_fields.items():
        if f"tiers.<tier>.{f}" not in section:
            missing.append(f"tiers.<tier>.{f}")
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            missing += [f"{f}.{g}" for g in _fields(sub) if f"`{g}`" not in section
                        and f"tiers.<tier>.{f}.{g}`" not in section]
    assert missing == []


def test_the_page_is_the_generators_output_of_the_schema():
    gen = _generator()
    assert PAGE.read_text() == gen.render(), "run .venv/bin/python docs/gen_configuration.py"
    # one row per field, nested ones included, with the schema's default
    assert "| `server.max_connections` | int | `10000` |" in _text()
    assert "| `models.<name>.tiers.<tier>.timeouts.ttft_s` | float | `300` |" in _text()
    assert len(gen.rows()) > 140


def test_the_generator_refuses_a_field_without_meaning_and_a_stale_meaning():
    gen = _generator()
    meanings = gen.load_meanings()
    with pytest.raises(KeyError, match=r"server\.port"):
        gen.render({k: v for k, v in meanings.items() if k != "server.port"})
    with pytest.raises(ValueError, match=r"server\.gone"):
        gen.render({**meanings, "server.gone": "a field the schema lacks"})


def test_field_names_wrap_only_after_a_dot():
    """The site's theme breaks code anywhere: at a 1400-px window 132 of 155 field paths broke
    mid-name (``server.worker`` / ``s``). Each path cell is now code of the ``field`` class,
    which the page's style keeps whole, with a break hint after each dot only."""
    page = PAGE.read_text()
    assert ".md-typeset td > code.field { word-break: normal; overflow-wrap: normal; }" in page
    cells = re.findall(r"^\| (.*?) \|", page, re.M)
    rows = [c for c in cells if c not in ("field", "---")]
    assert len(rows) == len(_generator().rows())
    for cell in rows:
        m = re.fullmatch(r'<code class="field">(.*)</code>', cell)
        assert m is not None, cell
        path = m.group(1)  # a hint after every dot, and nowhere else
        assert "<wbr>" not in path.replace(".<wbr>", ".") and "." not in path.replace(
            ".<wbr>", ""), cell
