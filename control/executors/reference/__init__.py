"""The reference executor: a PyTorch engine for Llama checkpoints in Hugging Face layout.

- ``model.py``: the Llama model, packed KV-cache forward (batch invariant), HF save/load.
- ``kvpool.py``: per-request KV slots of the target and draft caches, valid lengths, rollback.
- ``drafters.py``: draft models (with catch-up and confidence cuts), self-speculation, n-gram lookup.
- ``sampling.py``: filtered sampling, per-position noise, bad words; ``sampler.py``: the engine's
  sampler over its per-slot parameters.
- ``engine.py``: ``ReferenceEngine``, the continuous-batching speculative engine: requests, the
  loop, admission and prefill, commit; ``config.py``: ``EngineConfig``; ``requests.py``: a request
  inside the engine and ``GenerationResult``; ``slots.py``: the slot table (tokens, caps, sampling
  parameters per batch slot).
- ``decode.py``: the engine's parts of the step kernel (``control/executors/step``): drafting, the
  packed verify pass, acceptance, draft-cache rollback.
- ``policy_calls.py``: calls into the policy with errors contained; ``overlap.py``: the policy on a
  worker thread.
- ``loader.py``: ``load_engine_dir`` (manifest, models, tokenizer).
- ``calibrate.py``: a stored or quickly measured profile for an engine (until the profiler's).

Heavy imports (torch) live in these modules; import them where they are used.
"""
