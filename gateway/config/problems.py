"""Every problem of an invalid configuration in one report (``load_config``'s ``ConfigError``).

pydantic reports every field error of a document, but a section's own cross-field checks (its
``model_validator(mode="after")``: a model's ``default_tier`` without a pool, two models sharing
a name, a key's band that does not exist) run only once all of that section's fields are
valid, so a user fixing one layer met the next only on the next run. Here, after the field
errors, the after-validators that pydantic skipped are run on the raw values of their section
(``model_construct``, nested sections too), and whatever they raise is reported with the rest;
a check that cannot read its garbled inputs (any exception but ``ValueError``) is left out, its
fields' own errors being reported already.

An unknown field (``extra_forbidden``) says which field of that section was probably meant
(``did you mean `port`?``): the closest of the section's field names by ``difflib``'s ratio
(at least 0.6, its default cut-off).
"""

from __future__ import annotations

import difflib
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]


def _model_in(tp: Any) -> type[BaseModel] | None:
    """The config section class ``tp`` names (through ``X | None``), else None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) in (Union, types.UnionType):
        for arm in get_args(tp):
            if (m := _model_in(arm)) is not None:
                return m
    return None


def _step(tp: Any, part: str | int) -> Any:
    """The type one ``loc`` step below ``tp`` (a section's field, a dict's value, a list's
    item); None when the schema does not say."""
    if (model := _model_in(tp)) is not None:
        field = model.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, args = get_origin(tp), get_args(tp)
    if origin is dict and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args:
        return args[0]
    return None


def _section_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    tp: Any = root
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    return _model_in(tp)


def did_you_mean(root: type[BaseModel], loc: Loc) -> str | None:
    """The field of the section at ``loc[:-1]`` closest to the unknown field ``loc[-1]``."""
    section = _section_at(root, loc[:-1])
    if section is None or not loc:
        return None
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=1)
    return close[0] if close else None


def _construct(tp: Any, raw: Any) -> Any:
    """``raw`` shaped as ``tp`` without validation: sections by ``model_construct`` (nested
    ones too), other values as they are."""
    model = _model_in(tp)
    if model is not None and isinstance(raw, dict):
        values = {k: _construct(f.annotation, raw[k]) for k, f in model.model_fields.items()
                  if k in raw}
        return model.model_construct(**values)
    origin, args = get_origin(tp), get_args(tp)
    if origin is dict and len(args) == 2 and isinstance(raw, dict):
        return {k: _construct(args[1], v) for k, v in raw.items()}
    if origin is list and args and isinstance(raw, list):
        return [_construct(args[0], v) for v in raw]
    return raw


def _after_checks(model: type[BaseModel]) -> list[Any]:
    decorators = model.__pydantic_decorators__.model_validators.values()
    return [d.func for d in decorators if d.info.mode == "after"]


def _raw_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _blocks(root: type[BaseModel], section: Loc, failed: Loc, kind: str) -> bool:
    """Whether the error ``kind`` at ``failed`` spoils the inputs of the checks of the section
    at ``section`` (a prefix of it): a bad value of one of its own fields (in a dict or list of
    plain values too). An unknown field, or an error of a nested section or inside one (which
    is built from its raw values anyway), does not."""
    if kind == "extra_forbidden":
        return False
    tp: Any = _section_at(root, section)
    for part in failed[len(section):]:
        tp = _step(tp, part)
        if tp is None or _model_in(tp) is not None:
            return tp is None
    return True


def skipped_checks(root: type[BaseModel], data: dict[str, Any],
                   failed: list[tuple[Loc, str]]) -> list[tuple[Loc, str]]:
    """``(loc, message)`` of the after-validators pydantic skipped: those of every section
    above a failed location (``failed``: the errors' locations and types; a section whose own
    check failed is not above its error), deepest first, run on raw values; not those whose
    own fields' values are bad (``_blocks``: the field error says it already)."""
    above = sorted({loc[:i] for loc, _ in failed for i in range(len(loc))}, key=len,
                   reverse=True)
    out: list[tuple[Loc, str]] = []
    for loc in above:
        section = _section_at(root, loc)
        raw = data if not loc else _raw_at(data, loc)
        if section is None or not isinstance(raw, dict):
            continue
        checks = _after_checks(section)
        if not checks or any(f[:len(loc)] == loc and _blocks(root, loc, f, kind)
                             for f, kind in failed if len(f) > len(loc)):
            continue
        value = _construct(section, raw)
        for check in checks:
            try:
                check(value)
            except ValueError as e:
                out.append((loc, str(e)))
            except Exception:  # garbled inputs: their own field errors say so
                continue
    return out


def report(root: type[BaseModel], data: dict[str, Any], err: ValidationError) -> str:
    """Every problem of ``data`` as one message: ``invalid config:`` then one indented line
    per problem, ``<dotted location>: <what is wrong>`` (field errors first)."""
    lines, failed = [], []
    for e in err.errors():
        loc: Loc = tuple(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
            if (near := did_you_mean(root, loc)) is not None:
                msg += f"; did you mean `{near}`?"
        failed.append((loc, e["type"]))
        lines.append(f"  {'.'.join(map(str, loc)) or '(root)'}: {msg}")
    for loc, msg in skipped_checks(root, data, failed):
        lines.append(f"  {'.'.join(map(str, loc)) or '(root)'}: {msg}")
    return "invalid config:\n" + "\n".join(lines)
