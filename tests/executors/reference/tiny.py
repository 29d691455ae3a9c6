"""Tiny engine directories for tests: random Llama models, a byte-level BPE tokenizer trained in
process, and a manifest in the engine-directory layout (``control/executors/manifest.py``).

- ``target``: 2 layers, GQA (4 query / 2 KV heads);
- ``draft-small``: the target's first layer with its embeddings, norm and head (a truncated-layer
  copy; the target's last layer is damped, so the copy's proposals agree with it about half the time);
- ``draft-tiny``: an unrelated random 1-layer model of half the width (rarely agrees);
- ``ngram``: prompt lookup;
- ``self-spec``: the target with a 4-token sink and a 24-token window (MagicDec self-speculation).
Weights are scaled up from PyTorch's default init so the models are confident (fewer near-ties)
and the output is not one repeated token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from control.executors.reference.model import LlamaConfig, LlamaForCausalLM, save_pretrained

SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")

TEXT = """
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Stack:
    def __init__(self):
        self.items = []
    def push(self, item):
        self.items.append(item)
    def pop(self):
        return self.items.pop()

The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens with a small model
and verifies them with the large one; accepted tokens are kept and the first rejected one is
replaced by the target's own choice, so the output is exactly what the target alone would write.
"""


def train_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer)
    return tok


def random_model(cfg: LlamaConfig, seed: int, scale: float = 2.5) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(scale)
            if "embed" in name:
                p.normal_(0.0, 1.0)
    return m.eval()


def truncated_copy(target: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": layers})
    m = LlamaForCausalLM(cfg)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    m.load_state_dict(state)
    return m.eval()


def build_tiny_engine_dir(out: str | Path, seed: int = 0, max_position: int = 256) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(SPECIALS[0]), tok.token_to_id(SPECIALS[1])
    common = dict(vocab_size=vocab, max_position_embeddings=max_position, bos_token_id=bos, eos_token_id=eos)
    target = random_model(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, **common), seed)
    with torch.no_grad():  # a weak last layer: the 1-layer truncation then agrees with the target often
        last = target.model.layers[-1]
        last.self_attn.o_proj.weight.mul_(0.3)
        last.mlp.down_proj.weight.mul_(0.3)
    tiny = random_model(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2,                                     tie_word_embeddings=True, **common), seed + 1)
    models = {"target": target, "draft-small": truncated_copy(target, 1), "draft-tiny": tiny}
    for name, m in models.items():
        save_pretrained(m, out / name)
        tok.save(str(out / name / "tokenizer.json"))
    manifest = {
        "schema": "specctl.engines/v1",
        "sku": "cpu",
        "name": "tiny-test",
        "target": "target",
        "drafters": [
            {"name": "draft-small", "kind": "draft_model", "model": "draft-small",
             "params": models["draft-small"].num_parameters()},
            {"name": "draft-tiny", "kind": "draft_model", "model": "draft-tiny", "params": tiny.num_parameters()},
            {"name": "ngram", "kind": "ngram"},
            {"name": "self-spec", "kind": "self_spec", "sink": 4, "window": 24},
        ],
        "quick": True,
        "seed": seed,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out
