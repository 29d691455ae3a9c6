"""Fault injection for the llm model's failure paths, off unless tritonserver's environment asks for it.

``SPECCTL_INJECT_STEP_FAULT=ID,ID,...`` (token ids) makes the engine step raise ``InjectedFault``
once a request whose prompt starts with those ids has had its first tokens delivered: the step fails
as a real engine failure would, so the tests can check through the real server that the requests
in it are answered with an error and counted as failed. No client can reach this without access to
the server's environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from control.errors import ConfigError

STEP_FAULT_ENV = "SPECCTL_INJECT_STEP_FAULT"
MIN_FAULT_PREFIX = 4  # a shorter prefix could match an ordinary prompt


class InjectedFault(RuntimeError):
    """The engine step failure asked for by ``SPECCTL_INJECT_STEP_FAULT``."""


def step_fault_prefix(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The prompt prefix that triggers a step failure; () when none is set."""
    raw = environ.get(STEP_FAULT_ENV, "").strip()
    if not raw:
        return ()
    try:
        ids = tuple(int(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError(f"{STEP_FAULT_ENV}={raw[:60]!r}: must be comma-separated token ids") from None
    if len(ids) < MIN_FAULT_PREFIX:
        raise ConfigError(f"{STEP_FAULT_ENV}={raw[:60]!r}: give at least {MIN_FAULT_PREFIX} token ids")
    return ids


def failing_step(step: Callable[[], list], live: Mapping[int, Any], prefix: tuple[int, ...]) -> Callable[[], list]:
    """``step`` that raises ``InjectedFault`` when a live request whose prompt starts with ``prefix``
    has generated tokens before this step (``live``: request id -> ``Live``)."""
    n = len(prefix)

    def step_or_fail() -> list:
        for lv in list(live.values()):
            req = lv.request
            if req is not None and tuple(req.prompt_ids[:n]) == prefix and (lv.ids or lv.first_token_ns):
                raise InjectedFault(f"injected engine fault ({STEP_FAULT_ENV})")
        return step()

    return step_or_fail
