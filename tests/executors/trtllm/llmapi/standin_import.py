"""Import the stand-in ``tensorrt_llm`` into the test process for one test, and take it away after.

Other tests in the same process check what happens without TensorRT-LLM, so the package must not
stay importable: its path and every ``tensorrt_llm*`` module go when the test ends.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

from tests.executors.trtllm.llmapi.deploy import STANDIN


def _drop() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@contextlib.contextmanager
def standin(version: str = "1.2.1") -> Iterator:
    """The stand-in package, behaving as TensorRT-LLM ``version``."""
    _drop()
    sys.path.insert(0, str(STANDIN))
    importlib.invalidate_caches()
    try:
        trtllm = importlib.import_module("tensorrt_llm")
        trtllm.__version__ = version
        yield trtllm
    finally:
        sys.path.remove(str(STANDIN))
        _drop()
