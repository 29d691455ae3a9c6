"""``benchmarks/draft_step_price.py`` as documented: the quick pair's shapes timed both ways, side by
side, and two profiles of the template's drafters that differ only in how the drafts are priced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_two_profiles_that_price_the_drafts_two_ways(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "here"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "draft_step_price.py"), "--recipe", "quick",
                          "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("draft-tiny") >= 4  # three batches side by side and the fit line
    template = load_profile(ROOT / "profiles" / "cpu" / "stdlib-quick.yaml")
    engine, bare = load_profile(tmp_path / "here.yaml"), load_profile(tmp_path / "here-bare.yaml")
    for p in (engine, bare):
        assert p.pair == template.pair and p.acceptance == template.acceptance
        assert [d.name for d in p.drafters] == [d.name for d in template.drafters]
        assert p.models["target"] == engine.models["target"]  # one target fit, shared
    assert engine.environment["drafts"] == "engine draft steps" and bare.environment["drafts"] == "bare forwards"
    # separately fitted: at least one draft model's coefficients differ between the two
    assert any(engine.models[d] != bare.models[d] for d in ("draft-small", "draft-tiny"))


def test_a_bad_thread_count_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "draft_step_price.py"), "--out", str(tmp_path / "x"),
                          "--threads", "0"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--threads 0: must be >= 1" in run.stderr


def test_a_template_that_is_not_a_profile_is_refused_before_timing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("not: a profile\n")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "draft_step_price.py"), "--out", str(tmp_path / "x"),
                          "--template", str(bad)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--template: profile" in run.stderr and "schema" in run.stderr
    assert "Traceback" not in run.stderr and "side by side" not in run.stdout
