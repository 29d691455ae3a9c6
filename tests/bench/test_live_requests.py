"""The live bench's requests: the workload's output lengths are generated exactly unless asked not to."""

from __future__ import annotations

from control.bench.live import make_requests
from control.clients.triton import grpc_inputs
from control.commands.bench import add_load_args


def test_requests_generate_their_max_tokens_past_the_end_token_by_default():
    texts = ["def f(x):\n    return x\n" * 40]
    exact = make_requests("corpus", 5, seed=3, max_tokens=16, texts=texts)
    free = make_requests("corpus", 5, seed=3, max_tokens=16, texts=texts, ignore_eos=False)
    assert exact.ignore_eos and not free.ignore_eos
    assert (exact.max_tokens == free.max_tokens).all() and exact.prompts == free.prompts  # only the flag differs
    assert exact.notes["output_lengths"] == "max_tokens exactly (ignore_eos)"
    assert free.notes["output_lengths"] == "up to max_tokens (ends at the end token)"


def test_the_stop_at_eos_flag_is_off_unless_given():
    import argparse

    p = argparse.ArgumentParser()
    add_load_args(p, requests=4, loads="0.5")
    assert p.parse_args([]).stop_at_eos is False
    assert p.parse_args(["--stop-at-eos"]).stop_at_eos is True


def test_ignore_eos_travels_as_a_bool_input_only_when_set():
    from control.clients.triton import GenParams

    on = {t.name(): t for t in grpc_inputs("x", GenParams(max_tokens=4, ignore_eos=True))}
    assert on["ignore_eos"].datatype() == "BOOL"
    assert "ignore_eos" not in {t.name() for t in grpc_inputs("x", GenParams(max_tokens=4))}
    assert GenParams(max_tokens=4, ignore_eos=True).as_json()["ignore_eos"] is True
