"""Adapters to TensorRT-LLM (DESIGN.md section 3, ``trtllm``).

- ``llmapi``: the LLM API adapter (PyTorch backend): streaming generation, sampling parameters,
  per-request speculation metrics and iteration stats into the controller's telemetry.
- ``drafter_hook``: per-iteration, per-request k through TensorRT-LLM's user-provided drafter hook.
- ``orchestrator``: the per-step speculative loop our BLS model runs over TensorRT engines
  (``tensorrt_llm`` / ``tensorrt_llm_draft``), plain Python behind an ``EngineClient``.
- ``tensors``: the tensorrtllm backend's tensor names and semantics.

Importing this package never imports TensorRT-LLM; using an adapter that needs it raises
``MissingDependencyError`` saying what is missing.
"""

from __future__ import annotations

from control.errors import MissingDependencyError


def require_tensorrt_llm(what: str):
    """Import TensorRT-LLM for ``what`` or say plainly what is missing and where it runs."""
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError(
            f"{what} needs TensorRT-LLM, which is not installed here ({e.msg}); it runs on a GPU host: serve from "
            f"the NGC Triton TensorRT-LLM container (nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3) or "
            f"`pip install tensorrt_llm` there (see docs/gpu.md)"
        ) from None
    return tensorrt_llm
