"""Operator overrides: what ``PUT /v1/overrides`` sets (behind the bearer token).

A PUT replaces the whole set; a field left out (or null) is not overridden and the service's
configured default applies. ``{}`` clears every override. Types are strict (``max_k: true`` or
``"3"``, ``force_off: "yes"`` are refused, not coerced) and numbers must be finite.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from control.errors import ConfigError
from control.policyspec import ACCEPTED, MAX_K_LIMIT, parse_policy_spec
from control.profile import Profile

SERVICE_POLICIES = ACCEPTED.replace(", oracle (simulator only)", "")


class Overrides(BaseModel):
    """Operator overrides of the plan. Every field is optional."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    policy: str | None = Field(default=None, max_length=200, description=f"policy name; accepted: {SERVICE_POLICIES}")
    max_k: int | None = Field(default=None, ge=0, le=MAX_K_LIMIT, description="largest draft length")
    slo_tpot_ms: float | None = Field(default=None, gt=0, le=1e6, description="TPOT SLO in ms")
    slo_quantile: float | None = Field(default=None, ge=0.5, lt=1.0, description="meet the SLO at this quantile")
    force_off: bool | None = Field(default=None, description="true: no speculation at all")
    drafters: list[str] | None = Field(default=None, min_length=1, max_length=16,
                                       description="active drafter set (names from the profile)")
    default_drafter: str | None = Field(default=None, max_length=64)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            spec = parse_policy_spec(v)
        except ConfigError as e:
            raise ValueError(str(e).replace(ACCEPTED, SERVICE_POLICIES)) from None
        if spec.name == "oracle":
            raise ValueError(f"policy 'oracle' runs only inside the simulator; accepted: {SERVICE_POLICIES}")
        return str(spec)

    @field_validator("drafters")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"drafters must be unique (got: {', '.join(v)})")
        return v

    @model_validator(mode="after")
    def _slo(self) -> Overrides:
        if self.slo_quantile is not None and self.slo_tpot_ms is None:
            raise ValueError("slo_quantile needs slo_tpot_ms (the SLO the quantile must meet)")
        if self.slo_tpot_ms is not None and not math.isfinite(self.slo_tpot_ms):
            raise ValueError(f"slo_tpot_ms = {self.slo_tpot_ms!r}: must be a finite number > 0")
        return self

    def check_profile(self, profile: Profile) -> None:
        """Drafter names must exist in the profile; raises ConfigError naming the value and the choices."""
        names = profile.drafter_names
        for d in self.drafters or []:
            if d not in names:
                raise ConfigError(f"drafter '{d}' is not in profile {profile.sku}/{profile.pair}; it has: {', '.join(names)}")
        if self.default_drafter is not None:
            active = self.drafters or names
            if self.default_drafter not in active:
                raise ConfigError(f"default_drafter '{self.default_drafter}' is not an active drafter; "
                                  f"active: {', '.join(active)}")

    def describe(self) -> str:
        items = self.model_dump(exclude_none=True)
        return ", ".join(f"{k}={v}" for k, v in items.items()) or "none"
