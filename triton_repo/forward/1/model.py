"""Triton Python-backend entry point of the ``ensemble`` and ``tensorrt_llm_bls`` models.

They take tensorrtllm_backend's batched request shapes and forward each row to the ``llm`` model;
all logic lives in ``control.triton.forward_model``.
"""

import triton_python_backend_utils as pb_utils

from control.triton.forward_model import ForwardModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = ForwardModel(pb_utils, args)

    def execute(self, requests):
        # A refused request is answered through its response sender, never raised (see
        # triton_repo/llm/1/model.py).
        self.model.execute(requests)

    execute.__code__ = execute.__code__.replace(co_filename="forward")

    def finalize(self):
        self.model.finalize()
