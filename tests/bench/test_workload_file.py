"""Your own traces: --workload FILE (JSONL / CSV) for specctl sim, with bad rows named by line, and
absolute --qps besides fractions of capacity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from control.bench.report import load_json
from control.bench.workloads import load_workload
from control.cli import main
from control.errors import ConfigError


def _jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_jsonl_with_arrivals_keeps_them_sorted(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", [{"arrival_s": 2.0, "input_tokens": 30, "output_tokens": 5},
                                      {"arrival_s": 0.5, "prompt": "x" * 40, "output_tokens": 7},
                                      {"arrival_s": 1.0, "input_tokens": 12, "output_tokens": 3}])
    w = load_workload(str(p))
    assert w.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert w.prompt_tokens.tolist() == [10, 12, 30] and w.output_tokens.tolist() == [7, 3, 5]


def test_csv_with_prompts_and_no_arrivals_gets_poisson_at_the_rate(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("prompt,output_tokens\n" + "".join(f"\"{'ab' * (i + 1)}, text\",{i + 2}\n" for i in range(200)))
    w = load_workload(str(p), rate=4.0, seed=1)
    assert w.n == 200 and sorted(w.output_tokens.tolist()) == list(range(2, 202))
    assert w.rate == pytest.approx(4.0, rel=0.25)
    assert np.all(np.diff(w.arrival_s) >= 0)


@pytest.mark.parametrize(("text", "suffix", "message"), [
    ('{"arrival_s": 0, "input_tokens": 3, "output_tokens": 2}\n{"arrival_s": 1, "input_tokens": 0, "output_tokens": 2}\n',
     ".jsonl", "line 2: input_tokens = 0"),
    ('{"arrival_s": 0, "input_tokens": 3, "output_tokens": 2}\nnot json\n', ".jsonl", "line 2 is not JSON"),
    ('{"input_tokens": 3, "output_tokens": 2, "arival_s": 3}\n', ".jsonl", "line 1: unknown field 'arival_s'"),
    ('{"input_tokens": 3}\n', ".jsonl", "line 1: needs output_tokens"),
    ('{"input_tokens": 3, "prompt": "x", "output_tokens": 1}\n', ".jsonl", "exactly one of input_tokens or prompt"),
    ("arrival_s,input_tokens,output_tokens\n0,4,2\nsoon,4,2\n", ".csv", "line 3: arrival_s = 'soon'"),
    ("arrival_s,input_tokens,output_tokens\n0,4,2\n,4,2\n", ".csv", "line 3: arrival_s is missing"),
    ("input_tokens,output_tokens\n4,2.5\n", ".csv", "line 2: output_tokens = '2.5'"),
    ("input_tokens,output_tokens\n", ".csv", "no requests"),
])
def test_bad_rows_are_named_by_line(tmp_path, text, suffix, message):
    p = tmp_path / f"bad{suffix}"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_workload(str(p))
    assert message in str(e.value) and str(p) in str(e.value)


def test_sim_takes_a_workload_file_and_absolute_qps(tmp_path, capsys):
    profile = tmp_path / "a100.yaml"
    assert main(["roofline", "--sku", "a100", "--target", "llama-2-7b", "--draft", "llama-160m", "--out", str(profile)]) == 0
    rng = np.random.default_rng(0)
    trace = _jsonl(tmp_path / "mine.jsonl", [{"input_tokens": int(rng.integers(50, 400)),
                                              "output_tokens": int(rng.integers(20, 120))} for _ in range(120)])
    js = tmp_path / "out.json"
    rc = main(["sim", "--profile", str(profile), "--workload", str(trace), "--qps", "1,4", "--policies", "none,fixed:3",
               "--seeds", "1", "--requests", "120", "--capacity", "8", "--json", str(js), "--report", str(tmp_path / "o.md")])
    assert rc == 0
    doc = load_json(js)
    assert sorted({r["load"] for r in doc["results"]}) == [0.125, 0.5]  # 1 and 4 req/s of capacity 8
    assert "1 req/s = 0.125" in capsys.readouterr().err
    assert main(["sim", "--profile", str(profile), "--workload", str(trace), "--qps", "100", "--capacity", "8",
                 "--policies", "none", "--json", str(js)]) != 0
    assert "--qps 100" in capsys.readouterr().err
