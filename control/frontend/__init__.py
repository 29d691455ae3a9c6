"""The front end users reach: an OpenAI-compatible API and a guarded proxy of Triton's KServe HTTP API.

- ``limits``: body size, content type and JSON depth checks, as ASGI middleware in front of everything.
- ``protocol``: the OpenAI request models and response / error bodies.
- ``chat``: rendering chat messages into a prompt (the tokenizer's template or a plain one).
- ``backend``: one generation over Triton's gRPC streaming API, yielding each response.
- ``specmetrics``: per-request speculative-decoding metrics in vLLM's ``metrics.speculative_decoding`` shape.
- ``openai_routes``: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.
- ``proxy``: ``/v2/...`` forwarded to Triton's HTTP server on an internal loopback port.
- ``app``: the FastAPI application; ``process``: running it as a child process of ``specctl serve``.
"""
