"""Exact replay of the CPU pair's acceptance (control/bench/replay.py, ReplayAcceptance).

The exactness check: for every drafter at fixed k, the real reference engine (batch-invariant
drafts) and the simulator replaying the record accept the same number of draft tokens at every
step of every request.
"""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.replay import (
    ReplayRecord,
    fixed_configs,
    prompt_set_name,
    record_acceptance,
    replay_run,
    stdlib_prompts,
    tokens_per_s,
)
from control.errors import ConfigError

N_PROMPTS, PROMPT_LEN, MAX_TOKENS, MAX_K = 6, 32, 20, 4
ENGINE_BATCH = 3


class StepLog:
    """Wraps a policy; keeps (request id, drafted, accepted) per request-step in step order, and what
    each step's view said of it: (n-gram lookup's proposal at max_k, or -1 where the view has none;
    remaining tokens)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.steps: dict[int, list[tuple[int, int]]] = {}
        self.views: dict[int, list[tuple[int, int]]] = {}

    def decide(self, view):
        avail = view.ngram_avail if view.ngram_avail is not None else np.full(view.n, -1)
        for r, a, rem in zip(view.request_ids, avail, view.remaining, strict=True):
            self.views.setdefault(int(r), []).append((int(a), int(rem)))
        return self.inner.decide(view)

    def observe(self, outcome) -> None:
        for r, v, a in zip(outcome.request_ids, outcome.verified, outcome.accepted, strict=True):
            self.steps.setdefault(int(r), []).append((int(v), int(a)))
        self.inner.observe(outcome)

    def in_order(self, table: dict) -> list:
        return [table[rid] for rid in sorted(table)]  # engine ids are 1..N in prompt order, replay ids 0..N-1


@pytest.fixture(scope="module")
def loaded(quick_engines):
    import torch

    from control.executors.reference.loader import load_engine_dir

    torch.set_num_threads(1)
    eng = load_engine_dir(quick_engines)
    for m in eng.drafters.values():
        if hasattr(m, "config"):
            m.batch_invariant = True  # what the record assumes (see control/bench/replay.py)
    return eng


@pytest.fixture(scope="module")
def prompts(loaded):
    return stdlib_prompts(loaded.encode, N_PROMPTS, PROMPT_LEN, seed=3)


@pytest.fixture(scope="module")
def record(loaded, prompts):
    return record_acceptance(loaded, prompts, MAX_TOKENS, MAX_K, prompt_set_name(N_PROMPTS, PROMPT_LEN, 3))


@pytest.fixture(scope="module")
def profile(quick_engines):
    from control.executors.reference.calibrate import quick_profile
    from control.executors.reference.loader import load_engine_dir

    return quick_profile(load_engine_dir(quick_engines))


def _engine_log(loaded, prompts, profile, drafter: str, k: int) -> tuple[StepLog, list[list[int]]]:
    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, ReferenceEngine
    from control.plan import compile_plan
    from control.policy import build_policy

    plan = compile_plan(profile, policy=f"fixed:{k}", max_k=MAX_K, drafters=[drafter], default_drafter=drafter)
    log = StepLog(build_policy(f"fixed:{k}", plan))
    cfg = EngineConfig(max_batch=ENGINE_BATCH, max_k=MAX_K, batch_invariant=True,
                       max_len=PROMPT_LEN + MAX_TOKENS + MAX_K + 1)
    eng = ReferenceEngine(loaded.target, loaded.drafters, log, cfg)
    res = eng.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return log, [r.token_ids for r in res]


def _replay_log(record, profile, drafter: str, k: int) -> StepLog:
    """The simulator on the record, with the same fixed policy wrapped in a StepLog."""
    seen = {}

    def wrap(policy):
        seen["log"] = StepLog(policy)
        return seen["log"]

    replay_run(record, profile, f"fixed:{k}@{drafter}", ENGINE_BATCH, wrap=wrap)
    return seen["log"]


def test_record_matches_greedy_decoding(loaded, prompts, record):
    from control.bench.replay import greedy_continuations

    conts = greedy_continuations(loaded, prompts, MAX_TOKENS)
    assert record.lead.shape == (N_PROMPTS, MAX_TOKENS, len(loaded.drafters))
    assert (record.lead <= record.avail).all() and (record.avail <= MAX_K).all()
    models = [i for i, k in enumerate(record.kinds) if k == "draft_model"]
    assert (record.avail[:, :, models] == MAX_K).all()  # a draft model always proposes max_k tokens
    assert np.isfinite(record.conf[:, :, models]).all() and np.isnan(record.conf[:, :, record.kinds.index("ngram")]).all()
    # no draft can match past the end of the continuation
    pos = np.arange(MAX_TOKENS)
    assert (record.lead.max(axis=(0, 2)) <= MAX_TOKENS - pos).all()
    assert all(len(c) == MAX_TOKENS for c in conts)


@pytest.mark.parametrize("k", [1, 3])
def test_replay_accepts_what_the_reference_engine_accepts(loaded, prompts, record, profile, k):
    """Token for token: each request's sequence of (drafted, accepted) per step is the same in the
    real engine and in the replay, for every drafter; and speculation changes no output token."""
    from control.bench.replay import greedy_continuations

    plain = [list(c) for c in greedy_continuations(loaded, prompts, MAX_TOKENS)]
    for drafter in record.drafters:
        real, tokens = _engine_log(loaded, prompts, profile, drafter, k)
        assert tokens == plain, f"fixed:{k}@{drafter} changed the greedy output"
        sim = _replay_log(record, profile, drafter, k)
        real_seq, sim_seq = real.in_order(real.steps), sim.in_order(sim.steps)
        assert real_seq == sim_seq, f"fixed:{k}@{drafter}: replay differs from the engine"
        assert sum(a for s in real_seq for _, a in s) > 0, f"fixed:{k}@{drafter} never accepted a token"
        assert real.in_order(real.views) == sim.in_order(sim.views), f"fixed:{k}@{drafter}: the views differ"


def test_views_show_what_the_ngram_lookup_proposes(loaded, prompts, record, profile):
    """Every view of the engine and of the replay carries the n-gram lookup's proposal at max_k, and
    a draft of k there is exactly min(k, that proposal) tokens (within the request's room): what the
    policy may price n-gram by before it decides."""
    k = MAX_K
    real, _ = _engine_log(loaded, prompts, profile, "ngram", k)
    sim = _replay_log(record, profile, "ngram", k)
    for log in (real, sim):
        views, steps = log.in_order(log.views), log.in_order(log.steps)
        pairs = [(v, s) for vr, sr in zip(views, steps, strict=True) for v, s in zip(vr, sr, strict=True)]
        assert all(0 <= avail <= MAX_K for (avail, _), _ in pairs)
        assert all(drafted == min(k, rem - 1, avail) for (avail, rem), (drafted, _) in pairs)
        assert {avail for (avail, _), _ in pairs} >= {0, MAX_K}  # lookups that found nothing and full ones
        assert any(0 < avail < MAX_K for (avail, _), _ in pairs)  # and short tails
    assert real.in_order(real.views) == sim.in_order(sim.views)


def test_replay_repeats_exactly(record, profile):
    for spec in ("adaptive", "fixed:2@ngram"):
        a = replay_run(record, profile, spec, 4)
        b = replay_run(record, profile, spec, 4)
        assert a.busy_s == b.busy_s and a.accepted == b.accepted and a.steps == b.steps
        assert np.array_equal(a.finish_s, b.finish_s)
        assert tokens_per_s(a) > 0


def test_record_round_trips_through_npz(record, tmp_path):
    p = record.save(tmp_path / "r.npz")
    back = ReplayRecord.load(p)
    assert back.drafters == record.drafters and back.kinds == record.kinds and back.max_k == MAX_K
    assert back.prompt_set == record.prompt_set
    for name in ("lead", "avail", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(back, name), getattr(record, name))
    assert np.array_equal(back.conf, record.conf, equal_nan=True)


def test_bad_inputs_name_the_value(record, profile, tmp_path):
    with pytest.raises(ConfigError, match="not recorded"):
        replay_run(record, profile, "fixed:2@nope", 4)
    with pytest.raises(ConfigError, match="batch 0"):
        replay_run(record, profile, "none", 0)
    with pytest.raises(ConfigError, match="does not exist"):
        ReplayRecord.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a replay record"):
        ReplayRecord.load(tmp_path / "bad.npz")
    assert "none" in fixed_configs(record) and f"fixed:{MAX_K}@ngram" in fixed_configs(record)


def test_replay_bar_script_prints_the_same_table_twice(tmp_path):
    """benchmarks/replay_bar.py on the stored record of the quick pair: the table names the best fixed
    configuration and adaptive's ratio, and a second run prints exactly the same; ``--breakdown``
    splits each run's busy time into its prefill iterations and decode steps."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run() -> str:
        p = subprocess.run([sys.executable, str(root / "benchmarks" / "replay_bar.py"), "--batches", "32",
                            "--breakdown", "--json", str(tmp_path / "rows.json")], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return p.stdout

    first = run()
    assert first == run()
    row = next(line for line in first.splitlines() if line.startswith("| 32 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith("fixed:") and 0.5 < float(cells[5]) < 1.5
    assert "bar (adaptive / best fixed >= 1.00 at every batch)" in first
    rows = json.loads((tmp_path / "rows.json").read_text())
    record = ReplayRecord.load(root / "control" / "bench" / "data" / "replay-stdlib-quick.npz")
    for split in (rows[0]["best_fixed_split"], rows[0]["adaptive"]["split"]):
        assert split["prefill_s"] + split["decode_s"] == pytest.approx(split["busy_s"], rel=1e-12)
        assert 0 < split["prefill_s"] < split["busy_s"] and split["decode_steps"] > 0
        # every request is prefilled once, 32 at most in an iteration (the batch's free slots)
        assert -(-record.n // 32) <= split["prefill_iters"] <= record.n
    assert sum(line.startswith("| 32 | ") for line in first.splitlines()) == 3  # the bar's row and two splits


def test_replay_bar_over_several_policy_seeds_reports_the_mean_and_the_worst(tmp_path):
    """--seeds 3: each policy runs at policy seeds 0-2; the table adds the worst seed, the json keeps
    every seed's ratio, the mean lies between the worst and the best; --seeds 0 is refused."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [sys.executable, str(root / "benchmarks" / "replay_bar.py"), "--batches", "4"]
    p = subprocess.run([*script, "--seeds", "3", "--json", str(tmp_path / "rows.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "adaptive worst of 3 seeds" in p.stdout and "every seed:" in p.stdout and "mean of 3 seeds" in p.stdout
    row = json.loads((tmp_path / "rows.json").read_text())[0]["adaptive"]
    assert len(row["per_seed"]) == 3 and row["vs_best_min"] == min(row["per_seed"])
    assert min(row["per_seed"]) <= row["vs_best"] <= max(row["per_seed"])
    bad = subprocess.run([*script, "--seeds", "0"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--seeds 0" in bad.stderr and "Traceback" not in bad.stderr


def test_replay_bar_over_several_arrival_orders_keeps_the_records_own_first(tmp_path):
    """--orders 2: the record's own order, then a permutation of it, each against its own best fixed
    configuration; order 0's ratio is what --orders 1 reports, the worst is over both orders; --orders 0
    is refused."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [sys.executable, str(root / "benchmarks" / "replay_bar.py"), "--batches", "32"]
    rows = {}
    for n in (1, 2):
        p = subprocess.run([*script, "--orders", str(n), "--json", str(tmp_path / f"rows{n}.json")], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert ("arrival orders: the record's own and 1 permutations" in p.stdout) == (n == 2)
        assert ("adaptive worst of 2 orders x 1 seed" in p.stdout) == (n == 2)
        rows[n] = json.loads((tmp_path / f"rows{n}.json").read_text())[0]
    one, two = rows[1]["adaptive"], rows[2]["adaptive"]
    assert len(one["per_seed"]) == 1 and len(two["per_seed"]) == 2 and len(rows[2]["best_fixed_by_order"]) == 2
    assert two["per_seed"][0] == one["vs_best"] and rows[2]["best_fixed"] == rows[1]["best_fixed"]
    assert two["per_seed"][1] != two["per_seed"][0]  # another arrival order is another path
    assert two["vs_best_min"] == min(two["per_seed"]) and two["vs_best"] == pytest.approx(sum(two["per_seed"]) / 2)
    bad = subprocess.run([*script, "--orders", "0"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--orders 0" in bad.stderr and "Traceback" not in bad.stderr


def test_replay_bar_repeat_serves_the_record_several_times_over(tmp_path):
    """--repeat 2: every request of the record arrives twice, so each run generates twice the tokens
    and prefills every request twice; the header says so; --repeat 0 is refused."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [sys.executable, str(root / "benchmarks" / "replay_bar.py"), "--batches", "32", "--breakdown"]
    splits = []
    for n in (1, 2):
        p = subprocess.run([*script, "--repeat", str(n), "--json", str(tmp_path / f"rows{n}.json")], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert ("served 2 times over" in p.stdout) == (n == 2)
        splits.append(json.loads((tmp_path / f"rows{n}.json").read_text())[0]["best_fixed_split"])
    record = ReplayRecord.load(root / "control" / "bench" / "data" / "replay-stdlib-quick.npz")
    assert splits[1]["prefill_iters"] >= 2 * -(-record.n // 32)
    assert 1.8 * splits[0]["busy_s"] < splits[1]["busy_s"] < 2.2 * splits[0]["busy_s"]
    bad = subprocess.run([*script, "--repeat", "0"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--repeat 0" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("drafter", ["draft-small", "draft-tiny"])
def test_a_fixed_k_prefills_the_draft_model_it_names(record, profile, drafter):
    """A fixed k on a named draft model prefills that model's state, as the reference executor does
    with it as its default: no request waits on a catch-up of its prompt there, and the other draft
    model is not prefilled (a prefill of the first draft model had charged ``fixed:k@draft-tiny`` a
    wasted prefill and a catch-up per request, making the full pair's best fixed k look 1-4% slower)."""
    named, other = record.drafters.index(drafter), 1 - record.drafters.index(drafter)
    lags = []

    class Lags:
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def decide(self, view):
            lags.append(view.draft_lag[:, [named, other]].copy())
            return self.inner.decide(view)

        def observe(self, outcome):
            self.inner.observe(outcome)

    replay_run(record, profile, f"fixed:2@{drafter}", 2, wrap=Lags)
    lag = np.concatenate([x for x in lags if x.size])  # (request-steps, 2)
    assert lag.shape[0] > 20 and (lag[:, 0] == 0).all() and (lag[:, 1] > 0).any()
