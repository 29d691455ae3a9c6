"""`specctl build` input errors: one line naming the value and what is accepted, nothing written."""

import pytest

from control.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["--sku", "h100"], "--recipe"),
    (["--sku", "h900"], "unknown GPU SKU 'h900'"),
    ([], "--recipe FILE"),
    (["--sku", "cpu", "--seed", "-3"], "seed -3 must be an integer >= 0"),
    (["--sku", "cpu", "--seed", "abc"], "seed 'abc'"),
    (["--sku", "cpu", "--threads", "0"], "must be an integer >= 1"),
    (["--sku", "cpu", "--quick", "--corpus", "NOPE"], "--corpus"),
    (["--sku", "cpu", "--quick", "--out", "USERDIR"], "not an engine directory"),
    (["--sku", "cpu", "--quick", "--out", "FILE"], "is a file"),
])
def test_bad_build_input(argv, needle, tmp_path, capsys):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep")
    (tmp_path / "f").write_text("x")
    subs = {"NOPE": str(tmp_path / "nope"), "USERDIR": str(user), "FILE": str(tmp_path / "f")}
    argv = [subs.get(a, a) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert _run(["build", *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()
    assert (user / "notes.txt").read_text() == "keep" and sorted(p.name for p in user.iterdir()) == ["notes.txt"]


def test_existing_engines_need_force(quick_engines, capsys):
    before = sorted(p.name for p in quick_engines.iterdir())
    assert _run(["build", "--sku", "cpu", "--quick", "--out", str(quick_engines)]) != 0
    assert "--force" in capsys.readouterr().err
    assert sorted(p.name for p in quick_engines.iterdir()) == before


def _run(argv) -> int:
    """main()'s exit status; argparse reports bad argument values by exiting."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)
