"""The LLM API adapter (TensorRT-LLM PyTorch backend) behind the executor contract.

- build: ``LLM(model, **options)`` from the ``llm_api_options.yaml`` that ``specctl build`` wrote;
  ``speculative_config`` becomes the matching ``*DecodingConfig`` (or, with ``control:
  drafter-hook``, a ``UserProvidedDecodingConfig`` around our per-iteration drafter);
- streaming generation: ``generate_async(..., streaming=True)`` yields token deltas; sampling
  parameters are validated here (one-line errors naming the value) before TensorRT-LLM sees them;
- per-request speculation metrics: ``SamplingParams(return_perf_metrics=True)`` makes
  ``output.request_perf_metrics.speculative_decoding`` carry acceptance_rate,
  total_accepted_draft_tokens and total_draft_tokens, which go to the controller's telemetry;
- iteration stats: ``enable_iter_perf_stats`` in the options and ``LLM.get_stats``.

Import-guarded: building an ``LlmApiExecutor`` without TensorRT-LLM raises MissingDependencyError.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from control.errors import ConfigError, SpecctlError
from control.executors.trtllm import require_tensorrt_llm

# decoding_type -> TensorRT-LLM config class (tensorrt_llm/llmapi/llm_args.py)
DECODING_CLASSES = {"Draft_Target": "DraftTargetDecodingConfig", "Eagle3": "Eagle3DecodingConfig",
                    "NGram": "NGramDecodingConfig", "MTP": "MTPDecodingConfig"}
NESTED_CLASSES = {"kv_cache_config": "KvCacheConfig", "cuda_graph_config": "CudaGraphConfig"}


@dataclass(frozen=True, slots=True)
class SpecMetrics:
    """Per-request speculation outcome, as TensorRT-LLM reports it at the end of a request."""

    drafted: int
    accepted: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def spec_metrics(output: Any) -> SpecMetrics | None:
    """Read ``request_perf_metrics.speculative_decoding`` from a RequestOutput (or one of its
    completions); None when the request asked for no perf metrics or did not speculate."""
    for holder in (output, *getattr(output, "outputs", ())):
        perf = getattr(holder, "request_perf_metrics", None)
        sd = getattr(perf, "speculative_decoding", None) if perf is not None else None
        if sd is not None:
            return SpecMetrics(int(getattr(sd, "total_draft_tokens", 0) or 0),
                               int(getattr(sd, "total_accepted_draft_tokens", 0) or 0))
    return None


def sampling_kwargs(max_tokens, temperature=None, top_k=None, top_p=None, seed=None, end_id=None,
                    stop_token_ids=None) -> dict[str, Any]:
    """Validated keyword arguments for ``SamplingParams``; SpecctlError names the bad value."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise SpecctlError(f"max_tokens = {max_tokens!r}: must be an integer >= 1")
    kw: dict[str, Any] = {"max_tokens": max_tokens, "return_perf_metrics": True}
    if temperature is not None:
        if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature >= 0):
            raise SpecctlError(f"temperature = {temperature!r}: must be a finite number >= 0 (0 = greedy)")
        kw["temperature"] = float(temperature)
    if top_k is not None:
        if not isinstance(top_k, int) or top_k < 0:
            raise SpecctlError(f"top_k = {top_k!r}: must be an integer >= 0 (0 = off)")
        kw["top_k"] = top_k
    if top_p is not None:
        if not (isinstance(top_p, int | float) and 0.0 < top_p <= 1.0):
            raise SpecctlError(f"top_p = {top_p!r}: must be in (0, 1]")
        kw["top_p"] = float(top_p)
    if seed is not None:
        if not isinstance(seed, int) or seed < 0:
            raise SpecctlError(f"random_seed = {seed!r}: must be an integer >= 0")
        kw["seed"] = seed
    if end_id is not None:
        kw["end_id"] = int(end_id)
    if stop_token_ids:
        kw["stop_token_ids"] = [int(t) for t in stop_token_ids]
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


class LlmApiExecutor:
    """TensorRT-LLM's LLM API with our telemetry. Needs TensorRT-LLM and a GPU."""

    def __init__(self, model: str, options: dict[str, Any] | str | Path, *, drafter=None,
                 on_metrics: Callable[[int, SpecMetrics], None] | None = None) -> None:
        trtllm = require_tensorrt_llm("the LLM API executor")
        from tensorrt_llm import llmapi

        opts = load_options(options) if isinstance(options, str | Path) else dict(options)
        opts.pop("backend", None)
        self.llm = trtllm.LLM(model=model, **llm_kwargs(opts, lambda name: getattr(llmapi, name), drafter))
        self._SamplingParams = trtllm.SamplingParams
        self.on_metrics = on_metrics

    async def stream(self, request_id: int, prompt_ids: list[int], **sampling) -> AsyncIterator[list[int]]:
        """Yield new token ids as they are generated; report speculation metrics at the end."""
        params = self._SamplingParams(**sampling_kwargs(**sampling))
        sent = 0
        final = None
        async for out in self.llm.generate_async(prompt_ids, sampling_params=params, streaming=True):
            ids = out.outputs[0].token_ids
            if len(ids) > sent:
                yield list(ids[sent:])
                sent = len(ids)
            final = out
        m = spec_metrics(final) if final is not None else None
        if m is not None and self.on_metrics is not None:
            self.on_metrics(request_id, m)

    def iteration_stats(self, timeout: float = 2.0) -> list[dict]:
        """Iteration stats since the last call (``enable_iter_perf_stats`` must be on)."""
        return list(self.llm.get_stats(timeout=timeout))

    def shutdown(self) -> None:
        self.llm.shutdown()
