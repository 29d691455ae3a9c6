"""specctl roofline and specctl sim through the CLI: outputs, schema, determinism, errors."""

from __future__ import annotations

import json

import pytest

from control.bench.report import load_json
from control.cli import main
from control.profile import load_profile


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "a100.yaml"
    assert main(["roofline", "--sku", "a100", "--target", "llama-2-7b", "--draft", "llama-160m", "--out", str(out)]) == 0
    return out


def _sim(profile_path, tmp_path, tag, seeds="2", extra=(), policies="none,fixed:3,adaptive,oracle"):
    js = tmp_path / f"{tag}.json"
    md = tmp_path / f"{tag}.md"
    rc = main(["sim", "--profile", str(profile_path), "--workload", "poisson:in=lognormal:200:100,out=lognormal:100:50",
               "--loads", "0.3,0.9", "--policies", policies, "--seeds", seeds, "--requests", "150",
               "--json", str(js), "--report", str(md), *extra])
    assert rc == 0
    return js, md


def test_roofline_cli_writes_a_profile(profile_path):
    p = load_profile(profile_path)
    assert p.source == "roofline" and p.pair == "llama-2-7b+llama-160m"


def test_sim_writes_schema_report_and_plots_and_is_deterministic(profile_path, tmp_path, capsys):
    js, md = _sim(profile_path, tmp_path, "a")
    doc = load_json(js)
    assert len(doc["results"]) == 2 * 2 * 4  # loads x seeds x policies
    keys = {"policy", "load", "seed", "mean_latency_s", "p50_latency_s", "p99_latency_s", "ttft_s", "tpot_s",
            "goodput_tok_s", "slo_attainment", "acceptance_rate", "spec_step_share"}
    assert all(set(r) == keys for r in doc["results"])
    text = md.read_text()
    assert "against the bar" in text and "k distribution" in text
    assert (tmp_path / "a-latency.png").stat().st_size > 1000 and (tmp_path / "a-series.png").stat().st_size > 1000
    err = capsys.readouterr().err
    assert "no-speculation capacity" in err
    # captured output is no terminal: the progress is plain lines (a start and the last of 16 runs)
    assert "simulating: started (16 steps)" in err and "simulating: 16/16, " in err
    # run again without the oracle: it is the best of its own runs and fixed k's, and takes most of the time
    js2, _ = _sim(profile_path, tmp_path, "b", policies="none,fixed:3,adaptive")
    again = json.loads(js2.read_text())["results"]
    assert again == [r for r in doc["results"] if r["policy"] != "oracle"] and len(again) == 2 * 2 * 3


@pytest.mark.parametrize("argv,match", [
    (["--loads", "0.5,x"], "load 'x' is not a number"),
    (["--loads", "0"], "must be in (0, 10]"),
    (["--policies", "fixed:3,magic"], "unknown policy 'magic'"),
    (["--workload", "nope"], "unknown workload 'nope'"),
    (["--profile", "missing.yaml"], "does not exist"),
    (["--acceptance", "llama-7b=0.5"], "acceptance override for 'llama-7b': not a drafter of this run; drafters: llama-160m"),
])
def test_sim_bad_input_is_one_line(profile_path, capsys, argv, match):
    base = {"--profile": str(profile_path), "--workload": "poisson", "--loads": "0.5", "--policies": "none"}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    try:  # argparse rejects bad argument types itself (SystemExit 2); the rest returns 2
        rc = main(["sim", *[x for kv in base.items() for x in kv], "--requests", "20"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert match in err[-1] and "Traceback" not in "\n".join(err)
