"""Bad input to `specctl explain` and `specctl plan`: non-zero exit, one clear line, no traceback."""

import json
import subprocess
import sys

import pytest
import yaml

from control.cli import main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "control", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def good(tmp_path, profile):
    p = tmp_path / "good.yaml"
    profile.save(p)
    return p


def _bad_profile(tmp_path, profile, mutate):
    d = yaml.safe_load(profile.to_yaml())
    mutate(d)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


BASE = ["--batch", "4", "--ctx", "100", "--acceptance", "0.5"]


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"),
    ("schema", "schema"),
    ("negative", "a_ms_per_ctx_token"),
    ("nan", "c_ms"),
    ("notyaml", "not valid YAML"),
])
def test_bad_profiles_give_one_line(tmp_path, profile, case, needle):
    if case == "missing":
        path = tmp_path / "nope.yaml"
    elif case == "notyaml":
        path = tmp_path / "x.yaml"
        path.write_text("schema: [unclosed\n")
    else:
        mut = {
            "schema": lambda d: d.update(schema="specctl.profile/v9"),
            "negative": lambda d: d["models"]["target"].update(a_ms_per_ctx_token=-0.1),
            "nan": lambda d: d["models"]["target"].update(c_ms=float("nan")),
        }[case]
        path = _bad_profile(tmp_path, profile, mut)
    for cmd in (["explain", "--profile", str(path), *BASE], ["plan", "--profile", str(path)]):
        r = _run(*cmd)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--acceptance", "1.0"], "[0, 1)"),
    (["--acceptance", "-0.1"], "[0, 1)"),
    (["--acceptance", "nan"], "[0, 1)"),
    (["--max-k", "-1"], "0..16"),
    (["--batch", "0"], ">= 1"),
    (["--ctx", "abc"], "integer"),
    (["--slo-tpot-ms", "-5"], "> 0"),
    (["--drafter", "nope"], "drafter 'nope'"),
])
def test_bad_values_give_one_line(good, args, needle, capsys):
    base = dict(zip(BASE[::2], BASE[1::2], strict=True))
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    flat = [x for kv in base.items() for x in kv]
    try:
        rc = main(["explain", "--profile", str(good), *flat])
    except SystemExit as e:  # argparse rejects the value before the command runs
        rc = e.code
    err = capsys.readouterr().err
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def test_plan_outputs(good, capsys):
    assert main(["plan", "--profile", str(good), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schema"] == "specctl.plan/v1" and plan["policy"] == "adaptive"
    assert main(["plan", "--profile", str(good), "--trtllm-schedule", "--max-k", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    sched = {int(k): v for k, v in out["draft_len_schedule"].items()}
    assert sched[min(sched)] == out["max_draft_len"] <= 5
    assert main(["plan", "--profile", str(good), "--policy", "bogus"]) == 2
    assert "unknown policy 'bogus'" in capsys.readouterr().err


def test_build_refuses_an_engine_directory_it_cannot_create_before_training(tmp_path):
    """Found by hand: an unwritable --out failed only at the save step, after the whole build."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = _run("build", "--sku", "cpu", "--quick", "--out", str(blocker / "engines"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be created" in lines[0] and "is a file" in lines[0], r.stderr


@pytest.mark.parametrize("argv, flag", [
    (["sim", "--profile", "{good}", "--workload", "poisson", "--qps", "1", "--policies", "none", "--json", "{out}"], "--json"),
    (["sim", "--profile", "{good}", "--workload", "poisson", "--qps", "1", "--policies", "none", "--report", "{out}"],
     "--report"),
    (["plan", "--profile", "{good}", "--out", "{out}"], "--out"),
    (["roofline", "--sku", "h100", "--target", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--out", "{out}"], "--out"),
    (["record-acceptance", "--engine-dir", "{tmp}", "--out", "{out}"], "--out"),
    (["bench", "--url", "127.0.0.1:1", "--json", "{out}"], "--json"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, good, capsys, argv, flag):
    """Found by hand: `sim --json` and `record-acceptance --out` in a folder that cannot be written ran
    their whole job, then ended in an internal error."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for out, words in ((blocker / "x.out", f"cannot create its folder ('{blocker}' is a file)"), (tmp_path, "is a folder; give a file name in it")):
        args = [a.format(good=good, out=out, tmp=tmp_path) for a in argv]
        with pytest.raises(SystemExit) as e:  # argparse refuses it before the command runs
            main(args)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: " in err and words in err and "internal error" not in err, err


def test_bench_without_a_server_names_the_http_endpoint_it_derived(capsys):
    assert main(["bench", "--url", "127.0.0.1:1", "--loads", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Triton at http://127.0.0.1:8000" in err and "pass --http-url" in err, err
    assert main(["bench", "--url", "127.0.0.1:1", "--http-url", "http://127.0.0.1:1", "--loads", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Triton at http://127.0.0.1:1" in err and "pass --http-url" not in err, err


def test_serve_refuses_two_listeners_on_one_port_before_starting(quick_engines, tmp_path, capsys):
    """Found by hand: --http-port and --grpc-port alike ended in an internal error (BadStatusLine) mid-start."""
    rc = main(["serve", "--engine-dir", str(quick_engines), "--run-dir", str(tmp_path / "run"),
               "--http-port", "18599", "--grpc-port", "0", "--metrics-port", "18599"])
    err = capsys.readouterr().err
    assert rc == 2 and "--http-port and --metrics-port are both 18599" in err, err
    assert not (tmp_path / "run").exists()  # nothing was rendered or started


def test_bench_turns_a_policy_naming_a_drafter_into_the_drafters_option(capsys):
    """The replay tools' POLICY@DRAFTER is not a bench policy: the error says which option does it."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--url", "127.0.0.1:1", "--policies", "fixed:3,fixed:6@draft-tiny+ngram"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "give 'fixed:6' and --drafters draft-tiny,ngram" in err and "internal error" not in err, err
