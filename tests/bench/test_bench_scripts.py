"""The simulator-bar scripts run as documented (``python benchmarks/<script>.py``) from any directory,
without the project on PYTHONPATH, and turn a real sweep's JSON into the sim-results tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from control.bench import report
from control.bench.simrun import SimSetup, sweep
from control.bench.workloads import load_workload
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _load_script(name: str, monkeypatch):
    """A benchmark script imported as a module (registered in sys.modules for the test's length, where
    its dataclasses look their module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("bar")
    w = load_workload("poisson:in=lognormal:200:100,out=lognormal:60:30", requests=40, rate=1.0)
    res = sweep(SimSetup(make_profile(), w), [0.5, 1.0], ["none", "fixed:3", "adaptive", "oracle"], [0, 1],
                requests=40)
    path = report.write_json(out / "tiny.json", res.rows, {"pair": "test", "profile": "synthetic", "workload": "poisson",
                                                           "capacity_req_s": res.capacity_req_s, "requests_per_run": 40,
                                                           "seeds": 2})
    return path, res.rows


def test_sim_bar_starts_outside_the_repo(tmp_path):
    r = _script("sim_bar.py", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--length-scale" in r.stdout


def test_sim_results_md_summarises_a_sweep(bench_json, tmp_path):
    path, rows = bench_json
    r = _script("sim_results_md.py", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    verdicts, _ = report.bar_check(rows)
    # the bar table printed for the doc is the one bar_check computes from the same rows
    for v in verdicts:
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"| {v['load']:g} | "))  # bar table comes first
        assert line.rstrip().endswith("| pass |" if v["pass"] else "| MISS |")
    assert "Goodput relative to the oracle" in r.stdout and "Adaptive / best fixed k per seed: 0.5:" in r.stdout


def test_merge_bench_json_replaces_one_policy(bench_json, tmp_path):
    path, rows = bench_json
    over = [dict(r, mean_latency_s=r["mean_latency_s"] * 2) for r in rows if r["policy"] == "adaptive"]
    over_path = report.write_json(tmp_path / "over.json", over, {"rerun": "adaptive"})
    out = tmp_path / "merged.json"
    r = _script("merge_bench_json.py", str(path), str(over_path), str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = report.load_json(out)
    merged = {(x["policy"], x["load"], x["seed"]): x["mean_latency_s"] for x in doc["results"]}
    orig = {(x["policy"], x["load"], x["seed"]): x["mean_latency_s"] for x in rows}
    assert merged.keys() == orig.keys()
    for key, v in orig.items():
        assert merged[key] == pytest.approx(v * 2 if key[0] == "adaptive" else v)
    assert json.loads(out.read_text())["meta"]["rerun"]["policies"] == ["adaptive"]


def test_sim_results_md_summary_counts_the_passing_loads(bench_json, tmp_path):
    path, rows = bench_json
    r = _script("sim_results_md.py", "--summary", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    verdicts, _ = report.bar_check(rows)
    line = next(x for x in r.stdout.splitlines() if x.startswith("| tiny |"))
    assert line.split("|")[2].strip() == f"{sum(v['pass'] for v in verdicts)}/{len(verdicts)}"
    worst = max(v["vs_best"] for v in verdicts)
    assert line.split("|")[3].strip().startswith(f"{worst:.3f}")


def test_bar_check_reports_a_paired_interval_of_ours_over_the_best(bench_json):
    _, rows = bench_json
    from scipy.stats import t as student_t

    # ours = best fixed x (1.10, 0.90) on seeds (0, 1): a geometric mean of sqrt(0.99) and an interval
    # that is the t-interval of the two log ratios, wide enough to hold both sides of 1
    ratio = {0: 1.10, 1: 0.90}
    best = {}
    for r in rows:
        if r["policy"] == "fixed:3":
            best[(r["load"], r["seed"])] = r["mean_latency_s"]
    moved = [dict(r, mean_latency_s=best[(r["load"], r["seed"])] * ratio[r["seed"]]) if r["policy"] == "adaptive"
             else dict(r, mean_latency_s=r["mean_latency_s"] * (3.0 if r["policy"] in ("none", "oracle") else 1.0))
             for r in rows]
    verdicts, table = report.bar_check(moved)
    logs = np.log([1.10, 0.90])
    half = student_t.ppf(0.975, 1) * logs.std(ddof=1) / np.sqrt(2)
    for v in verdicts:
        assert v["best_fixed"] == "fixed:3"
        assert v["vs_best_ci"] == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
        assert v["vs_best_ci"][0] < 1.0 < v["vs_best_ci"][1]
    assert "paired 95% CI" in table.splitlines()[0]
    # the same ratio on every seed: no spread, a point interval at that ratio
    same = [dict(r, mean_latency_s=best[(r["load"], r["seed"])] * 1.05) if r["policy"] == "adaptive" else r
            for r in moved]
    for v in report.bar_check(same)[0]:
        assert v["vs_best_ci"] == pytest.approx((1.05, 1.05)) and not v["pass"]
    assert report.paired_ratio(moved, 0.5, "adaptive", "no-such-policy") is None


def test_validation_scripts_print_the_paper_tables(tmp_path):
    """The crossover validations run as documented from outside the repo and print their verdicts."""
    r = _script("validate_turbospec_tables.py", "--requests", "60", "--rows", "h100x4-70b-sonnet", "--extra", "adaptive",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| h100x4-70b-sonnet | k=7 | 14.5 |" in r.stdout
    assert "turbospec / best static, simulator | adaptive / best static, simulator |" in r.stdout
    assert "| h100x4-70b-sonnet | 16 | 1.020 |" in r.stdout  # the paper's TurboSpec / best static
    assert "crossover within 25%:" in r.stdout and "of the 4 cells where the paper crosses" in r.stdout
    r = _script("validate_turbospec_tables.py", "--extra", "nope", cwd=tmp_path)
    assert r.returncode != 0 and "--extra 'nope': unknown policy 'nope'" in r.stderr
    r = _script("validate_turbospec_tables.py", "--rows", "nope", cwd=tmp_path)
    assert r.returncode != 0 and "--rows: unknown nope" in r.stderr
    for flag in ("--requests", "--seeds"):
        r = _script("validate_turbospec_tables.py", flag, "0", cwd=tmp_path)
        assert r.returncode != 0 and f"{flag} 0: give a whole number >= 1" in r.stderr and "Traceback" not in r.stderr
    for bad, says in ((("--framework", "nope"), "unknown framework 'nope'"), (("--rates", "4,x"), "--rates '4,x'")):
        r = _script("validate_smartspec_fig1.py", *bad, cwd=tmp_path)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _script("validate_smartspec_fig1.py", "--requests", "60", "--seeds", "1", "--rates", "4,16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"fixed:5"' in r.stdout.splitlines()[-1]
    r = _script("validate_smartspec_fig11.py", "--panels", "c", "--requests", "40", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| c | vicuna-7b TP1 + llama-160m, spider | 32 |" in r.stdout
    assert "- `smartspec`: within 3% of the best static configuration or better in" in r.stdout
    for bad, says in ((("--panels", "c,z"), "--panels 'c,z'"), (("--framework", "nope"), "unknown framework 'nope'"),
                      (("--acceptance", "1.5"), "--acceptance 1.5")):
        r = _script("validate_smartspec_fig11.py", *bad, cwd=tmp_path)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_turbospec_split_draft_prepares_every_pass_on_the_host_only_where_the_target_is_split(monkeypatch):
    mod = _load_script("validate_turbospec_tables", monkeypatch)
    from control.buildsys.roofline import get_framework

    fw = get_framework("vllm-0.6")
    rows = {r.key: r for r in mod.ROWS}
    split = {key: mod.row_framework(fw, row, "split").draft_host_prep for key, row in rows.items()}
    assert split["h100x4-70b-sonnet"] and split["h100x2-33b-sharegpt"]
    assert not split["l40s-7b-sharegpt"] and not split["l40s-13b-sonnet"]
    assert mod.row_framework(fw, rows["h100x4-70b-sonnet"], "framework") is fw


def test_turbospec_row_holds_when_most_of_its_crossovers_agree(monkeypatch):
    mod = _load_script("validate_turbospec_tables", monkeypatch)
    paper = {"k=1": 10.0, "k=3": 12.0, "k=5": None, "k=7": 8.0}
    # k=1 within 25%, k=5 neither crosses, k=7 within 25%, k=3 out of range: three of four agree
    sim = {"k=1": 11.0, "k=3": 20.0, "k=5": None, "k=7": 6.5}
    assert mod.row_holds({"crossover_paper": paper, "crossover_sim": sim})
    half = dict(sim, **{"k=5": 4.0})  # the simulator crosses where the paper never does: two of four
    assert not mod.row_holds({"crossover_paper": paper, "crossover_sim": half})
    row = mod.ROWS[0]
    text = mod.markdown([(row, {lab: [1.0] * len(row.qps) for lab in (*mod.LABELS, mod.TS)},
                          {"crossover_paper": paper, "crossover_sim": sim, "ranking": []})])
    assert f"rows whose crossovers agree in most cells (within 25%, or neither crossing): 1 of 1: {row.key}" in text


def test_steady_bar_reads_the_best_fixed_k_and_the_crossover(tmp_path, monkeypatch):
    assert _script("steady_bar.py", "--help", cwd=tmp_path).returncode == 0
    mod = _load_script("steady_bar", monkeypatch)
    lat = {0.5: {"none": 2.0, "fixed:1": 1.5, "fixed:2": 1.6, "adaptive": 1.52},
           0.9: {"none": 5.0, "fixed:1": 5.2, "fixed:2": 5.9, "adaptive": 5.2}}
    rows = [{"policy": p, "load": load, "seed": s, "mean_latency_s": v + 0.01 * s}
            for load, d in lat.items() for p, v in d.items() for s in (0, 1)]
    low, high = mod.bar_rows(rows, [0.5, 0.9], [1, 2], [])
    assert (low["best_k"], low["past_crossover"], low["ok"]) == (1, False, True)
    assert low["vs_best"] == pytest.approx(1.525 / 1.505)
    # past the crossover (none is the best fixed k): adaptive 4% over none misses
    assert (high["best_k"], high["past_crossover"], high["ok"]) == (0, True, False)
    assert "**miss**" in mod.markdown("t", 10.0, [low, high], [])


def test_long_context_recording_records_each_decode_step_of_a_run(monkeypatch):
    """``benchmarks/sim_long_context.run_recording`` (behind sim_switch_off.py's runs) wraps
    ``simrun.make_policy`` whatever arguments it takes, and records every decode step's contexts and k."""
    from control.bench import simrun
    from control.bench.workloads import poisson

    mod = _load_script("sim_long_context", monkeypatch)
    w = poisson(40, 4.0, "lognormal:600:200", "32", seed=1)
    setup = SimSetup(make_profile(), w)
    steps: list[int] = []
    before = simrun.make_policy
    res, ctx, k = mod.run_recording(setup, w, "fixed:2", 0, steps=steps)
    assert simrun.make_policy is before and ctx.size == k.size == sum(steps) > 0
    assert (k == 2).mean() > 0.5 and res.output_tokens.sum() == w.output_tokens.sum()
