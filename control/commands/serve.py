"""``specctl serve``: the control-plane service and Triton (the ``llm`` model) for one engine directory."""

from __future__ import annotations

import argparse
import datetime as _dt
from pathlib import Path

from control.commands import args as A
from control.triton.deploy import DEFAULT_OVERLAP_POLICY, OVERLAP_MIN_PASS_MS

ROOT = Path(__file__).resolve().parents[2]


def _port0(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {text!r} is not an integer in 0..65535 (0: any free port)") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} must be in 0..65535 (0: any free port)")
    return v


def add_deployment_args(p: argparse.ArgumentParser, *, engine_required: bool = True) -> None:
    p.add_argument("--engine-dir", required=engine_required, default=None if engine_required else "engines/cpu",
                   help="engine directory (manifest.json + model directories)")
    p.add_argument("--profile", help="profile YAML (default: profiles/<sku>/<engine name>.yaml when it matches the "
                                     "engines, else a quick calibration of the engine directory)")
    p.add_argument("--policy", default="adaptive", help="none, fixed:K, adaptive, ... (default adaptive)")
    A.add_max_k(p)
    p.add_argument("--max-batch", type=A.positive_int, default=32, help="KV slots per model instance (default 32)")
    p.add_argument("--max-tokens-limit", type=A.positive_int, default=1024,
                   help="the most tokens one request may ask for (default 1024)")
    p.add_argument("--instances", type=A.positive_int, default=1, help="llm model instances (default 1)")
    p.add_argument("--threads", type=A.positive_int, default=1, help="torch threads per instance (default 1)")
    p.add_argument("--overlap-policy", type=A.on_off_auto, default=DEFAULT_OVERLAP_POLICY, metavar="auto|on|off",
                   help="the policy decides step t+1 on a worker thread while step t's passes run, from estimates one "
                        "step stale; greedy output is the same (default auto: on when the target's fixed pass time is "
                        f"at least {OVERLAP_MIN_PASS_MS:g} ms and a core is free for the thread; "
                        "docs/controller-cost.md, 'Off the critical path in the live server')")
    p.add_argument("--http-port", type=_port0, default=8000,
                   help="HTTP port (default 8000; 0 = any free): `specctl serve` puts its front end here (OpenAI API "
                        "and Triton's KServe API behind body limits) and Triton's own HTTP on an internal loopback port")
    p.add_argument("--grpc-port", type=_port0, default=8001, help="Triton gRPC port (default 8001; 0 = any free)")
    p.add_argument("--metrics-port", type=_port0, default=8002, help="Triton metrics port (default 8002; 0 = any free)")
    p.add_argument("--control-port", type=_port0, default=8700, help="control-plane port (default 8700; 0 = any free)")
    p.add_argument("--run-dir", help="where to render the model repository and write logs (default runs/<timestamp>)")
    p.add_argument("--token", help="bearer token for the control plane's writes (default: SPECCTL_TOKEN, else generated)")
    p.add_argument("--non-decoupled", action="store_true",
                   help="render the models non-decoupled: one response per request, so plain tritonclient infer() "
                        "works; streaming requests (stream true, the front end's streamed responses) are refused")


