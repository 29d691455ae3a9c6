"""Does speculation pay on the CPU pair? Tokens/s of greedy speculative decoding vs plain greedy
decoding, side by side in one run, per drafter and draft length k, at batch 1 (and more with --batch).

    python benchmarks/cpu_pair_speedup.py --engine-dir engines/cpu [--prompts 6] [--new 128]
        [--ks 1,2,3,4,5,6,8] [--batch 1] [--threads 2] [--json OUT]

A minimal greedy speculative loop over the reference model and its KV cache (draft k tokens with the
draft model or prompt lookup, verify them in one target pass of k + 1 tokens per request, keep the
longest matching prefix plus the target's own next token, roll the caches back by lowering lengths).
Every configuration decodes the same held-out prompts; configurations alternate prompt by prompt, so
load from other processes on a shared machine falls on all of them alike. Each run's output is
compared token for token with plain greedy decoding (lossless check). Speed-ups are ratios of
tokens/s measured in this run; absolute times on a shared machine mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from control.buildsys.cpu.ngram import ngram_propose  # noqa: E402
from control.executors.reference.model import KVCache, Segment, load_pretrained  # noqa: E402


class Seqs:
    """Per-request token lists and how many of their tokens each cache holds."""

    def __init__(self, prompts: list[list[int]]):
        self.tok = [list(p) for p in prompts]
        self.t_len = [0] * len(prompts)  # target cache rows valid
        self.d_len = [0] * len(prompts)  # draft cache rows valid


@torch.inference_mode()
def prefill(model, cache, seqs: list[list[int]]):
    ids = torch.tensor([t for s in seqs for t in s])
    segs = [Segment(i, 0, len(s)) for i, s in enumerate(seqs)]
    ends = torch.tensor(np.cumsum([len(s) for s in seqs]) - 1)
    return model(ids, segs, cache, logits_at=ends)


@torch.inference_mode()
def plain_decode(target, prompts, new: int):
    B = len(prompts)
    cache = KVCache(target.config, B, max(len(p) for p in prompts) + new + 16)
    logits = prefill(target, cache, prompts)
    out = [[] for _ in range(B)]
    pos = [len(p) for p in prompts]
    for _ in range(new):
        nxt = logits.argmax(-1)
        for i in range(B):
            out[i].append(int(nxt[i]))
        logits = target(nxt, [Segment(i, pos[i], 1) for i in range(B)], cache)
        pos = [p + 1 for p in pos]
    return out


@torch.inference_mode()
def spec_decode(target, draft, prompts, new: int, k: int, stats: dict):
    """Greedy speculative decoding with a draft model (``draft``) or prompt lookup (``draft=None``)."""
    B = len(prompts)
    maxlen = max(len(p) for p in prompts) + new + k + 16
    tc = KVCache(target.config, B, maxlen)
    s = Seqs(prompts)
    first = prefill(target, tc, prompts).argmax(-1)
    for i in range(B):
        s.t_len[i] = len(prompts[i])
        s.tok[i].append(int(first[i]))
    dc = None
    if draft is not None:
        dc = KVCache(draft.config, B, maxlen)
        prefill(draft, dc, prompts)
        s.d_len = [len(p) for p in prompts]
    goal = [len(p) + new for p in prompts]
    while any(len(s.tok[i]) < goal[i] for i in range(B)):
        live = [i for i in range(B) if len(s.tok[i]) < goal[i]]
        # -- draft k tokens per live request
        props = {i: [] for i in live}
        if draft is None:
            for i in live:
                props[i] = ngram_propose(np.asarray(s.tok[i]), k).tolist()
        else:
            pending = {i: s.tok[i][s.d_len[i]:] for i in live}  # tokens the draft has not seen (>= 1)
            for _ in range(k):
                ids = torch.tensor([t for i in live for t in pending[i]])
                segs = [Segment(i, s.d_len[i], len(pending[i])) for i in live]
                ends = torch.tensor(np.cumsum([len(pending[i]) for i in live]) - 1)
                guess = draft(ids, segs, dc, logits_at=ends).argmax(-1).tolist()
                for j, i in enumerate(live):
                    s.d_len[i] += len(pending[i])
                    props[i].append(guess[j])
                    pending[i] = [guess[j]]
        # -- verify: pending target tokens (the last accepted one) + the proposals, one pass
        chunks = {i: s.tok[i][s.t_len[i]:] + props[i] for i in live}
        ids = torch.tensor([t for i in live for t in chunks[i]])
        segs = [Segment(i, s.t_len[i], len(chunks[i])) for i in live]
        pred = target(ids, segs, tc).argmax(-1).tolist()
        off = 0
        for i in live:
            m = len(s.tok[i]) - s.t_len[i]  # pending tokens before the proposals (1)
            p = pred[off + m - 1: off + len(chunks[i])]
            off += len(chunks[i])
            a = 0
            while a < len(props[i]) and props[i][a] == p[a]:
                a += 1
            stats["drafted"] += len(props[i])
            stats["accepted"] += a
            stats["steps"] += 1
            s.tok[i] += props[i][:a] + [p[a]]
            s.t_len[i] = len(s.tok[i]) - 1
            if dc is not None:
                s.d_len[i] = min(s.d_len[i], len(s.tok[i]) - 1)
    return [s.tok[i][len(prompts[i]): goal[i]] for i in range(B)]


def heldout_prompt_ids(engine_dir: Path, n: int, length: int) -> list[list[int]]:
    from control.buildsys.cpu.acceptance import heldout_prompts, heldout_token_files

    # skip the first prompts: the build measured acceptance on those; these are other windows
    return heldout_prompts(heldout_token_files(engine_dir), n + 7, length)[7:].tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", default="engines/cpu")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4,5,6,8")
    ap.add_argument("--batch", default="1", help="batch sizes, e.g. 1,4")
    ap.add_argument("--drafters", help="comma list (default: every draft model and ngram)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = Path(a.engine_dir)
    manifest = json.loads((d / "manifest.json").read_text())
    target = load_pretrained(d / manifest["target"])
    drafts = {x["name"]: load_pretrained(d / x["model"]) for x in manifest["drafters"] if x["kind"] == "draft_model"}
    names = a.drafters.split(",") if a.drafters else [*drafts, "ngram"]
    ks = [int(x) for x in a.ks.split(",")]
    batches = [int(x) for x in a.batch.split(",")]
    prompts = heldout_prompt_ids(d, a.prompts * max(batches), a.prompt_len)
    results = []
    for B in batches:
        groups = [prompts[i * B:(i + 1) * B] for i in range(a.prompts)]
        configs = [("plain", 0)] + [(n, k) for n in names for k in ks]
        t = {c: 0.0 for c in configs}
        st = {c: {"drafted": 0, "accepted": 0, "steps": 0} for c in configs}
        mismatch = {c: 0 for c in configs}
        plain_warm = plain_decode(target, groups[0], 8)  # warm-up
        del plain_warm
        for gi, g in enumerate(groups):
            t0 = time.perf_counter()
            ref = plain_decode(target, g, a.new)
            t[("plain", 0)] += time.perf_counter() - t0
            for c in configs[1:]:
                n, k = c
                t0 = time.perf_counter()
                out = spec_decode(target, drafts.get(n), g, a.new, k, st[c])
                t[c] += time.perf_counter() - t0
                mismatch[c] += sum(o != r for o, r in zip(out, ref, strict=True))
            print(f"batch {B}: prompt group {gi + 1}/{len(groups)} done", file=sys.stderr, flush=True)
        tokens = a.new * B * len(groups)
        base = tokens / t[("plain", 0)]
        print(f"\nbatch {B}: plain greedy {base:.1f} tokens/s ({tokens} tokens)")
        print(f"{'drafter':<12} {'k':>2} {'tok/s':>8} {'speedup':>8} {'accept':>7} {'tok/step':>8} {'lossless':>8}")
        for c in configs[1:]:
            n, k = c
            tps = tokens / t[c]
            acc = st[c]["accepted"] / max(st[c]["drafted"], 1)
            per = (st[c]["accepted"] + st[c]["steps"]) / max(st[c]["steps"], 1)
            ok = "yes" if mismatch[c] == 0 else f"{mismatch[c]} diff"
            print(f"{n:<12} {k:>2} {tps:8.1f} {tps / base:8.2f}x {acc:7.3f} {per:8.2f} {ok:>8}")
            results.append({"batch": B, "drafter": n, "k": k, "tokens_per_s": tps, "speedup": tps / base,
                            "acceptance": acc, "tokens_per_step": per, "mismatched_requests": mismatch[c]})
        for n in names:
            best = max((r for r in results if r["batch"] == B and r["drafter"] == n), key=lambda r: r["speedup"])
            paying = [r["k"] for r in results if r["batch"] == B and r["drafter"] == n and r["speedup"] > 1.0]
            print(f"best {n}: k={best['k']} {best['speedup']:.2f}x; pays (> 1.0x) at k in {paying or 'none'}")
        results.append({"batch": B, "drafter": "plain", "k": 0, "tokens_per_s": base, "speedup": 1.0})
    env = {"threads": torch.get_num_threads(), "torch": torch.__version__, "loadavg_1m": os.getloadavg()[0],
           "engine": manifest.get("name"), "prompts": a.prompts, "new_tokens": a.new}
    if a.json:
        Path(a.json).write_text(json.dumps({"environment": env, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
