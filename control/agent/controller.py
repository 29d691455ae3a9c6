"""The in-process agent: the controller an executor's engine loop calls every step.

The agent is a ``Policy`` (``decide(view) -> Decision``, ``observe(outcome)``, and ``prune`` delegated
to the current policy when it has one). It wraps the policy the current plan names
(``control.policy.build_policy(plan.policy, plan)``) and follows the plans the control-plane service
publishes:

- On construction it compiles a default plan from the profile it is given (policy, K, SLO and
  drafter set from configuration), so it serves from the first step whether or not a service ever
  answers.
- ``start()`` launches a background thread (``control.agent.link.ServiceLink``) that subscribes
  to the service's plan stream (reconnecting with exponential backoff and jitter, resuming from the
  latest version) and posts telemetry about once a second.
- A new plan is validated and its policy built on the background thread; the engine thread applies
  it at the start of the next ``decide`` by swapping a reference. A plan naming the same policy keeps
  the policy's learned state (``update_context``); a different policy replaces it, and the one it
  replaces is parked with its learned state, to be resumed if a later plan names it again. Nothing on the
  engine thread waits on the network or takes a lock the network side holds.
- ``observe`` aggregates telemetry into numpy accumulators (``TelemetryWindow``). About once a second
  the engine thread moves the finished window onto a bounded queue; when the service is slow or down
  the oldest windows are dropped and counted, never waited for.
- ``observe_positions`` is for engines that report acceptance per request rather than per step
  (TensorRT-LLM's ``request_perf_metrics``): the request's per-position counts go into the same
  window. Call it from the thread that owns the agent's window (the one calling ``observe``), or
  from the only thread that touches the agent when nothing calls ``decide``/``observe``.

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
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from control.agent.link import STOP_TIMEOUT_S
from control.agent.window import REQUEST_CAPACITY, STEP_CAPACITY, TelemetryWindow
from control.agent.wire import MAX_SAMPLES, SOURCE_PATTERN, SOURCE_RULE, host_source
from control.errors import ConfigError
from control.plan import SLO, Plan, compile_plan
from control.policy.types import Decision, Policy, StepOutcome, StepView, wants_fresh
from control.policyspec import (
    DEFAULT_MAX_K,
    MAX_BATCH_LIMIT,
    MAX_K_LIMIT,
    check_policy_bounds,
    parse_policy_spec,
)
from control.profile import Profile

log = logging.getLogger("specctl.agent")

DEFAULT_PLAN_ID = "default"
# A window closes early at this many request-steps (a fast simulator), which bounds the work of
# turning it into a document on the network thread to a few tens of milliseconds.
MAX_WINDOW_REQUEST_STEPS = 1 << 18
MAX_PARKED_POLICIES = 4  # policies set aside by switches, learned state kept (oldest dropped first)
WAIT_POLL_S = 0.01  # how often wait_for_plan looks


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
    drafter_choice: dict | None = None  # the running policy's drafter choice (``drafter_state``), if it has one

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
        max_batch: the executor's largest batch (None: unbounded up to the spec limit); a plan whose
            policy names a k above ``max_k`` or a batch size above ``max_batch`` is refused whole.
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
                 drafters: Sequence[str] | None = None, max_k: int = DEFAULT_MAX_K, slo: SLO | None = None,
                 token: str | None = None, source: str | None = None, telemetry_interval_s: float = 1.0,
                 queue_windows: int = 8, max_samples: int = 256, backoff_initial_s: float = 0.25,
                 backoff_max_s: float = 5.0, timeout_s: float = 2.0, keepalive_timeout_s: float = 20.0,
                 seed: int = 0, max_batch: int | None = None) -> None:
        from control.policy.registry import build_policy

        if not 0 <= max_k <= MAX_K_LIMIT:
            raise ConfigError(f"max_k = {max_k!r}: must be in 0..{MAX_K_LIMIT}")
        if not (math.isfinite(telemetry_interval_s) and telemetry_interval_s > 0):
            raise ConfigError(f"telemetry_interval_s = {telemetry_interval_s!r}: must be a number > 0")
        if queue_windows < 1:
            raise ConfigError(f"queue_windows = {queue_windows!r}: must be >= 1")
        if not 0 <= max_samples <= MAX_SAMPLES:
            raise ConfigError(f"max_samples = {max_samples!r}: must be in 0..{MAX_SAMPLES}")
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
        if source is not None and not re.fullmatch(SOURCE_PATTERN, source):
            raise ConfigError(f"agent source {source!r}: {SOURCE_RULE}")
        self.source = source or host_source()
        self.interval = float(telemetry_interval_s)
        self.max_samples = int(max_samples)
        self.seed = seed
        self.max_k = max_k
        self.max_batch = max_batch
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
        self.policies_resumed = 0
        self._parked: dict[str, Policy] = {}  # policy spec -> instance set aside by a switch, learned state kept
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
            if decision.k.shape != (view.n,):
                raise ValueError(f"decision for {decision.k.shape} requests in a step of {view.n}")
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

    def wants_fresh(self) -> bool:
        """The wrapped policy's ``wants_fresh`` (False without one): an overlap engine asks the agent."""
        return wants_fresh(self._policy)

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
        if now - w.started >= self.interval or w.pos >= MAX_WINDOW_REQUEST_STEPS:
            self._close_window(now)

    def observe_positions(self, drafter: str, steps: int, drafted: int, accepted: int,
                          trials: Sequence[int], accepted_at: Sequence[int]) -> None:
        """One finished request's acceptance, per draft position (``trials[j]``: times position j + 1
        was evaluated, ``accepted_at[j]``: accepted), from an engine without per-step outcomes.
        ``steps``: the request's speculative steps. An unknown drafter name is counted as an error."""
        if drafter not in self.drafters:
            self._error(f"observe_positions: drafter {drafter!r} is not one of {', '.join(self.drafters)}")
            return
        w = self._window
        if w is None or w.drafters != self.drafters:
            w = self._open_window(self.drafters)
        w.on_positions(self.drafters.index(drafter), steps, drafted, accepted, trials, accepted_at)
        now = time.monotonic()
        if now - w.started >= self.interval:
            self._close_window(now)

    # -- plans -------------------------------------------------------------------------------------
    def _apply(self, p: _Pending) -> None:
        self._applied_seq = p.seq
        old = self._plan
        if p.plan.policy == old.policy and hasattr(self._policy, "update_context"):
            try:
                self._policy.update_context(p.policy.ctx)  # keep learned state
            except Exception as e:  # start afresh on the new plan rather than fail the step
                self._error(f"policy {self._policy.name} could not take plan {p.plan_id}: {type(e).__name__}: {e}")
                self._policy = p.policy
        else:
            self._policy = self._switch(old.policy, p)
        self._plan = p.plan
        self._plan_id = p.plan_id
        self.plans_applied += 1
        self.last_apply_delay_s = time.monotonic() - p.received

    def _switch(self, old_spec: str, p: _Pending) -> Policy:
        """The policy for a plan naming a different policy than the running one.

        The running policy is parked with what it has learned (acceptance, cost refit, drafter
        bandit) and a parked instance of the new plan's policy is resumed on the new plan, so an
        override to fixed k and back does not send the adaptive policy through its cold start again.
        Parked policies hold per-slot state keyed by request id, so requests that came and went while
        it was parked are recognised as new when it resumes.
        """
        if hasattr(self._policy, "update_context"):
            self._parked[old_spec] = self._policy
            while len(self._parked) > MAX_PARKED_POLICIES:
                self._parked.pop(next(iter(self._parked)))
        parked = self._parked.pop(p.plan.policy, None)
        if parked is None:
            return p.policy
        try:
            parked.update_context(p.policy.ctx)
        except Exception as e:
            self._error(f"policy {parked.name} could not resume on plan {p.plan_id}: {type(e).__name__}: {e}")
            return p.policy
        self.policies_resumed += 1
        return parked

    def offer_plan(self, plan: Plan, plan_id: str) -> bool:
        """Validate ``plan`` and build its policy (network thread); the engine applies it on its next step.

        Returns False (and counts a rejection) for a plan this executor cannot run.
        """
        from control.policy.registry import build_policy

        pending = self._pending
        latest = pending.plan_id if pending is not None and pending.seq != self._applied_seq else self._plan_id
        if plan_id == latest:
            return True
        try:
            check_policy_bounds(plan.policy, max_k=self.max_k, max_batch=self.max_batch or MAX_BATCH_LIMIT,
                                where=f"plan {plan_id}")
        except ConfigError as e:
            return self.reject_plan(f"plan {plan_id} rejected: {e}")
        if not set(plan.drafters) & set(self.drafters):
            return self.reject_plan(f"plan {plan_id} rejected: its drafters ({', '.join(plan.drafters)}) are not "
                                    f"among this executor's ({', '.join(self.drafters)})")
        try:
            policy = build_policy(plan.policy, plan, seed=self.seed)
        except Exception as e:
            return self.reject_plan(f"plan {plan_id} rejected: {e}")
        self._pending_seq += 1
        self._pending = _Pending(self._pending_seq, plan, plan_id, policy, time.monotonic())
        return True

    def reject_plan(self, reason: str) -> bool:
        """Count a plan that cannot be run (network thread) and keep serving on the current one; False."""
        self.plans_rejected += 1
        self.last_error = reason
        log.warning(reason)
        return False

    def window_payload(self, w: TelemetryWindow, seq: int) -> dict[str, Any]:
        """The telemetry document for a closed window (network thread), under the current plan."""
        plan = self.plan
        return w.to_payload(source=self.source, seq=seq, plan_version=plan.version, plan_id=self.plan_id,
                            dropped_windows=self.dropped_windows, dropped_steps=self.dropped_steps,
                            known=set(plan.profile.drafter_names),
                            short_rejects={d.name for d in plan.profile.drafters if not d.confidences})

    # -- telemetry (engine thread) -----------------------------------------------------------------
    def _open_window(self, drafters: tuple[str, ...]) -> TelemetryWindow:
        now = time.monotonic()
        if self._window is not None and self._window.has_data:
            self._close_window(now)
        self._window = TelemetryWindow(drafters, self.max_samples, now, self._rng)
        return self._window

    def _close_window(self, now: float) -> None:
        w = self._window
        w.closed_at = now
        # Size the next window's buffers from this one's use, so they rarely grow mid-window.
        self._window = TelemetryWindow(w.drafters, self.max_samples, now, self._rng, capacity=max(REQUEST_CAPACITY, w.pos + w.pos // 4),
                                       step_capacity=max(STEP_CAPACITY, w.steps + w.steps // 4))
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
        from control.agent.link import ServiceLink

        self._link = ServiceLink(self, self.url, token=self.token, **self.link_options)
        self._link.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Close the open window, try to send what is queued (up to ``timeout_s``), join the thread.

        Call after the engine loop has stopped (the open window belongs to the engine thread).
        """
        link = self._link
        if link is None:
            return
        if self._window is not None and self._window.has_data:
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
            time.sleep(WAIT_POLL_S)
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
            drafter_choice=self._drafter_choice(),
        )

    def _drafter_choice(self) -> dict | None:
        """The running policy's drafter state, read from another thread: a failed read is no state."""
        read = getattr(self._policy, "drafter_state", None)
        if read is None:
            return None
        try:
            return read()
        except Exception:  # the engine thread moved the arrays under us; the next stats call reads again
            return None
