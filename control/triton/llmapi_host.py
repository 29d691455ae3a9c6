"""``executor: trtllm`` (what ``specctl build --backend pytorch`` renders): TensorRT-LLM's LLM API
behind the ``Executor`` protocol (``control/executors/trtllm/llmapi_steps.py``), served by the same
``llm`` model as the reference engine (``control/triton/llm_model.py``), with the same request and
response contract: the tensors are parsed by ``control.triton.llm_request.parse_request`` and checked
against the model's vocabulary and ``max_seq_len`` with the reference engine's messages, so a client
sees the same one-line errors on either data plane.

``build_trtllm`` reads the config's parameters (``llm_api_options``, ``model``, ``plan``, ``control``,
``trtllm_version``), then needs TensorRT-LLM of the release the build recorded (``trtllm_version``;
empty: the pinned 1.2.1): without it, or with another release installed, the model fails to load
with one line saying what it found and what it needs. It builds the agent from the build's plan (its
profile, policy and K) and the executor. A cancelled request is aborted in TensorRT-LLM at once
(``RequestOutput.abort``) when the model's loop next looks, at most ``cancel_check_ms`` (default 50)
later.

How k is controlled (``choose_control``; reported by a ``stats`` request, and declared as the
executor's ``KScope``):

- ``drafter-hook`` (per request): n-gram deployments on one GPU. ``speculative_config`` becomes
  ``UserProvidedDecodingConfig`` with our drafter (``control/executors/trtllm/drafter_hook.py``):
  every iteration TensorRT-LLM asks it for drafts, and it asks the agent for k per request, so the
  plan the control plane pushes (per batch size, per request, with ``num_draft_tokens`` caps) takes
  effect at the next iteration, and the agent observes every iteration's acceptance and time.
- ``static-schedule`` (static): everything else. TensorRT-LLM fixes ``speculative_config`` once the
  LLM is built; the plan reaches it as the ``draft_len_schedule`` (batch size -> k) compiled at build
  time. That is the only knob for one-model EAGLE3 and MTP, whose drafting runs inside the target's
  forward pass; draft-target keeps TensorRT-LLM's own draft model and the schedule, because no
  in-process draft-model proposer exists for the hook yet. Per-request acceptance
  (``request_perf_metrics.speculative_decoding``; where 1.2.x returns those totals zeroed, the
  estimate from ``avg_decoded_tokens_per_iter``, see ``spec_metrics``) feeds the agent's telemetry
  when each request ends (``Agent.observe_positions``), so the control plane sees acceptance; the
  plans it pushes change nothing in TensorRT-LLM until the deployment is rebuilt, and
  ``num_draft_tokens`` cannot be applied (counted as ``uncapped`` in the stats).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control.errors import ConfigError
from control.executors.base import KScope
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.triton.hosted import Hosted
from control.triton.sender import ModelParams

log = logging.getLogger("specctl.triton.llmapi")

# decoding_type values whose drafts the hook produces in process (control/executors/trtllm/drafter_hook.py).
HOOK_METHODS = ("NGram",)
WHY_STATIC = {
    "Draft_Target": "no in-process draft-model proposer exists for the drafter hook yet, so TensorRT-LLM's own "
                    "draft model runs the draft_len_schedule compiled from the plan",
    "Eagle3": "EAGLE3 drafts inside TensorRT-LLM (one-model: in the target's forward pass); its "
              "speculative_config, with the compiled draft_len_schedule, is fixed once the LLM is built",
    "MTP": "MTP drafts inside the target's forward pass; its speculative_config, with the compiled "
           "draft_len_schedule, is fixed once the LLM is built",
}
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"
K_SCOPES = {"drafter-hook": KScope.per_request, "static-schedule": KScope.static, "none": KScope.none}
# speculative_config.decoding_type -> the method name of specctl build (control/executors/trtllm/granularity.py)
METHODS = {"Draft_Target": "draft_target", "NGram": "ngram", "Eagle3": "eagle3", "MTP": "mtp"}
DEFAULT_TOKEN_BUDGET = 8192  # max_num_tokens when the options give none (TensorRT-LLM's default)
DEFAULT_NGRAM = 3  # max_matching_ngram_size when the options give none


@dataclass(frozen=True)
class KControl:
    """How the plan's k reaches TensorRT-LLM in this deployment."""

    mode: str  # "drafter-hook" | "static-schedule" | "none"
    method: str | None  # speculative_config.decoding_type
    reason: str


def choose_control(requested: str, options: Mapping[str, Any], env: Mapping[str, str] | None = None) -> KControl:
    """``drafter-hook`` where the method and the parallelism allow it, else the static schedule."""
    env = os.environ if env is None else env
    sc = options.get("speculative_config")
    if not sc:
        return KControl("none", None, "the options have no speculative_config: TensorRT-LLM decodes without "
                                      "speculation")
    method = sc.get("decoding_type")
    if requested != "drafter-hook":
        return KControl("static-schedule", method, "the deployment asks for the static draft_len_schedule "
                                                   "compiled from the plan at build time")
    if method not in HOOK_METHODS:
        return KControl("static-schedule", method, WHY_STATIC.get(method, f"the drafter hook cannot draft for "
                                                                          f"decoding_type {method!r}"))
    gpus = int(options.get("tensor_parallel_size", 1) or 1) * int(options.get("pipeline_parallel_size", 1) or 1)
    if gpus != 1:
        return KControl("static-schedule", method, f"the drafter hook needs one GPU (this deployment has {gpus}): "
                                                   "with more, TensorRT-LLM runs it in worker processes the agent "
                                                   "cannot reach")
    if env.get(SINGLE_PROCESS_ENV, "1") != "1":
        return KControl("static-schedule", method, f"{SINGLE_PROCESS_ENV}={env[SINGLE_PROCESS_ENV]} puts "
                                                   "TensorRT-LLM's executor in a worker process the agent cannot reach")
    return KControl("drafter-hook", method, "the agent chooses k per request per iteration through "
                                            "UserProvidedDecodingConfig")




