"""Policies side by side on the reference executor under continuous batching (no server).

``reference_speed.py`` runs one batch of equal requests to completion; a server instead keeps its
batch full from a queue of requests of different lengths, which is where per-request draft lengths
and the drafter bandit matter. This queues ``--requests`` stdlib prompts with lognormal output
lengths (mean ``--max-tokens``) at ``--batch`` slots and reports, per policy, generated tokens per
second, acceptance, the mean k and the k histogram (request-steps). Policies are interleaved within
each repeat, and the median over repeats is reported with the spread, because single runs on a
shared machine vary by +-10-25%.

``model tok/s`` times the same run by the profile's cost model instead of the clock: each decode
step's verify pass and draft passes (catch-up included) from the features the engine reports to the
policy, and each prefill pass, the target's and the draft model's whose state it builds (a fixed k on a
draft model prefills it for every request; ``adaptive`` builds draft state by catch-up, which the decode
passes count), as the replay simulator charges them. It is the same for every repeat of a policy whose decisions do not
depend on measured times, so it separates what a policy decides from the machine's noise (it
trusts the profile: R^2 0.99 for the full pair's target). ``--model-times`` also hands the policies
the profile's times in place of measured ones (adaptive refits its cost model from them), so every
policy's decisions and model clock repeat exactly, even with other jobs on the machine.

A policy may name its drafters: ``fixed:3@draft-tiny`` runs draft-tiny (first named = default, the
one new requests prefill), ``adaptive@draft-small+ngram`` chooses between those two; ``adaptive-1d``
is adaptive on the engine's first draft model only. A ``+stale`` suffix (``adaptive+stale``) runs
the policy one step stale (``control.policy.stale.OneStepStale``: it decides step t+1 before it
learns step t's outcome, as under an overlap scheduler); ``+overlap`` runs it on the engine's own
worker thread (``EngineConfig.overlap_policy``), as ``specctl serve`` does on long passes.

    python benchmarks/continuous_batching.py --engine-dir engines/cpu --batch 16 [--requests 64]
        [--policies fixed:2,fixed:3,adaptive,adaptive-1d] [--repeats 2] [--threads 1] [--device cuda]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reference_speed import stdlib_prompts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=float, default=40.0, help="mean of the lognormal output lengths")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--prompts", choices=("stdlib", "corpus"), default="stdlib",
                    help="stdlib: spans of this Python's standard library; corpus: the held-out corpus files "
                         "that `specctl bench` draws its prompts from")
    ap.add_argument("--policies", default="fixed:2,fixed:3,adaptive,adaptive-1d")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--profile", help="profile for the plans (default: the stored one for this engine)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model-times", action="store_true",
                    help="policies observe the profile's step times instead of measured ones: their decisions "
                         "and the model clock then repeat exactly, whatever else the machine runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda[:N] (default cpu); on CUDA the models run in bf16")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.requests < 1 or args.repeats < 1 or args.max_tokens < 1:
        ap.error("--batch, --requests, --repeats and --max-tokens must be >= 1")

    import torch

    from control.errors import SpecctlError
    from control.executors.base import SamplingParams
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.executors.reference.engine import EngineConfig, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.plan import compile_plan
    from control.policy import build_policy
    from control.policy.base import PolicyContext
    from control.profile import load_profile
    from control.profiler.models import resolve_device

    torch.set_num_threads(args.threads)
    try:
        loaded = load_engine_dir(args.engine_dir, device=str(resolve_device(args.device)))
        profile = load_profile(args.profile) if args.profile else (find_profile(loaded) or quick_profile(loaded))
    except SpecctlError as e:  # a missing engine directory, a bad profile or device: one line, not a traceback
        raise SystemExit(f"continuous_batching: {e}") from None
    drafter = next(n for n, m in loaded.drafters.items() if hasattr(m, "config"))
    active = [n for n in loaded.drafters if n in profile.drafter_names]
    rng = np.random.default_rng(args.seed)
    if args.prompts == "corpus":
        from control.bench.live import corpus_texts

        prompts = token_windows(loaded, corpus_texts(), args.requests, args.prompt_len, seed=args.seed + 3)
    else:
        prompts = stdlib_prompts(loaded, args.requests, args.prompt_len, seed=args.seed + 3)
    lengths = np.clip(rng.lognormal(np.log(args.max_tokens) - 0.18, 0.6, args.requests), 4, 4 * args.max_tokens).astype(int)

    def make(spec: str):
        if spec.endswith("+overlap"):  # the engine's own worker decides a step ahead (EngineConfig)
            return make(spec.removesuffix("+overlap"))
        if spec.endswith("+stale"):
            from control.policy.stale import OneStepStale

            policy, default, cost = make(spec.removesuffix("+stale"))
            return OneStepStale(policy), default, cost
        name, _, named = spec.partition("@")
        drafters = [drafter] if name.endswith("-1d") else (named.split("+") if named else active)
        name = name.removesuffix("-1d")
        unknown = [d for d in drafters if d not in active]
        if unknown:
            raise SystemExit(f"policy '{spec}': drafter(s) {', '.join(unknown)} not in the profile and engine "
                             f"(known: {', '.join(active)})")
        plan = compile_plan(profile, policy=name, max_k=args.max_k, drafters=drafters, default_drafter=drafters[0])
        return build_policy(name, plan, seed=args.seed), drafters[0], PolicyContext.from_plan(plan).cost

    prefill_costs = {d: profile.models[profile.drafter(d).model].to_cost() for d in active if profile.drafter(d).model}
    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    tok_s: dict[str, list[float]] = {s: [] for s in specs}
    model_tok_s: dict[str, list[float]] = {s: [] for s in specs}
    last: dict[str, dict] = {}
    for rep in range(args.repeats):
        for spec in specs:
            policy, default, cost = make(spec)
            clock = ModelClock(policy, cost, replace_times=args.model_times, default=default, prefill_costs=prefill_costs)
            cfg = EngineConfig(max_batch=args.batch, max_k=args.max_k, default_drafter=default,
                               overlap_policy=spec.endswith("+overlap"),
                               max_len=args.prompt_len + int(lengths.max()) + 1)
            eng = ReferenceEngine(loaded.target, loaded.drafters, clock, cfg)
            for p, n in zip(prompts, lengths, strict=True):
                eng.add_request(p, SamplingParams(max_tokens=int(n), ignore_eos=True))
            gen = verified = accepted = 0
            ks: list[int] = []
            t0 = time.perf_counter()
            while eng.has_work():
                gen += sum(len(o.new_token_ids) for o in eng.step())
                st = eng.last_stats
                clock.prefill(st.prefill_requests, st.prefill_tokens)
                verified += st.verified
                accepted += st.accepted
                ks += list(st.k)
            eng.close()  # with +overlap: the last step's outcome, held for the worker, reaches the clock
            wall = time.perf_counter() - t0
            tok_s[spec].append(gen / wall)
            model_tok_s[spec].append(gen / max(clock.ms, 1e-9) * 1e3)
            k = np.asarray(ks, dtype=np.int64)
            last[spec] = {"acceptance": accepted / verified if verified else 0.0, "mean_k": float(k.mean()) if k.size else 0.0,
                          "hist": np.bincount(k, minlength=args.max_k + 1).tolist()}
            print(f"repeat {rep + 1} {spec:>14s}: {gen / wall:7.1f} tok/s, model {model_tok_s[spec][-1]:7.1f}", flush=True)

    def best_fixed(table):
        return max((statistics.median(v) for s, v in table.items() if s.startswith("fixed")), default=None)

    bf, bm = best_fixed(tok_s), best_fixed(model_tok_s)
    print(f"\nbatch {args.batch}, {args.requests} requests (mean {args.max_tokens:g} tokens), {args.threads} thread(s), "
          f"median of {args.repeats}; ratios to the best fixed policy")
    print(f"{'policy':>22s} {'tok/s':>8s} {'min-max':>15s} {'ratio':>6s} {'model tok/s':>11s} {'ratio':>6s} "
          f"{'accept':>7s} {'mean k':>7s}  k histogram")
    for spec in specs:
        v, mv = tok_s[spec], model_tok_s[spec]
        med, mmed = statistics.median(v), statistics.median(mv)
        s = last[spec]
        print(f"{spec:>22s} {med:8.1f} {min(v):7.1f}-{max(v):<7.1f} {(f'{med / bf:.3f}' if bf else '-'):>6s} "
              f"{mmed:11.1f} {(f'{mmed / bm:.3f}' if bm else '-'):>6s} {s['acceptance']:7.3f} {s['mean_k']:7.2f}  {s['hist']}")
    return 0


def token_windows(loaded, texts: list[str], n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens: BOS plus a random span of one of ``texts``."""
    rng = np.random.default_rng(seed)
    encoded = [ids for ids in (loaded.encode(t) for t in texts) if len(ids) > length]
    if not encoded:
        raise SystemExit(f"no prompt text is longer than --prompt-len {length} tokens; pass a smaller one")
    out = []
    for _ in range(n):
        ids = encoded[int(rng.integers(len(encoded)))]
        s = int(rng.integers(1, len(ids) - length + 1))
        out.append(ids[:1] + ids[s: s + length - 1])
    return out


