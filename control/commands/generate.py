"""``specctl generate``: generate text locally with the reference executor under a policy."""

from __future__ import annotations

import argparse
import json
import sys

from control.commands import args as A

EXECUTORS = ("reference",)


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text locally with speculative decoding",
                       description="Generate from a prompt with the reference executor, speculating as the policy decides.")
    p.add_argument("--executor", choices=EXECUTORS, default="reference", help="data plane (default reference)")
    p.add_argument("--engine-dir", help="engine directory (manifest.json + model directories); local generation")
    p.add_argument("--url", help="generate through a running deployment instead: grpc://HOST:PORT (or HOST:PORT) "
                                 "streams over gRPC, http://HOST:PORT uses Triton's generate_stream endpoint")
    p.add_argument("--num-draft-tokens", type=A.k_value, help="with --url: cap this request's draft length")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-tokens", type=A.positive_int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--policy", default="adaptive", help="none, fixed:K, adaptive, ... (default adaptive)")
    p.add_argument("--drafter", help="default drafter (default: the engine's first draft model)")
    p.add_argument("--profile", help="profile YAML for the plan (default: profiles/<sku>/ for this engine, else "
                                     "a quick in-process measurement)")
    A.add_max_k(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, help="random seed for sampling")
    p.add_argument("--stop", action="append", default=[], help="stop word (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens tokens even past the end token")
    p.add_argument("--device", default="cpu", help="torch device (default cpu; cuda when available)")
    p.add_argument("--threads", type=A.positive_int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--json", action="store_true",
                   help='print {"text", "token_ids", "stats": {steps, drafted, accepted, acceptance_rate, draft_ms, '
                        'verify_ms}} (verify_ms includes the prompt\'s prefill)')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from control.errors import ConfigError

    if args.url:
        return run_remote(args)
    if not args.engine_dir:
        raise ConfigError("give --engine-dir DIR (generate locally) or --url grpc://HOST:PORT (through `specctl serve`)")
    return run_local(args)


def run_remote(args: argparse.Namespace) -> int:
    """Generate through a deployment's llm model: stream the text as it arrives."""
    from rich.console import Console

    from control.clients.triton import GenParams, grpc_generate, http_generate, parse_url
    from control.errors import ConfigError
    from control.policyspec import parse_policy_spec

    err = Console(stderr=True)
    if args.prompt == "":
        raise ConfigError("--prompt is empty; give the text to continue")
    proto, addr = parse_url(args.url)
    policy = None
    if args.policy != "adaptive":  # per request only 'none' differs; the deployment's policy is set on the service
        policy = str(parse_policy_spec(args.policy))
    params = GenParams(max_tokens=args.max_tokens, temperature=args.temperature or None, top_k=args.top_k or None,
                       top_p=args.top_p if args.top_p != 1.0 else None, random_seed=args.seed,
                       stop_words=tuple(s for s in args.stop if s), num_draft_tokens=args.num_draft_tokens, policy=policy,
                       ignore_eos=args.ignore_eos)
    shown = [0]

    def show(res) -> None:
        if not args.json:
            sys.stdout.write(res.text[shown[0]:])
            sys.stdout.flush()
            shown[0] = len(res.text)

    if proto == "grpc":
        res = grpc_generate(addr, args.prompt, params, on_chunk=show)
    else:
        res = http_generate(addr, args.prompt, params, stream=True, on_chunk=show)
    stats = {"tokens": len(res.token_ids), "drafted": res.drafted, "accepted": res.accepted,
             "acceptance_rate": round(res.acceptance_rate, 4), "ttft_ms": round(res.ttft_s * 1e3, 3),
             "latency_ms": round(res.latency_s * 1e3, 3)}
    if args.json:
        print(json.dumps({"text": res.text, "token_ids": res.token_ids, "stats": stats}))
        return 0
    sys.stdout.write(res.text[shown[0]:] + "\n")
    err.print(f"[dim]{stats['tokens']} tokens from {args.url}: drafted {res.drafted}, accepted {res.accepted} "
              f"({res.acceptance_rate:.0%}); TTFT {stats['ttft_ms']:.1f} ms, latency {stats['latency_ms']:.1f} ms[/dim]")
    return 0


