"""The bookkeeping of stop requests between Triton's execute thread, the tokenising thread and the loop."""

from __future__ import annotations

import threading

from control.triton.stops import Stops


def test_a_stop_for_a_registered_request_is_queued_for_the_loop_once():
    s = Stops()
    assert s.due() == []
    s.request("a")
    s.request("b")
    assert s.due() == ["a", "b"]
    assert s.due() == []  # taken once


def test_a_stop_while_the_prompt_is_tokenised_ends_the_request_when_it_registers():
    s = Stops()
    s.expect("big")
    s.request("big")
    assert s.due() == []  # not the loop's: the request is not live yet
    assert s.arrived("big") is True
    assert s.arrived("big") is False  # forgotten once registered


def test_requests_nobody_stopped_or_without_an_id_register_as_usual():
    s = Stops()
    s.expect("big")
    assert s.arrived("big") is False
    s.expect("")  # no id: nothing to remember
    assert s.arrived("") is False
    s.request("big")  # after registration: the loop's to end
    assert s.due() == ["big"]


def test_stops_from_many_threads_are_all_delivered():
    s = Stops()
    ids = [f"r{i}" for i in range(2000)]

    def send(part):
        for tid in part:
            s.request(tid)

    threads = [threading.Thread(target=send, args=(ids[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    got: list[str] = []
    while any(t.is_alive() for t in threads):
        got += s.due()
    for t in threads:
        t.join()
    got += s.due()
    assert sorted(got) == sorted(ids)
