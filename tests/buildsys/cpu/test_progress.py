"""Progress of long work: rich bars on a terminal, plain timed lines in a log or a pipe."""

from __future__ import annotations

import io

from rich.console import Console

from control.buildsys.cpu.progress import LineReporter, RichReporter, reporter_for


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_line_reporter_writes_each_phase_its_count_on_a_timer_and_at_its_end():
    lines: list[str] = []
    clock = Clock()
    rep = LineReporter(lines.append, every_s=30.0, clock=clock)
    rep.phase("train target", total=100)
    for step in range(100):
        clock.t += 1.0
        rep.advance(loss=5.0 - step / 50)
    rep.phase("train draft")  # no total: counts only
    clock.t += 5.0
    rep.advance(3)
    rep.log("draft-tiny: 1.2M parameters")
    rep.close()
    assert lines[0] == "train target: started (100 steps)"
    timed = [ln for ln in lines if ln.startswith("train target: ") and "/100" in ln]
    # a line every 30 s (at 30, 60 and 90) and one when the phase reaches its total
    assert [ln.split(",")[0] for ln in timed] == ["train target: 30/100", "train target: 60/100",
                                                  "train target: 90/100", "train target: 100/100"]
    assert timed[-1] == "train target: 100/100, 100 s, loss 3.02"
    # a phase that ends between timer lines writes its last count when the next starts or at close
    assert lines[-3:] == ["train draft: started", "draft-tiny: 1.2M parameters", "train draft: 3, 5 s"]


def test_nothing_is_written_twice_for_the_same_count():
    lines: list[str] = []
    clock = Clock()
    rep = LineReporter(lines.append, every_s=10.0, clock=clock)
    rep.phase("profile", total=4)
    clock.t = 11.0
    rep.advance()
    rep.close()
    assert lines == ["profile: started (4 steps)", "profile: 1/4, 11 s"]


def test_reporter_for_draws_bars_on_a_terminal_and_lines_in_a_pipe():
    buf = io.StringIO()
    rep = reporter_for(Console(file=buf, force_terminal=False))
    assert isinstance(rep, LineReporter)
    rep.phase("build", total=2)
    rep.advance(2, tokens_per_s=1234.5)
    rep.close()
    assert buf.getvalue().splitlines() == ["build: started (2 steps)", "build: 2/2, 0 s, tokens_per_s 1.23e+03"]
    term = reporter_for(Console(file=io.StringIO(), force_terminal=True))
    try:
        assert isinstance(term, RichReporter)
    finally:
        term.close()
