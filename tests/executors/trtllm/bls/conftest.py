"""Tiny reference engines, and one real Triton server per session serving the rendered TensorRT-engine
deployment with stand-in engines (see deploy.py): the streaming speculative BLS ``specctl_bls`` and
its variants."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from control.triton.server import TritonServer, free_server_ports
from tests.conftest import make_profile
from tests.executors.trtllm.bls.deploy import ROOT, build_repository
from tests.executors.trtllm.bls.engines import build_tiny_engines, load_target, train_tokenizer


@pytest.fixture(scope="session")
def engines(tmp_path_factory) -> Path:
    return build_tiny_engines(tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="session")
def target(engines):
    torch.set_num_threads(1)  # tiny model; a shared 2-core machine
    return load_target(engines)


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="session")
def triton(tmp_path_factory, engines):
    work = tmp_path_factory.mktemp("bls")
    profile = work / "profile.yaml"
    profile.write_text(yaml.safe_dump(make_profile().to_dict()))
    repo = build_repository(work, engines, profile)
    srv = TritonServer(repo, work / "run", **free_server_ports(),
                       pythonpath=[str(ROOT)],  # the Python backend imports `control` from this checkout
                       extra_args=["--model-load-thread-count=8"])  # all eight models load at once
    srv.start(timeout_s=240)
    try:
        yield srv
    finally:
        srv.stop()
