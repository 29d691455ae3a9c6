"""Large prompts are tokenised off Triton's execute(): while large prompts are being tokenised (and
refused as too long in tokens), a small request is not held up behind them."""

from __future__ import annotations

import asyncio
import random
import statistics
import string

import pytest
import tritonclient.grpc.aio as aio

from control.clients.triton import GenParams, stream_generate
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

SMALL_TOKENS = 32
BIG_BYTES = 60_000  # under the quick pair's 64 KiB prompt limit (1024 positions x 64 bytes), ~30k tokens
HEAD_START_S = 0.05  # the large prompts reach the server first
BASELINE_RUNS = 3
DELAY_ALLOWED_S = 0.05  # before: 0.08 s behind 3 prompts, 0.5 s behind 12 (tokenised inside execute())
# Tries of the scenario, the best one counted: a delay from tokenising inside execute() shows in every
# try, a busy machine (another test worker) only in some.
TRIES = 3


def _big_prompt(seed: int) -> str:
    """Text that tokenises slowly: few merges apply to random printable characters."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + string.digits + string.punctuation + " ") for _ in range(BIG_BYTES))


async def _small(client) -> float:
    res = await stream_generate(client, PROMPTS[4], GenParams(max_tokens=SMALL_TOKENS))
    assert res.error is None and len(res.token_ids) == SMALL_TOKENS, res.error
    return res.ttft_s


async def _scenario(grpc_url: str, n_big: int) -> tuple[float, float, list]:
    client = aio.InferenceServerClient(grpc_url)
    try:
        alone = statistics.median([await _small(client) for _ in range(BASELINE_RUNS)])
        bigs = [asyncio.create_task(stream_generate(client, _big_prompt(i), GenParams(max_tokens=4)))
                for i in range(n_big)]
        await asyncio.sleep(HEAD_START_S)
        behind = await _small(client)
        return alone, behind, await asyncio.gather(*bigs)
    finally:
        await client.close()


@pytest.mark.parametrize("n_big", [3, 12])
def test_large_prompts_do_not_hold_up_a_small_request(deployment, n_big):
    delays = []
    for _ in range(TRIES):
        alone, behind, bigs = asyncio.run(asyncio.wait_for(_scenario(deployment.grpc_url, n_big), 120))
        print(f"\n{n_big} prompts of {BIG_BYTES} bytes: a {SMALL_TOKENS}-token request's first token after "
              f"{behind * 1e3:.0f} ms (alone {alone * 1e3:.0f} ms)")
        for r in bigs:  # tokenised, then refused by the engine's length check, naming the lengths
            assert r.error is not None and "exceeds the engine's max sequence length" in r.error, r.error
        delays.append(behind - alone)
        if delays[-1] < DELAY_ALLOWED_S:
            break
    assert min(delays) < DELAY_ALLOWED_S, delays


def test_a_large_prompt_that_fits_is_served_as_its_token_ids_would_be(deployment, reference):
    text = " " * 5000 + "def parse(x):\n"  # over execute()'s inline size, ~630 tokens
    ids = reference.loaded.encode(text)
    assert len(text) > 4096 and len(ids) < 1024 - SMALL_TOKENS
    from control.clients.triton import grpc_generate

    by_text = grpc_generate(deployment.grpc_url, text, GenParams(max_tokens=SMALL_TOKENS))
    by_ids = grpc_generate(deployment.grpc_url, ids, GenParams(max_tokens=SMALL_TOKENS))
    assert by_text.token_ids == by_ids.token_ids and len(by_text.token_ids) == SMALL_TOKENS
