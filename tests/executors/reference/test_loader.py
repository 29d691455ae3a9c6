"""load_engine_dir: the happy path, and a one-line error naming the problem for each broken directory."""

from __future__ import annotations

import json
import shutil

import pytest

from control.errors import ConfigError
from control.executors.reference.drafters import SelfSpec
from control.executors.reference.loader import load_engine_dir
from control.executors.reference.model import LlamaConfig, save_pretrained
from tests.executors.reference.tiny import random_model


@pytest.fixture
def engine_copy(tiny_engine_dir, tmp_path):
    d = tmp_path / "eng"
    shutil.copytree(tiny_engine_dir, d)
    return d


def _edit_manifest(d, fn):
    f = d / "manifest.json"
    m = json.loads(f.read_text())
    fn(m)
    f.write_text(json.dumps(m))


def test_loads_target_drafters_and_tokenizer(tiny_engine_dir):
    le = load_engine_dir(tiny_engine_dir)
    assert list(le.drafters) == ["draft-small", "draft-tiny", "ngram", "self-spec"]
    assert le.drafters["ngram"] is None and le.drafters["self-spec"] == SelfSpec(4, 24)
    assert le.drafters["draft-tiny"].num_parameters() < le.drafters["draft-small"].num_parameters() < le.target.num_parameters()
    assert le.target.batch_invariant and not le.drafters["draft-small"].batch_invariant
    ids = le.encode("def f(x): return x")
    assert ids[0] == le.bos_token_id and le.decode(ids) == "def f(x): return x"
    assert le.name == "tiny-test"


def _drop_target_tokenizer(d):
    (d / "target" / "tokenizer.json").unlink()


def _other_draft_tokenizer(d):
    f = d / "draft-tiny" / "tokenizer.json"
    t = json.loads(f.read_text())
    t["model"]["vocab"]["zzz-extra"] = 10_000
    f.write_text(json.dumps(t))


def _eagle_drafter(d):
    _edit_manifest(d, lambda m: m["drafters"].append({"name": "eagle", "kind": "eagle", "model": "target"}))


def _vocab_mismatch(d):
    f = d / "draft-small" / "config.json"
    c = json.loads(f.read_text())
    c["vocab_size"] += 1
    f.write_text(json.dumps(c))


def _draft_with_other_vocab(d):
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    save_pretrained(random_model(cfg, 5), d / "draft-tiny")


def _broken_config(d):
    (d / "target" / "config.json").write_text("{not json")


def _missing_weights(d):
    (d / "draft-tiny" / "model.safetensors").unlink()


def _missing_model_dir(d):
    shutil.rmtree(d / "draft-small")


def _garbage_tokenizer(d):
    for sub in ("target", "draft-small", "draft-tiny"):
        (d / sub / "tokenizer.json").write_text('{"hello": 1}')


@pytest.mark.parametrize(("breaker", "message"), [
    (_drop_target_tokenizer, "has no tokenizer.json"),
    (_other_draft_tokenizer, "differs from the target's tokenizer.json"),
    (_eagle_drafter, "drafter 'eagle' is of kind eagle"),
    (_vocab_mismatch, "has shape \\(320, 64\\) but config.json implies \\(321, 64\\)"),
    (_draft_with_other_vocab, "drafter 'draft-tiny' has vocab_size 300; the target has 320"),
    (_broken_config, "not valid JSON"),
    (_missing_weights, "no \\*.safetensors weights"),
    (_missing_model_dir, "names model directory 'draft-small', which is missing"),
    (_garbage_tokenizer, "not a tokenizers tokenizer.json"),
])
def test_broken_directories_fail_with_one_line(engine_copy, breaker, message):
    breaker(engine_copy)
    with pytest.raises(ConfigError, match=message) as e:
        load_engine_dir(engine_copy)
    assert "\n" not in str(e.value)


def test_missing_directory_and_manifest(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_engine_dir(tmp_path / "nope")
    with pytest.raises(ConfigError, match="no manifest.json"):
        load_engine_dir(tmp_path)
