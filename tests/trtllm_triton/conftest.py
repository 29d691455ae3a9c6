"""Tiny reference engines shared by the tests of this area."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.trtllm_triton.engines import build_tiny_engines, load_target, train_tokenizer


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
