"""The builders the ``llm`` model picks from by its ``executor`` parameter; each returns a ``Hosted``."""

from __future__ import annotations

from collections.abc import Callable

from control.triton.hosted import Hosted
from control.triton.llmapi_host import build_trtllm
from control.triton.reference_host import build_reference
from control.triton.sender import ModelParams
from control.triton.sim_host import build_sim

BUILDERS: dict[str, Callable[[ModelParams, str], Hosted]] = {
    "reference": build_reference,  # specctl serve: the PyTorch reference engine
    "trtllm": build_trtllm,  # specctl build --backend pytorch: TensorRT-LLM's LLM API
    "sim": build_sim,  # the simulator on a virtual clock (tests, demos)
}


def build_hosted(p: ModelParams, instance: str) -> Hosted:
    """The executor the parameters name, ready to serve (``ModelParams`` checked the name)."""
    return BUILDERS[p.executor](p, instance)
