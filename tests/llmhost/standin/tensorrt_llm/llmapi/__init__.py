"""Stand-in for ``tensorrt_llm.llmapi``: the config classes ``llm_kwargs`` looks up by name.

Each keeps its keyword arguments as attributes; unknown classes fail the lookup (AttributeError), as
they would on the real module.
"""

from tensorrt_llm._standin import LLM, SamplingParams


class _Config:
    decoding_type = ""

    def __init__(self, **kwargs) -> None:
        self.kwargs = dict(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kwargs})"


class KvCacheConfig(_Config):
    pass


class CudaGraphConfig(_Config):
    pass


class DraftTargetDecodingConfig(_Config):
    decoding_type = "Draft_Target"


class NGramDecodingConfig(_Config):
    decoding_type = "NGram"


class Eagle3DecodingConfig(_Config):
    decoding_type = "Eagle3"


class MTPDecodingConfig(_Config):
    decoding_type = "MTP"


class UserProvidedDecodingConfig(_Config):
    decoding_type = "User_Provided"


__all__ = ["LLM", "SamplingParams", "KvCacheConfig", "CudaGraphConfig", "DraftTargetDecodingConfig",
           "NGramDecodingConfig", "Eagle3DecodingConfig", "MTPDecodingConfig", "UserProvidedDecodingConfig"]
