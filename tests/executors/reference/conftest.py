"""Fixtures and helpers of the executor tests: the tiny engine, plans for it, test policies, drivers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from control.executors.base import SamplingParams
from control.executors.reference.engine import EngineConfig, ReferenceEngine
from control.executors.reference.loader import load_engine_dir
from control.plan import compile_plan
from control.policy import build_policy
from control.policy.types import Decision, StepOutcome, StepView
from control.profile import parse_profile

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox",
    "class Stack:\n    def push(self, item):",
    "a, b = b, a + b",
    "Speculative decoding drafts tokens",
    "x",
    "return self.items.pop()\n\nclass Queue:",
    "the target alone would write",
]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny models gain nothing from a second thread, and OpenMP's fork/join on a busy 2-core
    machine costs more than the work. Tests that need a thread count set it themselves."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def loaded(tiny_engine_dir):
    return load_engine_dir(tiny_engine_dir)


@pytest.fixture(scope="session")
def prompts(loaded):
    return [loaded.encode(t) for t in PROMPTS]


def tiny_profile(names=("draft-small", "draft-tiny", "ngram", "self-spec"), acceptance=None):
    """A synthetic profile (known coefficients) naming the tiny engine's drafters; speculation pays."""
    models = {"target": {"a_ms_per_ctx_token": 1e-4, "b_ms_per_batched_token": 0.05, "c_ms": 4.0}}
    drafters = []
    for n in names:
        if n == "ngram":
            drafters.append({"name": n, "kind": "ngram", "cost_ms": 0.05, "confidences": False})
        elif n.startswith("self"):
            drafters.append({"name": n, "kind": "self_spec", "model": "target", "sink": 4, "window": 24})
        else:
            models[n] = {"a_ms_per_ctx_token": 1e-5, "b_ms_per_batched_token": 0.01, "c_ms": 0.3}
            drafters.append({"name": n, "kind": "draft_model", "model": n})
    acc = acceptance or {n: 0.6 for n in names}
    return parse_profile({"schema": "specctl.profile/v1", "sku": "cpu", "pair": "tiny-test", "source": "roofline",
                          "models": models, "drafters": drafters, "acceptance": acc, "limits": {"max_batch": 64}})


def make_policy(spec: str, default_drafter: str = "draft-small", max_k: int = 6, names=None, **plan_kw):
    profile = tiny_profile(names or ("draft-small", "draft-tiny", "ngram", "self-spec"))
    plan = compile_plan(profile, policy=spec, max_k=max_k, default_drafter=default_drafter, **plan_kw)
    return build_policy(spec, plan)


def make_engine(loaded, policy=None, *, drafters=None, **cfg) -> ReferenceEngine:
    cfg.setdefault("max_batch", 4)
    cfg.setdefault("max_k", 6)
    return ReferenceEngine(loaded.target, loaded.drafters if drafters is None else drafters, policy, EngineConfig(**cfg))


class ChaosPolicy:
    """Random k, drafter, confidence cut and draft-prefill choice every step (seeded): exercises
    catch-up, drafter switches, rollbacks and caps far more than any real policy does."""

    name = "chaos"

    def __init__(self, seed: int = 0, max_k: int = 6, p_off: float = 0.25, cuts: bool = True) -> None:
        self.rng = np.random.default_rng(seed)
        self.max_k = max_k
        self.p_off = p_off
        self.cuts = cuts

    def decide(self, view: StepView) -> Decision:
        n, m = view.n, max(len(view.drafters), 1)
        k = self.rng.integers(0, self.max_k + 1, n)
        k[self.rng.random(n) < self.p_off] = 0
        cut = self.rng.uniform(0.0, 0.3, n) if self.cuts and self.rng.random() < 0.5 else None
        return Decision(k, self.rng.integers(0, m, n), conf_cut=cut, prefill_draft=bool(self.rng.random() < 0.5),
                        prefill_drafter=int(self.rng.integers(-1, m + 1)))  # m: not a drafter (the default)

    def observe(self, outcome: StepOutcome) -> None:
        pass


class Recorder:
    """Wraps a policy and keeps every view, decision and outcome."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "recorder")
        self.views, self.decisions, self.outcomes = [], [], []
        if hasattr(inner, "prune"):
            self.prune = inner.prune

    def decide(self, view):
        d = self.inner.decide(view)
        self.views.append(view)
        self.decisions.append(d)
        return d

    def observe(self, outcome):
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


def run_schedule(engine: ReferenceEngine, schedule, check=None) -> dict[int, tuple[list[int], object]]:
    """Add requests at given steps and run to completion.

    ``schedule``: list of (step, key, prompt_ids, SamplingParams). Returns key -> (tokens, reason).
    ``check(engine)`` runs after every step.
    """
    pending = sorted(schedule, key=lambda x: x[0])
    rid_key, out = {}, {}
    step = 0
    while pending or engine.has_work():
        while pending and pending[0][0] <= step:
            _, key, prompt, params = pending.pop(0)
            rid_key[engine.add_request(prompt, params)] = key
        for o in engine.step():
            key = rid_key[o.request_id]
            toks, _ = out.get(key, ([], None))
            toks = toks + list(o.new_token_ids)
            out[key] = (toks, o.finish_reason if o.finished else None)
        if check is not None:
            check(engine)
        step += 1
        assert step < 10_000, "engine did not finish"
    return out


def plain_reference(loaded, prompts, params_list) -> list[list[int]]:
    """Each prompt alone through a non-speculative engine: the output speculation must reproduce."""
    eng = make_engine(loaded, max_batch=1)
    return [eng.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params_list, strict=True)]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, **kw)
