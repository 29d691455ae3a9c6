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
        # Every request is answered through its response sender, a refused one with its error:
        # nothing is raised here (see control/triton/sender.py, ``execute``). Should a bug raise,
        # the error text Triton sends names this frame after the model, not a server path.
        self.model.execute(requests)

    execute.__code__ = execute.__code__.replace(co_filename="llm")

    def finalize(self):
        self.model.finalize()
