"""Progress reporting for long work (the CPU-pair build, the profiler).

Library code talks to a ``Reporter``; the CLI passes a rich one, tests a silent one, so nothing
below the commands prints on its own.
"""

from __future__ import annotations

import time
from typing import Any, Protocol


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
