"""The CPU-pair build: deterministic for a seed, and an engine directory every consumer can load."""

import json
from dataclasses import replace

import pytest
import torch

from control.buildsys.cpu.pair import build_cpu_pair, sha256_file
from control.buildsys.cpu.recipe import QUICK, DistillSpec, EvalSpec, ModelSpec, PairRecipe, TrainSpec
from control.buildsys.cpu.train import native_bf16
from control.errors import ConfigError
from control.executors.manifest import load_manifest
from control.executors.reference.model import load_pretrained

TINY = PairRecipe(
    name="stdlib-tiny",
    vocab=300,
    max_position=256,
    target=ModelSpec("target", hidden=32, layers=1, heads=2, ffn=64),
    drafts=(ModelSpec("draft-a", hidden=16, layers=1, heads=2, ffn=32, tie_embeddings=True),),
    target_train=TrainSpec(steps=6, batch=4, seq=32, lr=3e-3, warmup=2),
    distill=DistillSpec(sequences=8, prompt=8, generate=8, gen_batch=8, topk=4,
                        train=TrainSpec(steps=4, batch=4, seq=16, lr=3e-3, warmup=1, weight_decay=0.0)),
    eval=EvalSpec(prompts=3, prompt=8, generate=8),
    max_train_bytes=120_000,
    max_heldout_files=4,
)


def _hashes(d):
    return {p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*"))
            if p.suffix in (".safetensors", ".json") and p.name != "manifest.json"}


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = build_cpu_pair(tmp_path / "a", TINY, seed=7)
    b = build_cpu_pair(tmp_path / "b", TINY, seed=7)
    build_cpu_pair(tmp_path / "c", TINY, seed=8)
    ha, hb, hc = _hashes(tmp_path / "a"), _hashes(tmp_path / "b"), _hashes(tmp_path / "c")
    assert ha and ha == hb  # tokenizer, configs and weights: byte for byte
    assert a["hashes"] == b["hashes"]
    assert a["acceptance"] == b["acceptance"]
    # the tokenizer depends on the corpus only; the weights on the seed
    assert hc["target/tokenizer.json"] == ha["target/tokenizer.json"]
    assert hc["target/model.safetensors"] != ha["target/model.safetensors"]
    assert hc["draft-a/model.safetensors"] != ha["draft-a/model.safetensors"]


def test_engine_directory_contract(tmp_path):
    out = tmp_path / "engines" / "cpu"
    m = build_cpu_pair(out, TINY, seed=0)
    man = load_manifest(out)  # validates the schema and that every model directory exists
    assert man.sku == "cpu" and man.target == "target" and man.seed == 0
    kinds = {d.name: d.kind for d in man.drafters}
    assert kinds == {"draft-a": "draft_model", "ngram": "ngram"}
    assert all(d.acceptance is not None and 0.0 <= d.acceptance <= 1.0 for d in man.drafters)
    tok = (out / "target" / "tokenizer.json").read_bytes()
    for name in ("target", "draft-a"):
        d = out / name
        assert (d / "tokenizer.json").read_bytes() == tok  # drafts share the target's vocabulary
        cfg = json.loads((d / "config.json").read_text())
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 1)
        meta = json.loads((d / "manifest.json").read_text())
        assert meta["weights_sha256"] == sha256_file(d / "model.safetensors")
        assert meta["seed"] == 0 and meta["corpus"]["sha256"] == m["corpus"]["sha256"]
        assert meta["training"]["seconds"] > 0 and meta["training"]["tokens"] > 0
        # bf16 autocast only where the CPU computes bf16 natively: emulated, it is ~20x slower than fp32
        assert meta["training"]["bf16_autocast"] == (TINY.bf16_autocast and native_bf16())
        model = load_pretrained(d)
        assert model.num_parameters() == meta["params"] == m["params"][name]
        assert model.config.vocab_size == 300
    acc = json.loads((out / "draft-a" / "manifest.json").read_text())["heldout_acceptance"]
    assert len(acc["per_prompt"]) == 3 and acc["min"] <= acc["mean"] <= acc["max"]
    assert not list(tmp_path.glob("engines/.cpu.building-*"))  # no temporary directory left behind


def test_refuses_to_overwrite(tmp_path):
    out = tmp_path / "e"
    build_cpu_pair(out, TINY, seed=0)
    before = _hashes(out)
    with pytest.raises(ConfigError, match="--force"):
        build_cpu_pair(out, TINY, seed=1)
    assert _hashes(out) == before
    build_cpu_pair(out, TINY, seed=1, force=True)
    assert _hashes(out) != before
    other = tmp_path / "not-engines"
    other.mkdir()
    (other / "keep.txt").write_text("user data")
    with pytest.raises(ConfigError, match="not an engine directory"):
        build_cpu_pair(other, TINY, seed=0, force=True)
    assert (other / "keep.txt").read_text() == "user data"


def test_quick_pair(quick_engines):
    """The pair CI shares: draft sizes, held-out acceptance recorded, drafts usable by the target's tokenizer."""
    man = load_manifest(quick_engines)
    assert man.quick
    target = load_pretrained(quick_engines / "target")
    for d in man.drafters:
        if d.kind == "draft_model":
            draft = load_pretrained(quick_engines / d.model)
            assert draft.num_parameters() * 10 <= target.num_parameters()
            assert draft.config.vocab_size == target.config.vocab_size
    raw = json.loads((quick_engines / "manifest.json").read_text())
    assert raw["timings_s"]["total"] > 0
    assert set(raw["acceptance"]) == {"draft-small", "draft-tiny", "ngram"}


def test_saved_models_reproduce_recorded_acceptance(quick_engines):
    """Re-measuring acceptance from the saved checkpoints gives the numbers the manifest recorded."""
    from control.buildsys.cpu.acceptance import heldout_prompts, heldout_token_files, measure_acceptance
    from control.buildsys.cpu.progress import SilentReporter

    files = heldout_token_files(quick_engines)
    ev = QUICK.eval
    prompts = heldout_prompts(files, ev.prompts, ev.prompt)
    target = load_pretrained(quick_engines / "target")
    drafts = {n: load_pretrained(quick_engines / n) for n in ("draft-small", "draft-tiny")}
    acc = measure_acceptance(target, drafts, prompts, ev.generate, SilentReporter())
    recorded = json.loads((quick_engines / "manifest.json").read_text())["acceptance"]
    for name in ("draft-small", "draft-tiny", "ngram"):
        assert acc[name]["mean"] == pytest.approx(recorded[name]["mean"], abs=1e-3)


def test_full_recipe_sizes():
    """The full pair's shapes meet the issue: target >= 20M parameters, every draft <= a tenth of it."""
    from control.buildsys.cpu.recipe import FULL
    from control.buildsys.cpu.train import make_config
    from control.executors.reference.model import LlamaForCausalLM

    def params(spec, r):
        with torch.device("meta"):
            return LlamaForCausalLM(make_config(spec, r.vocab, r.max_position, 0, 1)).num_parameters()

    t = params(FULL.target, FULL)
    assert t >= 20_000_000
    assert len(FULL.drafts) >= 2
    assert all(params(d, FULL) * 10 <= t for d in FULL.drafts)
    q = params(QUICK.target, QUICK)
    assert all(params(d, QUICK) * 10 <= q for d in QUICK.drafts)


def test_tiny_recipe_is_valid():
    with pytest.raises(ConfigError, match="divisible"):
        replace(TINY, target=ModelSpec("target", hidden=30, layers=1, heads=4, ffn=8))
