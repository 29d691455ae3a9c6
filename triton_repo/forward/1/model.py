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
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
