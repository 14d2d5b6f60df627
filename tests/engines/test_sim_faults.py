"""Fault schema parsing and merging, plans (stop strings, tool calls), UTF-8 cut points."""

import pytest
from pydantic import ValidationError

from engines.sim.cli import parse_config
from engines.sim.faults import NO_FAULTS, Faults
from engines.sim.plans import apply_stop, make_plans
from engines.sim.sse import utf8_cuts
from engines.sim.textgen import TextGen, analyse


def test_parse_and_defaults() -> None:
    f = Faults.model_validate({"ttft_delay_s": 2, "chunks": ["a", "b"], "utf8_split": True})
    assert f.ttft_delay_s == 2.0 and f.chunks == ["a", "b"] and f.split_pause_s == 0.05
    assert f.touches_stream and not NO_FAULTS.touches_stream


def test_unknown_or_invalid_fields_rejected() -> None:
    with pytest.raises(ValidationError):
        Faults.model_validate({"ttft_delay": 1})
    with pytest.raises(ValidationError):
        Faults.model_validate({"stall_s": -1})


def test_request_overrides_replica_fields_it_sets() -> None:
    replica = Faults(ttft_delay_s=5, comments=True)
    merged = replica.merged(Faults(ttft_delay_s=0))
    assert merged.ttft_delay_s == 0 and merged.comments
    assert replica.merged(None) is replica


def test_cli_faults_and_crash_flag() -> None:
    cfg = parse_config(["--faults", '{"status": 503, "retry_after": 2}', "--crash",
                        "--mode", "speculative"])
    assert cfg.faults.status == 503 and cfg.faults.retry_after == 2 and cfg.faults.crash
    assert cfg.perf.num_speculative_tokens == 4
    assert parse_config([]).perf.num_speculative_tokens == 0


def test_utf8_cuts_fall_inside_characters() -> None:
    data = "안녕 👋".encode()
    cuts = utf8_cuts(data)
    assert cuts == [2, 5, 9]
    for c in cuts:
        with pytest.raises(UnicodeDecodeError):
            data[:c].decode()


def test_apply_stop_excludes_stop_string() -> None:
    items, stopped = apply_stop(["Hello", " wor", "ld", " again"], ["world"])
    assert stopped and "".join(items) == "Hello " and len(items) == 3
    assert apply_stop(["a", "b"], ["zz"]) == (["a", "b"], False)


def _plans(body: dict, faults: Faults = NO_FAULTS, limit: int = 1000):
    p = analyse("hello", 16)
    return make_plans(body, [p], body.get("n", 1), [limit], 64, faults, TextGen(0), True)


def test_plans_length_and_finish_reasons() -> None:
    assert _plans({})[0].tokens == 64 and _plans({})[0].finish == "stop"
    short = _plans({}, limit=5)[0]
    assert short.tokens == 5 and short.finish == "length"
    two = _plans({"n": 2})
    assert [p.index for p in two] == [0, 1] and two[0].items != two[1].items


def test_tool_plan_and_scripted_tool_after_chunks() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["city", "n"]}}}]
    pl = _plans({"tools": tools}, Faults(tool_args_chunks=5))[0]
    assert pl.finish == "tool_calls" and pl.items[0] == ("h", "f")
    assert len(pl.items) == 6
    assert _plans({"tools": tools, "tool_choice": "none"})[0].finish == "stop"
    scripted = _plans({}, Faults(chunks=["Hel", "lo ", '{"code":"pri'], tool_call_after_chunks=2))
    assert scripted[0].items == [("c", "Hel"), ("c", "lo "), ("h", "tool"), ("a", '{"code":"pri')]
