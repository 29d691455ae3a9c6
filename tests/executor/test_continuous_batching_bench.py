"""benchmarks/continuous_batching.py on the tiny engine: policies with named drafters run, and the
model clock gives every repeat of a policy whose decisions ignore measured times the same number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
