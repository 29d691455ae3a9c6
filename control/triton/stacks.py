"""``kill -USR1 <stub pid>`` writes every Python thread's stack of a model's stub to its stderr, which
is the tritonserver log: what a model that stopped answering is waiting on, without stopping it.

Both Python models (``llm`` and the forwarding ``ensemble``/``tensorrt_llm_bls``) install it when they
load; a stub without it would be ended by the signal, SIGUSR1's default action.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal

STACKS_SIGNAL = getattr(signal, "SIGUSR1", None)  # None where the platform has no SIGUSR1


def stacks_on_signal() -> None:
    """Have ``STACKS_SIGNAL`` dump every thread's stack to stderr in this process."""
    if STACKS_SIGNAL is None:
        return
    with contextlib.suppress(ValueError, RuntimeError, OSError):  # a signal this process may not take
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
