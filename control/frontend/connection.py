"""A request's HTTP client leaving: the work done for it is cancelled, and the response is the
status nginx logs for a client that closed the connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")
CLIENT_CLOSED = 499  # the status logged for a request whose client left before the answer (nginx's)


async def while_connected(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, ``work``'s result), or (False, None) once the client has gone: the work is then
    cancelled, and its caller stops the request on the model, which frees its KV slot at its next step
    (a client that times out and retries would otherwise leave the first generation running to
    max_tokens beside the retry)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None


async def _disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body has been read: only that is left to receive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
