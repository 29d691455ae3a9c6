"""The Plan: what the control-plane service pushes and the in-process controller applies.

A plan is a versioned, validated document (DESIGN.md section 4) holding the cost model (the
profile it was compiled from), acceptance priors, K, the SLO, gate thresholds, drafter policy and a
precomputed table of k over (batch size x context x acceptance) buckets with the matching
confidence cuts. The controller optimises exactly when it has per-request data and falls back to
the table otherwise; the table is also what compiles into engine-native knobs:

- ``trtllm_schedule``: TensorRT-LLM's ``draft_len_schedule`` (batch size -> k). Its rules, as
  TensorRT-LLM enforces them (``tensorrt_llm/llmapi/llm_args.py``,
  ``DecodingBaseConfig.validate_draft_len_schedule_and_sort``; lookup in
  ``tensorrt_llm/_torch/speculative/utils.py``, ``get_draft_len_for_batch_size``): keys >= 1; values
  >= 0 and <= max_draft_len; the smallest key's value equals max_draft_len; a batch size uses the value
  of the first key >= it; batch sizes above the last key run without speculation.
- ``num_draft_tokens``: the per-request cap our Triton models and the tensorrtllm BLS accept.
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
from control.goodput.acceptance import DEFAULT_ACCEPTANCE, chain_expected
from control.goodput.optimizer import Constraints
from control.goodput.stepcost import StepCostModel, uniform_step_ms
from control.policyspec import MAX_K_LIMIT, parse_policy_spec
from control.profile import Profile

PLAN_SCHEMA = "specctl.plan/v1"
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DEFAULT_CTX_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_ACC_BUCKETS = tuple(round(x, 2) for x in np.arange(0.05, 0.96, 0.05))


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
    max_k: int = Field(default=8, ge=0, le=MAX_K_LIMIT)
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


# -- compilation ----------------------------------------------------------------------------------------

def tabulate_k(cost: StepCostModel, batch, ctx, acc, max_k: int, slo: SLO | None = None,
               kv_tokens: int | None = None, token_budget: int | None = None,
               drafter: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Best uniform k and confidence cut over a grid of homogeneous batches, fully vectorised.

    Returns arrays of shape (len(batch), len(ctx), len(acc)).
    """
    B = np.asarray(batch, dtype=np.float64)[:, None, None, None]
    S = np.asarray(ctx, dtype=np.float64)[None, :, None, None]
    A = np.asarray(acc, dtype=np.float64)[None, None, :, None]
    k = np.arange(max_k + 1, dtype=np.float64)[None, None, None, :]
    t = np.broadcast_to(uniform_step_ms(cost, B, S, k, drafter), np.broadcast_shapes(B.shape, S.shape, A.shape, k.shape))
    tokens = B * chain_expected(A, k)
    g = tokens / t
    feasible = np.ones(g.shape, dtype=bool)
    if slo is not None and slo.tpot_ms is not None:
        margin = Constraints(slo_tpot_ms=slo.tpot_ms, slo_quantile=slo.quantile).slo_margin_ms(cost.step_std_ms())
        feasible &= t + margin <= slo.tpot_ms
    if kv_tokens is not None:
        feasible &= B * k <= kv_tokens
    if token_budget is not None:
        feasible &= B * (k + 1) <= token_budget
    feasible[..., 0] = True
    g = np.where(feasible, g, -np.inf)
    best = np.argmax(g, axis=-1)
    # Marginal-cost confidence cut at the chosen k: one more token of survival p pays iff p > G * dT.
    g_best = np.take_along_axis(g, best[..., None], axis=-1)[..., 0]
    t_best = np.take_along_axis(t, best[..., None], axis=-1)[..., 0]
    t_next = uniform_step_ms(cost, B[..., 0], S[..., 0], best + 1.0, drafter)
    dT = (t_next - t_best) / B[..., 0]
    cut = np.clip(g_best * dT, 0.0, 1.0)
    return best.astype(np.int64), cut


