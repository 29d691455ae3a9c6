"""Telemetry: what an in-process agent posts to the control-plane service (``specctl.telemetry/v1``).

One document covers one window of engine steps (about a second). Everything is an aggregate except
``samples``, a bounded random sample of the window's steps with the cost model's features, which the
service uses to refit the cost model online. Counts are exact for the window; the sample is not.

Per drafter, acceptance is reported per draft position the way the chain model needs it
(``control.goodput.estimators``): ``position_trials[j]`` = how many times position j + 1 was
evaluated (every earlier draft token accepted), ``position_accepted[j]`` = how many of those were
accepted. ``k_hist[i]`` counts per-request decisions with draft length i (the last bucket holds
i >= len - 1).

The service validates every field (strict types, finite numbers, ranges, lengths, consistency) and
rejects a document with 422 naming the first bad field, or with 413 when the body is larger than its limit.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from control.policyspec import MAX_K_LIMIT

TELEMETRY_SCHEMA = "specctl.telemetry/v1"
MAX_SAMPLES = 4096  # step samples per document
MAX_DRAFTERS = 16
MAX_POSITIONS = MAX_K_LIMIT  # draft positions 1..K
K_BUCKETS = MAX_K_LIMIT + 1  # k = 0..K
MAX_COUNT = 10**12  # any count above this is corrupt
MAX_MS = 1.0e7  # about 2.8 hours: a longer "step" is corrupt
MAX_WINDOW_S = 3600.0
MAX_SOURCE_CHARS = 128
SOURCE_PATTERN = rf"^[A-Za-z0-9_.:@/\-]{{1,{MAX_SOURCE_CHARS}}}$"
SOURCE_RULE = f"use 1..{MAX_SOURCE_CHARS} of A-Z a-z 0-9 _ . : @ / -"
_SOURCE_OFF = re.compile(r"[^A-Za-z0-9_.:@/\-]")
# A deployment group: the replicas that serve one model pair on one SKU, ``<sku>/<pair>`` (``group_name``).
MAX_SKU_CHARS, MAX_PAIR_CHARS = 64, 128  # the two halves of a group name, <sku>/<pair>
GROUP_PATTERN = rf"^[A-Za-z0-9_.:+@\-]{{1,{MAX_SKU_CHARS}}}/[A-Za-z0-9_.:+@\-]{{1,{MAX_PAIR_CHARS}}}$"
_GROUP_PART = re.compile(r"[^A-Za-z0-9_.:+@\-]")
# Column order of the agent's sample buffer (control.agent.TelemetryWindow) and of ``StepSamples``.
SAMPLE_FIELDS = (
    "batch", "ctx_tokens", "verify_tokens", "verify_ms", "draft_ms", "total_ms", "predicted_ms",
    "draft_passes", "draft_ctx_tokens", "draft_batched_tokens", "drafter", "drafted", "accepted",
)

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # also bounds the elements of list[Count]
_cfg = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _count(**kw):
    return Field(ge=0, le=MAX_COUNT, **kw)


def _ms(**kw):
    return Field(ge=0.0, le=MAX_MS, **kw)


class DrafterStats(BaseModel):
    """Acceptance of one drafter in the window."""

    model_config = _cfg

    name: str = Field(min_length=1, max_length=64)
    requests: Count = _count(description="request-steps that drafted with this drafter (k > 0)")
    drafted: Count = _count(description="draft tokens produced")
    verified: Count = _count(description="draft tokens sent to the target")
    accepted: Count = _count(description="draft tokens the target accepted")
    position_trials: list[Count] = Field(default_factory=list, max_length=MAX_POSITIONS)
    position_accepted: list[Count] = Field(default_factory=list, max_length=MAX_POSITIONS)

    @model_validator(mode="after")
    def _consistent(self) -> DrafterStats:
        if self.verified > self.drafted:
            raise ValueError(f"drafter '{self.name}': verified = {self.verified} exceeds drafted = {self.drafted}")
        if self.accepted > self.verified:
            raise ValueError(f"drafter '{self.name}': accepted = {self.accepted} exceeds verified = {self.verified}")
        t, a = self.position_trials, self.position_accepted
        if len(t) != len(a):
            raise ValueError(f"drafter '{self.name}': position_trials has {len(t)} entries, position_accepted {len(a)}; "
                             "they must have one per draft position")
        for j, (tj, aj) in enumerate(zip(t, a, strict=True)):
            if aj > tj:
                raise ValueError(f"drafter '{self.name}': position {j + 1} accepted {aj} of {tj} trials; "
                                 "accepted must be <= trials")
            if j and tj > t[j - 1]:
                raise ValueError(f"drafter '{self.name}': position {j + 1} has {tj} trials, more than position {j} "
                                 f"({t[j - 1]}); a position is tried only after every earlier one was accepted")
        return self


class StepSamples(BaseModel):
    """A random sample of the window's steps, column by column (all lists have the same length).

    ``drafter`` indexes the document's ``drafters`` list: the one drafter every speculating request
    used in that step, or -1 when none drafted or several did (such steps refit only the target).
    ``predicted_ms`` is the policy's own prediction (null when it made none).
    """

    model_config = _cfg

    batch: list[Count] = Field(max_length=MAX_SAMPLES)
    ctx_tokens: list[Count] = Field(max_length=MAX_SAMPLES)
    verify_tokens: list[Count] = Field(max_length=MAX_SAMPLES)
    verify_ms: list[float] = Field(max_length=MAX_SAMPLES)
    draft_ms: list[float] = Field(max_length=MAX_SAMPLES)
    total_ms: list[float] = Field(max_length=MAX_SAMPLES)
    predicted_ms: list[float | None] = Field(max_length=MAX_SAMPLES)
    draft_passes: list[Count] = Field(max_length=MAX_SAMPLES)
    draft_ctx_tokens: list[Count] = Field(max_length=MAX_SAMPLES)
    draft_batched_tokens: list[Count] = Field(max_length=MAX_SAMPLES)
    drafter: list[int] = Field(max_length=MAX_SAMPLES)
    drafted: list[Count] = Field(max_length=MAX_SAMPLES)
    accepted: list[Count] = Field(max_length=MAX_SAMPLES)

    @model_validator(mode="after")
    def _columns(self) -> StepSamples:
        n = len(self.batch)
        for name in SAMPLE_FIELDS:
            col = getattr(self, name)
            if len(col) != n:
                raise ValueError(f"samples.{name} has {len(col)} entries but samples.batch has {n}; "
                                 "every column needs one entry per sampled step")
        for name in ("verify_ms", "draft_ms", "total_ms", "predicted_ms"):
            for v in getattr(self, name):
                if v is not None and not (0.0 <= v <= MAX_MS):
                    raise ValueError(f"samples.{name} contains {v!r}; step times must be in [0, {MAX_MS:g}] ms")
        for i, (a, d) in enumerate(zip(self.accepted, self.drafted, strict=True)):
            if a > d:
                raise ValueError(f"samples.accepted[{i}] = {a} exceeds samples.drafted[{i}] = {d}")
        return self

    @property
    def n(self) -> int:
        return len(self.batch)


class TelemetryBatch(BaseModel):
    """One agent's telemetry for one window of steps."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True, strict=True)

    schema_: Literal["specctl.telemetry/v1"] = Field(alias="schema")
    source: str = Field(pattern=SOURCE_PATTERN, description="the agent's id (e.g. model name and instance)")
    replica: str | None = Field(default=None, pattern=SOURCE_PATTERN,
                                description="the replica (Triton server) the agent runs in; default: source")
    group: str | None = Field(default=None, pattern=GROUP_PATTERN,
                              description="'<sku>/<pair>' of the agent's profile; default: the service's first group")
    seq: Count = _count(description="window number, increasing per agent")
    plan_version: int = Field(ge=0, le=MAX_COUNT, description="version of the plan in force (0: the agent's default)")
    plan_id: str | None = Field(default=None, max_length=128)
    window_s: float = Field(gt=0.0, le=MAX_WINDOW_S)
    steps: Count = _count()
    spec_steps: Count = _count(default=0, description="steps in which at least one request drafted")
    request_steps: Count = _count(default=0, description="sum over steps of the decode batch size")
    ctx_tokens: Count = _count(default=0, description="sum over request-steps of the context length")
    max_batch: Count = _count(default=0)
    finished: Count = _count(default=0, description="requests that finished in the window")
    k_hist: list[Count] = Field(default_factory=list, max_length=K_BUCKETS)
    measured_ms_sum: float = _ms(default=0.0, description="sum of measured step times")
    predicted_steps: Count = _count(default=0, description="steps for which the policy predicted the step time")
    predicted_ms_sum: float = _ms(default=0.0)
    predicted_measured_ms_sum: float = _ms(default=0.0, description="measured time of the predicted steps")
    drafters: list[DrafterStats] = Field(default_factory=list, max_length=MAX_DRAFTERS)
    samples: StepSamples | None = None
    dropped_windows: Count = _count(default=0, description="windows this agent dropped so far (queue full, service away)")
    dropped_steps: Count = _count(default=0, description="steps in the dropped windows")

    @model_validator(mode="after")
    def _consistent(self) -> TelemetryBatch:
        if self.spec_steps > self.steps:
            raise ValueError(f"spec_steps = {self.spec_steps} exceeds steps = {self.steps}")
        if self.predicted_steps > self.steps:
            raise ValueError(f"predicted_steps = {self.predicted_steps} exceeds steps = {self.steps}")
        if self.max_batch > self.request_steps:
            raise ValueError(f"max_batch = {self.max_batch} exceeds request_steps = {self.request_steps}")
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique (got: {', '.join(names)})")
        if self.samples is not None:
            if self.samples.n > max(self.steps, 0):
                raise ValueError(f"{self.samples.n} step samples but only {self.steps} steps in the window")
            for i, d in enumerate(self.samples.drafter):
                if not -1 <= d < len(self.drafters):
                    raise ValueError(f"samples.drafter[{i}] = {d}: must be -1 or an index into drafters (0..{len(self.drafters) - 1})")
        return self

    # -- derived ---------------------------------------------------------------------------------
    @property
    def replica_id(self) -> str:
        """The replica this window comes from (an agent without a replica id is its own replica)."""
        return self.replica or self.source

    @property
    def mean_batch(self) -> float:
        return self.request_steps / self.steps if self.steps else 0.0

    @property
    def mean_ctx(self) -> float:
        return self.ctx_tokens / self.request_steps if self.request_steps else 0.0

    @property
    def mean_k(self) -> float:
        total = sum(self.k_hist)
        return sum(i * c for i, c in enumerate(self.k_hist)) / total if total else 0.0


def group_name(sku: str, pair: str) -> str:
    """A profile's deployment group, ``<sku>/<pair>``, with characters the wire does not carry replaced by '-'."""
    return f"{_GROUP_PART.sub('-', sku)[:MAX_SKU_CHARS] or '-'}/{_GROUP_PART.sub('-', pair)[:MAX_PAIR_CHARS] or '-'}"


def host_source() -> str:
    """``<host>-<pid>`` of this process as a source id the wire carries (odd characters to ``-``, cut to
    ``MAX_SOURCE_CHARS``)."""
    return _SOURCE_OFF.sub("-", f"{os.uname().nodename}-{os.getpid()}")[:MAX_SOURCE_CHARS]
