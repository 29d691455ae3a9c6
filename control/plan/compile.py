"""The plan compiler: a profile, acceptance state and constraints in, a ``Plan`` out.

``compile_plan`` tabulates the best k over (batch size x context x acceptance) buckets (the maths is
``control.goodput.tabulate``), sets the gate's off threshold, and compiles the engine-native knob:
``trtllm_schedule``, TensorRT-LLM's ``draft_len_schedule`` (its rules are ``control.plan.schedule``).
The per-request cap our Triton models and the tensorrtllm BLS accept, ``num_draft_tokens``, is
``Plan.num_draft_tokens``, read from the table at run time.
"""

from __future__ import annotations

import numpy as np

from control.errors import ConfigError
from control.goodput.acceptance import DEFAULT_ACCEPTANCE
from control.goodput.tabulate import k_by_batch, per_request_goodput_sum, tabulate_k, threshold_batch
from control.plan.schedule import compress_schedule, validate_trtllm_schedule
from control.plan.schema import SLO, AcceptanceState, BanditParams, GateParams, KTable, Plan
from control.policyspec import DEFAULT_MAX_K, MAX_K_LIMIT
from control.profile import Profile

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DEFAULT_CTX_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_ACC_BUCKETS = tuple(round(x, 2) for x in np.arange(0.05, 0.96, 0.05))
CUT_DECIMALS = 6  # confidence cuts are published rounded to this many decimals
DEFAULT_TYPICAL_CTX = 1024  # context tokens the static schedule and gate assume when the profile names none


def compile_plan(
    profile: Profile,
    *,
    version: int = 1,
    policy: str = "adaptive",
    max_k: int = DEFAULT_MAX_K,
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
                   k=k_tab.tolist(), conf_cut=np.round(cut_tab, CUT_DECIMALS).tolist())
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
    """The context length the plan's static artefacts (schedule, gate) are compiled for: the profile's
    ``grid.typical_ctx``, else ``DEFAULT_TYPICAL_CTX`` (or the profile's max context if shorter)."""
    return int(profile.grid.get("typical_ctx", min(DEFAULT_TYPICAL_CTX, profile.limits.max_ctx)))


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

    def score(k: np.ndarray) -> float:  # k: (max_batch,), k[b - 1] drafted at batch size b
        return per_request_goodput_sum(cost, ctx, acc, k)

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
