"""The llm model's control-plane token comes from an owner-only file, never from its config."""

import os

import pytest

from control.errors import ConfigError
from control.triton.repo import render_llm_repo, write_token_file
from control.triton.sender import ModelParams, read_token_file


def _config(**params):
    return {"parameters": {k: {"string_value": v} for k, v in {"engine_dir": "/e", **params}.items()}}


def test_a_token_in_the_config_is_refused_with_the_way_out():
    with pytest.raises(ConfigError, match="control_token: .*control_token_file"):
        ModelParams.from_config(_config(control_token="secret-0123456789abcdef"))


def test_the_token_file_must_be_owner_only_and_hold_one_token(tmp_path):
    path = write_token_file(tmp_path / "tok", "secret-0123456789abcdef")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert ModelParams.from_config(_config(control_token_file=str(path))).read_token() == "secret-0123456789abcdef"
    assert ModelParams.from_config(_config()).read_token() is None  # the agent falls back to SPECCTL_TOKEN
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="mode 644 lets others read it"):
        read_token_file(str(path))
    bad = tmp_path / "two"
    bad.write_text("two tokens\n")
    os.chmod(bad, 0o600)
    with pytest.raises(ConfigError, match="one token"):
        read_token_file(str(bad))
    with pytest.raises(ConfigError, match="cannot read it"):
        read_token_file(str(tmp_path / "missing"))


def test_the_rendered_config_names_the_file_not_the_token(tmp_path):
    token = "secret-0123456789abcdef"
    path = write_token_file(tmp_path / "control-token", token)
    repo = render_llm_repo(tmp_path / "repo", engine_dir=tmp_path, profile=None, control_url="http://127.0.0.1:1",
                           control_token_file=path)
    text = (repo / "llm" / "config.pbtxt").read_text()
    assert token not in text and str(path.resolve()) in text
