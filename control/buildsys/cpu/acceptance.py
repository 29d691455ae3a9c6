"""Held-out greedy acceptance of each drafter.

Along the target's own greedy continuation of held-out prompts, the rate at which a drafter's
next-token guess equals the target's greedy token. With greedy verification a draft token at
position j is accepted exactly when the tokens before it were accepted and it matches, and the
drafter then conditions on the target's own tokens, so this teacher-forced match rate is the
per-token acceptance greedy speculative decoding sees.
"""

from __future__ import annotations

import numpy as np
import torch

from control.buildsys.cpu.generate import greedy_generate
from control.buildsys.cpu.ngram import ngram_match_rate
from control.buildsys.cpu.progress import Reporter
from control.errors import ConfigError
from control.executors.reference.model import LlamaForCausalLM

PROMPT_SEED = 20240917  # fixed: every build measures on the same held-out prompts


def heldout_prompts(files: list[np.ndarray], n: int, length: int) -> torch.Tensor:
    """``n`` prompts of ``length`` tokens from the held-out files, spread over files (round robin)
    at deterministic random offsets."""
    usable = [f for f in files if f.shape[0] >= length + 1]
    if not usable:
        raise ConfigError(f"no held-out file has {length + 1} tokens; use a larger corpus or a shorter eval prompt")
    rng = np.random.default_rng(PROMPT_SEED)
    rows = []
    for i in range(n):
        f = usable[i % len(usable)]
        s = int(rng.integers(0, f.shape[0] - length))
        rows.append(f[s: s + length])
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def heldout_token_files(engine_dir) -> list[np.ndarray]:
    """The held-out files of a built pair's corpus, encoded with its tokenizer (as the build did)."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer

    from control.buildsys.cpu.corpus import load_corpus, stdlib_root
    from control.buildsys.cpu.tokenizer import encode_files

    d = Path(engine_dir)
    m = json.loads((d / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(d / m["target"] / "tokenizer.json"))
    root = m.get("corpus", {}).get("root") or stdlib_root()
    corpus = load_corpus(root, max_heldout_files=m.get("recipe", {}).get("max_heldout_files"), heldout_only=True)
    return encode_files(tok, [f.text for f in corpus.heldout])


def summarize(rates: np.ndarray) -> dict:
    return {
        "mean": round(float(rates.mean()), 4),
        "std": round(float(rates.std()), 4),
        "min": round(float(rates.min()), 4),
        "p10": round(float(np.quantile(rates, 0.1)), 4),
        "p50": round(float(np.quantile(rates, 0.5)), 4),
        "p90": round(float(np.quantile(rates, 0.9)), 4),
        "max": round(float(rates.max()), 4),
        "per_prompt": [round(float(x), 4) for x in rates],
    }


@torch.inference_mode()
def draft_match_rates(draft: LlamaForCausalLM, seqs: torch.Tensor, prompt_len: int) -> np.ndarray:
    logits = draft.forward_train(seqs[:, :-1])
    guess = logits[:, prompt_len - 1:].argmax(-1)
    return (guess == seqs[:, prompt_len:]).float().mean(1).numpy()


def measure_acceptance(target: LlamaForCausalLM, drafts: dict[str, LlamaForCausalLM], prompts: torch.Tensor,
                       new_tokens: int, reporter: Reporter, batch: int = 16) -> dict[str, dict]:
    """Per drafter (each draft model and ``ngram``): the per-prompt acceptance summary."""
    reporter.phase("held-out acceptance", prompts.shape[0] * new_tokens)
    seqs = torch.cat([greedy_generate(target, prompts[i: i + batch], new_tokens, reporter=reporter)
                      for i in range(0, prompts.shape[0], batch)])
    P = prompts.shape[1]
    out = {name: summarize(draft_match_rates(d, seqs, P)) for name, d in drafts.items()}
    arr = seqs.numpy()
    out["ngram"] = summarize(np.array([ngram_match_rate(row, P) for row in arr]))
    return out
