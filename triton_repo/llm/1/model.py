"""Triton Python-backend entry point of the ``llm`` model (decoupled, streaming).

All logic lives in ``control.triton.llm_model`` (importable: ``specctl serve`` puts the project on
the server's PYTHONPATH); this file only hands Triton's calls to it.
"""

import triton_python_backend_utils as pb_utils

from control.triton.llm_model import LlmModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = LlmModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
