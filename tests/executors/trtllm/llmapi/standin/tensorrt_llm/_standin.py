"""``LLM`` and ``SamplingParams`` with TensorRT-LLM's LLM API surface, backed by the reference executor.

What it mimics (from ``tensorrt_llm/llmapi/llm.py``, ``tensorrt_llm/executor/result.py`` and
``tensorrt_llm/sampling_params.py``):

- ``LLM(model, **options)``: ``model`` is a Hugging Face checkpoint directory (config.json,
  safetensors, tokenizer.json); options it does not know are refused, as ``LlmArgs`` refuses them.
  ``speculative_config``: ``DraftTargetDecodingConfig`` (``speculative_model`` = the draft's
  checkpoint) and ``NGramDecodingConfig`` run the reference engine's draft model / prompt lookup with
  k from ``draft_len_schedule`` under the release's semantics (``_release.py``: 1.2.1 keys are
  lower bounds, 1.3 keys upper bounds with 0 above the last); the config classes are strict
  (``_configs.py``). ``UserProvidedDecodingConfig(drafter=...)`` calls
  ``drafter.prepare_draft_tokens`` every iteration with the generation requests
  (``py_request_id``, ``py_client_id`` = the API request id, ``get_tokens(0)``,
  ``py_max_new_tokens``, ``py_orig_prompt_len``, ``py_num_accepted_draft_tokens``), then, as the
  executor does, ``drafter.pad_draft_tokens_for_cuda_graph`` with a resource manager: every draft
  is padded to the drafter's static maximum (a drafter built without it fails there). Each
  request's k is its draft length before padding (the reference engine verifies its own
  prompt-lookup drafts of that length, the same lookup as the project's n-gram proposer); the
  padding is counted (``padded_draft_tokens``), since on a GPU the target verifies it too.
- ``generate_async(prompt_ids_or_text, sampling_params, streaming=True)`` returns a result that is
  an async iterator over its own updates (``request_id``, ``outputs[0].token_ids`` cumulative,
  ``finish_reason``, ``request_perf_metrics.speculative_decoding`` when ``return_perf_metrics``
  (zero totals on 1.2.1, the real ones on the 1.3 shape), ``avg_decoded_tokens_per_iter`` and
  ``decoding_iter``, ``finished``, ``abort()``). A request the engine refuses raises ValueError from
  ``generate_async``. ``top_k=1`` (or temperature 0) is greedy.
- ``tokenizer.encode`` / ``decode``, ``get_stats``, ``shutdown``.

Test knob (not TensorRT-LLM's): option ``standin_fail_token``: a request whose prompt holds that
token id fails after its first update with a RuntimeError raised from the iteration, as a request
the executor fails mid-stream (its KV is freed).

Not mimicked: one step loop serves all requests (the reference engine's continuous batching), no
logprobs, n = 1 only, ``include_stop_str_in_output`` is always true (the reference engine keeps
stop words in the output).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

KNOWN_OPTIONS = {"tensor_parallel_size", "max_batch_size", "max_seq_len", "max_num_tokens", "kv_cache_config",
                 "enable_iter_perf_stats", "speculative_config", "disable_overlap_scheduler", "cuda_graph_config",
                 "standin_fail_token"}


@dataclass(kw_only=True)
class SamplingParams:
    """The fields of TensorRT-LLM's SamplingParams the adapter sets (others are refused: TypeError)."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    return_perf_metrics: bool = False
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return (self.top_k in (None, 1) and self.top_p in (None, 0.0)) or not self.temperature


