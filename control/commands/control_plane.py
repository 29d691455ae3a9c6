"""``specctl control-plane``: run the control-plane service alone (``specctl serve`` starts it next to Triton)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys

from control.commands import args as A

DEFAULT_PORT = 8700
MIN_TOKEN_CHARS = 16


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {text!r} is not an integer in 0..65535 (0: any free port)") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} must be in 0..65535 (0: any free port)")
    return v


def _seconds(text: str) -> float:
    return A.positive_float(text)


def state_path(given: str | None, profile, groups: int):
    """The state file of ``profile``'s group: ``given`` itself for one group, else one file per group beside it."""
    from pathlib import Path

    from control.agent.wire import group_name

    if not given:
        return None
    path = Path(given)
    if groups == 1:
        return path
    return path.with_name(f"{path.stem}.{group_name(profile.sku, profile.pair).replace('/', '+')}{path.suffix or '.json'}")


def register(sub) -> None:
    p = sub.add_parser(
        "control-plane", help="run the control-plane service (plans, telemetry, overrides, metrics, dashboard)",
        description="Serve plans compiled from a profile, refit them from agents' telemetry, accept operator "
                    "overrides (bearer token), and expose /metrics and a dashboard. Binds to 127.0.0.1 unless told otherwise.")
    p.add_argument("--profile", required=True, action="append",
                   help="profile YAML (specctl.profile/v1); repeat for several groups (one per SKU and model pair; "
                        "requests without ?group= go to the first)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--token", help="bearer token for writes (default: SPECCTL_TOKEN, else a generated one, printed)")
    p.add_argument("--policy", default="adaptive", help="policy plans name unless overridden (default adaptive)")
    A.add_max_k(p)
    p.add_argument("--max-batch", type=A.positive_int,
                   help="the deployment's largest batch; overrides naming a larger one are refused "
                        "(default: the profile's limits.max_batch)")
    p.add_argument("--slo-tpot-ms", type=A.positive_float, help="TPOT SLO in ms")
    p.add_argument("--slo-quantile", type=A.quantile, help="meet the SLO at this quantile of step time")
    p.add_argument("--drafter", help="default drafter (default: the profile's first)")
    p.add_argument("--state", help="JSON file keeping overrides and the plan version across restarts "
                                   "(with several profiles, one file per group next to it: <stem>.<sku>+<pair>.json)")
    p.add_argument("--stale-after", type=_seconds, default=5.0,
                   help="seconds without telemetry after which a replica is stale and left out of aggregates (default 5)")
    p.add_argument("--replan-interval", type=_seconds, default=1.0, help="seconds between checks for a material change (default 1)")
    p.add_argument("--min-replan", type=_seconds, default=2.0, help="minimum seconds between automatic replans (default 2)")
    p.add_argument("--keepalive", type=_seconds, default=5.0, help="seconds between plan-stream keepalives (default 5)")
    p.add_argument("--max-body-bytes", type=A.positive_int, default=1 << 20, help="largest accepted request body (default 1 MiB)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="server log level (default warning)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from control.errors import ConfigError
    from control.plan import SLO
    from control.policyspec import check_policy_bounds, parse_policy_spec
    from control.profile import load_profile
    from control.service.server import bind, is_loopback, serve, url_of
    from control.service.state import ControlState, ServiceConfig

    profiles = [load_profile(path) for path in args.profile]
    spec = parse_policy_spec(args.policy)
    if spec.name == "oracle":
        raise ConfigError("policy 'oracle' runs only inside the simulator; choose another --policy")
    for p in profiles:
        check_policy_bounds(spec, max_k=args.max_k, max_batch=args.max_batch or p.limits.max_batch, where="--policy")
        if args.drafter:
            p.drafter(args.drafter)
    if args.slo_quantile is not None and args.slo_tpot_ms is None:
        raise ConfigError("--slo-quantile needs --slo-tpot-ms (the SLO the quantile must meet)")
    token = args.token or os.environ.get("SPECCTL_TOKEN")
    generated = not token
    if generated:
        token = secrets.token_urlsafe(24)
    elif len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(f"token of {len(token)} characters: use at least {MIN_TOKEN_CHARS} characters without "
                          "spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    configs = [ServiceConfig(policy=str(spec), max_k=args.max_k, max_batch=args.max_batch,
                             slo=SLO(tpot_ms=args.slo_tpot_ms, quantile=args.slo_quantile),
                             default_drafter=args.drafter, keepalive_s=args.keepalive,
                             replan_interval_s=args.replan_interval, min_replan_s=args.min_replan,
                             max_body_bytes=args.max_body_bytes, state_path=state_path(args.state, p, len(profiles)))
               for p in profiles]
    sock = bind(args.host, args.port)  # before the heavier imports: a taken port fails fast
    from control.service.app import create_app
    from control.service.fleet import Fleet
    from control.service.replicas import ReplicaTable

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fleet = Fleet([ControlState(p, c) for p, c in zip(profiles, configs, strict=True)],
                  replicas=ReplicaTable(stale_after_s=args.stale_after))
    app = create_app(fleet, token=token)
    url = url_of(sock)
    for group, state in fleet.groups.items():
        plan = state.plan
        print(f"specctl control-plane: plan v{plan.version} ({plan.policy}, K={plan.max_k}) for {group} "
              f"at {url} (dashboard {url}/, API {url}/openapi.json)", flush=True)
    if generated:
        print(f"specctl control-plane: token (give it to agents and operators as SPECCTL_TOKEN): {token}", flush=True)
    if not is_loopback(args.host):
        print(f"specctl control-plane: warning: listening on {args.host}, beyond this machine; traffic is plain HTTP "
              "and writes are protected by the token alone", file=sys.stderr, flush=True)
    import gc

    gc.freeze()  # the modules and plans loaded so far are never garbage: keep the collector off them
    serve(app, sock, log_level=args.log_level)
    return 0
