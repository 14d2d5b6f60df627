"""The Anthropic Messages API ``/v1/messages`` and ``/v1/messages/count_tokens``.

- ``protocol``: ``MessagesProtocol`` and ``CountTokensProtocol``;
- ``request``: the body's checks (``parse_messages``) and its chat-shaped view (``chat_view``);
- ``resume``: mid-stream resume of a Messages stream (``resume_point``, the chat-completions
  ``continuation_body``, the ``MessagesSplice`` codec).
"""
