"""Profiles: fitted cost models per GPU SKU x model pair (``profiles/<sku>/<pair>.yaml``).

A profile is produced by the profiler (``source: measured``) or the roofline model (``source:
roofline``); never by hand. Schema ``specctl.profile/v1``::

    schema: specctl.profile/v1
    sku: h100
    pair: llama-3.1-8b+llama-3.2-1b
    source: measured | roofline
    environment: {}                # device, versions, date
    models:
      target: {a_ms_per_ctx_token: 0.0, b_ms_per_batched_token: 0.0, c_ms: 0.0, r2: 1.0, mape: 0.0}
      draft:  {a_ms_per_ctx_token: 0.0, b_ms_per_batched_token: 0.0, c_ms: 0.0, r2: 1.0, mape: 0.0}
    drafters:
      - {name: draft, kind: draft_model, model: draft}
      - {name: ngram, kind: ngram, cost_ms: 0.2}

Optional keys: ``overhead_ms`` (per step, outside the forward passes), ``acceptance`` (measured
greedy acceptance per drafter name, used as the prior), ``limits`` (max batch, max context, KV
tokens), ``grid`` (the sweep that produced the fit).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from control.errors import ConfigError, describe_validation_error
from control.goodput.cost import LinearCost
from control.goodput.stepcost import DrafterCost, DrafterKind, StepCostModel
from control.yamlfile import read_yaml_file

PROFILE_SCHEMA = "specctl.profile/v1"


def _finite_nonneg(v: float, name: str) -> float:
    if v is None or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return v


class CostCoeffs(BaseModel):
    """T_fwd = a * N_ctx + b * N_batched + c (+ d * N_req) in milliseconds, with the fit's quality.

    ``d_ms_per_request`` (default 0) is the per-request term of executors whose passes grow with the
    requests rather than their tokens (``control.goodput.cost``); a draft model's is folded into its b."""

    model_config = ConfigDict(extra="forbid")

    a_ms_per_ctx_token: float
    b_ms_per_batched_token: float
    c_ms: float
    r2: float = 1.0
    mape: float = 0.0
    resid_std_ms: float = 0.0
    d_ms_per_request: float = 0.0

    @field_validator("a_ms_per_ctx_token", "b_ms_per_batched_token", "c_ms", "mape", "resid_std_ms", "d_ms_per_request")
    @classmethod
    def _nonneg(cls, v: float, info) -> float:
        return _finite_nonneg(v, info.field_name)

    @field_validator("r2")
    @classmethod
    def _r2(cls, v: float) -> float:
        if not math.isfinite(v) or v > 1.0:
            raise ValueError("r2 must be a finite number <= 1")
        return v

    def to_cost(self) -> LinearCost:
        return LinearCost(self.a_ms_per_ctx_token, self.b_ms_per_batched_token, self.c_ms, self.r2, self.mape,
                          self.resid_std_ms, self.d_ms_per_request)

    @classmethod
    def from_cost(cls, c: LinearCost) -> CostCoeffs:
        return cls(a_ms_per_ctx_token=c.a, b_ms_per_batched_token=c.b, c_ms=c.c, r2=c.r2, mape=c.mape,
                   resid_std_ms=c.resid_std_ms, d_ms_per_request=c.d)


