"""Progress reporting for long work (the CPU-pair build, the profiler).

Library code talks to a ``Reporter``; the CLI passes one from ``reporter_for`` (rich bars on a
terminal, plain timed lines in a log or a pipe), tests a silent one, so nothing below the commands
prints on its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

LINE_EVERY_S = 30.0  # seconds between a plain reporter's lines within a phase (the full CPU pair's target
# trains for about 14 minutes in one phase)


class Reporter(Protocol):
    def phase(self, name: str, total: int | None = None) -> None: ...

    def advance(self, n: int = 1, **info: Any) -> None: ...

    def log(self, message: str) -> None: ...

    def close(self) -> None: ...


class SilentReporter:
    """Collects log lines (tests read them) and prints nothing."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.phases: list[str] = []

    def phase(self, name: str, total: int | None = None) -> None:
        self.phases.append(name)

    def advance(self, n: int = 1, **info: Any) -> None:
        pass

    def log(self, message: str) -> None:
        self.lines.append(message)

    def close(self) -> None:
        pass


def _fmt(info: dict[str, Any]) -> str:
    parts = []
    for k, v in info.items():
        parts.append(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}")
    return "  ".join(parts)


class RichReporter:
    """One rich progress bar per phase, with the latest metrics (loss, tokens/s) beside it."""

    def __init__(self, console=None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"), console=self.console, transient=False,
        )
        self._progress.start()
        self._task = None
        self._t0 = time.perf_counter()

    def phase(self, name: str, total: int | None = None) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        self._task = self._progress.add_task(name, total=total, info="")

    def advance(self, n: int = 1, **info: Any) -> None:
        if self._task is not None:
            if info:
                self._progress.update(self._task, advance=n, info=_fmt(info))
            else:
                self._progress.update(self._task, advance=n)

    def log(self, message: str) -> None:
        self._progress.console.print(message)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        self._progress.stop()


class LineReporter:
    """Plain lines for a log or a pipe, where rich draws nothing until a bar ends: one when a phase
    starts, then its count, elapsed time and latest metrics every ``every_s`` seconds and when it ends."""

    def __init__(self, write: Callable[[str], None] | None = None, every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._every, self._clock = every_s, clock
        self._name: str | None = None
        self._total: int | None = None
        self._done, self._info = 0, ""
        self._start = self._last = clock()
        self._said = True  # the current count has been written

    def phase(self, name: str, total: int | None = None) -> None:
        self._end_phase()
        self._name, self._total, self._done, self._info = name, total, 0, ""
        self._start = self._last = self._clock()
        self._write(f"{name}: started" + (f" ({total} steps)" if total else ""))
        self._said = True

    def advance(self, n: int = 1, **info: Any) -> None:
        if self._name is None:
            return
        self._done += n
        if info:
            self._info = _fmt(info)
        self._said = False
        now = self._clock()
        if now - self._last >= self._every or (self._total is not None and self._done >= self._total):
            self._say(now)

    def log(self, message: str) -> None:
        self._write(message)

    def close(self) -> None:
        self._end_phase()
        self._name = None

    def _end_phase(self) -> None:
        if self._name is not None and not self._said:
            self._say(self._clock())

    def _say(self, now: float) -> None:
        count = f"{self._done}/{self._total}" if self._total else f"{self._done}"
        line = f"{self._name}: {count}, {now - self._start:.0f} s"
        self._write(line + (f", {self._info}" if self._info else ""))
        self._last, self._said = now, True


def reporter_for(console=None) -> RichReporter | LineReporter:
    """Rich bars where ``console`` (default: standard error) is a terminal, plain lines otherwise."""
    from rich.console import Console

    console = console or Console(stderr=True)
    if console.is_terminal:
        return RichReporter(console)
    return LineReporter(lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
