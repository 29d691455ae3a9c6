"""The in-process agent: the controller an engine loop calls every step (``controller``), its telemetry
window (``window``), its link to the control-plane service (``link``) and the documents they exchange
(``wire``)."""

from control.agent.controller import Agent, AgentStats
from control.agent.window import TelemetryWindow

__all__ = ["Agent", "AgentStats", "TelemetryWindow"]
