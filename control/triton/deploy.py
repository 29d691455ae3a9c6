"""A deployment: the control-plane service and ``tritonserver`` with the rendered ``llm`` model.

``specctl serve``, ``specctl demo`` and the end-to-end tests all start one through ``Deployment``:

1. resolve the profile (``--profile``; else ``profiles/<sku>/<engine name>.yaml`` when it matches the
   engines; else a quick calibration of the engine directory, a few seconds) and copy it into the run
   directory;
2. check every port before starting anything (a taken port is one line naming it);
3. start ``specctl control-plane`` as a child process (its overrides and plan version kept in
   ``<run>/control-state.json``) and wait for ``/readyz`` with a deadline;
4. write the service's token to the owner-only ``<run>/control-token``; render ``triton_repo/`` into
   ``<run>/model_repository`` with the engine directory, profile, policy, the service's URL and the
   token file's path (never the token: Triton serves model configs to anyone) in the llm model's
   parameters, and start ``tritonserver`` with
   the project on PYTHONPATH, waiting for readiness with a deadline;
5. ``stop()`` drains the llm model (it ends every request in flight with an error saying the server
   is stopping: Triton cannot unload a decoupled model while requests hold its response senders, and
   the Python stub ignores SIGTERM), stops Triton, then the service (SIGTERM, then SIGKILL after a
   grace period): no orphans.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from control.errors import ConfigError, SpecctlError
from control.policyspec import DEFAULT_MAX_K

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 10  # tritonserver's wait for in-flight work and model unload at shutdown
TOKEN_FILE = "control-token"  # in the run directory, owner-only; the llm model's config names it
# The reference engine's policy on a worker thread during the passes (EngineConfig.overlap_policy);
# None: auto (``overlap_for``), chosen from the live CPU server's measurements (docs/controller-cost.md).
DEFAULT_OVERLAP_POLICY: bool | None = None
# auto puts the policy on its worker when the target's fixed pass time is at least this long: such
# passes run mostly inside torch's kernels, which release the GIL, so the worker decides beside them
# (the full CPU pair, 17.7 ms); shorter ones are Python-bound and the worker's time reappears inside
# them (the quick pair, 0.5 ms)
OVERLAP_MIN_PASS_MS = 5.0
STATE_FILE = "control-state.json"  # the service's overrides and plan version, kept across its restarts
DRAIN_FILE = "draining"  # in the run directory: written at stop, the llm model's cue to end its requests
DRAIN_WAIT_S = 5.0  # the most stop() waits for every llm instance to acknowledge the drain
DRAIN_ACK_POLL_S = 0.05  # how often stop() looks for the instances' acknowledgements
STOP_S = 30.0  # tritonserver's time to exit after SIGTERM before its process group is killed
# ... once drained: nothing is in flight, so the unload takes 1-3 s; what waits longer is a client's open
# gRPC stream, which holds the llm model in Triton 2.51 until its exit timeout (then it aborts). Killing
# the group then loses only the agent's last telemetry window.
DRAINED_STOP_S = 6.0


@dataclass
class DeploymentConfig:
    engine_dir: Path
    run_dir: Path
    profile: Path | None = None
    policy: str = "adaptive"
    max_k: int = DEFAULT_MAX_K
    max_batch: int = 32
    max_tokens: int = 1024
    instances: int = 1
    threads: int = 1
    drafter: str = ""
    overlap_policy: bool | None = DEFAULT_OVERLAP_POLICY  # None: auto (overlap_for)
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    control_port: int = 8700
    token: str | None = None
    service: bool = True  # False: the model runs on its default plan, no control plane
    decoupled: bool = True  # False: one response per request (plain infer()), no streaming
    service_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 180.0


def resolve_profile(engine_dir: Path, profile: Path | None, run_dir: Path,
                    say: Callable[[str], None] = lambda s: None) -> Path:
    """The profile this deployment uses, copied to ``run_dir/profile.yaml``."""
    from control.executors.manifest import load_manifest
    from control.profile import load_profile

    out = run_dir / "profile.yaml"
    if profile is not None:
        p = load_profile(profile)
        say(f"profile {profile} ({p.sku}/{p.pair})")
        p.save(out)
        return out
    m = load_manifest(engine_dir)
    name = str((m.model_extra or {}).get("name") or Path(engine_dir).name)
    drafters = {d.name for d in m.drafters}
    stored = ROOT / "profiles" / m.sku / f"{name}.yaml"
    if stored.is_file():
        p = load_profile(stored)
        if p.pair == name and drafters <= set(p.drafter_names):
            say(f"profile {stored.relative_to(ROOT)} (matches the engines)")
            p.save(out)
            return out
    say(f"no stored profile for engines '{name}': calibrating {engine_dir} (a few seconds)")
    import torch

    from control.executors.reference.calibrate import quick_profile
    from control.executors.reference.loader import load_engine_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quick_profile(load_engine_dir(engine_dir)).save(out)
    finally:
        torch.set_num_threads(threads)
    return out


def overlap_for(target_pass_ms: float, threads: int, instances: int, cores: int) -> tuple[bool, str]:
    """``--overlap-policy auto``'s choice, and why: on when the target's fixed pass time hides the policy
    and a core is left for the worker thread."""
    if target_pass_ms < OVERLAP_MIN_PASS_MS:
        return False, f"the target's fixed pass time, {target_pass_ms:.1f} ms, is under {OVERLAP_MIN_PASS_MS:g} ms"
    if threads * instances >= cores:
        return False, f"no core left for the policy's thread ({instances} instance(s) x {threads} torch thread(s), {cores} cores)"
    return True, f"the target's fixed pass time, {target_pass_ms:.1f} ms, hides it on a free core"


def usable_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            raise SpecctlError(f"{what} exited with code {proc.returncode} while starting: {' | '.join(tail)} (log: {log})")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SpecctlError(f"{what} was not ready within {timeout_s:.0f} s (log: {log})")


class Deployment:
    """The service and Triton for one engine directory; a context manager."""

    def __init__(self, cfg: DeploymentConfig, say: Callable[[str], None] = lambda s: None) -> None:
        from control.executors.manifest import load_manifest
        from control.triton.server import free_ports

        if not (Path(cfg.engine_dir) / "manifest.json").is_file():
            raise ConfigError(f"engine directory {cfg.engine_dir} has no manifest.json; build one with "
                              "`specctl build --sku cpu` (or --quick) or pass --engine-dir DIR")
        load_manifest(cfg.engine_dir)
        unset = [name for name in ("http_port", "grpc_port", "metrics_port", "control_port") if getattr(cfg, name) == 0]
        for name, port in zip(unset, free_ports(len(unset), cfg.host), strict=True):
            setattr(cfg, name, port)
        self.cfg = cfg
        self.say = say
        self.token = cfg.token or os.environ.get("SPECCTL_TOKEN") or secrets.token_urlsafe(24)
        self.run_dir = Path(cfg.run_dir)
        self.service_proc: subprocess.Popen | None = None
        self.triton = None
        self.profile_path: Path | None = None
        self.overlap_policy: bool | None = cfg.overlap_policy  # resolved (auto's choice) at start

    # -- endpoints ---------------------------------------------------------------------------------
    @property
    def control_url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.control_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.cfg.host}:{self.cfg.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"

    def endpoints(self) -> dict[str, str]:
        out = {"http": self.http_url, "grpc": self.grpc_url, "triton metrics": self.metrics_url}
        if self.cfg.service:
            out.update({"control plane": self.control_url, "dashboard": f"{self.control_url}/"})
        return out

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Deployment:
        from control.triton.repo import render_llm_repo, write_token_file
        from control.triton.server import TritonServer, check_ports

        c = self.cfg
        ports = {"http": c.http_port, "grpc": c.grpc_port, "metrics": c.metrics_port}
        if c.service:
            ports["control"] = c.control_port
        check_ports(ports, c.host)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob(f"{DRAIN_FILE}*"):  # a cue from a stop before would drain the new server
            stale.unlink()
        self.profile_path = resolve_profile(Path(c.engine_dir), c.profile, self.run_dir, self.say)
        overlap = c.overlap_policy
        if overlap is None:
            from control.profile import load_profile

            pass_ms = load_profile(self.profile_path).models["target"].c_ms
            overlap, why = overlap_for(pass_ms, c.threads, c.instances, usable_cores())
            self.say(f"policy on a worker thread beside the passes: {'on' if overlap else 'off'} (auto: {why})")
        self.overlap_policy = overlap
        try:
            if c.service:
                self.start_service()
            token_file = write_token_file(self.run_dir / TOKEN_FILE, self.token) if c.service else None
            repo = render_llm_repo(self.run_dir / "model_repository", engine_dir=Path(c.engine_dir),
                                   profile=self.profile_path, policy=c.policy,
                                   control_url=self.control_url if c.service else "",
                                   control_token_file=token_file, max_k=c.max_k,
                                   max_batch=c.max_batch, max_tokens=c.max_tokens, instances=c.instances,
                                   threads=c.threads, drafter=c.drafter, overlap_policy=overlap,
                                   decoupled=c.decoupled, drain_file=self.run_dir / DRAIN_FILE)
            self.say(f"starting tritonserver (model repository {repo})")
            self.triton = TritonServer(repo, self.run_dir, http_port=c.http_port, grpc_port=c.grpc_port,
                                       metrics_port=c.metrics_port, host=c.host, pythonpath=[str(ROOT)],
                                       # Bounds shutdown where the drain could not end the requests
                                       # (a stub that died or hangs): Triton then kills the stub.
                                       extra_args=[f"--exit-timeout-secs={EXIT_TIMEOUT_S}"])
            self.triton.start(timeout_s=c.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_service(self) -> None:
        """Start the control-plane service and wait until it is ready."""
        self.spawn_service()
        _wait_http(f"{self.control_url}/readyz", self.service_proc, 60.0, "the control-plane service",
                   self.run_dir / "control-plane.log")

    def spawn_service(self) -> None:
        """Start the control-plane service without waiting. It keeps its overrides and plan version in
        ``<run>/control-state.json``, so a restarted service carries on where the last one stopped."""
        c = self.cfg
        log = self.run_dir / "control-plane.log"
        cmd = [sys.executable, "-m", "control", "control-plane", "--profile", str(self.profile_path), "--host", c.host,
               "--port", str(c.control_port), "--policy", c.policy, "--max-k", str(c.max_k),
               "--max-batch", str(c.max_batch), "--state", str(self.run_dir / STATE_FILE), *c.service_args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPECCTL_TOKEN": self.token,
               "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        self.say(f"starting the control-plane service on {self.control_url}")
        with open(log, "ab") as f:
            self.service_proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                                 start_new_session=True)

    def kill_service(self) -> None:
        """SIGKILL the service (tests: the data plane must keep serving)."""
        p = self.service_proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def stop_service(self, timeout_s: float = 10.0) -> None:
        from control.triton.server import terminate_group

        terminate_group(self.service_proc, timeout_s)

    def alive(self) -> dict[str, bool]:
        return {"tritonserver": bool(self.triton and self.triton.alive()),
                "control plane": self.service_proc is not None and self.service_proc.poll() is None}

    def stop(self) -> None:
        if self.triton is not None:
            self.triton.stop(DRAINED_STOP_S if self.drain_if_serving() else STOP_S)
        self.stop_service()

    def drain_if_serving(self) -> bool:
        """``drain()`` when Triton is up and ready (not while starting, nor after a stub died: nothing
        would answer); True when every instance has drained. Again after a drain: True at once."""
        return self.triton is not None and self.triton.alive() and self.triton.ready() and self.drain()

    def drain(self) -> bool:
        """Ask every llm instance to end its requests (the drain file) and wait, at most
        ``DRAIN_WAIT_S``, until each has said so; True when all did. New requests are refused from then on."""
        cue = self.run_dir / DRAIN_FILE
        cue.write_text("stopping\n")
        deadline = time.monotonic() + DRAIN_WAIT_S
        while time.monotonic() < deadline:
            if sum(1 for _ in self.run_dir.glob(f"{DRAIN_FILE}.*")) >= self.cfg.instances:
                return True
            time.sleep(DRAIN_ACK_POLL_S)
        self.say(f"the llm model did not end its requests within {DRAIN_WAIT_S:g} s; stopping Triton all the same")
        return False

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
