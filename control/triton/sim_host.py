"""``executor: sim``: the simulator on a virtual clock behind the same ``llm`` model (tests, demos).

The profile (``profile`` parameter, required) gives the step costs and each drafter's acceptance
(its measured figure, else ``DEFAULT_ACCEPTANCE``); ``max_k``, ``max_batch`` and ``policy`` are the
reference path's. The run serves at most ``sim_requests`` requests. Text is byte-level: a prompt's
UTF-8 bytes are its token ids (shifted past ``BYTE_BASE``), and the synthetic output ids read back as
``" t<id>"`` words, so a client sees streamed text, token ids and counts like any other data plane's,
with modelled step times.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from control.triton.hosted import Hosted
from control.triton.sender import AGENT_BACKOFF_MAX_S, ModelParams

BYTE_BASE = 3  # token ids 0..2 are reserved (pad, bos, eos), as in the CPU pair's tokenizers
SIM_VOCAB = 4096
SIM_SEED = 0


def encode_bytes(text: str) -> list[int]:
    return [b + BYTE_BASE for b in text.encode("utf-8")]


def decode_synthetic(ids: list[int]) -> str:
    return "".join(f" t{int(i)}" for i in ids)


def build_sim(p: ModelParams, instance: str) -> Hosted:
    """A ``SimExecutor`` over the profile's step costs, with the agent as its policy."""
    from control.agent import Agent
    from control.executors.sim import AcceptanceProcess, SimConfig
    from control.executors.sim.executor import SimExecutor
    from control.goodput.acceptance import DEFAULT_ACCEPTANCE
    from control.policyspec import parse_policy_spec
    from control.profile import load_profile

    profile = load_profile(p.profile)
    drafters = tuple(profile.drafter_names)
    rates = np.array([[profile.acceptance.get(n, DEFAULT_ACCEPTANCE) for n in drafters]])  # (1, m)
    proc = AcceptanceProcess(np.repeat(rates, p.sim_requests, axis=0), np.ones(len(drafters)),
                             np.full(len(drafters), np.nan), p.max_k, SIM_SEED)
    agent = Agent(profile, url=p.control_url or None, policy=str(parse_policy_spec(p.policy)), drafters=drafters,
                  max_k=p.max_k, max_batch=p.max_batch, token=p.read_token(), backoff_max_s=AGENT_BACKOFF_MAX_S,
                  source=f"triton-{instance}".replace(" ", "-")[:128])
    ex = SimExecutor(profile.step_cost(list(drafters)), drafters, proc,
                     SimConfig(max_batch=p.max_batch, max_k=p.max_k, seed=SIM_SEED, record_series=False),
                     capacity=p.sim_requests, policy=agent, vocab_size=SIM_VOCAB)

    def describe() -> dict[str, Any]:
        return {"engine": f"sim:{profile.pair}", "kv_slots": p.max_batch, "virtual_clock_s": ex.now,
                "free_kv_tokens": ex.free_kv_slots}

    return Hosted(executor=ex, agent=agent, encode=encode_bytes, encode_words=encode_bytes, decode=decode_synthetic,
                  describe=describe, vocab_size=SIM_VOCAB)
