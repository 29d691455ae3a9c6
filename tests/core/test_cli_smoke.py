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
