"""Tiny random-weight engines in the engine directory layout (control/executors/manifest.py).

A 2-layer target and a draft that is the target plus weight noise (it agrees with the target often,
not always, so steps see real rejections), both in Hugging Face layout with one shared BPE
``tokenizer.json``. They build in well under a second, which is what a test session wants; the
trained CPU pair (``specctl build --sku cpu``) is what demos and benchmarks use.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from control.executors.manifest import ENGINES_SCHEMA, load_manifest
from control.executors.reference.model import LlamaConfig, LlamaForCausalLM, load_pretrained, save_pretrained

SEED = 0
WEIGHT_STD = 0.5  # large enough for varied (not looping) greedy text from random weights
DRAFT_NOISE = 0.02  # greedy agreement with the target of about 0.6 a token: drafts of every length accepted, and rejected
CORPUS = (
    "speculative decoding drafts a few tokens with a small model and verifies them with the target "
    "in one pass; the target's answer is the truth, so greedy output equals plain greedy decoding. "
    "the controller chooses how many tokens to draft per request and per step from a cost model "
    "and the acceptance it observes; at large batch sizes drafting costs more than it saves. "
) * 4


def train_tokenizer(vocab_size: int = 96):
    """A small byte-pair tokenizer trained on ``CORPUS`` (the ``tokenizers`` library)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    return tok


def _random_llama(vocab: int, seed: int, noise_from: LlamaForCausalLM | None = None) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2)
    gen = torch.Generator().manual_seed(seed)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        params = list(m.parameters())
        for p in params:
            p.copy_(torch.randn(p.shape, generator=gen) * WEIGHT_STD)
        if noise_from is not None:
            for p, q in zip(params, noise_from.parameters(), strict=True):
                p.copy_(q + DRAFT_NOISE * torch.randn(q.shape, generator=gen))
    return m.eval()


def build_tiny_engines(out: Path) -> Path:
    """Write ``out/{manifest.json, target/, draft/}``; returns ``out``."""
    out = Path(out)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    target = _random_llama(vocab, SEED)
    draft = _random_llama(vocab, SEED + 1, noise_from=target)
    for name, model in (("target", target), ("draft", draft)):
        d = save_pretrained(model, out / name)
        tok.save(str(d / "tokenizer.json"))
        (d / "manifest.json").write_text(json.dumps({"parameters": model.num_parameters(), "seed": SEED,
                                                     "weights": "random" if name == "target" else
                                                     f"target + N(0, {DRAFT_NOISE}^2) noise"}, indent=2) + "\n")
    manifest = {"schema": ENGINES_SCHEMA, "sku": "cpu", "target": "target", "quick": True, "seed": SEED,
                "drafters": [{"name": "draft", "kind": "draft_model", "model": "draft",
                              "params": draft.num_parameters()}]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    load_manifest(out)  # the contract every consumer checks
    return out


def load_target(engines: Path) -> LlamaForCausalLM:
    """The target in float64, as the stand-in models load it (ties in float32 argmax are not the BLS's fault)."""
    return load_pretrained(Path(engines) / load_manifest(engines).target, dtype=torch.float64)


@torch.no_grad()
def greedy(model: LlamaForCausalLM, prompt: list[int], n: int, end_id: int | None = None) -> list[int]:
    """Plain greedy decoding through the dense path (independent of the packed KV path the engines use)."""
    seq = list(prompt)
    out: list[int] = []
    for _ in range(n):
        tok = int(model.forward_train(torch.tensor([seq]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
        if end_id is not None and tok == end_id:
            break
    return out
