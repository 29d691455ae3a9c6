"""``executor: reference`` (what ``specctl serve`` renders): the PyTorch reference engine over an
engine directory, with the agent inside it when the engines have drafters."""

from __future__ import annotations

from pathlib import Path

from control.errors import ConfigError
from control.triton.hosted import Hosted
from control.triton.sender import AGENT_BACKOFF_MAX_S, PROMPT_BYTES_PER_TOKEN, ModelParams


def build_reference(p: ModelParams, instance: str) -> Hosted:
    """Load the engine directory, the profile (given, stored or calibrated) and the agent."""
    import torch

    from control.agent import Agent
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.policyspec import parse_policy_spec
    from control.profile import load_profile

    torch.set_num_threads(p.threads)
    loaded = load_engine_dir(p.engine_dir)
    drafters = tuple(loaded.drafters)
    if p.drafter and p.drafter not in drafters:
        raise ConfigError(f"llm model parameter drafter = {p.drafter!r}: not in {p.engine_dir} (it has: {', '.join(drafters)})")
    policy_spec = str(parse_policy_spec(p.policy))
    agent = None
    policy = PlainDecoding()
    if drafters:
        if p.profile:
            profile = load_profile(p.profile)
        else:
            profile = find_profile(loaded)
            if profile is None or profile.pair != loaded.name:
                profile = quick_profile(loaded)
        agent = Agent(profile, url=p.control_url or None, policy=policy_spec, drafters=drafters,
                      max_k=p.max_k, max_batch=p.max_batch, token=p.read_token(),
                      backoff_max_s=AGENT_BACKOFF_MAX_S, source=f"triton-{instance}".replace(" ", "-")[:128])
        policy = agent
    engine = ReferenceEngine(loaded.target, loaded.drafters, policy,
                             EngineConfig(max_batch=p.max_batch, max_k=p.max_k, default_drafter=p.drafter or None,
                                          overlap_policy=p.overlap_policy))
    tok = loaded.tokenizer
    bos = [] if loaded.bos_token_id is None else [loaded.bos_token_id]

    def describe() -> dict:
        doc = {"engine": Path(p.engine_dir).name, "kv_slots": engine.max_batch, "kv_slots_in_use": engine.running,
               "free_kv_tokens": engine.free_kv_slots, "overlap_policy": p.overlap_policy}
        worker = engine.policy_worker
        if worker is not None:  # policy_ms is then the step loop's share: hand-over + wait (policy_wait_ms)
            doc.update(policy_worker_ms=round(worker.busy_ms, 3), policy_worker_cpu_ms=round(worker.cpu_ms, 3),
                       policy_wait_ms=round(worker.wait_ms, 3),
                       policy_worker_jobs=worker.jobs, policy_prepared_used=worker.used,
                       policy_fresh_steps=engine.calls.fresh_steps)
        return doc

    return Hosted(
        executor=engine, agent=agent, encode=loaded.encode,
        encode_words=lambda s: tok.encode(s, add_special_tokens=False).ids, decode=loaded.decode, describe=describe,
        vocab_size=loaded.target.config.vocab_size, max_prompt_bytes=engine.max_len * PROMPT_BYTES_PER_TOKEN,
        # encode_batch tokenises without the GIL (encode holds it much of the time), so the engine
        # loop and execute() run on while a large prompt is tokenised; the same ids as encode.
        encode_large=lambda s: bos + tok.encode_batch([s], add_special_tokens=False)[0].ids,
        close=engine.close,
    )
