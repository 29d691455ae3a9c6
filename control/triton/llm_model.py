"""The ``llm`` Triton model: one engine loop per model instance, the controller (agent) inside it.

``triton_repo/llm/1/model.py`` is a thin shim that hands Triton's calls to ``load_model``, which
returns ``LlmModel`` (this module, ``executor: reference``, what ``specctl serve`` renders) or
``LlmApiModel`` (``control/triton/llmapi_model.py``, ``executor: trtllm``, what ``specctl build
--backend pytorch`` renders). ``LlmModel``:

- ``initialize`` reads the model parameters (``config.pbtxt``, rendered by ``specctl serve``): the
  executor and engine directory, the profile, the policy, the control-plane URL and the file holding its token, limits;
  it loads the engine, builds the agent (which serves on its default plan until the service answers)
  and starts the loop thread.
- ``execute`` (decoupled) validates each request, registers it with the executor and returns at
  once; a bad request gets a Triton error naming the value and what is accepted, and nobody else is
  affected.
- The loop thread steps the executor whenever it has work and sleeps on a condition otherwise. Each
  step's new tokens go out through that request's response sender (text detokenised incrementally,
  never splitting a multi-byte character); a request whose client cancelled or went away is cancelled
  in the executor before a step, which frees its KV slot at once: before each step a fixed number of
  the running and of the queued requests are asked in turn (``CancelWatch``), so the loop's own work
  per step does not grow with the queue; an error in one request or one step never takes the loop down.
- A request with ``stats`` true gets the instance's counters (KV slots in use, requests, the plan the
  agent follows, the last step's k) as JSON in ``text_output``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from control.errors import ConfigError
from control.triton.cancel_watch import CancelWatch
from control.triton.llm_metrics import LlmMetrics
from control.triton.llm_request import (
    ACCEPTED_OUTPUTS,
    DRAFTED_OUTPUTS,
    INPUTS,
    GenerateRequest,
    Limits,
    StatsRequest,
    check_parameters,
    parse_request,
)

log = logging.getLogger("specctl.triton.llm")

INPUT_NAMES = tuple(INPUTS)
EXECUTORS = ("reference", "trtllm")
CONTROLS = ("drafter-hook", "static-schedule")
K_HIST = 17  # k = 0..16
PROMPT_BYTES_PER_TOKEN = 64  # text_input above max_seq_len * this many bytes is refused before tokenising
TOKEN_FILE_FORBIDDEN_BITS = 0o077  # group and other permissions: the token file is owner-only
MAX_TOKEN_FILE_CHARS = 4096
AGENT_BACKOFF_MAX_S = 2.0  # a restarted control plane (same port) is found again within about this long


@dataclass(frozen=True)
class ModelParams:
    """The ``parameters`` of the llm model's config.pbtxt.

    ``executor: reference`` needs ``engine_dir``; ``executor: trtllm`` needs ``llm_api_options`` (the
    LLM API options ``specctl build`` wrote) and ``model`` (the target checkpoint; else the options'
    ``model`` key), and takes ``plan`` (the build's plan: the agent's profile, policy and K),
    ``control`` (``drafter-hook`` or ``static-schedule``), ``sku`` and ``pair``.
    """

    executor: str = "reference"
    engine_dir: str = ""
    llm_api_options: str = ""
    model: str = ""
    plan: str = ""
    control: str = "static-schedule"
    sku: str = ""
    pair: str = ""
    cancel_check_ms: int = 50
    profile: str = ""
    policy: str = "adaptive"
    max_k: int = 8
    max_batch: int = 32
    max_tokens: int = 1024
    default_max_tokens: int = 64
    threads: int = 1
    control_url: str = ""
    control_token_file: str = ""
    drafter: str = ""

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
        if p.cancel_check_ms < 1:
            raise ConfigError(f"llm model parameter cancel_check_ms = {p.cancel_check_ms}: must be >= 1")
        for name in ("max_k", "max_batch", "max_tokens", "default_max_tokens", "threads"):
            if getattr(p, name) < (0 if name == "max_k" else 1):
                raise ConfigError(f"llm model parameter {name} = {getattr(p, name)}: must be >= {0 if name == 'max_k' else 1}")
        return p

    def read_token(self) -> str | None:
        """The control-plane token: from ``control_token_file`` if set, else None (the agent then reads
        SPECCTL_TOKEN from the environment)."""
        return read_token_file(self.control_token_file) if self.control_token_file else None


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
    """One in-flight request: its sender and what has been sent."""

    rid: int
    sender: Any
    stream: bool
    detok: Detokenizer
    started: float
    request: GenerateRequest | None = None
    arrival_ns: int = 0  # wall clock, for return_perf_metrics
    first_token_ns: int = 0
    first_token_s: float = 0.0  # monotonic
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


@dataclass
class Counters:
    requests: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    steps: int = 0
    step_errors: int = 0
    send_errors: int = 0
    drafted: int = 0
    accepted: int = 0
    last_error: str = ""
    # Per-step totals since start (the benchmark diffs them around a run).
    busy_ms: float = 0.0
    decode_steps: int = 0
    spec_steps: int = 0
    step_verified: int = 0
    step_accepted: int = 0
    generated: int = 0
    # Where the busy time went (ms): the policy (decide + prune + observe), prompt prefill, draft
    # and verify passes, and the loop's own time delivering each step's outputs to the senders.
    policy_ms: float = 0.0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    deliver_ms: float = 0.0


def load_model(pb, args: dict[str, Any]):
    """The llm model for this config: ``LlmModel`` or, for ``executor: trtllm``, ``LlmApiModel``."""
    config = json.loads(args["model_config"])
    if ModelParams.from_config(config).executor == "trtllm":
        from control.triton.llmapi_model import LlmApiModel

        return LlmApiModel(pb, args)
    return LlmModel(pb, args)


class ResponseSender:
    """Responses through a request's Triton response sender, shared by both llm model flavours.

    Needs ``self.pb`` (triton_python_backend_utils), ``self.outputs`` (the output names the config
    declares), ``self.counters`` (``rejected``, ``send_errors``), the request parser's inputs
    (``limits``, ``_encode``, ``_encode_words``, ``current_policy()``), ``stats()`` and
    ``_submit(parsed, sender)``, which starts serving one parsed request.
    """

    def _read_config(self, pb, args: dict[str, Any], *, need_decoupled: bool = True) -> ModelParams:
        """The model config both flavours start from: pb, config, instance name, declared outputs and
        the parameters. A non-decoupled config (``need_decoupled`` False) answers each request with
        exactly one response and refuses ``stream``."""
        self.pb = pb
        self.config = json.loads(args["model_config"])
        self.instance = args.get("model_instance_name", "llm")
        self.decoupled = bool(pb.using_decoupled_model_transaction_policy(self.config))
        if need_decoupled and not self.decoupled:
            raise ConfigError("the llm model must be decoupled: set model_transaction_policy { decoupled: true }")
        self.params = ModelParams.from_config(self.config)
        self.outputs = {o["name"] for o in self.config.get("output", [])}
        self.metrics = LlmMetrics(pb, self.config.get("name", "llm"))
        return self.params

    def execute(self, requests) -> str | None:
        """Parse each request and start it; a refused request gets an error naming the value.

        Returns the error of a batch of one refused request: the Triton entry point raises it, so
        Triton counts the request in ``nv_inference_request_failure`` (an error sent through a
        decoupled sender counts as a success); in larger batches each refused request gets its
        error through its own sender."""
        for request in requests:
            sender = None
            try:
                parsed = self._parse(request)
                sender = request.get_response_sender()
                if isinstance(parsed, StatsRequest):
                    self._send(sender, {"text_output": np.array([json.dumps(self.stats())], dtype=object)}, final=True)
                else:
                    self._submit(parsed, sender)  # ConfigError: nothing was queued
                continue
            except ConfigError as e:
                message = str(e)
            except Exception as e:  # a bug must not take the instance down: fail this request only
                log.exception("llm: request failed")
                message = f"internal error ({type(e).__name__}) while reading this request; see the server log"
            self.counters.rejected += 1
            self.metrics.rejected()
            if len(requests) == 1:
                return message
            self._send_error(sender or request.get_response_sender(), message)
        return None

    def _parse(self, request) -> GenerateRequest | StatsRequest:
        pb = self.pb
        check_parameters(request.parameters())
        tensors = {}
        for name in INPUT_NAMES:
            t = pb.get_input_tensor_by_name(request, name)
            if t is not None:
                tensors[name] = t.as_numpy()
        parsed = parse_request(tensors, limits=self.limits, encode=self._encode, encode_words=self._encode_words,
                               deployment_policy=self.current_policy())
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


class LlmModel(ResponseSender):
    """What the Triton Python model does; ``pb`` is ``triton_python_backend_utils``."""

    def __init__(self, pb, args: dict[str, Any]) -> None:
        import torch

        p = self._read_config(pb, args, need_decoupled=False)
        torch.set_num_threads(p.threads)
        self._load(p)
        self.limits = Limits(max_tokens=p.max_tokens, default_max_tokens=min(p.default_max_tokens, p.max_tokens),
                             max_prompt_bytes=self.engine.max_len * PROMPT_BYTES_PER_TOKEN,
                             vocab_size=self.loaded.target.config.vocab_size)
        self.counters = Counters()
        self.live: dict[int, Live] = {}
        self._cond = threading.Condition()
        # Held across add_request + registration and across each step, so a step never produces
        # output for a request whose sender is not registered yet.
        self._reg = threading.Lock()
        self._stop = False
        self._last_k: list[int] = []
        self._k_hist = np.zeros(K_HIST, dtype=np.int64)  # request-steps by k
        self._watch = CancelWatch()
        self._thread = threading.Thread(target=self._loop, name=f"{self.instance}-engine", daemon=True)
        self._thread.start()
        if self.agent is not None:
            self.agent.start()

    # -- set-up ----------------------------------------------------------------------------------------
    def _load(self, p: ModelParams) -> None:
        from control.agent import Agent
        from control.executors.reference.calibrate import find_profile, quick_profile
        from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
        from control.executors.reference.loader import load_engine_dir
        from control.policyspec import parse_policy_spec
        from control.profile import load_profile

        self.loaded = loaded = load_engine_dir(p.engine_dir)
        drafters = tuple(loaded.drafters)
        if p.drafter and p.drafter not in drafters:
            raise ConfigError(f"llm model parameter drafter = {p.drafter!r}: not in {p.engine_dir} (it has: {', '.join(drafters)})")
        self.policy_spec = str(parse_policy_spec(p.policy))
        self.agent = None
        policy = PlainDecoding()
        if drafters:
            if p.profile:
                profile = load_profile(p.profile)
            else:
                profile = find_profile(loaded)
                if profile is None or profile.pair != loaded.name:
                    profile = quick_profile(loaded)
            self.agent = Agent(profile, url=p.control_url or None, policy=self.policy_spec, drafters=drafters,
                               max_k=p.max_k, max_batch=p.max_batch, token=p.read_token(),
                               backoff_max_s=AGENT_BACKOFF_MAX_S,
                               source=f"triton-{self.instance}".replace(" ", "-")[:128])
            policy = self.agent
        self.engine = ReferenceEngine(loaded.target, loaded.drafters, policy,
                                      EngineConfig(max_batch=p.max_batch, max_k=p.max_k,
                                                   default_drafter=p.drafter or None))
        tok = loaded.tokenizer
        self._encode = loaded.encode
        self._encode_words = lambda s: tok.encode(s, add_special_tokens=False).ids
        self._decode = loaded.decode

    # -- Triton entry points ---------------------------------------------------------------------------

    def finalize(self) -> None:
        t0 = time.monotonic()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(10)
        if self._thread.is_alive():
            log.warning("llm %s: the engine loop did not stop within 10 s", self.instance)
        for live in list(self.live.values()):
            self._send_error(live.sender, "the server is shutting down")
        self.live.clear()
        t1 = time.monotonic()
        if self.agent is not None:
            self.agent.stop()
        log.warning("llm %s: finalized (engine loop %.2f s, agent %.2f s)", self.instance, t1 - t0, time.monotonic() - t1)

    # -- requests --------------------------------------------------------------------------------------
    def _submit(self, req: GenerateRequest, sender) -> None:
        with self._reg:
            rid = self.engine.add_request(req.prompt_ids, req.params)  # ConfigError: nothing is queued
            self.live[rid] = Live(rid, sender, req.stream, Detokenizer(self._decode), time.monotonic(), req,
                                  arrival_ns=time.time_ns())
            self._watch.add(rid)
            self.counters.requests += 1
        with self._cond:
            self._cond.notify()

    def current_policy(self) -> str:
        return self.agent.plan.policy if self.agent is not None else "none"

    # -- the engine loop (its own thread) --------------------------------------------------------------
    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._stop and not engine.has_work():
                    self._cond.wait(0.5)
                if self._stop:
                    return
            self._reap_cancelled()
            try:
                with self._reg:
                    outs = engine.step()
            except Exception as e:  # a failed step fails the requests in it, never the loop
                self._step_failed(e)
                continue
            st = engine.last_stats
            c = self.counters
            c.steps += 1
            c.busy_ms += st.total_ms
            c.policy_ms += st.policy_ms
            c.prefill_ms += st.prefill_ms
            c.draft_ms += st.draft_ms
            c.verify_ms += st.verify_ms
            c.generated += st.generated
            if st.decode_batch:
                k = np.asarray(st.k, dtype=np.int64)
                c.decode_steps += 1
                c.spec_steps += int(k.size and k.max() > 0)
                c.step_verified += st.verified
                c.step_accepted += st.accepted
                self._k_hist += np.bincount(np.clip(k, 0, K_HIST - 1), minlength=K_HIST)
            self._last_k = list(st.k)
            t = time.perf_counter()
            for out in outs:
                self._deliver(out)
            c.deliver_ms += (time.perf_counter() - t) * 1e3
            self._watch.ran(out.request_id for out in outs if not out.finished)

    def _reap_cancelled(self) -> None:
        """Cancel the requests whose client cancelled or went away, among those due to be asked."""
        for rid in self._watch.due(self.live):
            live = self.live.get(rid)
            if live is None:
                continue
            try:
                gone = live.sender.is_cancelled()
            except Exception:
                gone = True
            if gone:
                self._cancel(rid, live)

    def _cancel(self, rid: int, live: Live) -> None:
        self.live.pop(rid, None)
        self.engine.cancel(rid)  # between steps: the KV slot is freed now
        self.counters.cancelled += 1
        try:
            live.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            self.counters.send_errors += 1

    def _deliver(self, out) -> None:
        live = self.live.get(out.request_id)
        if live is None:  # cancelled meanwhile
            return
        live.drafted, live.accepted = out.total_drafted, out.total_accepted
        if out.finished and out.finish_reason is not None and out.finish_reason.value == "cancelled":
            self.live.pop(out.request_id, None)
            return
        if out.new_token_ids and not live.first_token_ns:
            live.first_token_ns, live.first_token_s = time.time_ns(), time.monotonic()
        delta = live.detok.push(out.new_token_ids, final=out.finished)
        try:
            if live.stream:
                if out.new_token_ids or out.finished:
                    self._send(live.sender, self._outputs(live, delta, list(out.new_token_ids)), final=out.finished)
            else:
                live.text.append(delta)
                live.ids.extend(out.new_token_ids)
                if out.finished:
                    self._send(live.sender, self._outputs(live, "".join(live.text), live.ids), final=True)
        except Exception as e:  # the client went away: free its KV now
            self.counters.send_errors += 1
            self.counters.last_error = f"send: {type(e).__name__}: {e}"
            if not out.finished:
                self._cancel(out.request_id, live)
            self.live.pop(out.request_id, None)
            return
        if out.finished:
            self.live.pop(out.request_id, None)
            self.counters.completed += 1
            self.counters.drafted += out.total_drafted
            self.counters.accepted += out.total_accepted
            now = time.monotonic()
            self.metrics.finished(latency_s=now - live.started,
                                  ttft_s=(live.first_token_s or now) - live.started, tokens=out.num_generated,
                                  drafted=out.total_drafted, accepted=out.total_accepted)

    def _step_failed(self, e: Exception) -> None:
        log.exception("llm: engine step failed")
        self.counters.step_errors += 1
        self.counters.last_error = f"step: {type(e).__name__}: {e}"
        for rid, live in list(self.live.items()):
            self.live.pop(rid, None)
            self.engine.cancel(rid)
            self.counters.failed += 1
            self.metrics.failed()
            self._send_error(live.sender, f"the engine failed while running this request ({type(e).__name__}: {e}); "
                                          "retry it")

    # -- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        e = self.engine
        c = self.counters
        st = e.last_stats
        doc = {
            "instance": self.instance, "engine": Path(self.params.engine_dir).name,
            "kv_slots": e.max_batch, "kv_slots_in_use": e.running, "free_kv_tokens": e.free_kv_slots,
            "active_requests": len(self.live), "waiting": st.waiting,
            "requests": c.requests, "rejected": c.rejected, "completed": c.completed, "cancelled": c.cancelled,
            "failed": c.failed, "steps": c.steps, "step_errors": c.step_errors, "send_errors": c.send_errors,
            "drafted": c.drafted, "accepted": c.accepted, "last_k": self._last_k, "last_error": c.last_error,
            "busy_ms": round(c.busy_ms, 3), "policy_ms": round(c.policy_ms, 3), "prefill_ms": round(c.prefill_ms, 3),
            "draft_ms": round(c.draft_ms, 3), "verify_ms": round(c.verify_ms, 3), "deliver_ms": round(c.deliver_ms, 3),
            "decode_steps": c.decode_steps, "spec_steps": c.spec_steps,
            "step_verified": c.step_verified, "step_accepted": c.step_accepted, "generated": c.generated,
            "k_hist": self._k_hist.tolist(),
            "policy": self.current_policy(),
        }
        if self.agent is not None:
            doc["agent"] = self.agent.stats().to_dict()
            doc["plan_version"] = self.agent.plan.version
            # The newest plan the agent has received: it is applied at the next step, so an idle
            # instance shows here what its next request will run under.
            pending = getattr(self.agent, "_pending", None)
            newest = pending.plan if pending is not None else self.agent.plan
            doc["plan_received"] = {"policy": newest.policy, "version": newest.version, "max_k": newest.max_k}
        return doc
