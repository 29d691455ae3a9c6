"""Policy names as users write them (CLI flags, plans, overrides, Triton parameters).

``none``, ``fixed:K``, ``smartspec``, ``turbospec``, ``specserve``, ``hf-heuristic``,
``static-schedule`` (optionally ``static-schedule:1=4,8=2,32=1`` or ``static-schedule:maxconc=16``),
``adaptive``, and ``oracle`` (simulator only: it needs the step's outcome in advance).

Numbers in a spec are ASCII digits only, at most ``MAX_DIGITS`` of them; batch sizes are at most
``MAX_BATCH_LIMIT`` and a schedule has at most ``MAX_SCHEDULE_ENTRIES`` entries, so parsing and the
policies built from a spec stay small whatever the text. ``check_policy_bounds`` narrows those limits
to one deployment (its K and its max batch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from control.errors import ConfigError

MAX_K_LIMIT = 16
DEFAULT_MAX_K = 8  # K when a plan, command or deployment names none
MAX_BATCH_LIMIT = 65536  # the largest batch size a spec may name (any real deployment is far below)
MAX_DIGITS = 6  # digits in one number of a spec; enough for MAX_BATCH_LIMIT
MAX_SCHEDULE_ENTRIES = 64
MAX_SPEC_CHARS = 1024
NAMES = ("none", "fixed", "smartspec", "turbospec", "specserve", "hf-heuristic", "static-schedule", "adaptive", "oracle")
ACCEPTED = (
    f"none, fixed:K (K = 0..{MAX_K_LIMIT}), smartspec, turbospec, specserve, hf-heuristic, "
    "static-schedule[:B=K,...|:maxconc=N], adaptive, oracle (simulator only)"
)
_NUMBER = f"[0-9]{{1,{MAX_DIGITS}}}"  # ASCII only: \d would also take other scripts' digits


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg}"

    @property
    def fixed_k(self) -> int:
        return int(self.arg) if self.name == "fixed" and self.arg is not None else 0


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def parse_schedule_arg(arg: str) -> tuple[dict[int, int] | None, int | None]:
    """``1=4,8=2`` -> ({1: 4, 8: 2}, None); ``maxconc=16`` -> (None, 16)."""
    if arg.startswith("maxconc="):
        value = arg[len("maxconc="):]
        if not re.fullmatch(_NUMBER, value):
            raise ConfigError(f"static-schedule:maxconc={_short(value)}: max_concurrency must be an integer "
                              f"in 1..{MAX_BATCH_LIMIT} (ASCII digits)")
        n = int(value)
        if not 1 <= n <= MAX_BATCH_LIMIT:
            raise ConfigError(f"static-schedule:maxconc={n}: max_concurrency must be in 1..{MAX_BATCH_LIMIT}")
        return None, n
    parts = arg.split(",")
    if len(parts) > MAX_SCHEDULE_ENTRIES:
        raise ConfigError(f"static-schedule: {len(parts)} entries; at most {MAX_SCHEDULE_ENTRIES} are accepted")
    sched: dict[int, int] = {}
    for part in parts:
        m = re.fullmatch(rf"\s*({_NUMBER})\s*=\s*({_NUMBER})\s*", part)
        if not m:
            raise ConfigError(f"static-schedule:{_short(arg)}: entry '{_short(part)}' is not BATCH=K (ASCII digits, "
                              f"batch 1..{MAX_BATCH_LIMIT}, k 0..{MAX_K_LIMIT}); write e.g. static-schedule:1=4,8=2,32=1")
        b, k = int(m.group(1)), int(m.group(2))
        if not (1 <= b <= MAX_BATCH_LIMIT and k <= MAX_K_LIMIT):
            raise ConfigError(f"static-schedule:{_short(arg)}: batch size {b} must be in 1..{MAX_BATCH_LIMIT} "
                              f"and k {k} <= {MAX_K_LIMIT}")
        sched[b] = k
    return dict(sorted(sched.items())), None


def parse_policy_spec(text: str) -> PolicySpec:
    """Parse and validate a policy name; ConfigError names the value and what is accepted."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"policy {text!r} is empty; accepted: {ACCEPTED}")
    if len(text) > MAX_SPEC_CHARS:
        raise ConfigError(f"policy '{_short(text)}' is longer than {MAX_SPEC_CHARS} characters; accepted: {ACCEPTED}")
    text = text.strip()
    if "@" in text:  # the replay tools' POLICY@DRAFTER shorthand is not a policy name
        raise ConfigError(f"policy '{_short(text)}': a policy names no drafter; give '{_short(text.partition('@')[0])}' "
                          "and choose drafters apart from it (a plan's or override's 'drafters' and 'default_drafter')")
    name, _, arg = text.partition(":")
    name = name.lower()
    if name not in NAMES:
        raise ConfigError(f"unknown policy '{_short(text)}'; accepted: {ACCEPTED}")
    if name == "fixed":
        if not re.fullmatch(_NUMBER, arg or ""):
            raise ConfigError(f"policy '{_short(text)}': fixed needs a draft length in ASCII digits, e.g. fixed:3 "
                              f"(K = 0..{MAX_K_LIMIT})")
        if int(arg) > MAX_K_LIMIT:
            raise ConfigError(f"policy '{text}': k = {arg} is above the limit {MAX_K_LIMIT}")
        return PolicySpec("fixed", str(int(arg)))
    if name == "static-schedule":
        if arg:
            parse_schedule_arg(arg)
            return PolicySpec(name, arg)
        return PolicySpec(name)
    if arg:
        raise ConfigError(f"policy '{_short(text)}': '{name}' takes no argument; accepted: {ACCEPTED}")
    return PolicySpec(name)


def check_policy_bounds(spec: PolicySpec | str, *, max_k: int, max_batch: int, where: str = "policy") -> None:
    """Refuse a spec one deployment cannot run: k above its ``max_k`` or a batch size above its ``max_batch``.

    ConfigError names the value and the deployment's limit.
    """
    ps = parse_policy_spec(spec) if isinstance(spec, str) else spec
    if ps.name == "fixed" and ps.fixed_k > max_k:
        raise ConfigError(f"{where} '{ps}': k = {ps.fixed_k} is above this deployment's max_k = {max_k}")
    if ps.name != "static-schedule" or not ps.arg:
        return
    sched, maxconc = parse_schedule_arg(ps.arg)
    if maxconc is not None and maxconc > max_batch:
        raise ConfigError(f"{where} '{ps}': max_concurrency {maxconc} is above this deployment's max batch "
                          f"{max_batch}; use 1..{max_batch}")
    for b, k in (sched or {}).items():
        if b > max_batch:
            raise ConfigError(f"{where} '{_short(str(ps))}': batch size {b} is above this deployment's max batch "
                              f"{max_batch}; use 1..{max_batch}")
        if k > max_k:
            raise ConfigError(f"{where} '{_short(str(ps))}': k = {k} at batch {b} is above this deployment's "
                              f"max_k = {max_k}")
