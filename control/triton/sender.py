"""The ``llm`` model's plumbing, whatever executor it hosts: the model's parameters (``ModelParams``),
the control token file, incremental detokenising, per-request state and counters, and
``ResponseSender`` (the request-to-response plumbing through Triton's response senders)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from control.errors import ConfigError
from control.executors.base import StepTotals
from control.policyspec import DEFAULT_MAX_K
from control.triton.llm_metrics import LlmMetrics
from control.triton.llm_request import (
    ACCEPTED_OUTPUTS,
    DRAFTED_OUTPUTS,
    INPUTS,
    STOPPING,
    GenerateRequest,
    StatsRequest,
    StopRequest,
    check_parameters,
    parse_request,
    request_key,
)
from control.triton.stops import Stops
from control.triton.tokenize_worker import INLINE_PROMPT_BYTES, TokenizeWorker

log = logging.getLogger("specctl.triton.llm")

INPUT_NAMES = tuple(INPUTS)
EXECUTORS = ("reference", "trtllm", "sim")
CONTROLS = ("drafter-hook", "static-schedule")
PROMPT_BYTES_PER_TOKEN = 64  # text_input above max_seq_len * this many bytes is refused before tokenising
TOKEN_FILE_FORBIDDEN_BITS = 0o077  # group and other permissions: the token file is owner-only
MAX_TOKEN_FILE_CHARS = 4096
DEFAULT_SIM_REQUESTS = 4096  # executor sim: requests one model instance serves (acceptance rows)
FLAG_VALUES = {"true": True, "false": False}  # a boolean model parameter's accepted values
AGENT_BACKOFF_MAX_S = 2.0  # a restarted control plane (same port) is found again within about this long


@dataclass(frozen=True)
class ModelParams:
    """The ``parameters`` of the llm model's config.pbtxt.

    ``executor: reference`` needs ``engine_dir`` and takes ``overlap_policy`` (``true``: the policy
    decides step t+1 on a worker thread while step t runs, ``EngineConfig.overlap_policy``); ``executor: trtllm`` needs ``llm_api_options`` (the
    LLM API options ``specctl build`` wrote) and ``model`` (the target checkpoint; else the options'
    ``model`` key), and takes ``plan`` (the build's plan: the agent's profile, policy and K),
    ``control`` (``drafter-hook`` or ``static-schedule``), ``sku`` and ``pair``; ``executor: sim``
    needs ``profile`` and takes ``sim_requests`` (how many requests the simulated run holds).
    """

    executor: str = "reference"
    engine_dir: str = ""
    llm_api_options: str = ""
    model: str = ""
    plan: str = ""
    control: str = "static-schedule"
    trtllm_version: str = ""  # the TensorRT-LLM release the deployment was built for (empty: the pinned one)
    sku: str = ""
    pair: str = ""
    cancel_check_ms: int = 50
    profile: str = ""
    policy: str = "adaptive"
    max_k: int = DEFAULT_MAX_K
    max_batch: int = 32
    max_tokens: int = 1024
    default_max_tokens: int = 64
    threads: int = 1
    control_url: str = ""
    control_token_file: str = ""
    drain_file: str = ""  # the deployment writes it when stopping: end every request, refuse new ones
    drafter: str = ""
    sim_requests: int = DEFAULT_SIM_REQUESTS
    overlap_policy: bool = False  # executor reference: the policy decides step t+1 during step t (EngineConfig)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelParams:
        raw = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        if raw.get("control_token"):
            raise ConfigError("llm model parameter control_token: Triton shows the model config to anyone "
                              "(GET /v2/models/<name>/config), so it must not hold the token; write the token to "
                              "an owner-only file named by control_token_file, or set SPECCTL_TOKEN")
        kw: dict[str, Any] = {}
        for f in cls.__dataclass_fields__.values():
            if f.name not in raw or raw[f.name] == "":
                continue
            v = raw[f.name]
            if f.type == "int":
                try:
                    kw[f.name] = int(v)
                except ValueError:
                    raise ConfigError(f"llm model parameter {f.name} = {v!r}: must be an integer") from None
            elif f.type == "bool":
                kw[f.name] = _flag(f.name, v)
            else:
                kw[f.name] = v
        p = cls(**kw)
        if p.executor not in EXECUTORS:
            raise ConfigError(f"llm model parameter executor = {p.executor!r}: accepted: {', '.join(EXECUTORS)}")
        if p.executor == "reference" and not p.engine_dir:
            raise ConfigError("llm model parameter engine_dir is empty; `specctl serve --engine-dir DIR` fills it in")
        if p.executor == "trtllm":
            if not p.llm_api_options:
                raise ConfigError("llm model parameter llm_api_options is empty; `specctl build --recipe R --backend "
                                  "pytorch --out DIR` renders it (then run DIR/build.sh to fill in the paths)")
            if "@OUT@" in p.llm_api_options + p.model + p.plan:
                raise ConfigError("the llm model's parameters still contain @OUT@: run the deployment's build.sh "
                                  "(its first step points the configs at the deployment directory)")
            if p.control not in CONTROLS:
                raise ConfigError(f"llm model parameter control = {p.control!r}: accepted: {', '.join(CONTROLS)}")
        if p.executor == "sim" and not p.profile:
            raise ConfigError("llm model parameter profile is empty; executor sim needs a profile (its step costs "
                              "and acceptance)")
        if p.overlap_policy and p.executor != "reference":
            raise ConfigError(f"llm model parameter overlap_policy = true: only executor reference runs its policy on a "
                              f"worker thread (this model's executor is {p.executor}); remove the parameter")
        if p.cancel_check_ms < 1:
            raise ConfigError(f"llm model parameter cancel_check_ms = {p.cancel_check_ms}: must be >= 1")
        for name in ("max_k", "max_batch", "max_tokens", "default_max_tokens", "threads", "sim_requests"):
            if getattr(p, name) < (0 if name == "max_k" else 1):
                raise ConfigError(f"llm model parameter {name} = {getattr(p, name)}: must be >= {0 if name == 'max_k' else 1}")
        return p

    def read_token(self) -> str | None:
        """The control-plane token: from ``control_token_file`` if set, else None (the agent then reads
        SPECCTL_TOKEN from the environment)."""
        return read_token_file(self.control_token_file) if self.control_token_file else None


def _flag(name: str, text: str) -> bool:
    """A boolean model parameter: ``true`` or ``false`` (any case)."""
    v = text.strip().lower()
    if v not in FLAG_VALUES:
        raise ConfigError(f"llm model parameter {name} = {text!r}: accepted: true, false")
    return FLAG_VALUES[v]


def read_token_file(path: str) -> str:
    """A token from an owner-only file; ConfigError if it is missing, empty or readable by others."""
    import os
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"llm model parameter control_token_file = {path!r}: not a regular file")
        if st.st_mode & TOKEN_FILE_FORBIDDEN_BITS:
            raise ConfigError(f"llm model parameter control_token_file = {path!r}: mode {stat.S_IMODE(st.st_mode):o} "
                              "lets others read it; make it owner-only (chmod 600)")
        with open(path, encoding="utf-8") as f:
            token = f.read(MAX_TOKEN_FILE_CHARS + 1).strip()
    except OSError as e:
        raise ConfigError(f"llm model parameter control_token_file = {path!r}: cannot read it ({e.strerror})") from None
    if not token or len(token) > MAX_TOKEN_FILE_CHARS or any(c.isspace() for c in token):
        raise ConfigError(f"llm model parameter control_token_file = {path!r}: must hold one token of 1.."
                          f"{MAX_TOKEN_FILE_CHARS} characters without spaces")
    return token


class Detokenizer:
    """Incremental detokenisation: text deltas that never end inside a multi-byte character.

    Decodes a short window of recent tokens (as vLLM does) rather than the whole output per step.
    """

    __slots__ = ("decode", "tokens", "prefix", "read")

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self.prefix = 0  # tokens before this are fully emitted and not needed for context
        self.read = 0  # tokens before this have had their text emitted

    def push(self, new: tuple[int, ...] | list[int], final: bool = False) -> str:
        self.tokens.extend(new)
        before = self.decode(self.tokens[self.prefix:self.read])
        after = self.decode(self.tokens[self.prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            delta = after[len(before):]
            self.prefix, self.read = self.read, len(self.tokens)
            return delta
        if final and after.endswith("\ufffd"):
            return after[len(before):]
        return ""


@dataclass(eq=False)
class Live:
    """One in-flight request: its sender, its detokeniser and what has been sent
    (``ResponseSender._outputs`` reads ``drafted`` and ``accepted``)."""

    rid: int
    sender: Any
    stream: bool
    detok: Detokenizer
    started: float  # monotonic
    request: GenerateRequest | None = None
    _: KW_ONLY
    tid: str = ""  # the Triton request id ("" when the client gave none): what a stop request names
    text: list[str] = field(default_factory=list)  # text deltas sent so far
    ids: list[int] = field(default_factory=list)  # token ids sent so far
    generated: int = 0  # tokens the engine has delivered for it so far
    drafted: int = 0
    accepted: int = 0
    arrival_ns: int = 0  # wall clock, for return_perf_metrics
    first_token_ns: int = 0
    first_token_s: float = 0.0  # monotonic


@dataclass
class Counters:
    """Request outcomes, draft totals and the executor's steps (``ResponseSender`` counts ``rejected``
    and ``send_errors``)."""

    requests: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0  # by the client: a cancelled stream, a connection gone, or a stop request
    stopped: int = 0  # of those, by a stop request
    failed: int = 0
    send_errors: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    last_error: str = ""
    step_errors: int = 0
    totals: StepTotals = field(default_factory=StepTotals)  # the executor's steps, added up
    deliver_ms: float = 0.0  # the loop's own time delivering each step's outputs to the senders
    deliver_cpu_ms: float = 0.0  # the loop thread's CPU time in it (the rest: waiting on the server, the GIL, a core)


class ResponseSender:
    """Responses through a request's Triton response sender (the ``llm`` model's base).

    Needs ``self.pb`` (triton_python_backend_utils), ``self.outputs`` (the output names the config
    declares), ``self.counters`` (``rejected``, ``send_errors``), the request parser's inputs
    (``limits``, ``_encode``, ``_encode_words``, ``current_policy()``), ``stats()`` and
    ``_submit(parsed, sender, tid)``, which starts serving one parsed request, and ``_wake()``, which
    tells the engine loop a stop request came (``stops.py``).
    """

    def _read_config(self, pb, args: dict[str, Any]) -> ModelParams:
        """The model config the model starts from: pb, config, instance name, declared outputs and
        the parameters. A non-decoupled config answers each request with exactly one response and
        refuses ``stream``."""
        self.pb = pb
        self.config = json.loads(args["model_config"])
        self.instance = args.get("model_instance_name", "llm")
        self.decoupled = bool(pb.using_decoupled_model_transaction_policy(self.config))
        self.params = ModelParams.from_config(self.config)
        self.outputs = {o["name"] for o in self.config.get("output", [])}
        self.metrics = LlmMetrics(pb, self.config.get("name", "llm"))
        self._tokenizer = TokenizeWorker(f"{self.instance}-tokenize".replace(" ", "-"))
        self._encode_large: Callable[[str], list[int]] | None = None  # a GIL-free encode, where the host has one
        self._stops = Stops()
        return self.params

    def _close_tokenizer(self) -> None:
        """Stop the tokenising thread; requests still waiting for it get an error."""
        if not self._tokenizer.close():
            log.warning("llm %s: the tokenising thread did not stop in time", self.instance)

    def execute(self, requests) -> None:
        """Parse each request and start it; a refused request gets an error naming the value through
        its own response sender, and counts in ``specctl_requests_total{outcome="rejected"}``.

        Nothing is raised out of ``execute``: on that path the Python backend of Triton 2.51 reads an
        uninitialised flag from shared memory and may leak the request's response factory, after
        which the model never unloads (docs/decisions.md, 2026-11-28). So Triton counts a refused
        request as a successful execution."""
        for request in requests:
            sender = None
            try:
                parsed = self._parse(request)
                tid = request_key(request.request_id(), request.parameters())
                sender = request.get_response_sender()
                if isinstance(parsed, StatsRequest):
                    self._send(sender, {"text_output": np.array([json.dumps(self.stats())], dtype=object)}, final=True)
                elif isinstance(parsed, StopRequest):
                    self._stop_request(tid, sender)
                elif parsed.tokenize_later:
                    self._stops.expect(tid)
                    self._tokenizer.put(lambda p=parsed, s=sender, t=tid: self._tokenize_and_submit(p, s, t),
                                        lambda s=sender, t=tid: self._tokenize_refused(s, t))
                else:
                    self._submit(parsed, sender, tid)  # ConfigError: nothing was queued
                continue
            except ConfigError as e:
                message = str(e)
            except Exception as e:  # a bug must not take the instance down: fail this request only
                log.exception("llm: request failed")
                message = f"internal error ({type(e).__name__}) while reading this request; see the server log"
            self.counters.rejected += 1
            self.metrics.rejected()
            self._send_error(sender or request.get_response_sender(), message)

    def _stop_request(self, tid: str, sender) -> None:
        """``stop`` true: end the request in flight with this request's id (``stops.py``); the stop
        request gets one empty final response now."""
        if not tid:
            raise ConfigError("stop = true needs the id of the request to stop: send it on a gRPC stream with "
                              "that request's request_id (Triton's HTTP generate cannot carry one)")
        self._stops.request(tid)
        self._wake()
        self._send(sender, {}, final=True)

    def _tokenize_refused(self, sender, tid: str) -> None:
        self._stops.arrived(tid)
        self._send_error(sender, f"{STOPPING}; retry it")

    def _tokenize_and_submit(self, parsed: GenerateRequest, sender, tid: str = "") -> None:
        """On the tokenising thread: tokenise a large prompt, then start the request (or refuse it:
        Triton has counted it already, so the refusal counts in ``specctl_requests_total`` only)."""
        try:
            ids = (self._encode_large or self._encode)(parsed.prompt_text)
            self._submit(dataclasses.replace(parsed, prompt_ids=ids, tokenize_later=False), sender, tid)
            return
        except ConfigError as e:
            message = str(e)
        except Exception as e:  # a bug must not take the instance down: fail this request only
            log.exception("llm: starting a request failed")
            message = f"internal error ({type(e).__name__}) while starting this request; see the server log"
        self._stops.arrived(tid)  # (a no-op once the request was registered)
        self.counters.rejected += 1
        self.metrics.rejected()
        self._send_error(sender, message)

    def _parse(self, request) -> GenerateRequest | StatsRequest | StopRequest:
        pb = self.pb
        check_parameters(request.parameters())
        tensors = {}
        for name in INPUT_NAMES:
            t = pb.get_input_tensor_by_name(request, name)
            if t is not None:
                tensors[name] = t.as_numpy()
        parsed = parse_request(tensors, limits=self.limits, encode=self._encode, encode_words=self._encode_words,
                               deployment_policy=self.current_policy(), inline_prompt_bytes=INLINE_PROMPT_BYTES)
        if isinstance(parsed, GenerateRequest) and parsed.stream and not self.decoupled:
            raise ConfigError("stream = true: this deployment is not decoupled and answers with one response; "
                              "send stream false (or serve without --non-decoupled)")
        return parsed

    def _send(self, sender, outputs: dict[str, np.ndarray], final: bool) -> None:
        pb = self.pb
        tensors = [pb.Tensor(n, v) for n, v in outputs.items() if n in self.outputs]
        flags = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(pb.InferenceResponse(output_tensors=tensors), flags=flags)

    def _send_error(self, sender, message: str) -> None:
        pb = self.pb
        try:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client is gone
            self.counters.send_errors += 1

    def _outputs(self, live, text: str, ids: list[int]) -> dict[str, np.ndarray]:
        req = getattr(live, "request", None)
        if req is not None and req.include_input and not live.stream:  # exclude_input_in_output false
            text, ids = req.prompt_text + text, list(req.prompt_ids) + list(ids)
        out = {"text_output": np.array([text], dtype=object), "output_ids": np.asarray(ids, dtype=np.int32),
               "acceptance_rate": np.array([live.accepted / live.drafted if live.drafted else 0.0], dtype=np.float32)}
        for n in DRAFTED_OUTPUTS:
            out[n] = np.array([live.drafted], dtype=np.int32)
        for n in ACCEPTED_OUTPUTS:
            out[n] = np.array([live.accepted], dtype=np.int32)
        if req is not None and req.perf_metrics:
            out.update(self._perf_outputs(live))
        return out

    @staticmethod
    def _perf_outputs(live) -> dict[str, np.ndarray]:
        """tensorrtllm_backend's return_perf_metrics outputs. Admission and prefill happen in the
        engine step that yields the first token, so first_scheduled_time_ns is that step's end; the
        KV cache is one slot per request (no paged blocks, no reuse)."""
        first = live.first_token_ns or time.time_ns()
        vals = {"arrival_time_ns": live.arrival_ns, "first_scheduled_time_ns": first, "first_token_time_ns": first,
                "last_token_time_ns": time.time_ns(), "kv_cache_alloc_new_blocks": 1, "kv_cache_reused_blocks": 0,
                "kv_cache_alloc_total_blocks": 1}
        return {n: np.array([v], dtype=np.int64) for n, v in vals.items()}