def k_by_batch(cost: StepCostModel, ctx: int, acc: float, max_k: int, max_batch: int, slo: SLO | None = None,
               kv_tokens: int | None = None, token_budget: int | None = None, drafter: int = 0) -> np.ndarray:
    """Best uniform k for every batch size 1..max_batch at one context and acceptance (index 0 = batch 1)."""
    k, _ = tabulate_k(cost, np.arange(1, max_batch + 1), [ctx], [acc], max_k, slo, kv_tokens, token_budget, drafter)
    return k[:, 0, 0]


def threshold_batch(cost: StepCostModel, ctx: int, acc: float, max_k: int, max_batch: int,
                    slo: SLO | None = None, drafter: int = 0) -> int | None:
    """The smallest batch size at which speculation stops paying (None if it pays up to max_batch)."""
    if max_k <= 0:
        return 1
    k = k_by_batch(cost, ctx, acc, max_k, max_batch, slo, drafter=drafter)
    zero = np.flatnonzero(k == 0)
    return int(zero[0]) + 1 if zero.size else None


def compile_plan(
    profile: Profile,
    *,
    version: int = 1,
    policy: str = "adaptive",
    max_k: int = 8,
    acceptance: AcceptanceState | None = None,
    slo: SLO | None = None,
    drafters: list[str] | None = None,
    default_drafter: str | None = None,
    force_off: bool = False,
    gate: GateParams | None = None,
    bandit: BanditParams | None = None,
    batch_buckets=DEFAULT_BATCH_BUCKETS,
    ctx_buckets=DEFAULT_CTX_BUCKETS,
    acc_buckets=DEFAULT_ACC_BUCKETS,
    reason: str = "",
) -> Plan:
    """Compile a plan from a profile, acceptance state and constraints."""
    if not (0 <= max_k <= MAX_K_LIMIT):
        raise ConfigError(f"max_k = {max_k!r}: must be in 0..{MAX_K_LIMIT}")
    acceptance = acceptance or AcceptanceState()
    slo = slo or SLO()
    active = drafters or profile.drafter_names
    for d in active:
        profile.drafter(d)  # raises with the list of known drafters
    default = default_drafter or active[0]
    if default not in active:
        raise ConfigError(f"default drafter '{default}' is not among the active drafters ({', '.join(active)})")
    limits = profile.limits
    batch_buckets = [b for b in batch_buckets if b <= limits.max_batch] or [limits.max_batch]
    if batch_buckets[-1] < limits.max_batch:
        batch_buckets.append(limits.max_batch)
    cost = profile.step_cost([default])
    k_tab, cut_tab = tabulate_k(cost, batch_buckets, ctx_buckets, acc_buckets, max_k, slo,
                                limits.kv_tokens, limits.token_budget)
    table = KTable(drafter=default, batch=list(batch_buckets), ctx=list(ctx_buckets), acceptance=list(acc_buckets),
                   k=k_tab.tolist(), conf_cut=np.round(cut_tab, 6).tolist())
    rate = acceptance.rate.get(default, profile.acceptance.get(default, DEFAULT_ACCEPTANCE))
    gate = gate.model_copy() if gate is not None else GateParams()
    if gate.b_off is None:
        gate.b_off = threshold_batch(cost, typical_ctx(profile), rate, max_k, limits.max_batch, slo)
    plan = Plan(
        version=version, policy=policy, max_k=max_k, force_off=force_off, slo=slo, drafters=list(active),
        default_drafter=default, profile=profile, acceptance=acceptance, gate=gate,
        bandit=bandit or BanditParams(), table=table, reason=reason,
    )
    if max_k > 0 and not force_off:
        plan.static_schedule = trtllm_schedule(plan, ctx=typical_ctx(profile), acc=rate, max_batch=limits.max_batch)
    return plan


def typical_ctx(profile: Profile) -> int:
    """The context length the plan's static artefacts (schedule, gate) are compiled for."""
    return int(profile.grid.get("typical_ctx", min(1024, profile.limits.max_ctx)))


# -- engine-native compilers ----------------------------------------------------------------------------

