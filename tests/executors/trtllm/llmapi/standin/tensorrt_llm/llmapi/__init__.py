"""Stand-in for ``tensorrt_llm.llmapi``: the config classes ``llm_kwargs`` looks up by name, as strict as
``tensorrt_llm/llmapi/llm_args.py`` (pydantic models with ``extra="forbid"``: an unknown field is a
ValidationError), with the pinned release's field names and the validators our generated options
meet (see ``control/executors/trtllm/contract/``). Unknown classes fail the lookup (AttributeError),
as they would on the real module. Schedule and acceptance-switch rules follow the release the
stand-in behaves as (``tensorrt_llm._release``).
"""

from tensorrt_llm._configs import (
    CudaGraphConfig,
    DraftTargetDecodingConfig,
    Eagle3DecodingConfig,
    KvCacheConfig,
    MTPDecodingConfig,
    NGramDecodingConfig,
    UserProvidedDecodingConfig,
)
from tensorrt_llm._standin import LLM, SamplingParams

__all__ = ["LLM", "SamplingParams", "KvCacheConfig", "CudaGraphConfig", "DraftTargetDecodingConfig",
           "NGramDecodingConfig", "Eagle3DecodingConfig", "MTPDecodingConfig", "UserProvidedDecodingConfig"]
