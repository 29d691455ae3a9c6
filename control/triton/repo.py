"""Render ``triton_repo/`` for one deployment: the ``llm`` model with its parameters filled in, and
the ``ensemble`` / ``tensorrt_llm_bls`` models that take tensorrtllm_backend's batched shapes and
forward to it (``control/triton/forward_model.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from string import Template

from control.errors import ConfigError
from control.policyspec import DEFAULT_MAX_K

TEMPLATES = Path(__file__).resolve().parents[2] / "triton_repo"
ALIASES = ("ensemble", "tensorrt_llm_bls")  # tensorrtllm_backend's model names
ALIAS_MAX_BATCH = 64  # rows in one batched request to an alias (forward_model.MAX_ROWS)


def _param(key: str, value: object) -> str:
    v = str(value)
    if any(c in v for c in '"\\\n'):
        raise ConfigError(f"model parameter {key} = {v!r}: quotes, backslashes and newlines are not allowed")
    return f'parameters: {{ key: "{key}" value: {{ string_value: "{v}" }} }}'


def _alias_config(llm_template: str, name: str, decoupled: bool) -> str:
    """The llm config's inputs and outputs with a batch dimension, a batch_index output, no parameters."""
    text = Template(llm_template).substitute(instances=1, parameters="", decoupled=str(decoupled).lower())
    edits = [('name: "llm"', f'name: "{name}"'), ("max_batch_size: 0", f"max_batch_size: {ALIAS_MAX_BATCH}"),
             ("output [\n", 'output [\n  { name: "batch_index" data_type: TYPE_INT32 dims: [ 1 ] },\n')]
    for old, new in edits:
        if text.count(old) != 1:
            raise ConfigError(f"triton_repo/llm/config.pbtxt.in no longer has '{old.strip()}' once; "
                              "update control/triton/repo.py")
        text = text.replace(old, new)
    return f"# Rendered by specctl from triton_repo/llm/config.pbtxt.in: forwards each batch row to llm.\n{text}"


def render_llm_repo(out: Path, *, engine_dir: Path, profile: Path | None, policy: str = "adaptive",
                    control_url: str = "", control_token_file: Path | None = None, max_k: int = DEFAULT_MAX_K, max_batch: int = 32,
                    max_tokens: int = 1024, instances: int = 1, threads: int = 1, drafter: str = "",
                    overlap_policy: bool = False, decoupled: bool = True, drain_file: Path | None = None,
                    templates: Path = TEMPLATES) -> Path:
    """Write ``out/llm/{config.pbtxt,1/model.py}`` and the aliases; returns ``out`` (the model repository).
    ``drain_file``: where the deployment will ask the model to end its requests before stopping.

    The config names the file holding the control-plane token (``write_token_file``), never the token:
    Triton shows a model's config to any client. It is still written owner-only (it holds paths).
    """
    if instances < 1:
        raise ConfigError(f"instances = {instances}: must be >= 1")
    params = {"executor": "reference", "engine_dir": Path(engine_dir).resolve(),
              "profile": Path(profile).resolve() if profile else "", "policy": policy, "max_k": max_k,
              "max_batch": max_batch, "max_tokens": max_tokens, "threads": threads, "control_url": control_url,
              "control_token_file": Path(control_token_file).resolve() if control_token_file else "", "drafter": drafter,
              "overlap_policy": str(bool(overlap_policy)).lower(),
              "drain_file": Path(drain_file).resolve() if drain_file else ""}
    return render_llm_model(out, params, instances=instances, decoupled=decoupled, templates=templates)


def render_llm_model(out: Path, params: dict[str, object], *, instances: int = 1, decoupled: bool = True,
                     templates: Path = TEMPLATES) -> Path:
    """Write the ``llm`` model and its aliases with these model ``params`` (any executor's:
    ``control.triton.sender.ModelParams``); returns ``out``."""
    src = templates / "llm"
    if not (src / "config.pbtxt.in").is_file():
        raise ConfigError(f"{src} has no config.pbtxt.in; the project's triton_repo/ templates are missing")
    template = (src / "config.pbtxt.in").read_text()
    text = Template(template).substitute(
        instances=instances, decoupled=str(decoupled).lower(),
        parameters="\n".join(_param(k, v) for k, v in params.items()))
    _write_model(out / "llm", text, src / "1" / "model.py")
    for name in ALIASES:
        _write_model(out / name, _alias_config(template, name, decoupled), templates / "forward" / "1" / "model.py")
    return out


def _write_model(model: Path, config: str, model_py: Path) -> None:
    if model.exists():
        shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    shutil.copyfile(model_py, model / "1" / "model.py")
    fd = os.open(model / "config.pbtxt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable by its owner only (created 0600, never world-readable)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path
