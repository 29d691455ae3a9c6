"""``specctl generate``: the JSON contract, lossless output through the CLI, and one-line errors."""

from __future__ import annotations

import json

import pytest

from control.cli import main
from tests.executors.reference.conftest import tiny_profile


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("profiles") / "tiny.yaml"
    tiny_profile(("draft-small", "draft-tiny", "ngram")).save(p)
    return str(p)


def generate(capsys, engine_dir, *extra):
    rc = main(["generate", "--executor", "reference", "--engine-dir", str(engine_dir), "--prompt", "def fibonacci(n):",
               "--max-tokens", "24", "--threads", "1", *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize(("policy", "drafter"), [("fixed:3", "draft-small"), ("fixed:5", "ngram"), ("adaptive", "draft-small"),
                                                 ("specserve", "draft-tiny")])
def test_json_contract_and_lossless(capsys, tiny_engine_dir, profile_file, policy, drafter):
    rc, out, _ = generate(capsys, tiny_engine_dir, "--policy", "none", "--json")
    assert rc == 0
    plain = json.loads(out)
    rc, out, _ = generate(capsys, tiny_engine_dir, "--policy", policy, "--drafter", drafter, "--profile", profile_file, "--json")
    assert rc == 0
    spec = json.loads(out)
    assert set(spec) == {"text", "token_ids", "stats"}
    assert set(spec["stats"]) == {"steps", "drafted", "accepted", "acceptance_rate", "draft_ms", "verify_ms"}
    assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    assert len(spec["token_ids"]) == 24
    st = spec["stats"]
    assert st["drafted"] > 0 and 0 <= st["accepted"] <= st["drafted"]
    assert st["acceptance_rate"] == pytest.approx(st["accepted"] / st["drafted"], abs=1e-4)
    assert st["steps"] < plain["stats"]["steps"] or st["accepted"] == 0
    assert plain["stats"]["drafted"] == 0 and plain["stats"]["steps"] == 24


def test_without_a_profile_measures_one(capsys, tiny_engine_dir):
    rc, out, err = generate(capsys, tiny_engine_dir, "--policy", "fixed:2", "--drafter", "draft-small", "--json")
    assert rc == 0
    assert json.loads(out)["stats"]["drafted"] > 0


def test_human_output_streams_text(capsys, tiny_engine_dir, profile_file):
    rc, out, err = generate(capsys, tiny_engine_dir, "--policy", "fixed:2", "--profile", profile_file)
    assert rc == 0 and out.strip()
    assert "drafted" in err and "policy fixed:2" in err


def test_sampling_is_reproducible_with_a_seed(capsys, tiny_engine_dir, profile_file):
    runs = [json.loads(generate(capsys, tiny_engine_dir, "--policy", "fixed:3", "--profile", profile_file,
                                "--temperature", "0.8", "--top-p", "0.9", "--seed", str(s), "--json")[1])
            for s in (3, 3, 4)]
    assert runs[0]["token_ids"] == runs[1]["token_ids"] != runs[2]["token_ids"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "bogus"], "unknown policy 'bogus'"),
    (["--policy", "oracle"], "only inside the simulator"),
    (["--drafter", "nope"], "--drafter nope: not in this engine"),
    (["--max-tokens", "250"], "exceeds the engine's max sequence length 256"),
    (["--temperature", "-1"], "temperature = -1.0"),
    (["--top-p", "1.5"], "top_p = 1.5"),
    (["--device", "cuda:7"], "CUDA is not available"),
])
def test_bad_input_is_one_line(capsys, tiny_engine_dir, profile_file, extra, message):
    rc, out, err = generate(capsys, tiny_engine_dir, "--profile", profile_file, *extra)
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_engine_dir_and_empty_prompt(capsys, tmp_path, tiny_engine_dir):
    assert main(["generate", "--engine-dir", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--engine-dir", str(tiny_engine_dir), "--prompt", ""]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--engine-dir", str(tiny_engine_dir), "--prompt", "x", "--max-tokens", "0"])
    assert "must be an integer >= 1" in capsys.readouterr().err


def test_ignore_eos_is_taken_and_changes_nothing_before_an_end_token(capsys, tiny_engine_dir):
    """The flag reaches the engine (the end token it skips is tested through Triton with end_id:
    tests/e2e/test_generate.py); the tiny model never ends early, so the output is the same."""
    rc, out, _ = generate(capsys, tiny_engine_dir, "--policy", "none", "--json", "--max-tokens", "90")
    assert rc == 0
    free = json.loads(out)["token_ids"]
    rc, out, _ = generate(capsys, tiny_engine_dir, "--policy", "none", "--json", "--max-tokens", "90", "--ignore-eos")
    assert rc == 0
    assert json.loads(out)["token_ids"] == free and len(free) == 90
