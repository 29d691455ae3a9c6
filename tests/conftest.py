"""Shared fixtures. Test areas mirror control/'s packages (tests/policy, tests/executors/reference, ...).

Synthetic profiles with known coefficients are for tests only; real profiles come from
`specctl profile` and `specctl roofline`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from filelock import FileLock

from control.profile import parse_profile

# Idle OpenMP threads sleep instead of spinning; spinning threads slow every process on a shared
# machine down several-fold. Takes effect only if set before torch loads (conftest runs first).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def make_profile(target=(2.0e-5, 0.02, 6.0), draft=(2.5e-6, 0.003, 1.0), ngram_ms=0.2, acceptance=None,
                 max_batch=256, resid=0.0, **limits):
    a, b, c = target
    da, db, dc, *dd = draft  # (a, b, c[, d]): d the draft's per-request term per pass
    doc = {
        "schema": "specctl.profile/v1",
        "sku": "test",
        "pair": "target+draft",
        "source": "roofline",
        "models": {
            "target": {"a_ms_per_ctx_token": a, "b_ms_per_batched_token": b, "c_ms": c, "resid_std_ms": resid},
            "draft": {"a_ms_per_ctx_token": da, "b_ms_per_batched_token": db, "c_ms": dc,
                      "d_ms_per_request": dd[0] if dd else 0.0},
        },
        "drafters": [
            {"name": "draft", "kind": "draft_model", "model": "draft"},
            {"name": "ngram", "kind": "ngram", "cost_ms": ngram_ms, "confidences": False},
        ],
        "acceptance": acceptance or {"draft": 0.7, "ngram": 0.4},
        "limits": {"max_batch": max_batch, **limits},
    }
    return parse_profile(doc)


class Observing:
    """A policy that hands every outcome to ``see`` before the wrapped policy learns it (for tests that
    count what a policy did without changing it)."""

    def __init__(self, inner, see) -> None:
        self.inner = inner
        self.name = inner.name
        self.see = see

    def decide(self, view):
        return self.inner.decide(view)

    def observe(self, outcome) -> None:
        self.see(outcome)
        self.inner.observe(outcome)


def late_share_on(record, clock, policy: str, batch: int, drafter: str, **kw) -> tuple[float, float]:
    """Replay ``policy`` (``replay_run``'s keywords in ``kw``) and return its tokens per second and the
    share of the drafting request-steps in the second half of its steps that drafted on ``drafter``."""
    from control.bench.replay import replay_run, tokens_per_s

    d = record.drafters.index(drafter)
    outcomes = []  # (drafter (n,), drafted (n,) bool) per step

    def see(outcome):
        outcomes.append((outcome.drafter.copy(), outcome.verified > 0))

    got = tokens_per_s(replay_run(record, clock, policy, batch, wrap=lambda p: Observing(p, see), **kw))
    half = outcomes[len(outcomes) // 2:]
    on = sum(int(((dr == d) & spec).sum()) for dr, spec in half)
    drafted = sum(int(spec.sum()) for _, spec in half)
    return got, on / max(drafted, 1)


# What a failing test that used the live deployment shows of it: the servers' logs, so a failure in
# CI (where the run directory is gone afterwards) carries its cause with it.
SERVER_LOGS = ("tritonserver.log", "control-plane.log", "frontend.log")
LOG_TAIL_LINES = 120


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    dep = item.funcargs.get("deployment") if report.failed and hasattr(item, "funcargs") else None
    run_dir = getattr(dep, "run_dir", None)
    for name in SERVER_LOGS if run_dir is not None else ():
        log = Path(run_dir) / name
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"{name}, last {len(tail)} lines", "\n".join(tail)))
    return report


@pytest.fixture
def profile():
    return make_profile()


@pytest.fixture(scope="session")
def tiny_engine_dir(tmp_path_factory):
    """A tiny engine directory (random Llama target, two drafts, n-gram; tokenizer trained in process),
    in the layout of control/executors/manifest.py. Built once per session in about a second."""
    from tests.executors.reference.tiny import build_tiny_engine_dir

    return build_tiny_engine_dir(tmp_path_factory.mktemp("engines") / "cpu")


@pytest.fixture(scope="session")
def quick_engines(tmp_path_factory) -> Path:
    """The quick CPU pair (`specctl build --sku cpu --quick`, seed 0), built once per test session.

    Set SPECCTL_QUICK_ENGINES=DIR to keep it between sessions: an existing build there is reused,
    otherwise it is built there.
    """
    from control.buildsys.cpu.pair import build_cpu_pair
    from control.buildsys.cpu.recipe import QUICK
    from control.executors.manifest import load_manifest

    env = os.environ.get("SPECCTL_QUICK_ENGINES")
    out = Path(env) if env else _session_root(tmp_path_factory) / "quick-engines" / "cpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / ".build.lock")):  # pytest-xdist's workers build it once between them
        if (out / "manifest.json").is_file():
            load_manifest(out)
            return out
        build_cpu_pair(out, QUICK, seed=0)
    return out


def _session_root(tmp_path_factory) -> Path:
    """The temporary directory all of this run's pytest-xdist workers share (this session's own
    without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
