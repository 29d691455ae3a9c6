"""TensorRT-LLM's ``draft_len_schedule`` (batch size -> k): its rules, its lookup, and the compact
form a k-per-batch-size array compresses to.

The rules, as TensorRT-LLM enforces them (``tensorrt_llm/llmapi/llm_args.py``,
``DecodingBaseConfig.validate_draft_len_schedule_and_sort``; lookup in
``tensorrt_llm/_torch/speculative/utils.py``, ``get_draft_len_for_batch_size``): keys >= 1; values
>= 0 and <= max_draft_len; the smallest key's value equals max_draft_len; a batch size uses the value
of the first key >= it; batch sizes above the last key run without speculation.
``control.plan.compile.trtllm_schedule`` chooses the schedule a plan compiles to.
"""

from __future__ import annotations

import numpy as np

from control.errors import ConfigError


def validate_trtllm_schedule(schedule: dict[int, int], max_draft_len: int) -> None:
    """Check a draft_len_schedule against TensorRT-LLM's rules; ConfigError names the broken rule."""
    if not schedule:
        raise ConfigError("draft_len_schedule is empty; it needs at least {1: max_draft_len}")
    for b, k in schedule.items():
        if not isinstance(b, int | np.integer) or b < 1:
            raise ConfigError(f"draft_len_schedule: batch size key {b!r} must be an integer >= 1")
        if not isinstance(k, int | np.integer) or k < 0:
            raise ConfigError(f"draft_len_schedule[{b}] = {k!r}: draft length must be an integer >= 0")
        if k > max_draft_len:
            raise ConfigError(f"draft_len_schedule[{b}] = {k} exceeds max_draft_len = {max_draft_len}")
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise ConfigError(
            f"draft_len_schedule[{smallest}] = {schedule[smallest]}: the smallest key's value must equal max_draft_len = {max_draft_len}"
        )


def schedule_lookup(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's lookup: the value of the first key >= batch; 0 above the last key."""
    keys = sorted(schedule)
    i = int(np.searchsorted(keys, batch, side="left"))
    return schedule[keys[i]] if i < len(keys) else 0


def compress_schedule(k_per_batch: np.ndarray) -> dict[int, int]:
    """Breakpoints of k(batch), batch = 1..len: {last batch of each run: its k}; trailing zeros dropped."""
    k = np.asarray(k_per_batch, dtype=np.int64)
    nz = np.flatnonzero(k > 0)
    if nz.size == 0:
        return {}
    k = k[: nz[-1] + 1]
    ends = np.flatnonzero(np.diff(k) != 0)
    keys = np.append(ends, k.size - 1)
    return {int(i) + 1: int(k[i]) for i in keys}
