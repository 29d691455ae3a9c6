"""Build recipes (``build/recipes/<sku>-<pair>.yaml``): what to build for one GPU SKU and model pair.

Schema ``specctl.recipe/v1``::

    schema: specctl.recipe/v1
    sku: h100                          # h100 h200 b200 a100 l40s l4, or cpu (the reference pair)
    target: llama-3.1-8b               # a shape in control/buildsys/catalog.py
    target_path: meta-llama/Llama-3.1-8B-Instruct   # HF directory or id on the GPU host
    precision: bf16                    # bf16 | fp16 | fp8 (Ada+) | nvfp4 (Blackwell)
    tp: 1                              # tensor parallel size; must divide the KV heads
    max_batch: 64
    max_input_len: 4096
    max_seq_len: 8192
    max_num_tokens: 8192               # tokens per engine iteration
    speculation:
      method: draft_target             # draft_target | eagle3 | eagle | ngram | mtp
      draft: llama-3.2-1b              # catalog shape of the draft model / EAGLE head
      draft_path: meta-llama/Llama-3.2-1B-Instruct
      max_draft_len: 4
      ngram_size: 3                    # n-gram only: longest matched suffix
      draft_logits: false              # engines: rejection sampling on draft logits (gathers logits)
    memory:
      kv_cache_free_fraction: 0.90     # TensorRT-LLM's share of free memory for the KV cache
      headroom_gb: 2.0                 # runtime, CUDA graphs and workspaces, per GPU
    typical_ctx: 1024                  # context length the static schedule is compiled for

Validation rejects, with the reason: fp8 below Ada, nvfp4 below Blackwell, TP that does not divide
the KV heads, a draft model whose vocabulary differs from the target's, max_draft_len above what
the method supports, methods the SKU's executor cannot run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from control.buildsys.catalog import MODELS, SKUS, ModelShape, get_model, get_sku
from control.buildsys.trtllm_rules import (
    BACKEND_METHODS,
    EAGLE1_MAX_LAYERS,
    Method,
    max_draft_len_limit,
)
from control.errors import ConfigError, describe_validation_error
from control.yamlfile import read_yaml_file

RECIPE_SCHEMA = "specctl.recipe/v1"
PRECISIONS = ("bf16", "fp16", "fp8", "nvfp4")
CPU = "cpu"
CPU_METHODS = (Method.draft_target, Method.ngram)


class Speculation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Method
    draft: str | None = None
    draft_path: str | None = None
    max_draft_len: int = Field(ge=1)
    ngram_size: int = Field(default=3, ge=1, le=16)
    eagle_layers: int = Field(default=4, ge=1)  # EAGLE-1 engines only
    draft_logits: bool = False  # engines: verify against draft logits (needs --gather_generation_logits)


class Memory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kv_cache_free_fraction: float = Field(default=0.90, gt=0.0, le=0.98)
    headroom_gb: float = Field(default=2.0, ge=0.0)


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["specctl.recipe/v1"] = Field(alias="schema")
    sku: str
    target: str
    target_path: str | None = None
    precision: Literal["bf16", "fp16", "fp8", "nvfp4"] = "bf16"
    tp: int = Field(default=1, ge=1, le=8)
    max_batch: int = Field(default=64, ge=1, le=4096)
    max_input_len: int = Field(default=4096, ge=1)
    max_seq_len: int = Field(default=8192, ge=2)
    max_num_tokens: int = Field(default=8192, ge=1)
    speculation: Speculation
    memory: Memory = Field(default_factory=Memory)
    typical_ctx: int | None = Field(default=None, ge=1)
    quick: bool = False  # cpu only: the small CI pair

    @model_validator(mode="after")
    def _rules(self) -> Recipe:
        sku = self.sku.lower()
        if sku != CPU and sku not in SKUS:
            raise ValueError(f"unknown sku '{self.sku}'; known: {', '.join(SKUS)}, {CPU}")
        self.sku = sku
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(f"max_input_len {self.max_input_len} must be below max_seq_len {self.max_seq_len}")
        spec = self.speculation
        if sku == CPU:
            if spec.method not in CPU_METHODS:
                raise ValueError(
                    f"method {spec.method.value} cannot run on sku cpu: the reference executor drafts with "
                    f"{', '.join(m.value for m in CPU_METHODS)} (EAGLE3, EAGLE and MTP need TensorRT-LLM on a GPU SKU)")
            if self.tp != 1:
                raise ValueError(f"tp = {self.tp}: the cpu reference pair runs on one device (tp: 1)")
            if self.precision != "bf16":
                raise ValueError(f"precision {self.precision}: the cpu reference pair trains in fp32; leave precision at bf16")
            if self.target != "reference":
                raise ValueError(f"target '{self.target}': the cpu sku builds its own pair; write target: reference")
            if spec.method == Method.draft_target and not spec.draft:
                raise ValueError("method draft_target on cpu needs speculation.draft: <drafter name in the engine "
                                 "manifest, e.g. draft-small>")
            if spec.method == Method.ngram and spec.draft is not None:
                raise ValueError(f"method ngram takes no draft model (got draft: {spec.draft})")
            return self
        gpu = SKUS[sku]
        # Precision support by architecture (DESIGN.md section 6; catalog fp8/fp4 columns).
        if self.precision == "fp8" and not gpu.supports_fp8:
            raise ValueError(f"precision fp8 needs Ada, Hopper or Blackwell; {sku} is {gpu.arch} (use bf16)")
        if self.precision == "nvfp4" and not gpu.supports_nvfp4:
            raise ValueError(f"precision nvfp4 needs Blackwell; {sku} is {gpu.arch} (use fp8 or bf16)")
        target = _shape(self.target, "target")
        if target.kind != "llama":
            raise ValueError(f"target '{self.target}' is an EAGLE head, not a model")
        _check_tp(self.tp, target, "target")
        if self.max_seq_len > target.max_position:
            raise ValueError(f"max_seq_len {self.max_seq_len} exceeds {target.name}'s {target.max_position} positions")
        limit = max_draft_len_limit(spec.method, target.mtp_layers)
        if spec.method == Method.mtp:
            if target.mtp_layers == 0:
                raise ValueError(f"method mtp needs a target with MTP modules (num_nextn_predict_layers > 0); "
                                 f"{target.name} has none (use eagle3, draft_target or ngram)")
            if spec.max_draft_len != target.mtp_layers:
                raise ValueError(f"max_draft_len {spec.max_draft_len}: MTP drafts exactly num_nextn_predict_layers = "
                                 f"{target.mtp_layers} tokens (llm_args.py MTPDecodingConfig)")
        elif spec.max_draft_len > limit:
            raise ValueError(f"max_draft_len {spec.max_draft_len} is above what {spec.method.value} supports ({limit})")
        if spec.method in (Method.draft_target, Method.eagle3, Method.eagle):
            if not spec.draft:
                raise ValueError(f"method {spec.method.value} needs speculation.draft: <catalog shape>")
            draft = _shape(spec.draft, "draft")
            if spec.method == Method.draft_target:
                if draft.kind != "llama":
                    raise ValueError(f"draft '{draft.name}' is an EAGLE head; draft_target needs a draft model")
                if draft.vocab != target.vocab:
                    raise ValueError(f"draft '{draft.name}' has vocab {draft.vocab}, target '{target.name}' has "
                                     f"{target.vocab}: draft-target needs the same tokenizer")
                _check_tp(self.tp, draft, "draft")
            else:
                if draft.kind != "eagle_head":
                    raise ValueError(f"draft '{draft.name}' is a model, not an EAGLE head; {spec.method.value} needs one")
                if draft.hidden != target.hidden:
                    raise ValueError(f"EAGLE head '{draft.name}' has hidden size {draft.hidden}, target '{target.name}' "
                                     f"has {target.hidden}: the head reads the target's hidden states")
                if spec.method == Method.eagle and draft.vocab != target.vocab:
                    raise ValueError(f"EAGLE-1 head '{draft.name}' has vocab {draft.vocab}, target has {target.vocab}: "
                                     f"EAGLE-1 predicts through the target's vocabulary")
            if spec.method == Method.eagle and spec.eagle_layers > min(EAGLE1_MAX_LAYERS, spec.max_draft_len):
                raise ValueError(f"eagle_layers {spec.eagle_layers} must be <= {EAGLE1_MAX_LAYERS} and <= max_draft_len")
        elif spec.draft is not None:
            raise ValueError(f"method {spec.method.value} takes no draft model (got draft: {spec.draft})")
        return self

    # -- derived ---------------------------------------------------------------------------------
    @property
    def is_cpu(self) -> bool:
        return self.sku == CPU

    @property
    def method(self) -> Method:
        return self.speculation.method

    @property
    def pair(self) -> str:
        """Profile pair name: ``<target>+<draft>`` (``+ngram`` for prompt lookup)."""
        spec = self.speculation
        other = spec.draft if spec.draft else spec.method.value
        return f"{self.target}+{other}"

    def target_shape(self) -> ModelShape:
        return get_model(self.target)

    def draft_shape(self) -> ModelShape | None:
        if self.is_cpu or not self.speculation.draft:
            return None
        return get_model(self.speculation.draft)

    def check_backend(self, backend: str) -> None:
        if self.is_cpu:
            if backend != "reference":
                raise ConfigError(f"sku cpu builds the reference pair; --backend {backend} needs a GPU sku "
                                  f"(use --backend reference or omit --backend)")
            return
        if backend not in BACKEND_METHODS:
            raise ConfigError(f"backend '{backend}' is not one of pytorch, tensorrt")
        if self.method not in BACKEND_METHODS[backend]:
            ok = ", ".join(m.value for m in BACKEND_METHODS[backend])
            raise ConfigError(f"method {self.method.value} has no {backend} path in TensorRT-LLM (that backend runs: {ok})")
        if self.method == Method.eagle and self.speculation.eagle_layers > self.speculation.max_draft_len:
            raise ConfigError("eagle_layers must be <= max_draft_len")

    def gpu(self):
        return get_sku(self.sku)


def _shape(name: str, what: str) -> ModelShape:
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"{what} '{name}' is not in the catalogue; known: {', '.join(MODELS)}")
    return MODELS[key]


def _check_tp(tp: int, shape: ModelShape, what: str) -> None:
    if shape.kv_heads % tp or shape.heads % tp:
        ok = [t for t in (1, 2, 4, 8) if shape.kv_heads % t == 0 and shape.heads % t == 0]
        raise ValueError(f"tp = {tp} does not divide {what} '{shape.name}''s {shape.kv_heads} KV heads "
                         f"({shape.heads} query heads); use tp in {ok}")


def parse_recipe(data: Any, where: str = "recipe") -> Recipe:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with schema: {RECIPE_SCHEMA}, got {type(data).__name__}")
    if data.get("schema") != RECIPE_SCHEMA:
        raise ConfigError(f"{where}: schema = {data.get('schema')!r}; this version reads schema: {RECIPE_SCHEMA}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(where, e)) from None


def _describe(where: str, err: ValidationError) -> str:
    """Rule violations (whole-recipe checks) read as the rule; field errors name the field and value."""
    first = err.errors()[0]
    if not first.get("loc"):
        return f"{where}: {first.get('msg', '').removeprefix('Value error, ')}"
    return describe_validation_error(where, err)


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    data = read_yaml_file(path, "recipe", "see build/recipes/ for examples")
    return parse_recipe(data, where=f"recipe '{path}'")
