"""The plan's wire schema: the versioned, validated document the control-plane service publishes
and every data plane applies (DESIGN.md section 4).

A plan holds the cost model (the profile it was compiled from), acceptance priors, K, the SLO, gate
thresholds, drafter policy and a precomputed table of k over (batch size x context x acceptance)
buckets with the matching confidence cuts. ``control.plan.compile`` builds one; this module only
defines, validates, reads and writes it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from control.errors import ConfigError, describe_validation_error
from control.goodput.acceptance import DEFAULT_ACCEPTANCE
from control.plan.schedule import validate_trtllm_schedule
from control.policyspec import DEFAULT_MAX_K, MAX_K_LIMIT, parse_policy_spec
from control.profile import Profile

PLAN_SCHEMA = "specctl.plan/v1"


class SLO(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tpot_ms: float | None = Field(default=None, gt=0)
    quantile: float | None = Field(default=None, ge=0.5, lt=1.0)  # None: mean form


class GateParams(BaseModel):
    """On/off gate with memory: off above b_off, back on below b_on < b_off."""

    model_config = ConfigDict(extra="forbid")

    b_off: int | None = Field(default=None, ge=1)  # None: never off by batch size
    b_on_ratio: float = Field(default=0.75, gt=0.0, lt=1.0)
    min_dwell_steps: int = Field(default=16, ge=0)
    probe_every_steps: int = Field(default=256, ge=1)
    max_catchup_tokens: int = Field(default=4096, ge=0)

    @property
    def b_on(self) -> int | None:
        return None if self.b_off is None else max(int(self.b_off * self.b_on_ratio), 1)


class BanditParams(BaseModel):
    """SPIN's learning-based drafter selection."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    explore_slots: int = Field(default=32, ge=1)  # alpha
    chunk_slots: int = Field(default=8, ge=1)  # beta
    switch_cost_weight: float = Field(default=1.0, ge=0.0)  # lambda
    capacities: dict[str, int] = Field(default_factory=dict)  # per-drafter batch capacity B_j
    max_exploit_slots: int = Field(default=4096, ge=1)

    @model_validator(mode="after")
    def _chunks(self) -> BanditParams:
        if self.chunk_slots > self.explore_slots:
            raise ValueError(f"chunk_slots {self.chunk_slots} must be <= explore_slots {self.explore_slots}")
        return self


