"""``GET /v1/responses/{id}/input_items``' list: OpenAI's shape, stable ids, ``after`` paging
in either order, bad query values refused."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.responses.input_list import list_page, listed_item, parse_limit

RID = "resp_" + "ab" * 16


def items(n: int) -> list[dict]:
    return [listed_item({"role": "user", "content": f"m{i}"}, RID, i) for i in range(n)]


def test_items_get_type_stable_ids_and_text_parts() -> None:
    got = listed_item({"role": "assistant", "content": "hi"}, RID, 3)
    assert got == {"type": "message", "role": "assistant", "id": f"msg_{'ab' * 16}0003",
                   "content": [{"type": "output_text", "text": "hi"}]}
    kept = listed_item({"type": "function_call", "id": "fc_1", "call_id": "c"}, RID, 0)
    assert kept["id"] == "fc_1"
    assert listed_item({"type": "function_call_output", "call_id": "c", "output": "x"}, RID, 1)[
        "id"].startswith("fco_")


def test_default_page_is_newest_first_twenty() -> None:
    page = list_page(items(25), after=None, limit=parse_limit(None), order=None)
    assert page["object"] == "list" and len(page["data"]) == 20 and page["has_more"]
    assert page["data"][0]["content"][0]["text"] == "m24"
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_after_pages_through_everything_once(order: str) -> None:
    all_items, seen, after = items(7), [], None
    while True:
        page = list_page(all_items, after=after, limit=3, order=order)
        seen += [i["id"] for i in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    ids = [i["id"] for i in all_items]
    assert seen == (ids if order == "asc" else ids[::-1])


def test_empty_list() -> None:
    assert list_page([], after=None, limit=20, order="asc") == {
        "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


@pytest.mark.parametrize(("limit", "order", "after"), [
    ("0", None, None), ("101", None, None), ("x", None, None),
    ("5", "sideways", None), ("5", None, "msg_unknown"),
])
def test_bad_query_values_are_400(limit: str, order: str | None, after: str | None) -> None:
    with pytest.raises(InvalidRequest) as e:
        list_page(items(3), after=after, limit=parse_limit(limit), order=order)
    assert e.value.status == 400 and e.value.param in ("limit", "order", "after")


def test_repeated_ids_are_made_unique_by_position() -> None:
    dup = [listed_item({"id": i, "role": "user", "content": i}, RID, n)
           for n, i in enumerate(["a", "b", "a", "a~2", "a"])]
    page = list_page(dup, after=None, limit=10, order="asc")
    assert [i["id"] for i in page["data"]] == ["a", "b", "a~2~", "a~2", "a~4"]
    assert [i["content"][0]["text"] for i in page["data"]] == ["a", "b", "a", "a~2", "a"]


class _FakeState:
    """A stored response whose input repeats item ids (``ResponsesState.input_items``)."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items

    async def input_items(self, response_id: str, key_id: str | None) -> list[dict]:
        return [listed_item(item, response_id, i) for i, item in enumerate(self.items)]


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_the_openai_sdk_auto_pager_ends_over_repeated_ids(order: str) -> None:
    """The SDK's pager sends the last item's ``id`` as ``after``; with two items of one id it
    used to resume after the first of them for ever. Every item is listed exactly once."""
    import httpx
    import openai
    from fastapi import FastAPI

    from gateway.protocols.responses.routes import add_response_routes

    texts = [f"t{i}" for i in range(7)]
    stored = [{"type": "message", "role": "user", "content": t,
               "id": "msg_same" if i in (1, 2, 5) else f"msg_{i}"} for i, t in enumerate(texts)]
    app = FastAPI()
    add_response_routes(app, lambda scope: None, _FakeState(stored))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="k", http_client=http,
                                    max_retries=0)
        seen = []
        async for item in client.responses.input_items.list(RID, limit=2, order=order):
            seen.append(item.content[0].text)  # type: ignore[union-attr]
            assert len(seen) <= len(texts), "the pager did not end"
    assert seen == (texts if order == "asc" else texts[::-1])