def build_trtllm(p: ModelParams, instance: str) -> Hosted:
    """The LLM API executor for the deployment's options and plan, with its agent (see the module docstring)."""
    from control.executors.trtllm.llmapi import LlmApiExecutor, load_options
    from control.executors.trtllm.llmapi_steps import LlmApiSteps
    from control.executors.trtllm.version import PINNED, require_release

    opts = load_options(p.llm_api_options)
    model_path = p.model or str(opts.get("model") or "")
    if not model_path:
        raise ConfigError("llm model parameter model is empty and the LLM API options name no model; set it to "
                          "the target checkpoint (`specctl build` renders it)")
    control = choose_control(p.control, opts)
    plan = _load_plan(p.plan)
    version = p.trtllm_version or PINNED
    require_release(version, f"the llm model (executor: trtllm, {Path(p.llm_api_options).name})")
    sc = opts.get("speculative_config") or {}
    max_k = int(sc.get("max_draft_len", 0) or 0)
    if plan is None and control.mode == "drafter-hook":
        control = KControl("static-schedule", control.method, "no plan parameter: the drafter hook has "
                           "no controller to ask, so the options' draft_len_schedule applies")
    if plan is not None and control.mode == "drafter-hook":
        max_k = min(max_k, plan.max_k)
    agent = _agent(p, plan, control, max_k, instance)
    drafter_name = plan.default_drafter if plan is not None else ""
    planner, drafter = _hook(agent, control, max_k, drafter_name, opts) if control.mode == "drafter-hook" else (None, None)
    log.warning("llm %s: TensorRT-LLM LLM API, k control %s (%s)", instance, control.mode, control.reason)
    api = LlmApiExecutor(model_path, opts, drafter=drafter, version=version)
    scope = K_SCOPES[control.mode] if max_k > 0 else KScope.none
    steps = LlmApiSteps(api, agent, k_scope=scope, verify=_granularity(control, max_k), max_k=max_k,
                        drafter_name=drafter_name, planner=planner, poll_s=p.cancel_check_ms / 1e3)

    def describe() -> dict[str, Any]:
        doc: dict[str, Any] = {
            "executor": "trtllm", "model": Path(model_path).name, "k_control": control.mode,
            "k_control_reason": control.reason, "method": control.method, "max_k": max_k, "aborted": steps.aborted,
            "uncapped": steps.uncapped, "metrics_to_agent": steps.metrics_to_agent,
        }
        if planner is not None:
            doc["hook"] = {"iterations": planner._step, "last_k": planner.last_k.tolist(),
                           "capped_requests": len(planner.caps)}
        return doc

    return Hosted(executor=steps, agent=agent, encode=api.encode,
                  encode_words=lambda s: api.encode(s, add_special_tokens=False), decode=api.decode,
                  describe=describe, close=steps.shutdown)


def _load_plan(path: str):
    if not path:
        return None
    from control.plan import load_plan

    return load_plan(path)


def _agent(p: ModelParams, plan, control: KControl, max_k: int, instance: str):
    """The agent on the build's plan (None without a plan or without speculation)."""
    if plan is None or control.mode == "none":
        return None
    from control.agent import Agent

    return Agent(plan.profile, url=p.control_url or None, policy=plan.policy, drafters=(plan.default_drafter,),
                 max_k=min(max_k, plan.max_k), slo=plan.slo, token=p.read_token(),
                 source=f"triton-{instance}".replace(" ", "-")[:128])


def _hook(agent, control: KControl, max_k: int, drafter_name: str, opts: Mapping[str, Any]):
    """(KPlanner, TensorRT-LLM drafter) for ``drafter-hook``: n-gram drafts, k from the agent."""
    from control.executors.trtllm.drafter_hook import KPlanner, make_drafter, ngram_proposer

    os.environ.setdefault(SINGLE_PROCESS_ENV, "1")  # before the LLM is built: the hook runs in this process
    sc = opts.get("speculative_config") or {}
    planner = KPlanner(agent, max_k, drafter_name=drafter_name,
                       token_budget=int(opts.get("max_num_tokens", DEFAULT_TOKEN_BUDGET) or DEFAULT_TOKEN_BUDGET))
    return planner, make_drafter(planner, ngram_proposer(int(sc.get("max_matching_ngram_size", DEFAULT_NGRAM)
                                                             or DEFAULT_NGRAM)))


def _granularity(control: KControl, max_k: int) -> VerifyGranularity:
    """What TensorRT-LLM verifies per request on this path (``deployment_granularity``)."""
    if control.mode == "none" or max_k <= 0 or control.method not in METHODS:
        return PER_REQUEST
    from control.executors.trtllm.granularity import deployment_granularity

    hook = "drafter-hook" if control.mode == "drafter-hook" else None
    return deployment_granularity("pytorch", METHODS[control.method], hook, max_k)[0]
