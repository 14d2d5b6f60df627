"""Splice machinery the Messages and Responses resumes share: a broken stream continued by a
chat-completions request (``text_splice.chat_continuation``) whose text is spliced into the
client's own API events (``text_splice.TextSplice``).
"""