class _Tokenizer:
    """``encode`` / ``decode`` as TensorRT-LLM's TransformersTokenizer offers them."""

    def __init__(self, path: Path, bos: int | None, eos: int | None) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos, eos, eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False).ids)
        return ([self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []) + ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    request_perf_metrics: object | None = None


class RequestOutput:
    """One request's result: an async iterator over its updates (``GenerationResult`` in
    ``tensorrt_llm/executor/result.py``: each ``__anext__`` applies one update and returns self)."""

    def __init__(self, llm: LLM, request_id: int, prompt: list[int], params: SamplingParams) -> None:
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self._aborted = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.engine_rid: int | None = None
        self.avg_decoded_tokens_per_iter: float | None = None  # executor/result.py, set from each response
        self.decoding_iter = 0

    # engine thread -> event loop
    def _put(self, update) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, update)

    def abort(self) -> None:
        """``GenerationResult.abort`` -> ``abort_request``: the request ends with a cancelled final update."""
        if self.finished or self._aborted:
            return
        self._aborted = True
        self._llm._abort(self)
        self._put(("final", [], "cancelled", None))

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        kind, new, reason, metrics = await self._queue.get()
        if isinstance(reason, tuple):  # (finish reason, avg decoded tokens per iteration, iterations)
            reason, self.avg_decoded_tokens_per_iter, self.decoding_iter = reason
        if kind == "error":
            self.finished = True
            raise new
        c = self.outputs[0]
        c.token_ids.extend(new)
        c.text = self._llm.tokenizer.decode(c.token_ids)
        if kind == "final":
            self.finished = True
            c.finish_reason = reason
            if metrics is not None and self.sampling_params.return_perf_metrics:
                c.request_perf_metrics = SimpleNamespace(speculative_decoding=metrics)
        return self


class _Schedule:
    """``draft_len_schedule`` as a policy of the reference engine, looked up as the release does."""

    name = "draft_len_schedule"

    def __init__(self, schedule: dict, max_k: int) -> None:
        from control.buildsys.trtllm_rules import lookup
        from tensorrt_llm._release import current

        self.schedule = {int(b): int(k) for b, k in (schedule or {1: max_k}).items()}
        self.lookup = lookup
        self.line = current().line

    def decide(self, view):
        from control.policy.types import Decision

        k = min(self.lookup(self.schedule, view.n, self.line), view.max_k)
        return Decision(k=np.minimum(np.full(view.n, k, dtype=np.int64), view.k_cap),
                        drafter=np.zeros(view.n, dtype=np.int64))

    def observe(self, outcome) -> None:
        pass


class _GenRequest:
    """The fields of ``LlmRequest`` (``tensorrt_llm/_torch/pyexecutor/llm_request.py``) a drafter reads."""

    def __init__(self, rid: int, client_id: int, tokens: list[int], max_new: int, prompt_len: int, accepted: int):
        self.py_request_id = rid
        self.py_client_id = client_id
        self._tokens = tokens
        self.py_max_new_tokens = max_new
        self.py_orig_prompt_len = prompt_len
        self.py_num_accepted_draft_tokens = accepted
        self.py_draft_tokens: list[int] = []

    def get_tokens(self, beam: int) -> list[int]:
        return list(self._tokens)


class _ResourceManager:
    """What ``pad_draft_tokens_for_cuda_graph`` asks of the executor's resource manager."""

    def __init__(self) -> None:
        self.extended = 0

    def extend_capacity_for_tokens(self, request) -> None:
        self.extended += 1


