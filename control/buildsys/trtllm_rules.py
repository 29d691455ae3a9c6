"""TensorRT-LLM's rules, per release line, that our generated configs must obey.

Every rule names the TensorRT-LLM source it encodes. Two lines matter:

- ``1.2``: the last line on PyPI and the last with ``trtllm-build``, TensorRT engines and the Triton
  ``tensorrtllm`` C++ backend. Its dynamic draft length is "stage 1" (NVIDIA/TensorRT-LLM PR #8194,
  merged Oct 2025): two-model drafters only, and ``draft_len_schedule`` maps *lower bounds* to k.
- ``1.3``: PyTorch backend and LLM API only (engines, the C++ Executor and the Triton C++ backend
  were removed). Dynamic draft length reached the one-model path and the schedule's keys became
  *upper bounds* (PR #10860, merged Mar 2026).

Schedule semantics, as the sources implement them:

- 1.2, ``tensorrt_llm/_torch/speculative/drafter.py`` ``Drafter.get_draft_len_for_batch_size``:
  ``bisect_right`` over the sorted keys; a batch size uses the value of the *largest key <= it*; the
  last key's value holds for every larger batch. ``tensorrt_llm/llmapi/llm_args.py``
  ``DecodingBaseConfig.validate_draft_len_schedule_and_sort``: keys >= 1, values >= 0, key 1 is
  required and ``schedule[1] == max_draft_len``, every value <= max_draft_len.
- 1.3, ``tensorrt_llm/_torch/speculative/utils.py`` ``get_draft_len_for_batch_size``: ``bisect_left``;
  a batch size uses the value of the *first key >= it*; batch sizes above the last key run without
  speculation. ``llm_args.py``: keys >= 1, values >= 0, the *smallest* key's value equals
  max_draft_len, values <= max_draft_len; ``max_concurrency`` and ``draft_len_schedule`` are
  mutually exclusive (``validate_max_concurrency_and_draft_len_schedule_mutually_exclusive``), and
  setting a schedule turns on ``cuda_graph_config.enable_padding`` ("Automatically enabling
  cuda_graph_config.enable_padding because draft_len_schedule is set").

``control.plan.trtllm_schedule`` compiles the 1.3 form (our canonical one: {last batch of each run:
k}); ``to_line`` rewrites it for 1.2 and ``lookup`` evaluates either, so tests can prove that both
forms choose the same k at every batch size.

Known bug designed around (PR #16888, open when written): when a schedule or ``max_concurrency``
drives k to 0, one-model drafters (EAGLE3 one-model, MTP) stop refreshing their state and
acceptance collapses once speculation resumes. One-model schedules are compiled with
``one_model=True`` (never 0, last key = max batch size), and on the 1.2 line EAGLE3 runs two-model
(the only path with dynamic draft length there).

The acceptance-rate off switch (1.2: ``acceptance_window``/``acceptance_length_threshold``; renamed
by PR #12905 to ``acceptance_rate_window_size``/``acceptance_rate_threshold``) is one-way; we never
set it: our gate switches speculation off and back on with hysteresis.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from enum import Enum

from control.errors import ConfigError
from control.policyspec import MAX_K_LIMIT

LINES = ("1.2", "1.3")


class Method(str, Enum):
    draft_target = "draft_target"
    eagle3 = "eagle3"
    eagle = "eagle"  # EAGLE-1, TensorRT engines (examples/eagle)
    ngram = "ngram"
    mtp = "mtp"


# LLM API ``decoding_type`` per method (llm_args.py: DraftTargetDecodingConfig "Draft_Target",
# Eagle3DecodingConfig "Eagle3", NGramDecodingConfig "NGram", MTPDecodingConfig "MTP").
DECODING_TYPE = {
    Method.draft_target: "Draft_Target",
    Method.eagle3: "Eagle3",
    Method.ngram: "NGram",
    Method.mtp: "MTP",
}

# Which backend runs which method.
# - PyTorch: NGram/MTP/Draft_Target ``supports_backend`` is pytorch-only (llm_args.py); EAGLE-1 is an
#   engine-only model (tensorrt_llm/models/eagle).
# - TensorRT engines (1.2): draft-target through ``--speculative_decoding_mode draft_tokens_external``
#   (examples/draft_target_model/README.md); n-gram the same way, drafted by our BLS; EAGLE-1 through
#   examples/eagle/convert_checkpoint.py + ``--speculative_decoding_mode eagle`` (its README: "Only
#   EAGLE-1 is supported"). EAGLE3 and MTP have no engine path.
BACKEND_METHODS = {
    "pytorch": (Method.draft_target, Method.eagle3, Method.ngram, Method.mtp),
    "tensorrt": (Method.draft_target, Method.ngram, Method.eagle),
}

# Methods whose k can change per request per step under our control (BLS orchestrator on engines,
# the drafter hook on the LLM API). EAGLE-1 engines and one-model drafters decide inside the engine.
# On the LLM API the hook replaces TensorRT-LLM's drafter, so it serves only what we can draft in
# process (n-gram); draft-target keeps TensorRT-LLM's draft model and the compiled schedule.
PER_STEP_K = {"pytorch": (Method.ngram,), "tensorrt": (Method.draft_target, Method.ngram)}

# EAGLE-1 engine limits (examples/eagle/README.md: ``--max_draft_len 63 --num_eagle_layers 4``;
# tensorrt_llm/models/eagle/config.py caps num_eagle_layers at 4 in the versions read).
EAGLE1_MAX_DRAFT_LEN = 63
EAGLE1_MAX_LAYERS = 4


def max_draft_len_limit(method: Method, mtp_layers: int = 0) -> int:
    """The largest max_draft_len a method supports.

    MTP: ``MTPDecodingConfig.set_max_total_draft_tokens`` forces max_draft_len =
    num_nextn_predict_layers. EAGLE-1: the draft tree size (63 in the example). Chain drafters: our
    plans' limit (MAX_K_LIMIT); TensorRT-LLM only requires > 0.
    """
    if method == Method.mtp:
        return mtp_layers
    if method == Method.eagle:
        return EAGLE1_MAX_DRAFT_LEN
    return MAX_K_LIMIT


def check_line(line: str) -> str:
    if line not in LINES:
        raise ConfigError(f"TensorRT-LLM line '{line}' is not supported; accepted: {', '.join(LINES)}")
    return line


def one_model(method: Method, line: str) -> bool:
    """Whether the method runs as one model: EAGLE3 on 1.3 (``eagle3_one_model`` defaults to True),
    MTP always; on 1.2 we run EAGLE3 two-model so that its schedule is honoured."""
    if method == Method.mtp:
        return True
    return method == Method.eagle3 and line == "1.3"


# -- schedules ----------------------------------------------------------------------------------------

def lookup(schedule: dict[int, int], batch: int, line: str) -> int:
    """k that TensorRT-LLM of ``line`` runs at ``batch`` under ``schedule`` (see module docstring)."""
    keys = sorted(schedule)
    if line == "1.2":
        i = bisect_right(keys, batch)
        return schedule[keys[i - 1]] if i > 0 else 0
    i = bisect_left(keys, batch)
    return schedule[keys[i]] if i < len(keys) else 0


def to_line(canonical: dict[int, int], line: str) -> dict[int, int]:
    """Rewrite a canonical (1.3, upper-bound) schedule for ``line``.

    1.2 keys are lower bounds and key 1 is required: {e1: k1, e2: k2, .., en: kn} becomes
    {1: k1, e1 + 1: k2, .., e(n-1) + 1: kn, en + 1: 0}, which runs the same k at every batch size.
    """
    check_line(line)
    if line == "1.3" or not canonical:
        return dict(sorted(canonical.items()))
    ends = sorted(canonical)
    out = {1: canonical[ends[0]]}
    for prev, end in zip(ends, ends[1:], strict=False):
        out[prev + 1] = canonical[end]
    out[ends[-1] + 1] = 0
    return out


def validate_schedule(schedule: dict[int, int], max_draft_len: int, line: str) -> None:
    """TensorRT-LLM's validator for ``line``; ConfigError names the broken rule and its source."""
    check_line(line)
    src = "tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.validate_draft_len_schedule_and_sort"
    if not schedule:
        raise ConfigError(f"draft_len_schedule is empty ({src} needs at least one key)")
    for b, k in schedule.items():
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ConfigError(f"draft_len_schedule key {b!r}: batch size threshold must be an integer >= 1 ({src})")
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ConfigError(f"draft_len_schedule[{b}] = {k!r}: draft length must be an integer >= 0 ({src})")
        if k > max_draft_len:
            raise ConfigError(f"draft_len_schedule[{b}] = {k} exceeds max_draft_len = {max_draft_len} ({src})")
    if line == "1.2":
        if 1 not in schedule:
            raise ConfigError(f"draft_len_schedule {schedule} lacks batch size 1, which TensorRT-LLM 1.2 requires ({src})")
        if schedule[1] != max_draft_len:
            raise ConfigError(f"draft_len_schedule[1] = {schedule[1]} must equal max_draft_len = {max_draft_len} "
                              f"on TensorRT-LLM 1.2 ({src})")
    else:
        smallest = min(schedule)
        if schedule[smallest] != max_draft_len:
            raise ConfigError(f"draft_len_schedule[{smallest}] = {schedule[smallest]}: the smallest key's value must "
                              f"equal max_draft_len = {max_draft_len} ({src})")


def reaches_zero(schedule: dict[int, int], max_batch: int, line: str) -> bool:
    """Whether any batch size in 1..max_batch runs with k = 0 (the PR #16888 trigger)."""
    return any(lookup(schedule, b, line) == 0 for b in range(1, max_batch + 1))


def cuda_graph_batch_sizes(max_batch: int, schedule: dict[int, int]) -> list[int]:
    """Powers of two up to max_batch, max_batch itself and every schedule key <= max_batch.

    Keys go in so each (batch size, draft length) transition has a captured graph (the constraint
    PR #8703 proposed; with padding enabled a missing size pads up to the next captured one, which
    could cross a schedule boundary and run a k the plan did not choose).
    """
    sizes = {max_batch}
    b = 1
    while b < max_batch:
        sizes.add(b)
        b *= 2
    sizes.update(k for k in schedule if k <= max_batch)
    return sorted(sizes)
