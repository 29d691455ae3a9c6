"""``stream_generate``'s options that need no server."""

from __future__ import annotations

import asyncio

import pytest

from control.clients.triton import GenParams, stream_generate


def test_an_unknown_way_to_end_a_cancelled_request_is_refused_before_anything_is_sent():
    # no client at all: the option is checked before the stream is opened
    with pytest.raises(ValueError, match=r"on_cancel = 'abort': must be one of stop, cancel"):
        asyncio.run(stream_generate(None, "x", GenParams(max_tokens=1), on_cancel="abort"))
