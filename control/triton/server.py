"""Start and stop a real ``tritonserver``: the nvidia-pytriton wheel's on CPU hosts, the NGC
container's on GPU hosts.

What it takes to run the wheel's server reliably (each learned the hard way):
- The Python backend's stub must match the interpreter: the run directory gets a backend directory
  whose ``python/`` holds links to the wheel's backend library, its utils module and the stub for
  this Python version (a link, so the stub's $ORIGIN-relative rpath still finds its CUDA runtime).
- The stub must load this interpreter's libpython, not another one on the system, or models fail
  with ``'_thread.RLock' object has no attribute '_recursion_count'``: LIBDIR goes first on
  LD_LIBRARY_PATH, and the venv's ``bin`` first on PATH.
- A stub that cannot load its libraries makes the server hang forever instead of failing, so
  readiness is always polled with a deadline, and the log is read back on failure.
- gRPC and metrics bind to loopback unless told otherwise; HTTP binds to loopback always
  (``HTTP_HOST``): one request can crash Triton 2.51's HTTP server (a form-encoded body of ~4 MB,
  JSON nested ~300,000 deep), so it is only ever reached through specctl's front end, which
  refuses those. ``--exit-on-error=true``.
- Triton's administration APIs (shared-memory regions, model repository, tracing, logging) answer
  only requests that carry ``ADMIN_HEADER`` (``buildsys/triton_launch.py``) with the server's admin key (Triton's own
  ``--grpc-restricted-protocol`` / ``--http-restricted-api``): the gRPC port faces users, and a
  shared-memory registration or a log setting is a write with no token otherwise. The key is in the
  run directory (``ADMIN_KEY_FILE``, mode 0600) for an operator on the host.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from control.buildsys.triton_launch import ADMIN_KEY_FILE, admin_flags
from control.errors import MissingDependencyError, SpecctlError

HTTP_HOST = "127.0.0.1"  # Triton's HTTP server listens here whatever ``host`` is (see the module docstring)


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    python_backend: Path  # directory with libtriton_python.so and triton_python_backend_utils.py
    stub: Path | None  # stub for this interpreter (wheel installs); None: the backend dir has one
    libs: Path | None  # extra shared libraries the wheel bundles


def find_tritonserver() -> TritonInstall:
    """Locate tritonserver: $SPECCTL_TRITONSERVER, the nvidia-pytriton wheel, or /opt/tritonserver."""
    env = os.environ.get("SPECCTL_TRITONSERVER")
    if env:
        b = Path(env)
        if not b.is_file():
            raise MissingDependencyError(f"SPECCTL_TRITONSERVER={env} is not a file; point it at a tritonserver binary")
        return TritonInstall(b, b.parent.parent / "backends" / "python", None, None)
    try:
        import pytriton  # noqa: F401  (nvidia-pytriton)

        root = Path(sys.modules["pytriton"].__file__).parent / "tritonserver"
    except ImportError:
        root = None
    if root is not None and (root / "bin" / "tritonserver").is_file():
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
        if not stub.is_file():
            raise MissingDependencyError(
                f"the nvidia-pytriton wheel has no Python backend stub for Python {ver}; use Python 3.8-3.13"
            )
        libs = root.parent.parent / "nvidia_pytriton.libs"
        return TritonInstall(root / "bin" / "tritonserver", root / "backends" / "python", stub,
                             libs if libs.is_dir() else None)
    opt = Path("/opt/tritonserver/bin/tritonserver")
    if opt.is_file():
        return TritonInstall(opt, opt.parent.parent / "backends" / "python", None, None)
    raise MissingDependencyError(
        "tritonserver not found: on a CPU host install it with `pip install nvidia-pytriton==0.7.0` "
        "(or `make setup`); on a GPU host use the NGC Triton TensorRT-LLM container or set SPECCTL_TRITONSERVER"
    )


def prepare_backends(install: TritonInstall, run_dir: Path) -> Path:
    """A backend directory for this run whose python backend uses this interpreter's stub."""
    backends = run_dir / "backends"
    py = backends / "python"
    if py.exists():
        shutil.rmtree(py)
    py.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        src = install.python_backend / name
        if not src.exists():
            raise MissingDependencyError(f"Triton's Python backend is incomplete: {src} is missing")
        (py / name).symlink_to(src)
    stub = install.stub or install.python_backend / "triton_python_backend_stub"
    (py / "triton_python_backend_stub").symlink_to(stub)
    return backends


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports. All are held open while picking: ports picked one after another
    can repeat (the kernel may hand a just-closed ephemeral port out again), and two servers of one
    deployment then collide on it."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_server_ports(host: str = "127.0.0.1") -> dict[str, int]:
    """Distinct free ``http_port``, ``grpc_port`` and ``metrics_port`` for a ``TritonServer``."""
    return dict(zip(("http_port", "grpc_port", "metrics_port"), free_ports(3, host), strict=True))


