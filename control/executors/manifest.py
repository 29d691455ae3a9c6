"""The engine directory contract (``engines/<sku>/``), shared by the CPU-pair build, the reference
executor, the profiler and ``specctl serve``.

Layout::

    engines/cpu/
      manifest.json            # this schema: which model is the target, which drafters exist
      target/                  # Hugging Face layout: config.json, model.safetensors, tokenizer.json,
      draft-small/             #   plus manifest.json (parameters, training time, corpus, seed, ...)
      draft-tiny/

Every model directory carries the same ``tokenizer.json`` (drafts must share the target's vocab).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from control.errors import ConfigError, describe_validation_error

ENGINES_SCHEMA = "specctl.engines/v1"


class DrafterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["draft_model", "ngram", "eagle", "self_spec"]
    model: str | None = None  # subdirectory, for draft_model
    params: int | None = None
    acceptance: float | None = Field(default=None, ge=0.0, le=1.0)  # held-out greedy acceptance
    sink: int = 0
    window: int = 0


class EngineManifest(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_: Literal["specctl.engines/v1"] = Field(alias="schema")
    sku: str
    target: str  # subdirectory of the target model
    drafters: list[DrafterSpec] = Field(min_length=1)
    quick: bool = False
    seed: int | None = None
    corpus: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> EngineManifest:
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique (got {names})")
        for d in self.drafters:
            if d.kind == "draft_model" and not d.model:
                raise ValueError(f"drafter '{d.name}' (draft_model) needs model: <subdirectory>")
        return self


def load_manifest(engine_dir: str | Path) -> EngineManifest:
    d = Path(engine_dir)
    if not d.is_dir():
        raise ConfigError(f"engine directory '{d}' does not exist; build one with `specctl build --sku cpu --out {d}`")
    f = d / "manifest.json"
    if not f.is_file():
        raise ConfigError(f"'{d}' has no manifest.json; is it an engine directory made by `specctl build`?")
    try:
        data = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{f}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != ENGINES_SCHEMA:
        raise ConfigError(f"{f}: schema = {data.get('schema') if isinstance(data, dict) else None!r}; expected {ENGINES_SCHEMA}")
    try:
        m = EngineManifest.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(str(f), e)) from None
    for sub in [m.target] + [x.model for x in m.drafters if x.model]:
        if not (d / sub).is_dir():
            raise ConfigError(f"{f} names model directory '{sub}', which is missing under '{d}'; rebuild the engines")
    return m
