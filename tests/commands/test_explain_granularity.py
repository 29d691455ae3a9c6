"""``specctl explain`` on deployments rendered by ``specctl build``: the verification granularity of
the deployment's TensorRT-LLM path, and a verify cost that follows it (issue 18 item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from control.cli import main
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


def _deploy(tmp_path, recipe: str, backend: str) -> Path:
    out = tmp_path / f"{recipe}-{backend}"
    assert main(["build", "--recipe", str(ROOT / "build" / "recipes" / f"{recipe}.yaml"), "--backend", backend,
                 "--dry-run", "--out", str(out)]) == 0
    return out


def _explain(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["explain", "--batch", "32", "--ctx", "1024", "--acceptance", "0.3", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_ngram_hook_deployment_verifies_the_padded_max_k(tmp_path, capsys):
    hook = _deploy(tmp_path, "h100-llama3.1-8b-ngram", "pytorch")
    out = _explain(capsys, "--deployment", str(hook))
    assert out["verify"] == "padded:4:always" and "drafter hook" in out["path"]
    rows = out["curve"]
    assert [r["k"] for r in rows] == [0, 1, 2, 3, 4]
    assert {r["verified_tokens"] for r in rows} == {5}
    assert len({r["verify_ms"] for r in rows}) == 1  # the same verify cost at every k: that of K + 1 tokens
    assert out["best_k"] == 4 and "padded to the static max K = 4" in out["why"]
    # priced per request, the same profile would pick a small k and under-count every k's verify cost
    naive = _explain(capsys, "--deployment", str(hook), "--verify", "per_request")
    assert naive["best_k"] < 4
    assert [r["verified_tokens"] for r in naive["curve"]] == [1, 2, 3, 4, 5]
    assert all(a["verify_ms"] < rows[0]["verify_ms"] for a in naive["curve"][:-1])


def test_bls_deployment_verifies_per_request(tmp_path, capsys):
    bls = _deploy(tmp_path, "h100-llama3.1-8b-ngram", "tensorrt")
    out = _explain(capsys, "--deployment", str(bls))
    assert out["verify"] == "per_request" and "num_draft_tokens" in out["path"]
    assert [r["verified_tokens"] for r in out["curve"]] == [1, 2, 3, 4, 5]


def test_explain_table_names_the_granularity(tmp_path, capsys):
    hook = _deploy(tmp_path, "h100-llama3.1-8b-ngram", "pytorch")
    capsys.readouterr()
    assert main(["explain", "--deployment", str(hook), "--batch", "8", "--ctx", "512", "--acceptance", "0.6"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "path: LLM API with the user-provided drafter hook" in text
    assert "every request verifies 5 tokens at every step whatever its k" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--verify", "padded:2", "--max-k", "3"], "--max-k 3 is above the padded K = 2"),
    (["--verify", "tree"], "verify granularity 'tree' is not one of"),
    (["--deployment", "nowhere"], "--deployment nowhere: no specctl.yaml there"),
    (None, "needs --profile FILE or --deployment DIR"),
])
def test_explain_refuses_what_cannot_be(tmp_path, capsys, args, message):
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(make_profile().to_dict()))
    given = [] if args is None else ["--profile", str(prof), *args]
    assert main(["explain", "--batch", "4", "--ctx", "64", "--acceptance", "0.5", *given]) == 2
    assert message in capsys.readouterr().err
