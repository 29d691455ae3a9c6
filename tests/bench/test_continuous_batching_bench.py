"""benchmarks/continuous_batching.py on the tiny engine: policies with named drafters run, and the
model clock gives every repeat of a policy whose decisions ignore measured times the same number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _run(engine_dir, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "continuous_batching.py"), "--engine-dir",
                           str(engine_dir), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_model_clock_repeats_exactly_and_named_drafters_run(tiny_engine_dir, tmp_path):
    r = _run(tiny_engine_dir, "--batch", "3", "--requests", "6", "--max-tokens", "10", "--prompt-len", "16",
             "--repeats", "2", "--policies", "fixed:2,fixed:2@draft-tiny,fixed:2@ngram", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    model = {}
    for line in r.stdout.splitlines():
        m = re.match(r"repeat (\d) +(\S+): +[\d.]+ tok/s, model +([\d.]+)", line)
        if m:
            model.setdefault(m.group(2), []).append(float(m.group(3)))
    assert set(model) == {"fixed:2", "fixed:2@draft-tiny", "fixed:2@ngram"}
    for spec, v in model.items():
        assert len(v) == 2 and v[0] == v[1] > 0, (spec, v)  # wall time varies; the model clock does not
    assert len({v[0] for v in model.values()}) == 3  # different drafters, different modelled times


def test_unknown_drafter_is_named(tiny_engine_dir, tmp_path):
    r = _run(tiny_engine_dir, "--requests", "2", "--repeats", "1", "--policies", "fixed:2@nope", cwd=tmp_path)
    assert r.returncode != 0 and "nope" in r.stderr and "known:" in r.stderr


def test_missing_engine_dir_and_profile_are_one_line_errors(tiny_engine_dir, tmp_path):
    r = _run(tmp_path / "nowhere", cwd=tmp_path)
    assert r.returncode != 0 and "nowhere" in r.stderr and "specctl build" in r.stderr and "Traceback" not in r.stderr
    r = _run(tiny_engine_dir, "--profile", str(tmp_path / "none.yaml"), cwd=tmp_path)
    assert r.returncode != 0 and "none.yaml" in r.stderr and "Traceback" not in r.stderr


def test_device_is_a_one_line_error_naming_it(tiny_engine_dir, tmp_path):
    r = _run(tiny_engine_dir, "--device", "tpu", "--requests", "2", "--repeats", "1", cwd=tmp_path)
    assert r.returncode != 0 and "'tpu'" in r.stderr and "cuda" in r.stderr and "Traceback" not in r.stderr


def test_adaptive_runs_on_corpus_prompts_with_model_times(tiny_engine_dir, tmp_path):
    """--prompts corpus (the bench's held-out files) and --model-times run, and repeat exactly."""
    r = _run(tiny_engine_dir, "--batch", "3", "--requests", "8", "--max-tokens", "12", "--prompt-len", "16",
             "--repeats", "2", "--prompts", "corpus", "--model-times", "--policies", "adaptive", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    model = [float(m.group(1)) for m in re.finditer(r"repeat \d +adaptive: +[\d.]+ tok/s, model +([\d.]+)", r.stdout)]
    assert len(model) == 2 and model[0] == model[1] > 0, r.stdout


def test_fixed_k_on_the_engine_s_overlap_worker_gives_the_same_model_clock(tiny_engine_dir, tmp_path):
    """+overlap: the engine's worker decides a step ahead; fixed k ignores what it learns, so the model
    clock (with the last step's outcome, drained at close) equals the inline run's."""
    r = _run(tiny_engine_dir, "--batch", "3", "--requests", "6", "--max-tokens", "10", "--prompt-len", "16",
             "--repeats", "1", "--model-times", "--policies", "fixed:2,fixed:2+overlap", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    model = dict(re.findall(r"repeat \d +(\S+): +[\d.]+ tok/s, model +([\d.]+)", r.stdout))
    assert set(model) == {"fixed:2", "fixed:2+overlap"} and model["fixed:2"] == model["fixed:2+overlap"], r.stdout


def test_model_times_replace_what_the_policy_observes():
    """--model-times: the policy sees the profile's verify and draft times for what ran, not the
    machine's; without it, the measured ones. The model clock adds the same either way."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from benchmarks.continuous_batching import ModelClock
    from control.plan import compile_plan
    from control.policy.base import PolicyContext
    from control.policy.types import StepOutcome
    from tests.conftest import make_profile

    cost = PolicyContext.from_plan(compile_plan(make_profile(), max_k=4)).cost
    seen = []

    class Recorder:
        def observe(self, o):
            seen.append((o.verify_ms, o.draft_ms, o.total_ms))

    n = 4
    clocks = []
    for replace in (False, True):
        clock = ModelClock(Recorder(), cost, replace_times=replace)
        clock.drafters = ("draft", "ngram")
        clock.observe(StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=np.zeros(n, dtype=np.int64),
                                  ctx_lens=np.full(n, 100), drafted=np.full(n, 2), verified=np.full(n, 2),
                                  accepted=np.full(n, 1), verify_ms=999.0, draft_ms=555.0, total_ms=1554.0,
                                  draft_passes=2, draft_ctx_tokens=800, draft_batched_tokens=8))
        clocks.append(clock.ms)
    assert seen[0] == (999.0, 555.0, 1554.0)
    verify = float(cost.target.predict(400.0, 12.0))
    assert seen[1][0] == verify and 0 < seen[1][1] < 555.0 and np.isclose(seen[1][2], clocks[1])
    assert clocks[0] == clocks[1] > verify


def test_the_model_clock_charges_each_prefill_and_the_draft_state_it_builds():
    """A decision that prefills the draft model's state (a fixed k on a draft model) is charged that
    draft prefill beside the target's; one that leaves it to catch-up (adaptive) only the target's,
    the catch-up being charged in the decode passes. Without the draft prefill the clock favoured the
    fixed k (the full pair at batch 16: adaptive on draft-tiny 0.90-0.94x fixed:4, 0.99-1.00x with it)."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from benchmarks.continuous_batching import ModelClock
    from control.plan import compile_plan
    from control.policy.base import PolicyContext
    from control.policy.types import Decision
    from tests.conftest import make_profile

    profile = make_profile()
    cost = PolicyContext.from_plan(compile_plan(profile, max_k=4)).cost
    draft = profile.models["draft"].to_cost()
    view = SimpleNamespace(drafters=("draft", "ngram"), prefill_tokens=96)  # what the clock reads of a view
    charged = {}
    for builds in (True, False):
        class Policy:
            def decide(self, v, builds=builds):
                return Decision(k=np.zeros(0, dtype=np.int64), drafter=np.zeros(0, dtype=np.int64), prefill_draft=builds)

        clock = ModelClock(Policy(), cost, default="draft", prefill_costs={"draft": draft})
        clock.decide(view)
        clock.prefill(3, 96)
        clock.prefill(0, 0)  # a step that prefilled nothing
        charged[builds] = clock.ms
    target = float(cost.target.predict(0.0, 96.0, 1, 3)) + cost.overhead_ms
    assert np.isclose(charged[False], target)
    assert np.isclose(charged[True], target + float(draft.predict(0.0, 96.0, 1, 3)))
