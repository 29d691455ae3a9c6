"""One generation over Triton's gRPC streaming API (``tritonclient.grpc.aio``), response by response.

The request uses the ``llm`` model's contract (``text_input`` or ``input_ids``, ``max_tokens``,
``stream``, ``temperature``, ``top_p``, ``random_seed``, ``stop_words``); each response is yielded as
a ``Piece`` with its text and token ids and the request's running drafted / accepted totals.
Closing the iterator early (the HTTP client went away) stops the request on the server: a ``stop``
request with the same request id goes on the same stream (``control/triton/stops.py``,
``control.clients.triton.StoppableStream``), not a cancelled gRPC stream, which Triton 2.51's gRPC
frontend can crash on (docs/decisions.md, 2026-11-28).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from control.clients.triton import (
    STOP_GRACE_S,
    GenParams,
    StoppableStream,
    StreamBroken,
    grpc_inputs,
    send_stop,
)
from control.frontend.protocol import UNAVAILABLE, OpenAIError
from control.triton.forward_model import model_message
from control.triton.llm_request import STOPPING

UNAVAILABLE_MARKERS = ("StatusCode.UNAVAILABLE", "failed to connect", "Connection refused", "Socket closed")


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    token_ids: tuple[int, ...]
    drafted: int
    accepted: int
    final: bool


def _first(r, name: str):
    try:
        v = r.as_numpy(name)
    except Exception:
        return None
    return None if v is None else v.reshape(-1)


def _piece(r) -> Piece:
    params = r.get_response().parameters
    final = bool(params["triton_final_response"].bool_param) if "triton_final_response" in params else True
    ids = _first(r, "output_ids")
    text = _first(r, "text_output")
    words = [] if text is None else [x if isinstance(x, bytes) else str(x).encode() for x in text]
    drafted, accepted = _first(r, "drafted_tokens"), _first(r, "accepted_tokens")
    return Piece(b"".join(words).decode("utf-8", "replace"), tuple(int(x) for x in ids) if ids is not None else (),
                 int(drafted[0]) if drafted is not None else 0, int(accepted[0]) if accepted is not None else 0, final)


def _error(message: str) -> OpenAIError:
    m = " ".join(model_message(str(message)).split())
    if any(s in m for s in UNAVAILABLE_MARKERS):
        return OpenAIError(UNAVAILABLE, f"the model server is not reachable ({m[:200]}); retry the request")
    if STOPPING in m:  # drained at shutdown: the request was fine, the server is going away
        return OpenAIError(UNAVAILABLE, m[:500])
    return OpenAIError(400, m[:500])


def _keep(task: asyncio.Task, tasks: set[asyncio.Task]) -> asyncio.Task:
    """Hold a reference to ``task`` until it is done (the event loop keeps only weak ones)."""
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


class TritonBackend:
    """Generations on one gRPC channel to Triton; ``close()`` when done."""

    def __init__(self, grpc_address: str, model: str = "llm") -> None:
        import tritonclient.grpc.aio as aio

        self.address = grpc_address
        self.model = model
        self.client = aio.InferenceServerClient(grpc_address)
        self._tasks: set[asyncio.Task] = set()  # the streams' readers, and stopped requests' endings

    async def generate(self, prompt: str | list[int], params: GenParams) -> AsyncIterator[Piece]:
        stream = StoppableStream(self.client, self.model, grpc_inputs(prompt, params, stream=True), uuid.uuid4().hex)
        _keep(stream.reader, self._tasks)
        done = broken = False
        try:
            while True:
                try:
                    r, err = await stream.next()
                except StreamBroken as e:  # nothing more will come
                    broken = True
                    if e.cause is None:
                        return
                    raise _error(e.channel_text()) from None
                if err is not None:
                    done = True  # an error response is the request's last
                    raise _error(err.message() if hasattr(err, "message") else err)
                piece = _piece(r)
                done = piece.final
                yield piece
                if done:
                    return
        finally:
            if done or broken:
                stream.close()
            else:  # a task of its own: the caller's task is usually being cancelled
                _keep(asyncio.get_running_loop().create_task(stream.stop()), self._tasks)

    def stop(self, request_id: str) -> None:
        """Stop the request known by ``request_id`` (one this backend did not start: a KServe
        generate forwarded over HTTP), in a task of its own."""
        _keep(asyncio.get_running_loop().create_task(send_stop(self.client, request_id, model=self.model)),
              self._tasks)

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_model_ready(self.model))
        except Exception:
            return False

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STOP_GRACE_S)
        await self.client.close()

