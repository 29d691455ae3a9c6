import json

from control.cli import main


def test_explain_json_contract(tmp_path, capsys, profile):
    p = tmp_path / "p.yaml"
    profile.save(p)
    assert main(["explain", "--profile", str(p), "--batch", "8", "--ctx", "512", "--acceptance", "0.7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"best_k", "curve"}
    ks = [row["k"] for row in out["curve"]]
    assert ks == list(range(9))
    best = max((r for r in out["curve"] if r["feasible"]), key=lambda r: r["goodput_tok_s"])
    assert out["best_k"] == best["k"]


def test_bench_run_order_covers_every_run_and_rotates_the_policies():
    from collections import Counter

    from control.commands.bench import run_order

    pols = ["none", "fixed:3", "adaptive"]
    order = list(run_order([0.5, 1.0], pols, 3))
    assert Counter((load, pol) for _, load, pol in order) == {(ld, p): 3 for ld in (0.5, 1.0) for p in pols}
    assert [rep for rep, _, _ in order] == sorted(rep for rep, _, _ in order)  # repeats outermost
    for load in (0.5, 1.0):
        per_rep = [[p for r, ld, p in order if r == rep and ld == load] for rep in range(3)]
        assert {tuple(x) for x in per_rep} == {("none", "fixed:3", "adaptive"), ("fixed:3", "adaptive", "none"),
                                               ("adaptive", "none", "fixed:3")}
        assert {x[-1] for x in per_rep} == set(pols)  # each policy runs last once
