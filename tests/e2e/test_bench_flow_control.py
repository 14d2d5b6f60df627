"""The flow-control benchmark's short version (loadtests/bench_flow_control.py --small): the
same workload, shorter windows. Loose margins only (2 shared cores): with flow control the
interactive band's TTFT p95 is far below its value without, the batch keys' served tokens are
fairer, every refusal at arrival carries ``Retry-After`` (and the gateway's decision time),
and no request hangs."""

import pytest

from loadtests.bench_flow_control import run, small_params

pytestmark = pytest.mark.e2e


def test_flow_control_protects_interactive_and_shares_fairly():
    res = run(small_params())
    off, on = res["off"], res["on"]
    assert on["interactive_requests"] > 0 and off["interactive_requests"] >= 0
    assert on["interactive_ttft_p95_s"] * 5 < off["interactive_ttft_p95_s"], (on, off)
    assert on["jain_batch"] > off["jain_batch"], (on, off)
    assert on["flood_share"] < off["flood_share"], (on, off)
    assert on["shed_with_retry_after"] == on["shed"]
    if on["shed"]:  # every refusal at arrival says how long the gateway took to decide
        assert on["shed_gateway_max_ms"] is not None, on
    assert on["hung"] == 0 and off["hung"] == 0
    assert not {k for k in on["errors"] if not k.startswith("http 504")}, on["errors"]