def check_ports(ports: dict[str, int], host: str = "127.0.0.1") -> None:
    taken = [f"{name} port {p}" for name, p in ports.items() if not port_free(p, host)]
    if taken:
        raise SpecctlError(f"{', '.join(taken)} already in use on {host}; pick another with --{'-'.join(taken[0].split()[:2])} or stop what holds it")


def write_admin_key(run_dir: Path, key: str) -> Path:
    """The key in the owner-only ``run_dir/ADMIN_KEY_FILE``, for an operator on the host."""
    path = Path(run_dir) / ADMIN_KEY_FILE
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return path


def server_env(install: TritonInstall, extra_pythonpath: list[str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    libdirs = [sysconfig.get_config_var("LIBDIR") or ""]
    if install.libs is not None:
        libdirs.append(str(install.libs))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in libdirs if d] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    if extra_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(extra_pythonpath + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def terminate_group(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it after
    ``timeout_s``; nothing once the process has exited."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


class TritonServer:
    """A tritonserver process over a model repository; use as a context manager."""

    def __init__(self, model_repo: Path, run_dir: Path, *, http_port: int, grpc_port: int, metrics_port: int,
                 host: str = "127.0.0.1", pythonpath: list[str] | None = None, extra_args: list[str] | None = None,
                 install: TritonInstall | None = None) -> None:
        self.model_repo = Path(model_repo)
        self.run_dir = Path(run_dir)
        self.host = host
        self.ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self.install = install or find_tritonserver()
        self.pythonpath = pythonpath or []
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.log_path = self.run_dir / "tritonserver.log"
        self.admin_key = secrets.token_urlsafe(24)  # the same across restarts of this server

    @property
    def http_url(self) -> str:
        return f"http://{HTTP_HOST}:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        self.launch()
        self.wait_ready(timeout_s)
        return self

    def launch(self) -> TritonServer:
        """Start the process without waiting for readiness (``ready()`` polls it)."""
        check_ports({"http": self.ports["http"]}, HTTP_HOST)
        check_ports({k: v for k, v in self.ports.items() if k != "http"}, self.host)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        backends = prepare_backends(self.install, self.run_dir) if self.install.stub else self.install.python_backend.parent
        cmd = [
            str(self.install.binary), f"--model-repository={self.model_repo}", f"--backend-directory={backends}",
            f"--http-address={HTTP_HOST}", f"--grpc-address={self.host}", f"--metrics-address={self.host}",
            f"--http-port={self.ports['http']}", f"--grpc-port={self.ports['grpc']}",
            f"--metrics-port={self.ports['metrics']}", "--exit-on-error=true", "--log-verbose=0",
            *admin_flags(self.admin_key), *self.extra_args,
        ]
        write_admin_key(self.run_dir, self.admin_key)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process for its lifetime; restarts append
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(self.install, self.pythonpath),
                                     start_new_session=True)
        log.close()
        return self

    def ready(self, timeout_s: float = 1.0) -> bool:
        """One readiness probe: ``/v2/health/ready`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=timeout_s) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and every process of its group (its backend stubs): in-flight requests
        fail at once instead of waiting out a graceful exit. Also after the server itself died: its
        stubs outlive it, orphaned, unless their group is killed."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SpecctlError(f"tritonserver exited with code {self.proc.returncode} while starting: {self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.2)
        self.stop()
        raise SpecctlError(f"tritonserver was not ready within {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errs = [ln for ln in text if ln.startswith("E") or "error" in ln.lower()]
        return " | ".join((errs or text)[-lines:]) + f" (full log: {self.log_path})"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is not None:  # it died: end what is left of its group (orphaned stubs)
            self.kill()
            return
        terminate_group(self.proc, timeout_s)

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
