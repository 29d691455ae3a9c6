"""The TensorRT-LLM release specctl targets, and the check that the installed one is it.

``PINNED`` is the release ``specctl build`` generates for by default and records in what it writes
(``specctl.yaml``: ``trtllm_version``). 1.2.1 is the last release a user can install; the 1.3 line
is a moving pre-release (1.3.0rc0 onwards renamed config fields, gave draft-target a one-engine mode
and retired the host n-gram drafter), so no 1.3 rc is offered until one is named here after its
source has been read (its ``draft_len_schedule`` lookup, its ``Drafter`` constructor, its perf
metrics).

``SUPPORTED`` maps each release we generate for to its schedule semantics (``LINE`` of
``control.buildsys.trtllm_rules``). The upstream names each release's adapters rely on are listed,
with the upstream file each came from, in ``contract/trtllm-<version>.json`` beside this module.
"""

from __future__ import annotations

import json
from pathlib import Path

from control.errors import ConfigError

PINNED = "1.2.1"
SUPPORTED: dict[str, str] = {PINNED: "1.2"}  # release -> schedule semantics (trtllm_rules line)
CONTRACT_DIR = Path(__file__).with_name("contract")


def check_version(version: str) -> str:
    """``version`` if specctl generates for it, else ConfigError listing the releases it does."""
    if version not in SUPPORTED:
        raise ConfigError(f"TensorRT-LLM {version!r} is not a release specctl generates for; accepted: "
                          f"{', '.join(SUPPORTED)} (1.3 pre-releases are not pinned: see docs/gpu.md)")
    return version


def line_of(version: str) -> str:
    """The schedule semantics (``1.2`` or ``1.3``) of a supported release."""
    return SUPPORTED[check_version(version)]


def require_release(needed: str, what: str):
    """The installed ``tensorrt_llm`` module if it is release ``needed``; otherwise MissingDependencyError
    (not installed) or ConfigError naming the installed and the needed release (one line each)."""
    from control.executors.trtllm import require_tensorrt_llm

    trtllm = require_tensorrt_llm(what)
    require_installed(str(getattr(trtllm, "__version__", "unknown")), needed, what)
    return trtllm


def require_installed(installed: str, needed: str, what: str) -> None:
    """Refuse to run ``what`` built for ``needed`` on another installed TensorRT-LLM (one line)."""
    if installed != needed:
        raise ConfigError(f"{what} was built for TensorRT-LLM {needed} but {installed} is installed: install "
                          f"tensorrt_llm=={needed} (or its NGC container), or rebuild the deployment with "
                          f"`specctl build` for the installed release")


def contract_path(version: str) -> Path:
    return CONTRACT_DIR / f"trtllm-{check_version(version)}.json"


def load_contract(version: str) -> dict:
    """The upstream names the adapters rely on for ``version`` (see scripts/derive_trtllm_contract.py)."""
    return json.loads(contract_path(version).read_text())
