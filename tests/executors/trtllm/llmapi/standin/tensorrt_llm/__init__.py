"""Stand-in for TensorRT-LLM's LLM API (test scaffolding, not product).

TensorRT-LLM cannot be installed on the CI machine (no wheel, no GPU). The llm Triton model's
``executor: trtllm`` path is tested through a real Triton server with this package first on the
server's PYTHONPATH: the names the adapter uses (``LLM``, ``SamplingParams``, ``tensorrt_llm.llmapi``
config classes, ``tensorrt_llm._torch.speculative.drafter.Drafter``) with the LLM API's streaming
surface, backed by the project's reference executor (``control/executors/reference``). See
``_standin.py`` for what it does and does not mimic, ``_release.py`` for the releases it behaves as
(``__version__``), and ``control/executors/trtllm/contract/`` for the upstream names it must carry.
"""

from tensorrt_llm._release import initial_version

__version__ = initial_version()

from tensorrt_llm._standin import LLM, SamplingParams  # noqa: E402 - __version__ first: the stand-in reads it

__all__ = ["LLM", "SamplingParams"]
