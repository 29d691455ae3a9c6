"""Per-iteration, per-request k on the LLM API through TensorRT-LLM's user-provided drafter hook.

TensorRT-LLM fixes ``speculative_config`` once the LLM is built; the documented way to decide per
iteration is ``UserProvidedDecodingConfig(max_draft_len=K, drafter=<Drafter>)``, whose
``prepare_draft_tokens(scheduled_requests, resource_manager)`` fills ``request.py_draft_tokens``
for every generation request of the iteration (``tensorrt_llm/_torch/speculative/drafter.py``).
Our drafter asks the controller for k per request, then drafts that many tokens with a proposer
(n-gram prompt lookup in process; a draft model through any ``proposer(tokens, k)`` callable).

``KPlanner`` is the plain-Python part: it keeps stable slots per request, builds the ``StepView``,
asks the policy, and turns what the target accepted last iteration into a ``StepOutcome``.
``make_drafter`` wraps it in TensorRT-LLM's ``Drafter`` class and needs TensorRT-LLM.

Padding: right after ``prepare_draft_tokens`` the executor calls the base's
``pad_draft_tokens_for_cuda_graph``, which pads every request's draft with zeros to the static
maximum the drafter was built with (``drafter_init_kwargs``), so the k chosen per request changes
what is drafted and accepted, not how many positions the target verifies (max_draft_len for every
request). The planner's per-request totals (``KPlanner.totals``) count the drafts before padding;
TensorRT-LLM's own perf totals are zero on 1.2.x.

Which methods can use it: the hook replaces TensorRT-LLM's own drafter, so it serves methods whose
drafts we can produce in process: n-gram prompt lookup (``ngram_proposer``), or a draft model given
a ``Proposer`` for it (none ships yet for the LLM API path, so draft-target deployments keep
TensorRT-LLM's own drafter and the static ``draft_len_schedule``). One-model EAGLE3 and MTP draft
inside the target's forward pass: their ``speculative_config`` is fixed once the LLM is built, and
only the compiled schedule shapes their k.

Where it runs: TensorRT-LLM calls ``prepare_draft_tokens`` on its executor thread. With one GPU
(``tensor_parallel_size`` 1) and ``TLLM_WORKER_USE_SINGLE_PROCESS=1`` (read by
``enable_worker_single_process_for_tp1`` in ``tensorrt_llm/llmapi/utils.py``) that thread is in the
process that built the LLM, so the hook and the in-process agent share state; otherwise the drafter
is sent to a worker process and the agent would never see its decisions.

Per-request caps (Triton's ``num_draft_tokens``) are keyed by the LLM API request id, which reaches
the executor as ``LlmRequest.py_client_id`` (``tensorrt_llm/executor/worker.py`` sends
``client_id=request.id``; ``tensorrt_llm/_torch/pyexecutor/llm_request.py``). The step time the
policy observes is the wall time between consecutive hook calls: the previous iteration's target
pass, sampling and our drafting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from control.errors import ConfigError
from control.executors.step.clamp import clamp_decision
from control.executors.step.ngram import ngram_propose
from control.executors.step.view import build_view
from control.executors.trtllm import require_tensorrt_llm
from control.executors.trtllm.granularity import hook_granularity
from control.policy.types import I64, Policy, StepOutcome

Proposer = Callable[[np.ndarray, int], np.ndarray]


def ngram_proposer(n: int = 3) -> Proposer:
    return lambda tokens, k: ngram_propose(tokens, k, max_n=n)


class KPlanner:
    """Slots, views and outcomes for a policy driven from inside TensorRT-LLM's executor loop."""

    def __init__(self, policy: Policy, max_k: int, drafter_name: str = "hook", token_budget: int = 8192) -> None:
        self.policy = policy
        self.max_k = int(max_k)
        self.drafters = (drafter_name,)
        self.token_budget = token_budget
        self._slot: dict[int, int] = {}
        self._free: list[int] = []
        self._pending: dict[int, int] = {}  # request id -> tokens drafted last iteration
        self._step = 0
        self.caps: dict[int, int] = {}  # LLM API request id -> num_draft_tokens (set by the host)
        self._last_call: float | None = None
        self._draft_ms = 0.0  # the proposer's time in the previous iteration
        self.last_k = np.zeros(0, dtype=I64)  # the last iteration's k per request (for stats)
        self._client: dict[int, int] = {}  # executor request id -> LLM API request id
        self.totals: dict[int, list[int]] = {}  # LLM API request id -> [drafted, accepted] so far
        # TensorRT-LLM pads every draft to the static max K right after the hook: k changes drafting only
        self.verify = hook_granularity(self.max_k)

    def set_cap(self, client_id: int, cap: int | None) -> None:
        """Cap k for one request (its LLM API request id); None removes the cap."""
        if cap is None:
            self.caps.pop(int(client_id), None)
        else:
            self.caps[int(client_id)] = max(int(cap), 0)

    def caps_for(self, client_ids: Sequence[int]) -> np.ndarray:
        caps, k = self.caps, self.max_k
        return np.fromiter((min(caps.get(int(c), k), k) for c in client_ids), I64, len(client_ids))

    def step_time(self, now: float, max_gap_s: float = 1.0) -> tuple[float, float]:
        """(total_ms, draft_ms) of the iteration that ended now: NaN when the hook was idle before it."""
        last, self._last_call = self._last_call, now
        if last is None or now - last > max_gap_s:
            return float("nan"), self._draft_ms
        return (now - last) * 1e3, self._draft_ms

    def drafting_took(self, ms: float) -> None:
        self._draft_ms = float(ms)

    def _slots(self, rids: Sequence[int]) -> np.ndarray:
        live = set(rids)
        for rid in [r for r in self._slot if r not in live]:  # finished requests give their slot back
            self._free.append(self._slot.pop(rid))
            self._pending.pop(rid, None)
            self._client.pop(rid, None)
        out = np.empty(len(rids), dtype=I64)
        for i, rid in enumerate(rids):
            if rid not in self._slot:
                self._slot[rid] = self._free.pop() if self._free else len(self._slot) + len(self._free)
            out[i] = self._slot[rid]
        return out

    def plan(self, rids: Sequence[int], ctx_lens, remaining, k_cap=None) -> np.ndarray:
        """k per request for this iteration: the policy's decision through the step kernel's clamp."""
        n = len(rids)
        view = build_view(slots=self._slots(rids), request_ids=np.asarray(rids, dtype=I64),
                          ctx_lens=np.asarray(ctx_lens, dtype=I64), remaining=np.asarray(remaining, dtype=I64),
                          drafters=self.drafters, max_k=self.max_k, token_budget=self.token_budget,
                          k_cap=None if k_cap is None else np.asarray(k_cap, dtype=I64), drafter=np.zeros(n, dtype=I64),
                          step=self._step, now=time.monotonic(), verify=self.verify)
        self._step += 1
        k = clamp_decision(view, self.policy.decide(view), 1, 0, str(getattr(self.policy, "name", self.policy))).k
        self.last_k = k
        return k

    def bind(self, rids: Sequence[int], client_ids: Sequence[int]) -> None:
        """Which LLM API request each executor request is (for per-request totals)."""
        for rid, cid in zip(rids, client_ids, strict=True):
            self._client[int(rid)] = int(cid)

    def forget(self, client_id: int) -> None:
        """A finished request's totals and cap go."""
        self.totals.pop(int(client_id), None)
        self.caps.pop(int(client_id), None)

    def _total(self, rid: int) -> list[int]:
        return self.totals.setdefault(self._client.get(rid, rid), [0, 0])

    def drafted(self, rids: Sequence[int], counts) -> None:
        """What each request drafted this iteration (before padding): TensorRT-LLM's perf totals are
        zero on 1.2.x, so these counts are the request's speculation totals."""
        for rid, c in zip(rids, counts, strict=True):
            self._pending[int(rid)] = int(c)
            self._total(int(rid))[0] += int(c)

    def accepted(self, rids: Sequence[int], accepted, ctx_lens, total_ms: float = float("nan"),
                 draft_ms: float = 0.0) -> None:
        """Report what the target accepted of last iteration's drafts (requests that drafted), and
        that iteration's wall time when known (NaN keeps it out of the cost model's samples)."""
        rids = [int(r) for r in rids]
        keep = [i for i, r in enumerate(rids) if r in self._pending and r in self._slot]
        if not keep:
            return
        ids = np.asarray([rids[i] for i in keep], dtype=I64)
        drafted = np.asarray([self._pending.pop(rids[i]) for i in keep], dtype=I64)
        acc = np.minimum(np.asarray(accepted, dtype=I64)[keep], drafted)
        for rid, a in zip(ids.tolist(), acc.tolist(), strict=True):
            self._total(rid)[1] += a
        self.policy.observe(StepOutcome(
            slots=np.asarray([self._slot[r] for r in ids], dtype=I64), request_ids=ids,
            drafter=np.zeros(ids.size, dtype=I64), ctx_lens=np.asarray(ctx_lens, dtype=I64)[keep],
            drafted=drafted, verified=drafted, accepted=acc, step=self._step, now=time.monotonic(),
            total_ms=total_ms, draft_ms=draft_ms, verify_ms=total_ms - draft_ms))