class _UserProvided:
    """``UserProvidedDecodingConfig``: the drafter hook decides each request's k every iteration."""

    name = "user-provided"

    def __init__(self, drafter, llm: LLM) -> None:
        self.drafter = drafter
        self.llm = llm
        self.accepted: dict[int, int] = {}
        self.resources = _ResourceManager()
        self.padded_draft_tokens = 0  # zeros the padding added (verified on a GPU, not by the reference engine)

    def decide(self, view):
        from control.policy.types import Decision

        reqs = []
        for rid in view.request_ids.tolist():
            res = self.llm._by_rid.get(rid)
            seq = self.llm._seq.get(rid, [])
            if res is None:
                reqs.append(_GenRequest(rid, rid, seq, 1, len(seq), 0))
                continue
            reqs.append(_GenRequest(rid, res.request_id, seq, res.sampling_params.max_tokens,
                                    len(res.prompt_token_ids), self.accepted.get(rid, 0)))
        batch = SimpleNamespace(generation_requests=reqs, context_requests=[])
        self.drafter.prepare_draft_tokens(batch, self.resources)
        k = np.fromiter((len(r.py_draft_tokens) for r in reqs), np.int64, len(reqs))
        self.drafter.pad_draft_tokens_for_cuda_graph(batch, self.resources)  # as the executor does, right after
        padded = [len(r.py_draft_tokens) for r in reqs]
        self.padded_draft_tokens += int(sum(padded) - k.sum())
        return Decision(k=np.minimum(k, view.max_k), drafter=np.zeros(view.n, dtype=np.int64))

    def observe(self, outcome) -> None:
        for rid, a in zip(outcome.request_ids.tolist(), outcome.accepted.tolist(), strict=True):
            self.accepted[rid] = a


