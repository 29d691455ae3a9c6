"""Fault injection for the llm model's failure paths, off unless tritonserver's environment asks for it.

``SPECCTL_INJECT_STEP_FAULT=ID,ID,...`` (token ids) makes the engine step raise ``InjectedFault``
once a request whose prompt starts with those ids has had its first tokens delivered: the step fails
as a real engine failure would, so the tests can check through the real server that the requests
in it are answered with an error and counted as failed. ``SPECCTL_INJECT_DELIVER_FAULT=ID,...`` makes
the delivery of such a request's output raise instead, once it has tokens: the loop's own work failing
for one request, which must end that request with an error and nothing else. No client can reach
either without access to the server's environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from control.errors import ConfigError

STEP_FAULT_ENV = "SPECCTL_INJECT_STEP_FAULT"
DELIVER_FAULT_ENV = "SPECCTL_INJECT_DELIVER_FAULT"
MIN_FAULT_PREFIX = 4  # a shorter prefix could match an ordinary prompt


class InjectedFault(RuntimeError):
    """The failure asked for by ``SPECCTL_INJECT_STEP_FAULT`` or ``SPECCTL_INJECT_DELIVER_FAULT``."""


def fault_prefix(name: str, environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The prompt prefix that triggers the fault ``name`` names; () when none is set."""
    raw = environ.get(name, "").strip()
    if not raw:
        return ()
    try:
        ids = tuple(int(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError(f"{name}={raw[:60]!r}: must be comma-separated token ids") from None
    if len(ids) < MIN_FAULT_PREFIX:
        raise ConfigError(f"{name}={raw[:60]!r}: give at least {MIN_FAULT_PREFIX} token ids")
    return ids


def _hit(lv: Any, prefix: tuple[int, ...]) -> bool:
    """Whether live request ``lv``'s prompt starts with ``prefix`` and it has had tokens."""
    req = lv.request
    return req is not None and tuple(req.prompt_ids[:len(prefix)]) == prefix and bool(lv.ids or lv.first_token_ns)


def failing_step(step: Callable[[], list], live: Mapping[int, Any], prefix: tuple[int, ...]) -> Callable[[], list]:
    """``step`` that raises ``InjectedFault`` when a live request whose prompt starts with ``prefix``
    has generated tokens before this step (``live``: request id -> ``Live``)."""

    def step_or_fail() -> list:
        if any(_hit(lv, prefix) for lv in list(live.values())):
            raise InjectedFault(f"injected engine fault ({STEP_FAULT_ENV})")
        return step()

    return step_or_fail


def failing_deliver(deliver: Callable[[Any], None], live: Mapping[int, Any],
                    prefix: tuple[int, ...]) -> Callable[[Any], None]:
    """``deliver(out)`` that raises ``InjectedFault`` for a request whose prompt starts with ``prefix``
    once it has had tokens; every other request's output is delivered as usual."""

    def deliver_or_fail(out: Any) -> None:
        lv = live.get(out.request_id)
        if lv is not None and _hit(lv, prefix):
            raise InjectedFault(f"injected delivery fault ({DELIVER_FAULT_ENV})")
        deliver(out)

    return deliver_or_fail