def drafter_init_kwargs(max_k: int) -> dict:
    """``Drafter.__init__`` arguments for our hook (the pinned release's constructor, see
    ``contract/trtllm-1.2.1.json``): a linear draft of at most ``max_k`` tokens, so
    ``max_total_draft_tokens`` = ``max_draft_len`` (``UserProvidedDecodingConfig`` sets the same), which
    the base keeps as ``_static_max_total_draft_tokens``: ``pad_draft_tokens_for_cuda_graph`` pads every
    request's draft to it right after ``prepare_draft_tokens``, so the target verifies ``max_k`` tokens
    per request whatever k we chose. ``max_concurrency`` None keeps speculation on at every batch size
    (``should_use_spec_decode``; the controller turns it off per request with k = 0); no
    ``draft_len_schedule``: the hook decides k every iteration."""
    k = int(max_k)
    if k < 1:
        raise ConfigError(f"the drafter hook needs max_draft_len >= 1 (got {k}); set speculative_config.max_draft_len")
    return {"max_draft_len": k, "max_total_draft_tokens": k, "max_concurrency": None, "draft_len_schedule": None}


def make_drafter(planner: KPlanner, proposer: Proposer):
    """A TensorRT-LLM ``Drafter`` deciding k per request per iteration (needs TensorRT-LLM)."""
    require_tensorrt_llm("the drafter hook")
    from tensorrt_llm._torch.speculative.drafter import Drafter

    class SpecctlDrafter(Drafter):
        # The target's TorchSampler rewinds the KV cache by the padded draft length, so the executor must
        # extend KV capacity after padding (read by releases that have the flag; ignored by 1.2.1's base).
        _needs_padding_kv_extension = True

        def __init__(self) -> None:
            super().__init__(**drafter_init_kwargs(planner.max_k))

        def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None:
            reqs = list(scheduled_requests.generation_requests)
            if not reqs:
                return
            total_ms, draft_ms = planner.step_time(time.monotonic())
            rids = [int(r.py_request_id) for r in reqs]
            cids = [int(c) if (c := getattr(r, "py_client_id", None)) is not None else rid
                    for r, rid in zip(reqs, rids, strict=True)]
            tokens = [np.asarray(r.get_tokens(0), dtype=np.int64) for r in reqs]
            ctx = np.fromiter((t.size for t in tokens), I64, len(reqs))
            planner.accepted(rids, [int(getattr(r, "py_num_accepted_draft_tokens", 0) or 0) for r in reqs], ctx,
                             total_ms, draft_ms)
            remaining = np.fromiter((max(int(r.py_max_new_tokens) - (t.size - int(r.py_orig_prompt_len)), 1)
                                     for r, t in zip(reqs, tokens, strict=True)), I64, len(reqs))
            planner.bind(rids, cids)
            k = planner.plan(rids, ctx, remaining, k_cap=planner.caps_for(cids))
            t0 = time.perf_counter()
            counts = []
            for r, t, ki in zip(reqs, tokens, k, strict=True):
                draft = proposer(t, int(ki)).tolist() if ki > 0 else []
                r.py_draft_tokens = draft
                counts.append(len(draft))
            planner.drafting_took((time.perf_counter() - t0) * 1e3)
            planner.drafted(rids, counts)

    return SpecctlDrafter()