class AcceptanceState(BaseModel):
    """Acceptance priors per drafter: pooled rate, per-position rates, per-category rates."""

    model_config = ConfigDict(extra="forbid")

    rate: dict[str, float] = Field(default_factory=dict)
    per_position: dict[str, list[float]] = Field(default_factory=dict)
    per_category: dict[str, dict[str, float]] = Field(default_factory=dict)

    @field_validator("rate")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        for k, a in v.items():
            if not (math.isfinite(a) and 0.0 <= a < 1.0):
                raise ValueError(f"acceptance of '{k}' = {a!r} must be in [0, 1)")
        return v

    @field_validator("per_position")
    @classmethod
    def _pos(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for k, rates in v.items():
            for a in rates:
                if not (math.isfinite(a) and 0.0 <= a < 1.0):
                    raise ValueError(f"per-position acceptance of '{k}' contains {a!r}; each must be in [0, 1)")
        return v


class KTable(BaseModel):
    """Best k (and the confidence cut) per (batch bucket, context bucket, acceptance bucket)."""

    model_config = ConfigDict(extra="forbid")

    drafter: str
    batch: list[int]
    ctx: list[int]
    acceptance: list[float]
    k: list[list[list[int]]]
    conf_cut: list[list[list[float]]]

    @model_validator(mode="after")
    def _shape(self) -> KTable:
        shape = (len(self.batch), len(self.ctx), len(self.acceptance))
        for name in ("k", "conf_cut"):
            arr = np.asarray(getattr(self, name))
            if arr.shape != shape:
                raise ValueError(f"table.{name} has shape {arr.shape}, expected {shape} (batch x ctx x acceptance)")
        for name in ("batch", "ctx", "acceptance"):
            vals = getattr(self, name)
            if any(b <= a for a, b in zip(vals, vals[1:], strict=False)):
                raise ValueError(f"table.{name} buckets must be strictly increasing")
        return self

    def _idx(self, batch: int, ctx: int, acc: float) -> tuple[int, int, int]:
        bi = int(np.searchsorted(self.batch, batch, side="left"))
        ci = int(np.searchsorted(self.ctx, ctx, side="left"))
        ai = int(np.searchsorted(self.acceptance, acc, side="right")) - 1
        return (min(bi, len(self.batch) - 1), min(ci, len(self.ctx) - 1), min(max(ai, 0), len(self.acceptance) - 1))

    def lookup(self, batch: int, ctx: int, acc: float) -> int:
        """k for a batch of ``batch`` requests of context ``ctx``: buckets round batch and context
        up (conservative: a larger batch and longer context never cost less) and acceptance down."""
        bi, ci, ai = self._idx(batch, ctx, acc)
        return int(self.k[bi][ci][ai])


class Plan(BaseModel):
    """The document the service publishes and every data plane applies."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["specctl.plan/v1"] = Field(default=PLAN_SCHEMA, alias="schema")
    version: int = Field(ge=1)
    created_at: float = Field(default_factory=time.time)
    reason: str = ""
    policy: str = "adaptive"
    max_k: int = Field(default=DEFAULT_MAX_K, ge=0, le=MAX_K_LIMIT)
    force_off: bool = False
    slo: SLO = Field(default_factory=SLO)
    drafters: list[str] = Field(default_factory=list)  # the active drafter set (profile names)
    default_drafter: str | None = None
    profile: Profile
    acceptance: AcceptanceState = Field(default_factory=AcceptanceState)
    gate: GateParams = Field(default_factory=GateParams)
    bandit: BanditParams = Field(default_factory=BanditParams)
    table: KTable
    static_schedule: dict[int, int] = Field(default_factory=dict)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        try:
            return str(parse_policy_spec(v))
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _refs(self) -> Plan:
        names = self.profile.drafter_names
        if not self.drafters:
            self.drafters = list(names)
        for d in self.drafters:
            if d not in names:
                raise ValueError(f"drafter '{d}' is not in the profile (has: {', '.join(names)})")
        if self.default_drafter is None:
            self.default_drafter = self.drafters[0]
        if self.default_drafter not in self.drafters:
            raise ValueError(f"default_drafter '{self.default_drafter}' is not an active drafter ({', '.join(self.drafters)})")
        if self.static_schedule:
            validate_trtllm_schedule(self.static_schedule, max(self.static_schedule.values()))
        return self

    # -- lookups for the controller -----------------------------------------------------------------
    def prior_rate(self, drafter: str | None = None) -> float:
        name = drafter or self.default_drafter
        return self.acceptance.rate.get(name, self.profile.acceptance.get(name, DEFAULT_ACCEPTANCE))

    def lookup_k(self, batch: int, ctx: int, acc: float | None = None) -> int:
        if self.force_off:
            return 0
        return min(self.table.lookup(batch, ctx, self.prior_rate() if acc is None else acc), self.max_k)

    def num_draft_tokens(self, batch: int, ctx: int, acc: float | None = None) -> int:
        """Per-request draft cap for engines that take one (Triton ``num_draft_tokens``)."""
        return self.lookup_k(batch, ctx, acc)

    # -- serialisation ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def parse_plan(data: Any, where: str = "plan") -> Plan:
    if isinstance(data, str | bytes):
        try:
            data = yaml.safe_load(data)
        except yaml.YAMLError as e:
            raise ConfigError(f"{where} is neither JSON nor YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with schema: {PLAN_SCHEMA}, got {type(data).__name__}")
    if data.get("schema") != PLAN_SCHEMA:
        raise ConfigError(f"{where}: schema = {data.get('schema')!r}; this version reads schema: {PLAN_SCHEMA}")
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"plan file '{path}' does not exist; compile one with `specctl plan --profile P --json`")
    return parse_plan(path.read_text(), where=f"plan '{path}'")
