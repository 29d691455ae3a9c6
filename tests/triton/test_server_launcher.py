"""The tritonserver launcher against the real server from the nvidia-pytriton wheel."""

import json
import socket
import textwrap
import urllib.request

import pytest

from control.errors import SpecctlError
from control.triton.server import TritonServer, free_ports, free_server_ports, port_free
from tests.triton.listening import listening_on

CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = textwrap.dedent('''
    import sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                s = r.get_response_sender()
                t = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0]
                # prove the stub runs this interpreter: echo its version with each part
                for i in range(3):
                    out = t + f"-{i}-{sys.version_info.major}.{sys.version_info.minor}".encode()
                    s.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([out], dtype=object))]))
                s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')


@pytest.fixture
def repo(tmp_path):
    m = tmp_path / "models" / "echo"
    (m / "1").mkdir(parents=True)
    (m / "config.pbtxt").write_text(CONFIG)
    (m / "1" / "model.py").write_text(MODEL)
    return tmp_path


def _ports():
    return free_server_ports()


def test_server_starts_streams_and_stops(repo):
    import sys

    srv = TritonServer(repo / "models", repo / "run", **_ports())
    with srv:
        req = urllib.request.Request(f"{srv.http_url}/v2/models/echo/generate_stream",
                                     data=json.dumps({"text_input": "hi"}).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        assert [e["text_output"] for e in events] == [f"hi-{i}-{ver}" for i in range(3)]
        # loopback only
        assert srv.host == "127.0.0.1"
    assert not srv.alive()
    assert port_free(srv.ports["http"])


def test_taken_port_is_reported_before_starting(repo):
    ports = _ports()
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["grpc_port"]))
        s.listen()
        with pytest.raises(SpecctlError, match=f"grpc port {ports['grpc_port']} already in use"):
            TritonServer(repo / "models", repo / "run", **ports).start()


def test_free_ports_are_distinct_and_bindable():
    """Picked together, never twice the same (one at a time, a just-closed port can come back, and a
    deployment's control-plane service and Triton's metrics endpoint then collided on it in CI)."""
    for _ in range(20):
        ports = free_ports(64)
        assert len(set(ports)) == 64
    assert all(port_free(p) for p in free_server_ports().values())


def test_a_broken_model_fails_fast_with_the_log(repo):
    (repo / "models" / "echo" / "1" / "model.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(SpecctlError, match="boom at import|exited|not ready"):
        TritonServer(repo / "models", repo / "run", **_ports()).start(timeout_s=60)


def test_http_listens_on_loopback_whatever_the_host(repo):
    """Triton's HTTP server can be crashed by one request; only gRPC and metrics follow ``host``."""
    ports = _ports()
    srv = TritonServer(repo / "models", repo / "run", host="127.0.0.2", **ports)
    with srv:
        assert listening_on(ports["http_port"]) == {"127.0.0.1"}
        assert listening_on(ports["grpc_port"]) == {"127.0.0.2"}
        assert listening_on(ports["metrics_port"]) == {"127.0.0.2"}
        assert srv.http_url == f"http://127.0.0.1:{ports['http_port']}"
        with urllib.request.urlopen(f"{srv.http_url}/v2/health/ready", timeout=10) as r:
            assert r.status == 200