class ModelClock:
    """Wraps a policy; adds up each step's time as the cost model predicts it from what ran: the decode
    passes from the outcomes, the prefill pass from the engine's stats (``prefill``).

    ``default``: the engine's default drafter (the one a decision's ``prefill_drafter`` = -1 names);
    ``prefill_costs``: per draft model name, its whole-model cost (the profile's), for its prefill."""

    def __init__(self, policy, cost, replace_times: bool = False, default: str | None = None,
                 prefill_costs: dict | None = None) -> None:
        self.policy, self.cost, self.ms, self.replace_times = policy, cost, 0.0, replace_times
        self.name = getattr(policy, "name", "policy")
        self.drafters: tuple[str, ...] = ()  # the executor's drafter names (outcomes index them)
        self.default, self.prefill_costs = default, prefill_costs or {}
        self._builds: str | None = None  # the draft model whose state this step's prefill builds
        if hasattr(policy, "prune"):
            self.prune = policy.prune
        if hasattr(policy, "wants_fresh"):
            self.wants_fresh = policy.wants_fresh

    def decide(self, view):
        self.drafters = view.drafters
        d = self.policy.decide(view)
        if view.prefill_tokens:
            self._builds = None
            if d is not None and d.prefill_draft:
                i = int(d.prefill_drafter)
                self._builds = view.drafters[i] if 0 <= i < len(view.drafters) else self.default
        return d

    def prefill(self, requests: int, tokens: int) -> None:
        """The step's prefill pass over ``tokens`` prompt tokens of ``requests`` requests (none: 0)."""
        if not requests:
            return
        c = self.cost
        self.ms += float(c.target.predict(0.0, float(tokens), 1, requests)) + c.overhead_ms
        model = self.prefill_costs.get(self._builds)
        if model is not None:
            self.ms += float(model.predict(0.0, float(tokens), 1, requests))

    def observe(self, o) -> None:
        if o.n:
            c = self.cost
            verify = float(c.target.predict(float(o.ctx_lens.sum()), float((o.verified + 1).sum()), 1, o.n))
            drafted = o.drafter[o.drafted > 0]
            ran = {self.drafters[int(i)] for i in np.unique(drafted)}
            models = [d for d in c.drafters if d.name in ran and d.model is not None]
            draft = 0.0
            for d in models:  # two models in one step report pooled features: split evenly
                draft += float(d.model.predict(o.draft_ctx_tokens, o.draft_batched_tokens, o.draft_passes)) / len(models)
            for d in c.drafters:
                if d.name in ran and d.model is None:  # n-gram lookups: a cost per drafting request
                    draft += d.const_ms * int((drafted == self.drafters.index(d.name)).sum())
            self.ms += verify + draft + c.overhead_ms
            if self.replace_times:  # the policy learns the model's times, not the machine's
                o.verify_ms, o.draft_ms, o.total_ms = verify, draft, verify + draft + c.overhead_ms
                o.prev_loop_ms = math.nan  # the loop's own time is the machine's too: not measured
        self.policy.observe(o)


if __name__ == "__main__":
    raise SystemExit(main())
