"""Strict config models with the field names of ``tensorrt_llm/llmapi/llm_args.py`` (1.2 line) that our
generated options and ``llm_kwargs`` use, and the validators those options must pass.

Fields our code never sets are left out on purpose: an option we start emitting must be added here
from upstream's source (and to the contract), not accepted silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from tensorrt_llm._release import current


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = Field(default=0.9, ge=0, le=1)
    dtype: str = "auto"


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: list[int] | None = None
    max_batch_size: NonNegativeInt = 0
    enable_padding: bool = False

    @model_validator(mode="after")
    def _sizes(self):
        if self.batch_sizes:
            self.batch_sizes = sorted(self.batch_sizes)
            top = self.batch_sizes[-1]
            if self.max_batch_size not in (0, top):
                raise ValueError(f"CudaGraphConfig.max_batch_size {self.max_batch_size} must equal "
                                 f"max(batch_sizes) {top} when both are given")
            self.max_batch_size = top
        return self


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: NonNegativeInt | None = None
    max_total_draft_tokens: int | None = None
    speculative_model: str | Path | None = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
    max_concurrency: NonNegativeInt | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    acceptance_window: NonNegativeInt | None = None
    acceptance_length_threshold: float | None = None
    acceptance_rate_window_size: NonNegativeInt | None = None
    acceptance_rate_threshold: float | None = None
    allow_advanced_sampling: bool = False

    @field_validator("draft_len_schedule")
    @classmethod
    def validate_draft_len_schedule_and_sort(cls, v, info):
        if v is None:
            return v
        for b, k in v.items():
            if b < 1 or k < 0:
                raise ValueError(f"draft_len_schedule: batch size {b} must be >= 1 and draft length {k} >= 0")
        top = info.data.get("max_draft_len")
        first = 1 if current().line == "1.2" else min(v)
        if current().line == "1.2" and 1 not in v:
            raise ValueError("draft_len_schedule must include batch_size=1")
        if top is not None and (v[first] != top or any(k > top for k in v.values())):
            raise ValueError(f"draft_len_schedule {v}: schedule[{first}] must equal max_draft_len {top} and "
                             f"no draft length may exceed it")
        return dict(sorted(v.items()))

    @model_validator(mode="after")
    def _release_fields(self):
        ours = current().acceptance_fields
        for name in ("acceptance_window", "acceptance_length_threshold", "acceptance_rate_window_size",
                     "acceptance_rate_threshold"):
            if name not in ours and getattr(self, name) is not None:
                raise ValueError(f"{name}: extra inputs are not permitted in this release (it names them {ours})")
        return self

    def _linear(self, what: str, need_model: bool = False):
        if not self.max_draft_len:
            raise ValueError(f"max_draft_len must be > 0 for {what}")
        if need_model and self.speculative_model is None:
            raise ValueError(f"speculative_model must be specified for {what}")
        self.max_total_draft_tokens = self.max_draft_len
        return self


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def _check(self):
        return self._linear("NGram")


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"

    @model_validator(mode="after")
    def _check(self):
        return self._linear("DraftTarget", need_model=True)


class Eagle3DecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle3"] = "Eagle3"
    eagle3_one_model: bool | None = True

    @model_validator(mode="after")
    def _check(self):
        return self._linear("Eagle", need_model=True)


class MTPDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: PositiveInt = 1

    @model_validator(mode="after")
    def _check(self):
        self.max_draft_len = self.max_total_draft_tokens = self.num_nextn_predict_layers
        return self


class UserProvidedDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["User_Provided"] = "User_Provided"
    drafter: object
    resource_manager: object = None

    @model_validator(mode="after")
    def _check(self):
        self.max_total_draft_tokens = self.max_draft_len
        return self
