"""Long prompts: a request whose prompt is longer than the catch-up limit still drafts under
``adaptive`` (docs/decisions.md, stop 55: for two weeks such requests never drafted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from control.bench.simrun import SimSetup, run_policy
from control.bench.workloads import poisson
from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_adaptive_drafts_for_prompts_past_the_catch_up_limit_as_a_fixed_k_does():
    prof = load_profile(ROOT / "profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml")
    w = poisson(120, 1.0, "lognormal:12000:4000", "lognormal:300:100", seed=3)
    setup = SimSetup(prof, w)
    assert setup.plan().gate.max_catchup_tokens < np.median(w.prompt_tokens)
    fixed = run_policy(setup, w, "fixed:1", 0)
    ours = run_policy(setup, w, "adaptive", 0)
    assert ours.spec_steps > 0.8 * ours.decode_steps, (ours.spec_steps, ours.decode_steps)
    lat = np.mean(ours.finish_s - ours.arrival_s) / np.mean(fixed.finish_s - fixed.arrival_s)
    assert lat < 1.02, lat
