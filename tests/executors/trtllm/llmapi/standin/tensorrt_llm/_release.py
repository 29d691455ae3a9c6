"""Which TensorRT-LLM release the stand-in behaves as (test scaffolding, not product).

``SPECCTL_STANDIN_TRTLLM_VERSION`` picks it when the package is imported (default ``1.2.1``, the
release specctl pins); tests in one process may set ``tensorrt_llm.__version__`` instead, which
every behaviour below reads when it runs.

- ``1.2.1``: ``draft_len_schedule`` keys are lower bounds (``bisect_right``; key 1 required and equal
  to max_draft_len), the acceptance switch is ``acceptance_window`` / ``acceptance_length_threshold``,
  and the PyTorch flow returns ``request_perf_metrics.speculative_decoding`` with zero totals (what
  TensorRT-LLM did before PR #17082): acceptance is visible only through
  ``RequestOutput.avg_decoded_tokens_per_iter`` and ``decoding_iter``.
- ``1.3.0+standin``: the other shape, for tests that must see both: keys are upper bounds
  (``bisect_left``, 0 above the last key; the smallest key carries max_draft_len), the switch is
  ``acceptance_rate_window_size`` / ``acceptance_rate_threshold``, and the totals are filled (after
  PR #17082). It stands for no particular 1.3 pre-release.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

ENV = "SPECCTL_STANDIN_TRTLLM_VERSION"


@dataclass(frozen=True)
class Release:
    line: str  # schedule semantics, as control.buildsys.trtllm_rules names them
    perf_totals: bool  # speculative_decoding totals filled (False: zeroed)
    acceptance_fields: tuple[str, str]


RELEASES = {
    "1.2.1": Release("1.2", False, ("acceptance_window", "acceptance_length_threshold")),
    "1.3.0+standin": Release("1.3", True, ("acceptance_rate_window_size", "acceptance_rate_threshold")),
}


def initial_version() -> str:
    v = os.environ.get(ENV, "1.2.1")
    if v not in RELEASES:
        raise ImportError(f"{ENV}={v!r}: the stand-in behaves as one of {', '.join(RELEASES)}")
    return v


def current() -> Release:
    """The release the package says it is now (``tensorrt_llm.__version__``)."""
    return RELEASES[sys.modules["tensorrt_llm"].__version__]
