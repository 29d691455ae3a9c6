"""The tokenising thread: jobs in order, a failing job does not stop it, close answers what is left."""

from __future__ import annotations

import threading

import numpy as np

from control.triton.llm_request import Limits, parse_request
from control.triton.tokenize_worker import TokenizeWorker


def test_jobs_run_in_order_and_survive_a_failing_job():
    w = TokenizeWorker("t")
    seen, done = [], threading.Event()
    w.put(lambda: seen.append(1), lambda: None)
    w.put(lambda: 1 / 0, lambda: None)
    w.put(lambda: (seen.append(2), done.set()), lambda: None)
    assert done.wait(5) and seen == [1, 2]
    w.close()


def test_close_answers_the_jobs_not_run_and_later_ones():
    w = TokenizeWorker("t")
    gate, dropped = threading.Event(), []
    w.put(lambda: gate.wait(5), lambda: dropped.append("first"))
    w.put(lambda: None, lambda: dropped.append("queued"))
    closer = threading.Thread(target=w.close)
    closer.start()
    while not w._closed.is_set():  # the queued job must still be queued when close begins
        threading.Event().wait(0.01)
    gate.set()
    closer.join(10)
    w.put(lambda: None, lambda: dropped.append("late"))
    assert dropped == ["queued", "late"]


def test_close_wakes_an_idle_thread_at_once():
    """An idle thread waits on its queue for as long as it takes; close wakes it."""
    w = TokenizeWorker("t")
    done = threading.Event()
    w.put(done.set, lambda: None)
    assert done.wait(5)  # the thread is back in its wait
    assert w.close(timeout_s=10.0)


def test_parse_leaves_a_large_text_prompt_untokenised():
    calls = []

    def encode(s):
        calls.append(s)
        return [1, 2]

    kw = {"limits": Limits(max_prompt_bytes=10_000), "encode": encode, "encode_words": encode,
          "deployment_policy": "adaptive", "inline_prompt_bytes": 100}
    small = parse_request({"text_input": np.array([b"x" * 100], dtype=object)}, **kw)
    big = parse_request({"text_input": np.array([b"x" * 101], dtype=object)}, **kw)
    assert (small.prompt_ids, small.tokenize_later) == ([1, 2], False)
    assert (big.prompt_ids, big.tokenize_later, big.prompt_text) == ([], True, "x" * 101)
    assert calls == ["x" * 100]