def deployment_config(args: argparse.Namespace):
    from control.errors import ConfigError
    from control.policyspec import parse_policy_spec
    from control.triton.deploy import DeploymentConfig

    spec = parse_policy_spec(args.policy)
    if spec.name == "oracle":
        raise ConfigError("--policy oracle runs only inside the simulator; choose another policy")
    engine = Path(args.engine_dir)
    if not (engine / "manifest.json").is_file():
        raise ConfigError(f"--engine-dir {engine}: no manifest.json there; build the CPU pair with "
                          "`specctl build --sku cpu` (add --quick for a small one) or point at an engine directory")
    if args.profile and not Path(args.profile).is_file():
        raise ConfigError(f"--profile {args.profile}: no such file")
    _distinct_ports(args)
    run_dir = Path(args.run_dir) if args.run_dir else ROOT / "runs" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return DeploymentConfig(engine_dir=engine, run_dir=run_dir, profile=Path(args.profile) if args.profile else None,
                            policy=str(spec), max_k=args.max_k, max_batch=args.max_batch,
                            max_tokens=args.max_tokens_limit, instances=args.instances, threads=args.threads,
                            overlap_policy=args.overlap_policy,
                            http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                            control_port=args.control_port, token=args.token,
                            decoupled=not getattr(args, "non_decoupled", False))


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve an engine directory: Triton (llm model) + the control-plane service",
                       description="Render triton_repo for the deployment into a run directory, start the control-plane "
                                   "service and tritonserver (loopback only), print the endpoints, restart either when it "
                                   "dies (or when the model's Python stub dies), and stop both on Ctrl-C or SIGTERM.")
    add_deployment_args(p)
    p.add_argument("--spec-decode-metrics", action="store_true",
                   help="add metrics.speculative_decoding (vLLM's shape) to every OpenAI response, not only to "
                        "requests that set spec_decode_metrics")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from rich.console import Console

    from control.triton.deploy import Deployment
    from control.triton.supervisor import CHECK_INTERVAL_S, Supervisor

    console = Console(stderr=True)
    cfg = deployment_config(args)
    public_port, cfg.http_port = _frontend_port(cfg), 0  # Triton's HTTP: an internal free loopback port
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    dep = Deployment(cfg, say=lambda s: console.print(f"[dim]{s}[/dim]"))
    frontend = None
    try:
        with console.status("starting the control plane, tritonserver and the front end"):
            dep.start()
            frontend = _start_frontend(dep, public_port, args.spec_decode_metrics)
        if stop.is_set():
            return 130
        console.print(f"[bold]specctl serve[/bold]: {cfg.engine_dir} with policy {cfg.policy}, run directory {cfg.run_dir}")
        endpoints = {"http": frontend.url, "openai": f"{frontend.url}/v1",
                     **{k: v for k, v in dep.endpoints().items() if k != "http"},
                     "triton-http": dep.http_url}  # internal: the front end's upstream, without its limits
        for name, url in endpoints.items():
            print(f"  {name:15s} {url}", flush=True)
        token = "(as given)" if args.token else "(from SPECCTL_TOKEN)" if _env_token() else dep.token
        print(f"  {'token':15s} {token}", flush=True)
        print("ready; Ctrl-C stops all", flush=True)
        supervisor = Supervisor(dep, say=lambda s: print(f"specctl serve: {s}", flush=True))
        while not stop.wait(CHECK_INTERVAL_S):
            give_up = supervisor.check() or (None if frontend.alive() else "the front end exited")
            if give_up:
                console.print(f"[red]{give_up}; stopping (logs in {cfg.run_dir})[/red]")
                return 1
        console.print("stopping")
        return 0
    finally:
        if frontend is not None:
            dep.drain_if_serving()  # the front end's clients get the drain's message before it stops
            frontend.stop()
        dep.stop()
        for s, h in old.items():
            signal.signal(s, h)


def _distinct_ports(args: argparse.Namespace) -> None:
    """Each listener its own port: two on one port fail only once the second binds, mid-start."""
    from control.errors import ConfigError

    seen: dict[int, str] = {}
    for flag in ("--http-port", "--grpc-port", "--metrics-port", "--control-port"):
        port = getattr(args, flag[2:].replace("-", "_"))
        if port and port in seen:
            raise ConfigError(f"{seen[port]} and {flag} are both {port}; give each its own port (0 picks a free one)")
        seen[port] = flag


def _frontend_port(cfg) -> int:
    """The front end's port, checked now (0: picked once Triton holds its ports, so they cannot collide)."""
    from control.triton.server import check_ports

    if cfg.http_port:
        check_ports({"http": cfg.http_port}, cfg.host)
    return cfg.http_port


def _start_frontend(dep, port: int, spec_metrics: bool):
    from control.executors.manifest import load_manifest
    from control.frontend.process import FrontendProcess, frontend_args
    from control.triton.server import free_port

    engine = Path(dep.cfg.engine_dir)
    args = frontend_args(triton_grpc=dep.grpc_url, triton_http=dep.http_url,
                         tokenizer_dir=engine / load_manifest(engine).target, max_k=dep.cfg.max_k,
                         spec_metrics=spec_metrics)
    return FrontendProcess(args, host=dep.cfg.host, port=port or free_port(dep.cfg.host), run_dir=dep.run_dir).start()


def _env_token() -> str | None:
    import os

    return os.environ.get("SPECCTL_TOKEN")