class DrafterEntry(BaseModel):
    """One drafter the deployment can use."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    kind: DrafterKind
    model: str | None = None  # key into ``models`` (draft model, EAGLE head, or the target for self_spec)
    cost_ms: float = 0.0  # per-step constant (n-gram lookup; launch overhead for the others)
    sink: int = Field(default=0, ge=0)
    window: int = Field(default=0, ge=0)
    confidences: bool = True  # whether the drafter reports per-token confidences

    @field_validator("cost_ms")
    @classmethod
    def _cost(cls, v: float) -> float:
        return _finite_nonneg(v, "cost_ms")


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(default=256, ge=1)
    max_ctx: int = Field(default=8192, ge=1)
    kv_tokens: int | None = Field(default=None, ge=1)
    token_budget: int | None = Field(default=None, ge=1)


class Profile(BaseModel):
    """A validated profile document."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["specctl.profile/v1"] = Field(alias="schema")
    sku: str = Field(min_length=1)
    pair: str = Field(min_length=1)
    source: Literal["measured", "roofline"]
    environment: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, CostCoeffs]
    drafters: list[DrafterEntry] = Field(min_length=1)
    overhead_ms: float = 0.0
    acceptance: dict[str, float] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    grid: dict[str, Any] = Field(default_factory=dict)

    @field_validator("overhead_ms")
    @classmethod
    def _overhead(cls, v: float) -> float:
        return _finite_nonneg(v, "overhead_ms")

    @field_validator("acceptance")
    @classmethod
    def _acc(cls, v: dict[str, float]) -> dict[str, float]:
        for k, a in v.items():
            if not (math.isfinite(a) and 0.0 <= a < 1.0):
                raise ValueError(f"acceptance of '{k}' = {a!r} must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _refs(self) -> Profile:
        if "target" not in self.models:
            raise ValueError(f"models must include 'target' (got: {', '.join(self.models) or 'none'})")
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique (got: {', '.join(names)})")
        for d in self.drafters:
            needs_model = d.kind != DrafterKind.ngram
            if needs_model and d.model is None:
                raise ValueError(f"drafter '{d.name}' of kind {d.kind.value} needs model: <key in models>")
            if d.model is not None and d.model not in self.models:
                raise ValueError(f"drafter '{d.name}' refers to model '{d.model}', not in models ({', '.join(self.models)})")
            if d.kind == DrafterKind.self_spec and d.sink + d.window <= 0:
                raise ValueError(f"drafter '{d.name}' (self_spec) needs sink + window > 0")
        for k in self.acceptance:
            if k not in names:
                raise ValueError(f"acceptance given for unknown drafter '{k}' (drafters: {', '.join(names)})")
        try:  # a hand-edited share or budget fails at load, naming the file, not at the first step
            _reread_share(self.environment)
            _plain_chunk_budget(self.environment)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    # -- derived --------------------------------------------------------------------------------
    @property
    def drafter_names(self) -> list[str]:
        return [d.name for d in self.drafters]

    def drafter_cost(self, entry: DrafterEntry) -> DrafterCost:
        # draft passes carry one token per request: a per-request term is a per-token one there
        raw = self.models[entry.model].to_cost() if entry.model else None
        model = raw.per_token_draft() if raw is not None else None
        return DrafterCost(entry.name, entry.kind, model, entry.cost_ms, entry.sink, entry.window,
                           raw.d if raw is not None else 0.0)

    def step_cost(self, drafters: list[str] | None = None) -> StepCostModel:
        """The step cost model over the given drafters (default: all, in profile order). A roofline
        profile of a framework that verifies by batch expansion prices verification that way."""
        entries = self.drafters if drafters is None else [self.drafter(n) for n in drafters]
        target = self.models["target"].to_cost()
        if self.verifies_by_expansion:
            target = replace(target, expanded=True, reread_share=self.expansion_reread_share)
        return StepCostModel(target, tuple(self.drafter_cost(e) for e in entries), self.overhead_ms)

    @property
    def verifies_by_expansion(self) -> bool:
        """Whether the framework a roofline profile was built for verifies by batch expansion."""
        return bool(_framework_value(self.environment, "verify_expansion", False))

    @property
    def expansion_reread_share(self) -> float:
        """Under batch expansion, what a copy's KV read costs as a share of a first read (the
        framework's ``reread_share``; 1 in profiles written before it was recorded)."""
        return _reread_share(self.environment)

    @property
    def plain_chunk_budget(self) -> int:
        """The chunked-prefill token budget of a deployment without a speculative model (the
        framework's ``plain_chunk_budget``; 0: it prefills as every other deployment does)."""
        return _plain_chunk_budget(self.environment)

    def drafter(self, name: str) -> DrafterEntry:
        for d in self.drafters:
            if d.name == name:
                return d
        raise ConfigError(f"drafter '{name}' is not in profile {self.sku}/{self.pair}; it has: {', '.join(self.drafter_names)}")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_yaml())
        tmp.replace(path)
        return path


def _framework_value(environment: dict, key: str, default: Any) -> Any:
    """``environment.framework[key]`` of a roofline profile, ``default`` where absent."""
    fw = environment.get("framework")
    return fw.get(key, default) if isinstance(fw, dict) else default


def _reread_share(environment: dict) -> float:
    """``environment.framework.reread_share`` (1 where absent), or a ConfigError naming a bad value."""
    share = _framework_value(environment, "reread_share", 1.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
        raise ConfigError(f"environment.framework.reread_share = {share!r}: must be a number in [0, 1] (the "
                          "share of an HBM read a batch-expansion copy pays); rebuild the profile with "
                          "`specctl roofline` or fix the value")
    return float(share)


def _plain_chunk_budget(environment: dict) -> int:
    """``environment.framework.plain_chunk_budget`` (0 where absent), or a ConfigError naming a bad value."""
    budget = _framework_value(environment, "plain_chunk_budget", 0)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"environment.framework.plain_chunk_budget = {budget!r}: must be an integer >= 0 (the "
                          "chunked-prefill token budget of a deployment without speculation; 0: none); rebuild "
                          "the profile with `specctl roofline` or fix the value")
    return budget


def parse_profile(data: Any, where: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with schema: {PROFILE_SCHEMA}, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != PROFILE_SCHEMA:
        raise ConfigError(f"{where}: schema = {schema!r}; this version reads schema: {PROFILE_SCHEMA}")
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile; every problem is a one-line ConfigError naming the value."""
    path = Path(path)
    data = read_yaml_file(path, "profile", "generate one with `specctl profile` or `specctl roofline`")
    return parse_profile(data, where=f"profile '{path}'")
