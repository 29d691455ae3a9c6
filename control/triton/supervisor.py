"""Keeps a deployment serving without a person: ``specctl serve`` calls ``Supervisor.check`` every
``CHECK_INTERVAL_S`` (50 ms; a check reads a few ``/proc`` files), which bounds how long Triton may
still report itself ready after a stub died.

- The control-plane service exited (killed, crashed): start it again on the same port. It reads its
  overrides and plan version back from the deployment's state file; the agents inside Triton keep
  serving on their last plan meanwhile and resubscribe with backoff. Triton is not touched.
- A Python backend stub of the ``llm`` model died (``kill -9``, out of memory): Triton would keep the
  requests it handed to that stub unanswered forever and report itself ready. The supervisor kills
  tritonserver's whole process group at once, so every in-flight request fails with a connection
  error, and starts it again on the same ports; until the model is loaded, health is not ready
  (nothing listens). The same restart follows a tritonserver that exited.
- Restarts are bounded: more than ``max_restarts`` of one part within ``window_s`` and the
  supervisor gives up (``check`` returns the reason), rather than loop on a fault a restart cannot fix.

Processes are found in ``/proc`` (Linux): the stubs are tritonserver's descendants whose executable
is ``triton_python_backend_stub``.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from control.errors import SpecctlError

if TYPE_CHECKING:
    from control.triton.deploy import Deployment

STUB_NAME = "triton_python_backend_stub"
CHECK_INTERVAL_S = 0.05
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0
PROC = Path("/proc")


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    kids = _children_map()
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _exe_name(pid: int) -> str:
    try:
        argv0 = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return ""
    return Path(argv0.decode(errors="replace")).name


def stub_pids(server_pid: int) -> set[int]:
    """The live Python backend stubs under tritonserver ``server_pid``."""
    return {p for p in descendants(server_pid) if _exe_name(p) == STUB_NAME and process_alive(p)}


def lost_part(server: subprocess.Popen, stubs: Iterable[int]) -> str | None:
    """What of a started tritonserver died: the server itself, or one of ``stubs`` (the Python backend
    stubs it had once ready); None while all of them live."""
    if server.poll() is not None:
        return f"tritonserver exited (code {server.returncode})"
    dead = sorted(p for p in stubs if not process_alive(p))
    return f"a Python backend stub of tritonserver (pid {', '.join(map(str, dead))}) died" if dead else None


@dataclass
class RestartBudget:
    """At most ``limit`` restarts within ``window_s`` seconds."""

    limit: int = MAX_RESTARTS
    window_s: float = RESTART_WINDOW_S
    times: deque[float] = field(default_factory=deque)

    def take(self, now: float) -> bool:
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        if len(self.times) >= self.limit:
            return False
        self.times.append(now)
        return True


class Supervisor:
    """Restarts what died in a started ``Deployment`` (see the module docstring)."""

    def __init__(self, dep: Deployment, *, say: Callable[[str], None] = print, max_restarts: int = MAX_RESTARTS,
                 window_s: float = RESTART_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.dep = dep
        self.say = say
        self.clock = clock
        self.budgets = {"control plane": RestartBudget(max_restarts, window_s),
                        "tritonserver": RestartBudget(max_restarts, window_s)}
        self.restarts = {"control plane": 0, "tritonserver": 0}
        self.stubs: set[int] = set()
        self.triton_started_at: float | None = None  # set while a restarted server is not ready yet
        if dep.triton is not None and dep.triton.proc is not None:
            self.stubs = stub_pids(dep.triton.proc.pid)

    def check(self) -> str | None:
        """One round of checks and restarts; a reason to give up, or None while all is well."""
        return self._check_service() or self._check_triton()

    def _restart_allowed(self, part: str, why: str) -> str | None:
        if not self.budgets[part].take(self.clock()):
            b = self.budgets[part]
            return f"{part} {why} {b.limit} times within {b.window_s:.0f} s; giving up"
        self.restarts[part] += 1
        return None

    def _check_service(self) -> str | None:
        dep = self.dep
        proc = dep.service_proc
        if not dep.cfg.service or proc is None or proc.poll() is None:
            return None
        code = proc.returncode
        give_up = self._restart_allowed("control plane", "exited")
        if give_up:
            return give_up
        self.say(f"control plane exited (code {code}); restarting it on {dep.control_url} "
                 "(the model keeps serving on its last plan)")
        dep.spawn_service()
        return None

    def _check_triton(self) -> str | None:
        server = self.dep.triton
        if server is None or server.proc is None:
            return None
        if self.triton_started_at is not None:
            return self._await_ready(server)
        why = lost_part(server.proc, self.stubs)
        if why is None:
            return None
        give_up = self._restart_allowed("tritonserver", "failed")
        if give_up:
            return f"{why}; {give_up}"
        self.say(f"{why}; restarting tritonserver (in-flight requests fail now, new ones once it is ready)")
        server.kill()
        try:
            server.launch()
        except SpecctlError as e:
            return f"{why}; tritonserver could not be started again: {e}"
        self.stubs = set()
        self.triton_started_at = self.clock()
        return None

    def _await_ready(self, server) -> str | None:
        if server.proc.poll() is not None:
            self.triton_started_at = None
            self.stubs = set()
            return self._check_triton()
        if server.ready(timeout_s=0.5):
            self.stubs = stub_pids(server.proc.pid)
            self.say(f"tritonserver is ready again ({self.clock() - self.triton_started_at:.1f} s after the restart)")
            self.triton_started_at = None
            return None
        if self.clock() - self.triton_started_at > self.dep.cfg.ready_timeout_s:
            return f"tritonserver was not ready within {self.dep.cfg.ready_timeout_s:.0f} s of a restart: {server.log_tail()}"
        return None
