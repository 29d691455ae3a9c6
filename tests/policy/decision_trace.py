"""A deterministic sequence of engine steps for replaying a policy and recording its decisions.

Requests arrive and leave (new ids in reused slots), the batch swings from 1 to ``max_batch`` and
back, contexts grow, some requests' drafts lag, requests carry categories, draft models report
confidences and steps report their loop time: every branch of ``adaptive`` gets exercised. Outcomes
follow each request's own acceptance rate, so the sequence depends on the decisions: a policy that
decides differently at one step sees different steps after it.

``python -m tests.policy.decision_trace OUT.npz`` records the decisions of the code on the path, with
adaptive as built (``adaptive``: a full decision every few steps, look-ups between) and deciding
fully every step (``adaptive-every-step``). ``tests/policy/data/adaptive_decisions.npz`` holds both;
its every-step part was recorded before the numeric fast paths of the optimiser existed and has not
changed since (``test_decision_cost.py`` checks both parts).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from control.plan import compile_plan
from control.policy import StepOutcome, StepView, build_policy
from control.policy.adaptive import AdaptivePolicy
from control.policy.base import PolicyContext
from control.profile import load_profile
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {"h100-8b": lambda: load_profile(ROOT / "profiles" / "h100" / "llama-3.1-8b+llama-3.2-1b.yaml"),
            "cpu-3drafters": lambda: load_profile(ROOT / "profiles" / "cpu" / "stdlib-full.yaml"),
            # compute-bound: speculation stops paying above batch 36, so the gate switches off and on
            "gated": lambda: make_profile(target=(2e-5, 0.2, 4.0))}
STEPS = 600
MAX_BATCH = 48
FIELDS = ("k", "drafter", "conf_cut", "step_ms", "tokens", "prefill_draft", "prefill_drafter")


def _batch_size(step: int) -> int:
    """1 for a while, then a ramp to MAX_BATCH, a plateau, and back down (the gate switches)."""
    phase = step % 300
    if phase < 60:
        return 1 + (phase // 20)  # 1, 2, 3
    if phase < 150:
        return min(MAX_BATCH, 4 + (phase - 60))
    if phase < 220:
        return MAX_BATCH
    return max(2, MAX_BATCH - (phase - 220))


def replay(policy_name: str, profile_key: str, steps: int = STEPS, seed: int = 7, policy=None) -> dict[str, list]:
    """Decide and observe ``steps`` steps; returns each decision's fields per step."""
    prof = PROFILES[profile_key]()
    plan = compile_plan(prof, max_k=8)
    pol = policy if policy is not None else _build(policy_name, plan, seed)
    drafters = tuple(plan.drafters)
    m = len(drafters)
    rng = np.random.default_rng(seed)
    cap_slots = MAX_BATCH + 8
    rid = np.arange(cap_slots, dtype=np.int64)  # request id per slot
    ctx = rng.integers(64, 3000, cap_slots)
    left = rng.integers(8, 200, cap_slots)
    rate = rng.uniform(0.2, 0.95, cap_slots)
    lag = np.zeros((cap_slots, m), dtype=np.int64)
    next_rid = cap_slots
    rec: dict[str, list] = {f: [] for f in FIELDS}
    loop_ms = float("nan")
    prev_n = 0
    for step in range(steps):
        n = _batch_size(step)
        slots = np.arange(n)
        view = StepView.build(slots=slots, request_ids=rid[slots], ctx_lens=ctx[slots], remaining=left[slots],
                              drafters=drafters, max_k=8, free_kv_slots=4000 if step % 97 else 10,
                              token_budget=8192, k_cap=np.where(rid[slots] % 11 == 0, 2, 8),
                              draft_lag=lag[slots], category=rid[slots] % 4, step=step)
        d = pol.decide(view)
        k = d.k
        acc = np.minimum(rng.geometric(1.0 - rate[slots]) - 1, k)
        conf = np.where(np.arange(8)[None, :] < k[:, None], rng.uniform(0.05, 1.0, (n, 8)), np.nan)
        out = StepOutcome(slots=slots, request_ids=rid[slots], drafter=d.drafter, ctx_lens=ctx[slots].copy(),
                          drafted=k, verified=k, accepted=acc, confidence=conf, category=rid[slots] % 4,
                          verify_ms=5.0 + 0.05 * n + 0.01 * float(k.sum()), draft_ms=0.8 * float(k.max(initial=0)),
                          total_ms=0.0, draft_passes=int(k.max(initial=0)), draft_ctx_tokens=int(ctx[slots].sum()),
                          draft_batched_tokens=int(k.sum()), step=step, prev_loop_ms=loop_ms, prev_loop_requests=prev_n)
        pol.observe(out)
        loop_ms, prev_n = 0.3 + 0.02 * n + rng.uniform(0, 0.1), n
        _record(rec, d)
        ctx[slots] += acc + 1
        left[slots] -= acc + 1
        lag[slots] = np.where(k[:, None] > 0, 0, lag[slots] + (acc + 1)[:, None])
        done = slots[left[slots] <= 0]
        for s in done:  # a new request takes the slot
            rid[s], next_rid = next_rid, next_rid + 1
            ctx[s], left[s], rate[s] = rng.integers(64, 3000), rng.integers(8, 200), rng.uniform(0.2, 0.95)
            lag[s] = 0 if rng.random() < 0.7 else ctx[s]
    return rec


def _build(policy_name: str, plan, seed: int):
    if policy_name == EVERY_STEP:
        return AdaptivePolicy(PolicyContext.from_plan(plan), seed=seed, refresh_every=1)
    return build_policy(policy_name, plan, seed=seed)


def _record(rec: dict[str, list], d) -> None:
    rec["k"].append(d.k.copy())
    rec["drafter"].append(d.drafter.copy())
    rec["conf_cut"].append(np.full(d.k.shape, -1.0) if d.conf_cut is None else d.conf_cut.copy())
    rec["step_ms"].append(d.predicted_step_ms)
    rec["tokens"].append(d.predicted_tokens)
    rec["prefill_draft"].append(d.prefill_draft)
    rec["prefill_drafter"].append(d.prefill_drafter)


def flatten(rec: dict[str, list]) -> dict[str, np.ndarray]:
    out = {}
    for f in FIELDS:
        v = rec[f]
        out[f] = np.concatenate(v) if isinstance(v[0], np.ndarray) else np.asarray(v)
    return out


EVERY_STEP = "adaptive-every-step"  # adaptive with a full decision every step
CASES = tuple((pol, prof) for pol in ("adaptive", EVERY_STEP) for prof in ("h100-8b", "cpu-3drafters", "gated"))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.policy.decision_trace OUT.npz", file=sys.stderr)
        return 2
    arrays = {}
    for pol, prof in CASES:
        for f, a in flatten(replay(pol, prof)).items():
            arrays[f"{pol}/{prof}/{f}"] = a
    np.savez_compressed(argv[0], **arrays)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
