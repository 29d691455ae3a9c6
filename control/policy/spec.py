"""Policy names as users write them (CLI flags, plans, overrides, Triton parameters).

``none``, ``fixed:K``, ``smartspec``, ``turbospec``, ``specserve``, ``hf-heuristic``,
``static-schedule`` (optionally ``static-schedule:1=4,8=2,32=1`` or ``static-schedule:maxconc=16``),
``adaptive``, and ``oracle`` (simulator only: it needs the step's outcome in advance).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from control.errors import ConfigError

MAX_K_LIMIT = 16
NAMES = ("none", "fixed", "smartspec", "turbospec", "specserve", "hf-heuristic", "static-schedule", "adaptive", "oracle")
ACCEPTED = (
    "none, fixed:K (K = 0..16), smartspec, turbospec, specserve, hf-heuristic, "
    "static-schedule[:B=K,...|:maxconc=N], adaptive, oracle (simulator only)"
)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg}"

    @property
    def fixed_k(self) -> int:
        return int(self.arg) if self.name == "fixed" and self.arg is not None else 0


def parse_schedule_arg(arg: str) -> tuple[dict[int, int] | None, int | None]:
    """``1=4,8=2`` -> ({1: 4, 8: 2}, None); ``maxconc=16`` -> (None, 16)."""
    m = re.fullmatch(r"maxconc=(\d+)", arg)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise ConfigError(f"static-schedule:maxconc={n}: max_concurrency must be >= 1")
        return None, n
    sched: dict[int, int] = {}
    for part in arg.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*=\s*(\d+)\s*", part)
        if not m:
            raise ConfigError(
                f"static-schedule:{arg}: entry '{part}' is not BATCH=K; write e.g. static-schedule:1=4,8=2,32=1"
            )
        b, k = int(m.group(1)), int(m.group(2))
        if b < 1 or k > MAX_K_LIMIT:
            raise ConfigError(f"static-schedule:{arg}: batch size {b} must be >= 1 and k {k} <= {MAX_K_LIMIT}")
        sched[b] = k
    return dict(sorted(sched.items())), None


def parse_policy_spec(text: str) -> PolicySpec:
    """Parse and validate a policy name; ConfigError names the value and what is accepted."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"policy {text!r} is empty; accepted: {ACCEPTED}")
    text = text.strip()
    name, _, arg = text.partition(":")
    name = name.lower()
    if name not in NAMES:
        raise ConfigError(f"unknown policy '{text}'; accepted: {ACCEPTED}")
    if name == "fixed":
        if not re.fullmatch(r"\d+", arg or ""):
            raise ConfigError(f"policy '{text}': fixed needs a draft length, e.g. fixed:3 (K = 0..{MAX_K_LIMIT})")
        if int(arg) > MAX_K_LIMIT:
            raise ConfigError(f"policy '{text}': k = {arg} is above the limit {MAX_K_LIMIT}")
        return PolicySpec("fixed", str(int(arg)))
    if name == "static-schedule":
        if arg:
            parse_schedule_arg(arg)
            return PolicySpec(name, arg)
        return PolicySpec(name)
    if arg:
        raise ConfigError(f"policy '{text}': '{name}' takes no argument; accepted: {ACCEPTED}")
    return PolicySpec(name)
