"""The README's configuration reference is checked against the schema: every field is named."""

from pathlib import Path

from pydantic import BaseModel

from gateway.config import GatewayConfig, ModelConfig, PoolConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_every_config_field_is_documented():
    text = README.read_text()
    section = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
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
            missing += [f"{f}.{g}" for g in _fields(sub) if f"`{g}`" not in section]
    assert missing == []
