"""Triton Python-backend entry point of the ``llm`` model (decoupled, streaming).

All logic lives in ``control.triton.llm_model`` (importable: ``specctl serve`` puts the project on
the server's PYTHONPATH; in the Triton TensorRT-LLM container, ``pip install`` this repository); this
file only hands Triton's calls to it. The config's ``executor`` parameter picks the data plane:
``reference`` (``specctl serve``) or ``trtllm`` (``specctl build --backend pytorch``).
"""

import triton_python_backend_utils as pb_utils

from control.triton.llm_model import load_model


class TritonPythonModel:
    def initialize(self, args):
        self.model = load_model(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
