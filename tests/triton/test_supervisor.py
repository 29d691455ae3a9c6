"""The supervisor's restart budget and its view of processes (the restarts themselves are exercised on a
real ``specctl serve`` in tests/e2e/test_faults.py)."""

import os
import subprocess
import sys
import time

from control.triton.supervisor import RestartBudget, descendants, lost_part, process_alive, stub_pids


def test_the_restart_budget_refuses_a_burst_and_recovers_after_its_window():
    b = RestartBudget(limit=3, window_s=60.0)
    assert [b.take(t) for t in (0.0, 1.0, 2.0, 3.0)] == [True, True, True, False]
    assert b.take(61.5) is True  # the restart at 0 left the window
    assert b.take(61.6) is True  # and the one at 1
    assert b.take(61.7) is False  # 2, 61.5 and 61.6 are within it


def test_processes_are_seen_through_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid()) and process_alive(child.pid)
        assert stub_pids(child.pid) == set()  # a plain process has no Python backend stub under it
    finally:
        child.kill()
    # Killed but not reaped: a zombie is not alive.
    deadline = time.monotonic() + 5
    while process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(child.pid)
    child.wait()


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def _until_dead(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 5
    while process_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_lost_part_names_a_dead_stub_then_a_server_that_exited():
    server, stub = _sleeper(), _sleeper()
    try:
        assert lost_part(server, {stub.pid}) is None
        stub.kill()
        _until_dead(stub)
        assert lost_part(server, {stub.pid}) == f"a Python backend stub of tritonserver (pid {stub.pid}) died"
        server.kill()
        server.wait()
        assert lost_part(server, {stub.pid}) == f"tritonserver exited (code {server.returncode})"
    finally:
        for p in (server, stub):
            p.kill()
            p.wait()
