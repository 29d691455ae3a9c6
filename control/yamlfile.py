"""Reading a YAML file a user wrote (a recipe, a profile), with one-line errors that name it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from control.errors import ConfigError


def read_yaml_file(path: Path, kind: str, missing_hint: str) -> Any:
    """The parsed YAML at ``path``; ConfigError naming the ``kind`` of file, the path and the line
    of a syntax error, or ``missing_hint`` (what to do) when the file does not exist."""
    if not path.is_file():
        raise ConfigError(f"{kind} '{path}' does not exist; {missing_hint}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{kind} '{path}' is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
