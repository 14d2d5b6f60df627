"""The OpenAI APIs ``/v1/chat/completions`` and ``/v1/completions``.

- ``chat``: ``ChatProtocol``, ``CompletionsProtocol`` and their stream codec ``OpenAIStream``
  with ``ChunkRewriter``;
- ``resume``: what a broken stream gave the client (``resume_point``) and the request
  continuing it (``continuation_body``, the healed tail left out: ``heal_tail``);
- ``splice``: ``OpenAISplice``, the codec splicing the continuation into the client's stream,
  and ``stream_ending``;
- ``assemble``: ``AssemblyCodec`` and ``assemble``, a non-stream answer built from the
  engine's stream.
"""
