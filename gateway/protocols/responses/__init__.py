"""The OpenAI Responses API ``/v1/responses``, its stored state and its routes.

- ``protocol``: ``ResponsesProtocol``: typed ``event:`` stream, usage in ``response.usage``;
- ``state``: ``ResponsesState``, gateway-owned ``previous_response_id`` chains and the
  in-flight table for ``cancel`` (``cancel``: the cross-gateway ``CancelBus``);
- ``store``: ``MemoryResponseStore``, ``RedisResponseStore``; ``ids``: response ids;
- ``items``: input items → chat-shaped conversation, output text; ``input_list``: the
  ``input_items`` listing;
- ``resume``: mid-stream resume of a Responses stream (``resume_point``, ``Framing``,
  ``continuation_body``, the ``ResponsesSplice`` codec);
- ``tokens``: ``InputTokensProtocol`` (``/v1/responses/input_tokens``);
- ``routes``: ``GET``/``DELETE`` of stored responses, ``cancel``, the input item list.
"""
