"""Argument types that reject bad values with a message naming the value and what is accepted."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from control.policyspec import DEFAULT_MAX_K, MAX_K_LIMIT


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be an integer >= 1")
    return v


def nonnegative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be an integer >= 0")
    return v


def output_file(text: str) -> str:
    """A file the command will write when its work is done: checked before the work, so a long run does
    not end in an error. Its folder is created; it must be writable, and the path not a folder."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("the file name is empty")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name in it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((a for a in path.parents if a.exists() and not a.is_dir()), None)
        why = f"'{blocker}' is a file" if blocker is not None else e.strerror
        raise argparse.ArgumentTypeError(f"{text!r}: cannot create its folder ({why}); "
                                         "give a path in a writable folder") from None
    if path.exists():
        if not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable; give a path in a writable folder")
        return text
    try:  # a trial file: permission bits alone do not say (a root user, a special file system)
        path.open("x").close()
        path.unlink()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write there ({e.strerror}); "
                                         "give a path in a writable folder") from None
    return text


ON_OFF = {"on": True, "off": False}


def on_off(text: str) -> bool:
    """``on`` or ``off`` (any case) as a bool."""
    v = ON_OFF.get(text.strip().lower())
    if v is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(ON_OFF)}")
    return v


AUTO = "auto"


def on_off_auto(text: str) -> bool | None:
    """``on``, ``off`` or ``auto`` (any case) as True, False or None (auto: the program decides)."""
    if text.strip().lower() == AUTO:
        return None
    if text.strip().lower() not in ON_OFF:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join([*ON_OFF, AUTO])}")
    return on_off(text)


def port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {text!r} is not an integer in 1..65535") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} must be in 1..65535")
    return v


def k_value(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer draft length in 0..{MAX_K_LIMIT}") from None
    if not 0 <= v <= MAX_K_LIMIT:
        raise argparse.ArgumentTypeError(f"draft length {v} must be in 0..{MAX_K_LIMIT}")
    return v


def add_max_k(p: argparse.ArgumentParser) -> None:
    """``--max-k``: the largest draft length, DEFAULT_MAX_K unless given."""
    p.add_argument("--max-k", type=k_value, default=DEFAULT_MAX_K, help=f"largest draft length (default {DEFAULT_MAX_K})")


def acceptance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"acceptance {text!r} is not a number in [0, 1)") from None
    if not (math.isfinite(v) and 0.0 <= v < 1.0):
        raise argparse.ArgumentTypeError(f"acceptance {text} must be in [0, 1)")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return v


def quantile(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"quantile {text!r} is not a number in [0.5, 1)") from None
    if not (0.5 <= v < 1.0):
        raise argparse.ArgumentTypeError(f"quantile {text} must be in [0.5, 1)")
    return v
