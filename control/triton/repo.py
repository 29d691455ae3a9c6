"""Render ``triton_repo/`` for one deployment: the ``llm`` model with its parameters filled in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from string import Template

from control.errors import ConfigError

TEMPLATES = Path(__file__).resolve().parents[2] / "triton_repo"


def _param(key: str, value: object) -> str:
    v = str(value)
    if any(c in v for c in '"\\\n'):
        raise ConfigError(f"model parameter {key} = {v!r}: quotes, backslashes and newlines are not allowed")
    return f'parameters: {{ key: "{key}" value: {{ string_value: "{v}" }} }}'


def render_llm_repo(out: Path, *, engine_dir: Path, profile: Path | None, policy: str = "adaptive",
                    control_url: str = "", control_token_file: Path | None = None, max_k: int = 8, max_batch: int = 32,
                    max_tokens: int = 1024, instances: int = 1, threads: int = 1, drafter: str = "",
                    templates: Path = TEMPLATES) -> Path:
    """Write ``out/llm/{config.pbtxt,1/model.py}``; returns ``out`` (the model repository).

    The config names the file holding the control-plane token (``write_token_file``), never the token:
    Triton shows a model's config to any client. It is still written owner-only (it holds paths).
    """
    if instances < 1:
        raise ConfigError(f"instances = {instances}: must be >= 1")
    src = templates / "llm"
    if not (src / "config.pbtxt.in").is_file():
        raise ConfigError(f"{src} has no config.pbtxt.in; the project's triton_repo/ templates are missing")
    params = {"executor": "reference", "engine_dir": Path(engine_dir).resolve(),
              "profile": Path(profile).resolve() if profile else "", "policy": policy, "max_k": max_k,
              "max_batch": max_batch, "max_tokens": max_tokens, "threads": threads, "control_url": control_url,
              "control_token_file": Path(control_token_file).resolve() if control_token_file else "", "drafter": drafter}
    text = Template((src / "config.pbtxt.in").read_text()).substitute(
        instances=instances, parameters="\n".join(_param(k, v) for k, v in params.items()))
    model = out / "llm"
    if model.exists():
        shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    shutil.copyfile(src / "1" / "model.py", model / "1" / "model.py")
    cfg = model / "config.pbtxt"
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return out


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable by its owner only (created 0600, never world-readable)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path