class LLM:
    def __init__(self, model, **options) -> None:
        import torch

        from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
        from control.executors.reference.model import load_pretrained

        unknown = sorted(set(options) - KNOWN_OPTIONS)
        if unknown:
            raise ValueError(f"LLM: unknown options {unknown}")
        torch.set_num_threads(1)  # tiny models; a shared CI machine
        model = Path(model)
        target = load_pretrained(model)
        self.tokenizer = _Tokenizer(model / "tokenizer.json", target.config.bos_token_id, target.config.eos_token_id)
        self.options = options
        self.fail_token = options.get("standin_fail_token")
        sc = options.get("speculative_config")
        max_k = int(getattr(sc, "max_draft_len", 0) or 0)
        drafters: dict = {}
        policy = PlainDecoding()
        kind = getattr(sc, "decoding_type", None)
        if kind == "Draft_Target":
            drafters = {"draft": load_pretrained(sc.speculative_model)}
            policy = _Schedule(getattr(sc, "draft_len_schedule", None), max_k)
        elif kind == "NGram":
            drafters = {"ngram": None}
            policy = _Schedule(getattr(sc, "draft_len_schedule", None), max_k)
        elif kind == "User_Provided":
            drafters = {"ngram": None}
            policy = _UserProvided(sc.drafter, self)
        elif sc is not None:
            raise ValueError(f"the stand-in LLM does not run decoding_type {kind!r}")
        self.speculation = kind
        self.engine = ReferenceEngine(target, drafters, policy,
                                      EngineConfig(max_batch=int(options.get("max_batch_size", 8)), max_k=max(max_k, 1)))
        self._ids = itertools.count(1)
        self._by_rid: dict[int, RequestOutput] = {}
        self._seq: dict[int, list[int]] = {}  # engine thread: prompt + generated per engine request
        self._sent: dict[int, int] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._stats: list[dict] = []
        self._thread = threading.Thread(target=self._loop, name="standin-llm", daemon=True)
        self._thread.start()

    # -- the LLM API -----------------------------------------------------------------------------------
    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, streaming: bool = False,
                       **_ignored) -> RequestOutput:
        from control.errors import ConfigError
        from control.executors.base import SamplingParams as RefParams

        sp = sampling_params or SamplingParams(end_id=self.tokenizer.eos_token_id)
        prompt = self.tokenizer.encode(inputs) if isinstance(inputs, str) else [int(t) for t in inputs]
        words = [self.tokenizer.encode(w, add_special_tokens=False) for w in _as_list(sp.stop)]
        words += [[t] for t in sp.stop_token_ids or []]
        bad = [self.tokenizer.encode(w, add_special_tokens=False) for w in _as_list(sp.bad)]
        bad += [[t] for t in sp.bad_token_ids or []]
        greedy = sp.greedy
        params = RefParams(max_tokens=sp.max_tokens, temperature=0.0 if greedy else float(sp.temperature),
                           top_k=0 if greedy else int(sp.top_k or 0), top_p=1.0 if greedy or sp.top_p is None else sp.top_p,
                           random_seed=sp.seed, stop_words=[w for w in words if w], bad_words=[w for w in bad if w],
                           end_id=sp.end_id, ignore_eos=sp.ignore_eos)
        res = RequestOutput(self, next(self._ids), prompt, sp)
        with self._cond:
            try:
                rid = self.engine.add_request(prompt, params)
            except ConfigError as e:
                raise ValueError(str(e)) from None
            res.engine_rid = rid
            self._by_rid[rid] = res
            self._seq[rid] = list(prompt)
            self._sent[rid] = 0
            self._cond.notify()
        return res

    def get_stats(self, timeout: float = 2) -> list[dict]:
        out, self._stats = self._stats, []
        return out

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(10)

    # -- the engine thread -----------------------------------------------------------------------------
    def _abort(self, res: RequestOutput) -> None:
        with self._cond:
            if res.engine_rid is not None and self._by_rid.pop(res.engine_rid, None) is not None:
                self.engine.cancel(res.engine_rid)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self.engine.has_work():
                    self._cond.wait(0.1)
                if self._stop:
                    return
            try:
                outs = self.engine.step()
            except Exception as e:  # the executor failed: every request in it fails
                with self._cond:
                    for rid, res in list(self._by_rid.items()):
                        self._by_rid.pop(rid, None)
                        self.engine.cancel(rid)
                        res._put(("error", RuntimeError(f"executor step failed: {e}"), None, None))
                continue
            st = self.engine.last_stats
            self._stats.append({"iter": st.step, "numActiveRequests": st.running, "iterLatencyMS": st.total_ms})
            with self._cond:  # generate_async registers a request under this lock before the engine sees it
                for out in outs:
                    self._dispatch(out)

    def _perf(self, out):
        return _perf_fields(self, out) if self.speculation else None

    def _dispatch(self, out) -> None:
        from control.executors.base import FinishReason

        rid = out.request_id
        res = self._by_rid.get(rid)
        if res is None:  # aborted
            return
        new = list(out.new_token_ids)
        self._seq[rid].extend(new)
        self._sent[rid] += 1
        if self.fail_token is not None and self.fail_token in res.prompt_token_ids and self._sent[rid] == 2:
            self._by_rid.pop(rid, None)
            self.engine.cancel(rid)
            res._put(("error", RuntimeError(f"request {res.request_id} failed in the executor (stand-in fault)"),
                      None, None))
            return
        if out.finished:
            iters = self._sent[rid]  # (avg_decoded_tokens_per_iter, decoding_iter): tokens over the steps that made them
            per_iter = ((len(self._seq[rid]) - len(res.prompt_token_ids)) / iters, iters)
            self._by_rid.pop(rid, None)
            self._seq.pop(rid, None)
            self._sent.pop(rid, None)
            reason = {FinishReason.stop: "stop", FinishReason.length: "length",
                      FinishReason.cancelled: "cancelled"}.get(out.finish_reason, "stop")
            res._put(("final", new, (reason, *per_iter), self._perf(out)))
        else:
            res._put(("update", new, None, None))


def _perf_fields(llm: LLM, out):
    """``request_perf_metrics.speculative_decoding``: zero totals on 1.2.1 (before PR #17082)."""
    from tensorrt_llm._release import current

    if current().perf_totals:
        return SimpleNamespace(total_draft_tokens=out.total_drafted, total_accepted_draft_tokens=out.total_accepted,
                               acceptance_rate=out.acceptance_rate)
    return SimpleNamespace(total_draft_tokens=0, total_accepted_draft_tokens=0, acceptance_rate=0.0)


def _as_list(words) -> list[str]:
    if not words:
        return []
    return [words] if isinstance(words, str) else list(words)
