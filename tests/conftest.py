"""Shared fixtures. Test areas live in subpackages (tests/core, tests/executor, tests/sim, ...).

Synthetic profiles with known coefficients are for tests only; real profiles come from
`specctl profile` and `specctl roofline`."""

from __future__ import annotations

import pytest

from control.profile import parse_profile


def make_profile(target=(2.0e-5, 0.02, 6.0), draft=(2.5e-6, 0.003, 1.0), ngram_ms=0.2, acceptance=None,
                 max_batch=256, resid=0.0, **limits):
    a, b, c = target
    da, db, dc = draft
    doc = {
        "schema": "specctl.profile/v1",
        "sku": "test",
        "pair": "target+draft",
        "source": "roofline",
        "models": {
            "target": {"a_ms_per_ctx_token": a, "b_ms_per_batched_token": b, "c_ms": c, "resid_std_ms": resid},
            "draft": {"a_ms_per_ctx_token": da, "b_ms_per_batched_token": db, "c_ms": dc},
        },
        "drafters": [
            {"name": "draft", "kind": "draft_model", "model": "draft"},
            {"name": "ngram", "kind": "ngram", "cost_ms": ngram_ms, "confidences": False},
        ],
        "acceptance": acceptance or {"draft": 0.7, "ngram": 0.4},
        "limits": {"max_batch": max_batch, **limits},
    }
    return parse_profile(doc)


@pytest.fixture
def profile():
    return make_profile()


@pytest.fixture(scope="session")
def tiny_engine_dir(tmp_path_factory):
    """A tiny engine directory (random Llama target, two drafts, n-gram; tokenizer trained in process),
    in the layout of control/executors/manifest.py. Built once per session in about a second."""
    from tests.executor.tiny import build_tiny_engine_dir

    return build_tiny_engine_dir(tmp_path_factory.mktemp("engines") / "cpu")