def run_local(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from control.errors import ConfigError
    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.policyspec import parse_policy_spec

    err = Console(stderr=True)
    spec = parse_policy_spec(args.policy)
    if args.prompt == "":
        raise ConfigError("--prompt is empty; give the text to continue")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device}: CUDA is not available here; use --device cpu")
    torch.set_num_threads(args.threads)
    with err.status(f"loading {args.engine_dir}"):
        loaded = load_engine_dir(args.engine_dir, device=args.device)
    if args.drafter is not None and args.drafter not in loaded.drafters:
        raise ConfigError(f"--drafter {args.drafter}: not in this engine (it has: {', '.join(loaded.drafters)})")
    drafter = args.drafter or _default_drafter(loaded.drafters)
    stop = [loaded.tokenizer.encode(s, add_special_tokens=False).ids for s in args.stop if s]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, random_seed=args.seed, stop_words=[s for s in stop if s],
                            ignore_eos=args.ignore_eos)
    prompt = loaded.encode(args.prompt)
    if spec.name == "none" or drafter is None:
        policy = PlainDecoding()
    else:
        policy = _policy(str(spec), loaded, drafter, args, err)
    engine = ReferenceEngine(loaded.target, loaded.drafters, policy,
                             EngineConfig(max_batch=1, max_k=args.max_k, default_drafter=drafter))
    rid = engine.add_request(prompt, params)
    tokens: list[int] = []
    steps = drafted = accepted = 0
    draft_ms = verify_ms = 0.0
    shown = ""
    reason = None
    while engine.has_work():
        for out in engine.step():
            if out.request_id != rid:
                continue
            tokens += out.new_token_ids
            steps += 1
            drafted, accepted = out.total_drafted, out.total_accepted
            reason = out.finish_reason
        st = engine.last_stats
        draft_ms += st.draft_ms
        verify_ms += st.verify_ms + st.prefill_ms
        if not args.json:
            text = loaded.decode(tokens)
            if not text.endswith("\ufffd") and len(text) > len(shown):
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
    text = loaded.decode(tokens)
    stats = {"steps": steps, "drafted": drafted, "accepted": accepted,
             "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
             "draft_ms": round(draft_ms, 3), "verify_ms": round(verify_ms, 3)}
    if args.json:
        print(json.dumps({"text": text, "token_ids": tokens, "stats": stats}))
        return 0
    sys.stdout.write(text[len(shown):] + "\n")
    err.print(f"[dim]{len(tokens)} tokens in {steps} steps ({reason.value if reason else '?'}); policy "
              f"{getattr(policy, 'name', spec)}, drafter {drafter or '-'}: drafted {drafted}, accepted {accepted} "
              f"({stats['acceptance_rate']:.0%}); draft {draft_ms:.1f} ms, verify {verify_ms:.1f} ms[/dim]")
    return 0


def _default_drafter(drafters: dict) -> str | None:
    """The first draft model, else the first model-based drafter, else the first drafter."""
    from control.executors.reference.model import LlamaForCausalLM

    for pick in (lambda m: isinstance(m, LlamaForCausalLM), lambda m: m is not None, lambda m: True):
        for name, m in drafters.items():
            if pick(m):
                return name
    return None


def _policy(spec: str, loaded, drafter: str, args, err):
    """Compile a plan for this engine and build the policy: --profile, a stored profile, or a quick one."""
    from control.errors import ConfigError
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.plan import compile_plan
    from control.policy import build_policy
    from control.profile import load_profile

    if args.profile:
        profile = load_profile(args.profile)
    else:
        profile = find_profile(loaded)
        if profile is None:
            with err.status("no stored profile for this engine; measuring one (a few seconds)"):
                profile = quick_profile(loaded)
    if drafter not in profile.drafter_names:
        raise ConfigError(f"drafter '{drafter}' is not in profile {profile.sku}/{profile.pair} "
                          f"(it has: {', '.join(profile.drafter_names)}); pass --profile for this engine")
    active = [n for n in loaded.drafters if n in profile.drafter_names]
    plan = compile_plan(profile, policy=spec, max_k=args.max_k, drafters=active, default_drafter=drafter,
                        reason="specctl generate")
    return build_policy(spec, plan, seed=args.seed or 0)
