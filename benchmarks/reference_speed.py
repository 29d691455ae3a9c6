"""Speed of the reference executor: speculative vs plain decoding, measured side by side in one run.

For each batch size (default 1, 4, 16, 32) the same prompts run under plain decoding, fixed k for
each k in --ks and each drafter in --fixed-drafters (the best of them is "best fixed k", chosen in
hindsight, per drafter and overall), and the adaptive policy, both
choosing among all drafters ("adaptive") and restricted to the fixed-k drafter ("adaptive-1d"); each
configuration's generated tokens per second is reported as a ratio to plain decoding at that batch
size. "plain-fast" is plain decoding with the target's batch invariance off (no row padding, fused
attention): the fastest non-speculative baseline, which gives up the bitwise lossless guarantee;
speculation is also reported against it. Configurations are interleaved within each repeat so machine drift hits all of them alike;
the median over repeats is reported. Also reported: acceptance, the mean draft length, the share
of step time spent in the policy (decide + prune + observe), and whether every configuration
produced exactly plain decoding's tokens (greedy speculation is lossless).

Prompts are snippets of this Python's standard library sources (what the CPU pair is trained on),
tokenized by the engine's tokenizer. ``--synthetic DIR`` first writes a random-weight engine at the
full CPU pair's shapes (target 512x6, drafts: a 2-layer truncated copy and a 96-wide model) for
when no built engine exists; its speed ratios are meaningful, its text is not.

    python benchmarks/reference_speed.py --engine-dir engines/cpu [--batches 1,4,16,32] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def stdlib_prompts(loaded, n: int, length: int, seed: int = 0) -> list[list[int]]:
    files = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if p.stat().st_size > 4000)
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        text = files[int(rng.integers(len(files)))].read_text(errors="replace")
        ids = loaded.encode(text)
        if len(ids) < length + 1:
            continue
        s = int(rng.integers(1, len(ids) - length))
        out.append(ids[:1] + ids[s: s + length - 1])  # keep the BOS token first
    return out


def run_one(loaded, policy, batch: int, prompts, max_tokens: int, max_k: int, drafter: str | None,
            invariant: bool = True) -> dict:
    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, ReferenceEngine

    cfg = EngineConfig(max_batch=batch, max_k=max_k, default_drafter=drafter, batch_invariant=invariant,
                       max_len=max(len(p) for p in prompts) + max_tokens + 1)
    eng = ReferenceEngine(loaded.target, loaded.drafters, policy, cfg)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ids = [eng.add_request(p, params) for p in prompts]
    toks: dict[int, list[int]] = {i: [] for i in ids}
    steps = policy_ms = total_ms = 0.0
    drafted = accepted = k_sum = k_n = 0
    t0 = time.perf_counter()
    while eng.has_work():
        for o in eng.step():
            toks[o.request_id] += o.new_token_ids
        st = eng.last_stats
        steps += 1
        policy_ms += st.policy_ms
        total_ms += st.total_ms
        drafted += st.verified
        accepted += st.accepted
        k_sum += sum(st.k)
        k_n += len(st.k)
    wall = time.perf_counter() - t0
    generated = sum(len(t) for t in toks.values())
    return {"tok_s": generated / wall, "wall_s": wall, "steps": steps, "acceptance": accepted / drafted if drafted else 0.0,
            "mean_k": k_sum / k_n if k_n else 0.0, "policy_share": policy_ms / total_ms if total_ms else 0.0,
            "tokens": [toks[i] for i in ids]}


def policy_factories(loaded, profile, ks, max_k: int, drafter: str, fixed_drafters: list[str]):
    """Configurations by name: plain, fixed k for each drafter in ``fixed_drafters`` (``fixed:k`` for
    the default drafter, ``fixed:k@name`` for the others), adaptive and adaptive-1d."""
    from control.executors.reference.engine import PlainDecoding
    from control.plan import compile_plan
    from control.policy import build_policy

    active = [n for n in loaded.drafters if n in profile.drafter_names]

    def make(spec, drafters=active, default=drafter):
        return lambda: build_policy(spec, compile_plan(profile, policy=spec, max_k=max_k, drafters=drafters,
                                                       default_drafter=default))

    out = {"plain": PlainDecoding, "plain-fast": PlainDecoding}
    for d in fixed_drafters:
        for k in ks:
            out[f"fixed:{k}" if d == drafter else f"fixed:{k}@{d}"] = make(f"fixed:{k}", [d], d)
    out["adaptive"] = make("adaptive")  # chooses k per request and step, and the drafter (bandit)
    out["adaptive-1d"] = make("adaptive", [drafter])  # chooses k only, with the fixed-k drafter
    return out


def build_synthetic(out: Path, seed: int = 0) -> Path:
    """A random-weight engine directory at the full CPU pair's shapes (for timing only)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from control.executors.reference.model import LlamaConfig, LlamaForCausalLM, save_pretrained

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator((f.read_text(errors="replace") for f in files), trainers.BpeTrainer(
        vocab_size=4096, special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    common = dict(vocab_size=4096, max_position_embeddings=2048, bos_token_id=0, eos_token_id=1)

    def model(hidden, layers, heads, ffn, s, tie=False):
        torch.manual_seed(s)
        m = LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                         num_attention_heads=heads, num_key_value_heads=heads,
                                         tie_word_embeddings=tie, **common))
        with torch.no_grad():
            m.model.embed_tokens.weight.normal_(0.0, 1.0)
            for layer in m.model.layers[2:]:  # later layers matter little: a 2-layer copy agrees often
                layer.self_attn.o_proj.weight.mul_(0.25)
                layer.mlp.down_proj.weight.mul_(0.25)
        return m

    target = model(512, 6, 8, 1408, seed)
    small = LlamaForCausalLM(LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": 2}))
    small.load_state_dict({k: v for k, v in target.state_dict().items()
                           if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2})
    tiny = model(96, 1, 2, 256, seed + 1, tie=True)
    out.mkdir(parents=True, exist_ok=True)
    for name, m in (("target", target), ("draft-small", small), ("draft-tiny", tiny)):
        save_pretrained(m, out / name)
        tok.save(str(out / name / "tokenizer.json"))
    (out / "manifest.json").write_text(json.dumps({
        "schema": "specctl.engines/v1", "sku": "cpu", "name": "synthetic-full-shapes", "target": "target",
        "drafters": [{"name": "draft-small", "kind": "draft_model", "model": "draft-small"},
                     {"name": "draft-tiny", "kind": "draft_model", "model": "draft-tiny"},
                     {"name": "ngram", "kind": "ngram"}],
        "note": "random weights at the full CPU pair's shapes, for timing only",
    }, indent=2))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--engine-dir", help="engine directory to benchmark")
    src.add_argument("--synthetic", metavar="DIR", help="write a random engine at the full pair's shapes to DIR and use it")
    ap.add_argument("--batches", default="1,4,16,32", help="batch sizes (default 1,4,16,32)")
    ap.add_argument("--ks", default="1,2,3,4,6", help="fixed draft lengths to try (default 1,2,3,4,6)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default 64)")
    ap.add_argument("--drafter", help="drafter for fixed k and the plan's default (default: first draft model)")
    ap.add_argument("--fixed-drafters", default="all",
                    help="drafters to run fixed k with, comma-separated, or 'all' (default) or 'default'")
    ap.add_argument("--profile", help="profile for the plans (default: stored for this engine, else measured)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the median is reported")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda[:N] (default cpu); on CUDA the models run in bf16, and cuBLAS makes no "
                         "batch-invariance promise, so the lossless column is a measurement there")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    from control.errors import SpecctlError
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.executors.reference.loader import load_engine_dir
    from control.profile import load_profile

    console = Console(stderr=True)
    torch.set_num_threads(args.threads)
    try:
        batches = [int(x) for x in args.batches.split(",")]
        ks = [int(x) for x in args.ks.split(",")]
        engine_dir = args.engine_dir or build_synthetic(Path(args.synthetic))
        from control.profiler.models import resolve_device

        loaded = load_engine_dir(engine_dir, device=str(resolve_device(args.device)))
        drafter = args.drafter or next(n for n, m in loaded.drafters.items() if hasattr(m, "config"))
        with console.status("profile for the plans"):
            profile = load_profile(args.profile) if args.profile else (find_profile(loaded) or quick_profile(loaded))
        usable = [n for n in loaded.drafters if n in profile.drafter_names]
        if args.fixed_drafters == "all":
            fixed_drafters = usable
        elif args.fixed_drafters == "default":
            fixed_drafters = [drafter]
        else:
            fixed_drafters = [d.strip() for d in args.fixed_drafters.split(",") if d.strip()]
            bad = [d for d in fixed_drafters if d not in usable]
            if bad:
                raise ValueError(f"--fixed-drafters: {', '.join(bad)} not among this engine's profiled drafters "
                                 f"({', '.join(usable)}), 'all' or 'default'")
    except (SpecctlError, ValueError, StopIteration) as e:
        console.print(f"reference_speed: error: {e or 'the engine has no draft model'}")
        return 2
    factories = policy_factories(loaded, profile, ks, max(ks), drafter, fixed_drafters)
    prompts_all = stdlib_prompts(loaded, max(batches), args.prompt_len)
    run_one(loaded, factories["plain"](), 1, prompts_all[:1], 8, max(ks), drafter)  # warm-up
    results: dict[int, dict[str, list[dict]]] = {b: {name: [] for name in factories} for b in batches}
    total = len(batches) * len(factories) * args.repeats
    with console.status("") as status:
        done = 0
        for rep in range(args.repeats):
            for b in batches:
                for name, make in factories.items():
                    done += 1
                    status.update(f"[{done}/{total}] batch {b}, {name} (repeat {rep + 1})")
                    results[b][name].append(run_one(loaded, make(), b, prompts_all[:b], args.max_tokens, max(ks), drafter,
                                                    invariant=name != "plain-fast"))
    loaded.target.batch_invariant = True
    rows = []
    for b in batches:
        med = {name: statistics.median(r["tok_s"] for r in runs) for name, runs in results[b].items()}
        plain = med["plain"]
        ref_tokens = results[b]["plain"][0]["tokens"]
        # Requests whose tokens differ from plain decoding's, per configuration (0 everywhere = lossless).
        diverged = {name: sum(a != b_ for r in runs for a, b_ in zip(r["tokens"], ref_tokens, strict=True))
                    for name, runs in results[b].items() if name != "plain-fast"}
        lossless = not any(diverged.values())
        fixed = {n: v for n, v in med.items() if n.startswith("fixed:")}
        best = max(fixed, key=fixed.get)
        per_drafter = {}
        for d in fixed_drafters:
            mine = {n: v for n, v in fixed.items() if (n.split("@")[1] if "@" in n else drafter) == d}
            b_d = max(mine, key=mine.get)
            per_drafter[d] = {"config": b_d, "k": int(b_d.split(":")[1].split("@")[0]), "ratio": round(mine[b_d] / plain, 3)}
        ad = results[b]["adaptive"]
        rows.append({
            "batch": b, "plain_tok_s": round(plain, 2),
            "ratios": {n: round(v / plain, 3) for n, v in med.items()},
            "best_fixed": best, "best_fixed_ratio": round(fixed[best] / plain, 3),
            "best_fixed_per_drafter": per_drafter,
            "adaptive_ratio": round(med["adaptive"] / plain, 3),
            "adaptive_vs_best_fixed": round(med["adaptive"] / fixed[best], 3),
            "adaptive_1d_ratio": round(med["adaptive-1d"] / plain, 3),
            "adaptive_1d_mean_k": round(statistics.median(r["mean_k"] for r in results[b]["adaptive-1d"]), 2),
            "plain_fast_ratio": round(med["plain-fast"] / plain, 3),
            "adaptive_vs_plain_fast": round(med["adaptive"] / med["plain-fast"], 3),
            "best_fixed_vs_plain_fast": round(fixed[best] / med["plain-fast"], 3),
            "adaptive_mean_k": round(statistics.median(r["mean_k"] for r in ad), 2),
            "acceptance": {n: round(statistics.median(r["acceptance"] for r in runs), 3)
                           for n, runs in results[b].items() if not n.startswith("plain")},
            "policy_share_adaptive": round(statistics.median(r["policy_share"] for r in ad), 4),
            "policy_share_fixed": round(statistics.median(r["policy_share"] for r in results[b][best]), 4),
            "lossless": lossless,
            "diverged_requests": {n: v for n, v in diverged.items() if v},
        })
    table = Table(title=f"reference executor, {loaded.name}: generated tokens/s relative to plain decoding "
                        f"({args.max_tokens} tokens, {args.threads} threads, median of {args.repeats})")
    for col in ("batch", "plain tok/s", "plain-fast", *[f"best fixed {d}" for d in fixed_drafters], "best fixed",
                "adaptive", "adaptive / best fixed", "adaptive k", f"adaptive-1d ({drafter})",
                "adaptive / plain-fast", "policy share (adaptive)", "lossless"):
        table.add_column(col, justify="right")
    for r in rows:
        pd = r["best_fixed_per_drafter"]
        table.add_row(str(r["batch"]), f"{r['plain_tok_s']:.1f}", f"{r['plain_fast_ratio']:.2f}x",
                      *[f"k={pd[d]['k']} {pd[d]['ratio']:.2f}x" for d in fixed_drafters],
                      r["best_fixed"], f"{r['adaptive_ratio']:.2f}x", f"{r['adaptive_vs_best_fixed']:.2f}",
                      f"{r['adaptive_mean_k']:.2f}", f"{r['adaptive_1d_ratio']:.2f}x",
                      f"{r['adaptive_vs_plain_fast']:.2f}x", f"{100 * r['policy_share_adaptive']:.2f}%",
                      "yes" if r["lossless"] else "NO")
    Console(width=200).print(table)
    meta = {"engine": loaded.name, "drafter": drafter, "profile": f"{profile.sku}/{profile.pair} ({profile.source})",
            "threads": args.threads, "max_tokens": args.max_tokens, "prompt_len": args.prompt_len,
            "repeats": args.repeats, "torch": torch.__version__, "device": args.device,
            "device_name": torch.cuda.get_device_name(loaded.target.lm_head.weight.device)
            if args.device.startswith("cuda") else "cpu"}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0 if all(r["lossless"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
