"""The in-process agent: the controller an executor's engine loop calls every step.

The agent is a ``Policy`` (``decide(view) -> Decision``, ``observe(outcome)``, and ``prune`` delegated
to the current policy when it has one). It wraps the policy the current plan names
(``control.policy.build_policy(plan.policy, plan)``) and follows the plans the control-plane service
publishes:

- On construction it compiles a default plan from the profile it is given (policy, K, SLO and
  drafter set from configuration), so it serves from the first step whether or not a service ever
  answers.
- ``start()`` launches a background thread (``control.service.client.ServiceLink``) that subscribes
  to the service's plan stream (reconnecting with exponential backoff and jitter, resuming from the
  latest version) and posts telemetry about once a second.
- A new plan is validated and its policy built on the background thread; the engine thread applies
  it at the start of the next ``decide`` by swapping a reference. A plan naming the same policy keeps
  the policy's learned state (``update_context``); a different policy replaces it. Nothing on the
  engine thread waits on the network or takes a lock the network side holds.
- ``observe`` aggregates telemetry into numpy accumulators (``TelemetryWindow``). About once a second
  the engine thread moves the finished window onto a bounded queue; when the service is slow or down
  the oldest windows are dropped and counted, never waited for.

Usage from an engine loop (the Triton model hosts one agent per executor)::

    agent = Agent(profile, url="http://127.0.0.1:8700", policy="adaptive", drafters=("draft", "ngram"))
    agent.start()
    ...                      # executor.set_policy(agent); the engine calls decide/prune/observe
    agent.stop()             # after the engine loop has stopped: sends what is queued, joins the thread
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from control.errors import ConfigError
from control.plan import SLO, Plan, compile_plan
from control.policy.spec import MAX_K_LIMIT, parse_policy_spec
from control.policy.types import Decision, Policy, StepOutcome, StepView
from control.profile import Profile
from control.service.telemetry import K_BUCKETS, MAX_MS, SAMPLE_FIELDS, TELEMETRY_SCHEMA

log = logging.getLogger("specctl.agent")

DEFAULT_PLAN_ID = "default"
_COL = {name: i for i, name in enumerate(SAMPLE_FIELDS)}


class TelemetryWindow:
    """Telemetry of one window of steps, accumulated with a few numpy operations per step.

    Owned by the engine thread while open; after ``Agent`` closes it, only the network thread reads
    it (``to_payload``). Per executor drafter and draft position it keeps histograms of how far each
    request's chain got (evaluated and accepted lengths), from which per-position trials and
    acceptances follow by a reverse cumulative sum at flush time.
    """

    def __init__(self, drafters: tuple[str, ...], max_samples: int, started: float, rng: random.Random) -> None:
        self.drafters = drafters
        m = max(len(drafters), 1)
        self.m = m
        self.started = started
        self.closed_at = started
        self.steps = 0
        self.spec_steps = 0
        self.request_steps = 0
        self.ctx_tokens = 0
        self.max_batch = 0
        self.finished = 0
        self.measured_ms = 0.0
        self.pred_steps = 0
        self.pred_ms = 0.0
        self.pred_measured_ms = 0.0
        self.k_hist = np.zeros(K_BUCKETS, dtype=np.int64)
        self.tried_hist = np.zeros(m * K_BUCKETS, dtype=np.int64)  # [d, L]: requests whose chain evaluated L positions
        self.acc_hist = np.zeros(m * K_BUCKETS, dtype=np.int64)  # [d, L]: requests that accepted L tokens
        self.tok = np.zeros((4, m), dtype=np.int64)  # requests, drafted, verified, accepted per drafter
        self.samples = np.zeros((max_samples, len(SAMPLE_FIELDS)))
        self.seen = 0
        self._rng = rng
        self._offsets = np.arange(m, dtype=np.int64) * K_BUCKETS

    def on_decide(self, k: np.ndarray) -> None:
        if k.size:
            self.k_hist += np.bincount(np.minimum(k, K_BUCKETS - 1), minlength=K_BUCKETS)

    def on_outcome(self, o: StepOutcome, predicted_ms: float) -> None:
        self.steps += 1
        total = o.total_ms
        if not 0.0 <= total <= MAX_MS:  # NaN or corrupt: counts still go out, the time does not
            total = 0.0
        self.measured_ms += total
        n = o.n
        self.finished += int(o.finished.size)
        if 0.0 <= predicted_ms <= MAX_MS:  # False for NaN (no prediction)
            self.pred_steps += 1
            self.pred_ms += predicted_ms
            self.pred_measured_ms += total
        if n == 0:
            return
        ctx = int(o.ctx_lens.sum())
        self.request_steps += n
        self.ctx_tokens += ctx
        if n > self.max_batch:
            self.max_batch = n
        top = K_BUCKETS - 1
        verified = np.minimum(o.verified, top)
        accepted = np.minimum(np.minimum(o.accepted, verified), top)
        spec = o.drafted > 0
        d = np.clip(o.drafter, 0, self.m - 1)
        drafter_used = -1
        drafted_sum = int(o.drafted.sum())
        accepted_sum = 0
        if drafted_sum:
            self.spec_steps += 1
            base = self._offsets[d]
            size = self.m * K_BUCKETS
            self.tried_hist += np.bincount(base + np.minimum(accepted + 1, verified), minlength=size)
            self.acc_hist += np.bincount(base + accepted, minlength=size)
            self.tok += np.stack([np.bincount(d, weights=spec, minlength=self.m),
                                  np.bincount(d, weights=o.drafted, minlength=self.m),
                                  np.bincount(d, weights=o.verified, minlength=self.m),
                                  np.bincount(d, weights=accepted, minlength=self.m)]).astype(np.int64)
            ds = d[spec]
            lo, hi = int(ds.min()), int(ds.max())
            drafter_used = lo if lo == hi else -1
            accepted_sum = int(accepted.sum())
        # Reservoir sample of steps for the service's cost-model refit.
        cap = self.samples.shape[0]
        if cap == 0:
            return
        i = self.seen
        self.seen += 1
        if i >= cap:
            i = self._rng.randrange(self.seen)
            if i >= cap:
                return
        self.samples[i] = (n, ctx, int(o.verified.sum()) + n, o.verify_ms, o.draft_ms, o.total_ms, predicted_ms,
                           o.draft_passes, o.draft_ctx_tokens, o.draft_batched_tokens, drafter_used, drafted_sum,
                           accepted_sum)

    # -- flush (network thread) ------------------------------------------------------------------
    def to_payload(self, *, source: str, seq: int, plan_version: int, plan_id: str, dropped_windows: int,
                   dropped_steps: int) -> dict[str, Any]:
        """The ``specctl.telemetry/v1`` document for this window."""
        drafters = []
        tried = self.tried_hist.reshape(self.m, K_BUCKETS)
        acc = self.acc_hist.reshape(self.m, K_BUCKETS)
        # trials at position j (0-based) = requests whose chain evaluated more than j positions.
        trials = tried[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]
        accepted = acc[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]
        for i, name in enumerate(self.drafters):
            if self.tok[1, i] == 0:
                continue
            last = int(np.flatnonzero(trials[i])[-1]) + 1 if trials[i].any() else 0
            drafters.append({
                "name": name, "requests": int(self.tok[0, i]), "drafted": int(self.tok[1, i]),
                "verified": int(self.tok[2, i]), "accepted": int(self.tok[3, i]),
                "position_trials": trials[i, :last].tolist(), "position_accepted": accepted[i, :last].tolist(),
            })
        used = np.flatnonzero([self.tok[1, i] > 0 for i in range(len(self.drafters))]).tolist()
        remap = {old: new for new, old in enumerate(used)}
        doc: dict[str, Any] = {
            "schema": TELEMETRY_SCHEMA, "source": source, "seq": seq, "plan_version": plan_version, "plan_id": plan_id,
            "window_s": max(self.closed_at - self.started, 1e-6), "steps": self.steps, "spec_steps": self.spec_steps,
            "request_steps": self.request_steps, "ctx_tokens": self.ctx_tokens, "max_batch": self.max_batch,
            "finished": self.finished, "k_hist": self.k_hist.tolist(), "measured_ms_sum": self.measured_ms,
            "predicted_steps": self.pred_steps, "predicted_ms_sum": self.pred_ms,
            "predicted_measured_ms_sum": self.pred_measured_ms, "drafters": drafters,
            "dropped_windows": dropped_windows, "dropped_steps": dropped_steps,
        }
        n = min(self.seen, self.samples.shape[0])
        s = self.samples[:n]
        times = s[:, [_COL["verify_ms"], _COL["draft_ms"], _COL["total_ms"]]]
        s = s[np.all(np.isfinite(times) & (times >= 0) & (times <= MAX_MS), axis=1)]  # drop corrupt timings
        pred = s[:, _COL["predicted_ms"]]
        pred[~(np.isfinite(pred) & (pred >= 0) & (pred <= MAX_MS))] = np.nan
        n = s.shape[0]
        if n:
            cols: dict[str, list] = {}
            for name, j in _COL.items():
                col = s[:, j]
                if name in ("verify_ms", "draft_ms", "total_ms"):
                    cols[name] = col.tolist()
                elif name == "predicted_ms":
                    cols[name] = [None if v != v else v for v in col.tolist()]
                elif name == "drafter":
                    cols[name] = [remap.get(int(v), -1) for v in col]
                else:
                    cols[name] = col.astype(np.int64).tolist()
            doc["samples"] = cols
        return doc


@dataclass(slots=True)
class AgentStats:
    """What the agent reports about itself (for the hosting model's /metrics and for tests)."""

    policy: str
    plan_version: int
    plan_id: str
    plan_source: str  # "default" (compiled locally) or "service"
    plans_applied: int
    plans_rejected: int
    connected: bool
    subscriptions: int  # successful connections to the plan stream
    connect_failures: int
    steps: int
    policy_errors: int
    telemetry_sent: int
    telemetry_rejected: int
    telemetry_post_failures: int
    dropped_windows: int
    dropped_steps: int
    queued_windows: int
    last_error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class _Pending:
    """A validated plan with its freshly built policy, waiting for the engine thread."""

    seq: int
    plan: Plan
    plan_id: str
    policy: Policy
    received: float


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"control URL '{url}' must look like http://HOST:PORT (e.g. http://127.0.0.1:8700)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"control URL '{url}' has an invalid port; use 1..65535") from None
    return url.rstrip("/")


class Agent:
    """A ``Policy`` that follows the control-plane service's plans; see the module docstring.

    Args:
        profile: the deployment's profile; the default plan is compiled from it.
        url: the control-plane service (``http://127.0.0.1:8700``); None = run on the default plan only.
        policy, max_k, slo: the default plan's policy, maximum draft length and TPOT SLO.
        drafters: the executor's drafter names (index = the executor's drafter id). The default plan
            uses the profile's drafters that the executor has; a service plan that shares none of
            them is rejected.
        token: bearer token for telemetry posts (default: the SPECCTL_TOKEN environment variable).
        source: this agent's id in telemetry (default: host pid).
        telemetry_interval_s: window length; queue_windows: bounded queue of closed windows;
        max_samples: step samples per window for the service's refit.
        backoff_initial_s / backoff_max_s: reconnect backoff (exponential with jitter).
        timeout_s: connect and post timeout; keepalive_timeout_s: a plan stream silent for this long
            (the service sends keepalives) is considered dead and reconnected.
    """

    def __init__(self, profile: Profile, *, url: str | None = None, policy: str = "adaptive",
                 drafters: Sequence[str] | None = None, max_k: int = 8, slo: SLO | None = None,
                 token: str | None = None, source: str | None = None, telemetry_interval_s: float = 1.0,
                 queue_windows: int = 8, max_samples: int = 256, backoff_initial_s: float = 0.25,
                 backoff_max_s: float = 5.0, timeout_s: float = 2.0, keepalive_timeout_s: float = 20.0,
                 seed: int = 0) -> None:
        from control.policy.registry import build_policy

        if not 0 <= max_k <= MAX_K_LIMIT:
            raise ConfigError(f"max_k = {max_k!r}: must be in 0..{MAX_K_LIMIT}")
        if not (math.isfinite(telemetry_interval_s) and telemetry_interval_s > 0):
            raise ConfigError(f"telemetry_interval_s = {telemetry_interval_s!r}: must be a number > 0")
        if queue_windows < 1:
            raise ConfigError(f"queue_windows = {queue_windows!r}: must be >= 1")
        if not 0 <= max_samples <= 4096:
            raise ConfigError(f"max_samples = {max_samples!r}: must be in 0..4096")
        if not (0 < backoff_initial_s <= backoff_max_s):
            raise ConfigError(f"backoff: need 0 < backoff_initial_s ({backoff_initial_s}) <= backoff_max_s ({backoff_max_s})")
        spec = str(parse_policy_spec(policy))
        self.drafters = tuple(drafters) if drafters is not None else tuple(profile.drafter_names)
        active = [d for d in profile.drafter_names if d in self.drafters]
        if not active:
            raise ConfigError(f"none of the executor's drafters ({', '.join(self.drafters) or 'none'}) is in profile "
                              f"{profile.sku}/{profile.pair}; it has: {', '.join(profile.drafter_names)}")
        self.url = _check_url(url) if url else None
        self.token = token if token is not None else os.environ.get("SPECCTL_TOKEN")
        self.source = source or f"{os.uname().nodename}-{os.getpid()}"
        self.interval = float(telemetry_interval_s)
        self.max_samples = int(max_samples)
        self.seed = seed
        self.link_options = {"backoff_initial_s": backoff_initial_s, "backoff_max_s": backoff_max_s,
                             "timeout_s": timeout_s, "keepalive_timeout_s": keepalive_timeout_s}

        plan = compile_plan(profile, policy=spec, max_k=max_k, slo=slo or SLO(), drafters=active,
                            reason="agent default: no plan from the control-plane service yet")
        self.default_plan = plan
        self._plan = plan
        self._plan_id = DEFAULT_PLAN_ID
        self._policy: Policy = build_policy(spec, plan, seed=seed)
        # Hand-over from the network thread: a reference, replaced whole (latest wins), never locked.
        self._pending: _Pending | None = None
        self._applied_seq = 0
        self._pending_seq = 0
        self.plans_applied = 0
        self.plans_rejected = 0
        self.last_apply_delay_s = 0.0
        self.steps = 0
        self.policy_errors = 0
        self.last_error = ""
        # Telemetry: the open window (engine thread) and the queue of closed ones (network thread).
        self._rng = random.Random(seed)
        self._window: TelemetryWindow | None = None
        self.queue: deque[TelemetryWindow] = deque(maxlen=queue_windows)
        self.dropped_windows = 0
        self.dropped_steps = 0
        self._last_decision: Decision | None = None
        self._link = None
        self._stopped_link = None

    # -- the Policy protocol (engine thread) -------------------------------------------------------
    @property
    def name(self) -> str:
        return self._policy.name

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def plan_id(self) -> str:
        return self._plan_id

    @property
    def policy(self) -> Policy:
        return self._policy

    def decide(self, view: StepView) -> Decision:
        pending = self._pending
        if pending is not None and pending.seq != self._applied_seq:
            self._apply(pending)
        try:
            decision = self._policy.decide(view)
        except Exception as e:  # a policy bug must not fail requests: plain decoding is always correct
            decision = Decision.plain(view.n)
            self._error(f"policy {self._policy.name} failed in decide: {type(e).__name__}: {e}")
        self._last_decision = decision
        w = self._window
        if w is None or w.drafters != view.drafters:
            w = self._open_window(view.drafters)
        w.on_decide(decision.k)
        return decision

    def prune(self, view: StepView, decision: Decision, drafted: np.ndarray, confidence: np.ndarray) -> np.ndarray:
        prune = getattr(self._policy, "prune", None)
        if prune is None:
            return drafted
        try:
            return prune(view, decision, drafted, confidence)
        except Exception as e:
            self._error(f"policy {self._policy.name} failed in prune: {type(e).__name__}: {e}")
            return drafted

    def observe(self, outcome: StepOutcome) -> None:
        self.steps += 1
        try:
            self._policy.observe(outcome)
        except Exception as e:
            self._error(f"policy {self._policy.name} failed in observe: {type(e).__name__}: {e}")
        d = self._last_decision
        predicted = d.predicted_step_ms if d is not None and d.k.shape[0] == outcome.n else float("nan")
        w = self._window
        if w is None:
            return
        w.on_outcome(outcome, predicted)
        now = time.monotonic()
        if now - w.started >= self.interval:
            self._close_window(now)

    # -- plans -------------------------------------------------------------------------------------
    def _apply(self, p: _Pending) -> None:
        self._applied_seq = p.seq
        old = self._plan
        if p.plan.policy == old.policy and hasattr(self._policy, "update_context"):
            self._policy.update_context(p.policy.ctx)  # keep learned state
        else:
            self._policy = p.policy
        self._plan = p.plan
        self._plan_id = p.plan_id
        self.plans_applied += 1
        self.last_apply_delay_s = time.monotonic() - p.received

    def offer_plan(self, plan: Plan, plan_id: str) -> bool:
        """Validate ``plan`` and build its policy (network thread); the engine applies it on its next step.

        Returns False (and counts a rejection) for a plan this executor cannot run.
        """
        from control.policy.registry import build_policy

        pending = self._pending
        latest = pending.plan_id if pending is not None and pending.seq != self._applied_seq else self._plan_id
        if plan_id == latest:
            return True
        if not set(plan.drafters) & set(self.drafters):
            self.plans_rejected += 1
            self.last_error = (f"plan {plan_id} rejected: its drafters ({', '.join(plan.drafters)}) are not among "
                               f"this executor's ({', '.join(self.drafters)})")
            log.warning(self.last_error)
            return False
        try:
            policy = build_policy(plan.policy, plan, seed=self.seed)
        except Exception as e:
            self.plans_rejected += 1
            self.last_error = f"plan {plan_id} rejected: {e}"
            log.warning(self.last_error)
            return False
        self._pending_seq += 1
        self._pending = _Pending(self._pending_seq, plan, plan_id, policy, time.monotonic())
        return True

    # -- telemetry (engine thread) -----------------------------------------------------------------
    def _open_window(self, drafters: tuple[str, ...]) -> TelemetryWindow:
        now = time.monotonic()
        if self._window is not None and self._window.steps:
            self._close_window(now)
        self._window = TelemetryWindow(drafters, self.max_samples, now, self._rng)
        return self._window

    def _close_window(self, now: float) -> None:
        w = self._window
        w.closed_at = now
        self._window = TelemetryWindow(w.drafters, self.max_samples, now, self._rng)
        if self.url is None:
            return
        q = self.queue
        while len(q) >= q.maxlen:  # full: the service is slow or away; drop the oldest and count it
            try:
                oldest = q.popleft()
            except IndexError:  # the network thread just took it
                break
            self.dropped_windows += 1
            self.dropped_steps += oldest.steps
        q.append(w)

    def _error(self, msg: str) -> None:
        self.policy_errors += 1
        if msg != self.last_error:
            log.error(msg)
        self.last_error = msg

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> Agent:
        """Start the background subscription and telemetry thread (no-op without a URL or if running)."""
        if self.url is None or self._link is not None:
            return self
        from control.service.client import ServiceLink

        self._link = ServiceLink(self, self.url, token=self.token, **self.link_options)
        self._link.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close the open window, try to send what is queued (up to ``timeout_s``), join the thread.

        Call after the engine loop has stopped (the open window belongs to the engine thread).
        """
        link = self._link
        if link is None:
            return
        if self._window is not None and self._window.steps:
            self._close_window(time.monotonic())
        link.stop(timeout_s)
        self._link = None
        self._stopped_link = link

    def wait_for_plan(self, predicate, timeout_s: float) -> bool:
        """Block until ``predicate(plan_id, plan)`` holds for an offered or applied plan (tests, tools)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            p = self._pending
            if predicate(self._plan_id, self._plan) or (p is not None and predicate(p.plan_id, p.plan)):
                return True
            time.sleep(0.01)
        return False

    def stats(self) -> AgentStats:
        link = self._link or self._stopped_link
        return AgentStats(
            policy=self._plan.policy, plan_version=self._plan.version, plan_id=self._plan_id,
            plan_source="default" if self._plan_id == DEFAULT_PLAN_ID else "service",
            plans_applied=self.plans_applied, plans_rejected=self.plans_rejected,
            connected=bool(link and link.connected), subscriptions=link.subscriptions if link else 0,
            connect_failures=link.connect_failures if link else 0, steps=self.steps,
            policy_errors=self.policy_errors, telemetry_sent=link.sent if link else 0,
            telemetry_rejected=link.rejected if link else 0, telemetry_post_failures=link.post_failures if link else 0,
            dropped_windows=self.dropped_windows, dropped_steps=self.dropped_steps, queued_windows=len(self.queue),
            last_error=self.last_error or (link.last_error if link else ""),
        )
