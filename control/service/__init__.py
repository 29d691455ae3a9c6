"""The control-plane service (FastAPI + uvicorn) and the wire formats it shares with agents.

- ``telemetry``: the ``specctl.telemetry/v1`` schema agents post (plans are ``control.plan``).
- ``state``: the plan and what it is compiled from (refit cost model, acceptance, overrides).
- ``estimates``: acceptance tracking and the cost-model refit; ``overrides``: the operator's knobs.
- ``app``: the HTTP API; ``metrics``: Prometheus; ``dashboard``: the HTML page.
- ``server``: binding and running uvicorn; ``client``: the agent's side of the wire.

Importing this package imports nothing heavy; FastAPI is loaded by ``app``.
"""
