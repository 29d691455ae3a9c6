"""The LLM API adapter (TensorRT-LLM PyTorch backend) behind the executor contract.

- build: ``LLM(model, **options)`` from the ``llm_api_options.yaml`` that ``specctl build`` wrote;
  ``speculative_config`` becomes the matching ``*DecodingConfig`` (or, with ``control:
  drafter-hook``, a ``UserProvidedDecodingConfig`` around our per-iteration drafter);
- streaming generation: ``generate_async(..., streaming=True)`` yields token deltas; sampling
  parameters are validated here (one-line errors naming the value) before TensorRT-LLM sees them;
- per-request speculation metrics: ``SamplingParams(return_perf_metrics=True)`` makes
  ``output.request_perf_metrics.speculative_decoding`` carry acceptance_rate,
  total_accepted_draft_tokens and total_draft_tokens, which go to the controller's telemetry; the
  PyTorch flow of the pinned 1.2.1 returns them zeroed (filled from PR #17082 on), so where they are
  zero the outcome is estimated from ``avg_decoded_tokens_per_iter`` and ``decoding_iter``;
- iteration stats: ``enable_iter_perf_stats`` in the options and ``LLM.get_stats``.

Import-guarded: building an ``LlmApiExecutor`` without TensorRT-LLM raises MissingDependencyError.

TensorRT-LLM names used (read in its sources): ``LLM.generate_async(inputs, sampling_params,
streaming=True)`` returns a ``RequestOutput`` (``tensorrt_llm/llmapi/llm.py``) that is an async
iterator over its own updates, with ``request_id``, ``outputs[0].token_ids`` (cumulative),
``outputs[0].finish_reason``, ``outputs[0].request_perf_metrics``, ``finished`` and ``abort()``
(``tensorrt_llm/executor/result.py``: ``GenerationResult.abort`` -> ``abort_request``);
``LLM.tokenizer`` (``encode`` / ``decode``, ``tensorrt_llm/llmapi/tokenizer.py``);
``SamplingParams`` fields (``tensorrt_llm/sampling_params.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from control.errors import ConfigError, SpecctlError
from control.executors.trtllm.version import PINNED, require_release

# decoding_type -> TensorRT-LLM config class (tensorrt_llm/llmapi/llm_args.py)
DECODING_CLASSES = {"Draft_Target": "DraftTargetDecodingConfig", "Eagle3": "Eagle3DecodingConfig",
                    "NGram": "NGramDecodingConfig", "MTP": "MTPDecodingConfig"}
NESTED_CLASSES = {"kv_cache_config": "KvCacheConfig", "cuda_graph_config": "CudaGraphConfig"}


@dataclass(frozen=True, slots=True)
class SpecMetrics:
    """Per-request speculation outcome, as TensorRT-LLM reports it at the end of a request.

    ``source``: ``totals`` (``request_perf_metrics.speculative_decoding``) or ``per-iteration``
    (estimated from ``avg_decoded_tokens_per_iter`` where the release returns zero totals)."""

    drafted: int
    accepted: int
    source: str = "totals"

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def _totals(output: Any) -> SpecMetrics | None:
    for holder in (output, *getattr(output, "outputs", ())):
        perf = getattr(holder, "request_perf_metrics", None)
        sd = getattr(perf, "speculative_decoding", None) if perf is not None else None
        if sd is not None:
            return SpecMetrics(int(getattr(sd, "total_draft_tokens", 0) or 0),
                               int(getattr(sd, "total_accepted_draft_tokens", 0) or 0))
    return None


def per_iteration_metrics(avg_tokens_per_iter: float | None, iterations: int | None, max_k: int) -> SpecMetrics | None:
    """A request's speculation from ``RequestOutput.avg_decoded_tokens_per_iter`` and ``decoding_iter``
    (``tensorrt_llm/executor/result.py`` sets both from every response).

    Each iteration yields one target token plus the drafts it accepted, so accepted = (avg - 1) *
    iterations. Every iteration's draft is padded to the static maximum (``Drafter
    .pad_draft_tokens_for_cuda_graph``), so the target verified ``max_k`` positions per iteration:
    drafted = iterations * max_k, which under-states the rate where a schedule drafted fewer.
    None without speculation (``max_k`` 0) or without the two numbers.
    """
    if not avg_tokens_per_iter or not iterations or max_k <= 0:
        return None
    iters = int(iterations)
    drafted = iters * int(max_k)
    accepted = min(max(int(round((float(avg_tokens_per_iter) - 1.0) * iters)), 0), drafted)
    return SpecMetrics(drafted, accepted, "per-iteration")


def spec_metrics(output: Any, max_k: int = 0) -> SpecMetrics | None:
    """Read a RequestOutput's speculation: ``request_perf_metrics.speculative_decoding`` totals where they
    are filled; where they are zero (the PyTorch flow on 1.2.x, before TensorRT-LLM PR #17082) or
    absent, the per-iteration estimate; None when the request asked for no perf metrics and carries
    no per-iteration numbers, or did not speculate."""
    totals = _totals(output)
    if totals is not None and totals.drafted > 0:
        return totals
    est = per_iteration_metrics(getattr(output, "avg_decoded_tokens_per_iter", None),
                                getattr(output, "decoding_iter", None), max_k)
    return est if est is not None else totals


def chain_positions(drafted: int, accepted: int, steps: int, max_k: int) -> tuple[list[int], list[int]]:
    """Per-position chain statistics (``position_trials``, ``position_accepted``) for a request that
    drafted ``drafted`` and had ``accepted`` of them accepted over ``steps`` decode steps.

    TensorRT-LLM reports only a request's totals. They are spread over ``s`` speculative steps of
    ``k`` = round(drafted / steps) tokens (s = ceil(drafted / k)) under the single-rate chain model
    (DESIGN.md section 4): the rate ``a`` solves s * (a + a^2 + ... + a^k) = accepted, position j is
    tried s * a^(j-1) times and accepted s * a^j times. The totals are kept (up to rounding); how
    acceptance falls along the draft is the model's, not measured.
    """
    if drafted <= 0:
        return [], []
    accepted = min(max(int(accepted), 0), int(drafted))
    steps = max(int(steps), 1)
    k = int(min(max(round(drafted / steps), 1), max(int(max_k), 1)))
    s = -(-int(drafted) // k)
    target = min(accepted / s, float(k))
    lo, hi = 0.0, 1.0
    powers = np.arange(1, k + 1)
    for _ in range(48):  # sum of a^j is increasing in a on [0, 1]: bisect
        mid = 0.5 * (lo + hi)
        if float(np.sum(mid ** powers)) < target:
            lo = mid
        else:
            hi = mid
    a = 0.5 * (lo + hi)
    acc = [min(int(round(s * a ** j)), s) for j in range(1, k + 1)]
    for j in range(1, k):  # a position is tried only after the previous one was accepted
        acc[j] = min(acc[j], acc[j - 1])
    trials = [s, *acc[:-1]]
    return trials, acc


def sampling_kwargs(max_tokens, temperature=None, top_k=None, top_p=None, seed=None, end_id=None,
                    stop_token_ids=None, stop=None, bad=None, ignore_eos=False) -> dict[str, Any]:
    """Validated keyword arguments for TensorRT-LLM's ``SamplingParams``; SpecctlError names the bad value.

    Greedy (temperature 0 or not given) is sent as ``top_k=1``, which every TensorRT-LLM line treats
    as greedy (``SamplingParams._greedy_decoding`` in ``tensorrt_llm/sampling_params.py``: top_k in
    (None, 1) and top_p in (None, 0)); temperature, top_k > 0 and top_p < 1 are sent only when
    sampling. ``stop`` / ``bad`` are strings TensorRT-LLM tokenizes itself (``SamplingParams._setup``);
    the stop string stays in the output (``include_stop_str_in_output``), as on the reference path.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise SpecctlError(f"max_tokens = {max_tokens!r}: must be an integer >= 1")
    kw: dict[str, Any] = {"max_tokens": max_tokens, "return_perf_metrics": True}
    if temperature is not None and not (isinstance(temperature, int | float) and not isinstance(temperature, bool)
                                        and math.isfinite(temperature) and temperature >= 0):
        raise SpecctlError(f"temperature = {temperature!r}: must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0):
        raise SpecctlError(f"top_k = {top_k!r}: must be an integer >= 0 (0 = off)")
    if top_p is not None and not (isinstance(top_p, int | float) and not isinstance(top_p, bool) and 0.0 < top_p <= 1.0):
        raise SpecctlError(f"top_p = {top_p!r}: must be in (0, 1]")
    if not temperature:
        kw["top_k"] = 1
    else:
        kw["temperature"] = float(temperature)
        if top_k:
            kw["top_k"] = top_k
        if top_p is not None and top_p < 1.0:
            kw["top_p"] = float(top_p)
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise SpecctlError(f"random_seed = {seed!r}: must be an integer >= 0")
        kw["seed"] = seed
    if end_id is not None:
        kw["end_id"] = int(end_id)
    if not isinstance(ignore_eos, bool):
        raise SpecctlError(f"ignore_eos = {ignore_eos!r}: must be true or false")
    if ignore_eos:
        kw["ignore_eos"] = True
    if stop_token_ids:
        kw["stop_token_ids"] = [int(t) for t in stop_token_ids]
    for name, words in (("stop", stop), ("bad", bad)):
        if not words:
            continue
        if isinstance(words, str) or not all(isinstance(w, str) and w for w in words):
            raise SpecctlError(f"{name} = {words!r}: give a list of non-empty strings")
        kw[name] = list(words)
    if stop:
        kw["include_stop_str_in_output"] = True
    return kw


def load_options(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"LLM API options '{p}' do not exist; generate them with `specctl build --recipe R --out DIR`")
    try:
        opts = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"LLM API options '{p}' are not valid YAML: {e}") from None
    if not isinstance(opts, dict):
        raise ConfigError(f"LLM API options '{p}': expected a mapping, got {type(opts).__name__}")
    return opts


def llm_kwargs(options: dict[str, Any], classes: Callable[[str], Any], drafter=None) -> dict[str, Any]:
    """``LLM(**kwargs)`` from an options mapping; ``classes(name)`` returns TensorRT-LLM's class.

    With ``drafter`` (our hook), speculative_config becomes UserProvidedDecodingConfig with the same
    max_draft_len; the static schedule is dropped (the hook decides k every iteration).
    """
    kw = {k: v for k, v in options.items() if k not in ("speculative_config", *NESTED_CLASSES)}
    for key, cls in NESTED_CLASSES.items():
        if key in options:
            kw[key] = classes(cls)(**options[key])
    sc = options.get("speculative_config")
    if sc is not None:
        sc = dict(sc)
        dtype = sc.pop("decoding_type", None)
        if dtype not in DECODING_CLASSES:
            raise ConfigError(f"speculative_config.decoding_type = {dtype!r}; accepted: {', '.join(DECODING_CLASSES)}")
        if drafter is not None:
            kw["speculative_config"] = classes("UserProvidedDecodingConfig")(max_draft_len=sc["max_draft_len"],
                                                                           drafter=drafter)
        else:
            kw["speculative_config"] = classes(DECODING_CLASSES[dtype])(**sc)
    elif drafter is not None:
        raise ConfigError("the drafter hook needs speculative_config.max_draft_len in the options")
    return kw


class LlmApiStream:
    """One request in flight on the LLM API: its id, its deltas, ``abort()``.

    ``deltas()`` yields ``(new token ids, finished)`` for every update TensorRT-LLM sends; once
    finished, ``finish_reason`` and ``metrics`` (None when the request did not speculate) are set.
    """

    def __init__(self, output: Any, max_k: int = 0) -> None:
        self.output = output
        self.max_k = max_k
        self.request_id = int(output.request_id)
        self.sent = 0
        self.finish_reason: str | None = None
        self.metrics: SpecMetrics | None = None

    def abort(self) -> None:
        self.output.abort()

    async def deltas(self) -> AsyncIterator[tuple[list[int], bool]]:
        async for out in self.output:
            c = out.outputs[0]
            ids = c.token_ids
            new = list(ids[self.sent:]) if len(ids) > self.sent else []
            self.sent = max(self.sent, len(ids))
            m = spec_metrics(out, self.max_k)
            if m is not None:
                self.metrics = m
            done = bool(out.finished)
            if done:
                self.finish_reason = c.finish_reason
            yield new, done
            if done:
                return


class LlmApiExecutor:
    """TensorRT-LLM's LLM API with our telemetry. Needs TensorRT-LLM and a GPU."""

    def __init__(self, model: str, options: dict[str, Any] | str | Path, *, drafter=None,
                 on_metrics: Callable[[int, SpecMetrics], None] | None = None, version: str = PINNED) -> None:
        trtllm = require_release(version, "the LLM API executor")
        from tensorrt_llm import llmapi

        opts = load_options(options) if isinstance(options, str | Path) else dict(options)
        opts.pop("backend", None)
        opts.pop("model", None)
        self.options = opts
        self.llm = trtllm.LLM(model=model, **llm_kwargs(opts, lambda name: getattr(llmapi, name), drafter))
        self._SamplingParams = trtllm.SamplingParams
        self.on_metrics = on_metrics
        self.max_seq_len: int | None = opts.get("max_seq_len")
        self.max_k = int((opts.get("speculative_config") or {}).get("max_draft_len", 0) or 0)
        self.vocab_size: int | None = model_vocab_size(model)

    # -- tokenizer (the model's, as TensorRT-LLM loaded it) ------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.llm.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return self.llm.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- generation -----------------------------------------------------------------------------------
    def start(self, prompt_ids: list[int], **sampling) -> LlmApiStream:
        """Submit one request (call from the event loop that will iterate it); ValueError etc. from
        TensorRT-LLM for a request it refuses."""
        params = self._SamplingParams(**sampling_kwargs(**sampling))
        return LlmApiStream(self.llm.generate_async(list(prompt_ids), sampling_params=params, streaming=True),
                            self.max_k)

    async def stream(self, request_id: int, prompt_ids: list[int], **sampling) -> AsyncIterator[list[int]]:
        """Yield new token ids as they are generated; report speculation metrics at the end."""
        s = self.start(prompt_ids, **sampling)
        async for new, _done in s.deltas():
            if new:
                yield new
        if s.metrics is not None and self.on_metrics is not None:
            self.on_metrics(request_id, s.metrics)

    def shutdown(self) -> None:
        self.llm.shutdown()


def model_vocab_size(model: str | Path) -> int | None:
    """The vocabulary size from a local Hugging Face checkpoint's config.json (None: not a local
    checkpoint, e.g. a hub id TensorRT-LLM downloads)."""
    cfg = Path(model) / "config.json"
    try:
        v = json.loads(cfg.read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return int(v) if isinstance(v, int) and v > 0 else None
