"""Response ids: their shape, and the Redis key spaces of records and run markers.

The gateway names every response ``resp_`` + 32 hex digits (``Turn``); OpenAI's own ids are
``resp_`` + 48-50 hex digits. An id a client names (``GET``/``DELETE``/``cancel`` of
``/v1/responses/{id}``, ``previous_response_id``) is looked up only when it has that shape:
``resp_`` then 1 to ``MAX_ID_TAIL`` characters of ``[A-Za-z0-9_-]``. Anything else cannot
name a stored or running response and gets the API's 404 at once, the same answer as a
missing, expired, deleted or foreign id (nothing tells them apart), without a store lookup.

Key spaces (disjoint by construction, whatever the id): records are ``<prefix>rec:<id>``,
run markers ``<prefix>run:<id>``, the cancel channel ``<prefix>cancel``; no id can reach
another space, because the space is a fixed segment before the id, and an id holds no ``:``.
"""

from __future__ import annotations

import re

#: Longest id tail after ``resp_`` (characters); OpenAI's ids have ~50, the gateway's 32.
MAX_ID_TAIL = 128
_ID = re.compile(rf"resp_[A-Za-z0-9_-]{{1,{MAX_ID_TAIL}}}")

RECORD_SPACE = "rec:"
RUN_SPACE = "run:"
CANCEL_CHANNEL = "cancel"


def is_response_id(value: object) -> bool:
    """True when ``value`` is a string shaped like a response id (module docstring)."""
    return (isinstance(value, str) and len(value) <= MAX_ID_TAIL + 5
            and _ID.fullmatch(value) is not None)
