"""The reference executor: a PyTorch engine for Llama checkpoints in Hugging Face layout.

- ``model.py``: the Llama model, packed KV-cache forward (batch invariant), HF save/load.
- ``kvpool.py``: per-request KV slots of the target and draft caches, valid lengths, rollback.
- ``drafters.py``: draft models (with catch-up and confidence cuts) and n-gram prompt lookup.
- ``sampling.py``: filtered sampling, greedy and rejection-sampling verification, stop/bad words.
- ``engine.py``: ``ReferenceEngine``, the continuous-batching speculative engine.
- ``loader.py``: ``load_engine_dir`` (manifest, models, tokenizer).
- ``calibrate.py``: a stored or quickly measured profile for an engine (until the profiler's).

Heavy imports (torch) live in these modules; import them where they are used.
"""