def validate_trtllm_schedule(schedule: dict[int, int], max_draft_len: int) -> None:
    """Check a draft_len_schedule against TensorRT-LLM's rules; ConfigError names the broken rule."""
    if not schedule:
        raise ConfigError("draft_len_schedule is empty; it needs at least {1: max_draft_len}")
    for b, k in schedule.items():
        if not isinstance(b, int | np.integer) or b < 1:
            raise ConfigError(f"draft_len_schedule: batch size key {b!r} must be an integer >= 1")
        if not isinstance(k, int | np.integer) or k < 0:
            raise ConfigError(f"draft_len_schedule[{b}] = {k!r}: draft length must be an integer >= 0")
        if k > max_draft_len:
            raise ConfigError(f"draft_len_schedule[{b}] = {k} exceeds max_draft_len = {max_draft_len}")
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise ConfigError(
            f"draft_len_schedule[{smallest}] = {schedule[smallest]}: the smallest key's value must equal max_draft_len = {max_draft_len}"
        )


def schedule_lookup(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's lookup: the value of the first key >= batch; 0 above the last key."""
    keys = sorted(schedule)
    i = int(np.searchsorted(keys, batch, side="left"))
    return schedule[keys[i]] if i < len(keys) else 0


def compress_schedule(k_per_batch: np.ndarray) -> dict[int, int]:
    """Breakpoints of k(batch), batch = 1..len: {last batch of each run: its k}; trailing zeros dropped."""
    k = np.asarray(k_per_batch, dtype=np.int64)
    nz = np.flatnonzero(k > 0)
    if nz.size == 0:
        return {}
    k = k[: nz[-1] + 1]
    ends = np.flatnonzero(np.diff(k) != 0)
    keys = np.append(ends, k.size - 1)
    return {int(i) + 1: int(k[i]) for i in keys}


def trtllm_schedule(plan: Plan, *, ctx: int, acc: float, max_batch: int | None = None,
                    one_model: bool = False) -> dict[int, int]:
    """Compile the plan into TensorRT-LLM's ``draft_len_schedule`` for one context and acceptance.

    TensorRT-LLM requires the smallest key to carry max_draft_len, so when the best k at batch 1 is
    not the largest (long contexts, where k can grow with batch), we compare the legal schedules by
    predicted goodput summed over all batch sizes: every value capped at k(1); max_draft_len = max k
    with the first segment raised to it; or no schedule (speculation off); and keep the best.

    ``one_model``: for one-model drafters (EAGLE3 one-model, MTP) k = 0 leaves the drafter's state
    stale and acceptance collapses when speculation resumes (TensorRT-LLM PR #16888, open at the time
    of writing). Such schedules never contain 0 and their last key is max_batch, so no batch size falls
    off the end.
    """
    max_batch = max_batch or plan.profile.limits.max_batch
    cost = plan.profile.step_cost([plan.default_drafter])
    lim = plan.profile.limits
    want = k_by_batch(cost, ctx, acc, plan.max_k, max_batch, plan.slo, lim.kv_tokens, lim.token_budget)
    if one_model:
        want = np.maximum(want, 1)
    if want.max() <= 0:
        return {}
    batches = np.arange(1, max_batch + 1, dtype=np.float64)

    def score(k: np.ndarray) -> float:
        return float(np.sum(chain_expected(acc, k) / uniform_step_ms(cost, batches, ctx, k)))

    # Candidate 0: no schedule at all (speculation off) - better when the forced first segment
    # would speculate where the optimiser says it does not pay.
    candidates = [] if one_model else [(score(np.zeros(max_batch)), 0, np.zeros(max_batch, dtype=np.int64))]
    for cap in sorted({int(want[0]), int(want.max())}):
        if cap <= 0:
            continue
        k = np.minimum(want, cap)
        k[0] = cap
        # The first segment (up to the first breakpoint) carries max_draft_len by TensorRT-LLM's rule.
        first_end = int(np.flatnonzero(np.diff(np.append(want, -1)) != 0)[0])
        k[: first_end + 1] = cap
        candidates.append((score(k), cap, k))
    _, cap, k = max(candidates, key=lambda c: c[0])
    if cap == 0:
        return {}
    sched = compress_schedule(k)  # with one_model, k >= 1 throughout, so the last key is max_batch
    validate_trtllm_schedule(sched, cap)
    return sched
