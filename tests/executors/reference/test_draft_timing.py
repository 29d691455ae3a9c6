"""The draft-step timer the profiler prices draft models with: the engine's own drafting code, its
features as the engine reports them to the cost refit."""

import pytest

from control.executors.reference.draft_timing import DraftStepTimer
from control.executors.reference.model import LlamaConfig
from tests.executors.reference.tiny import random_model

CFG = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)


@pytest.mark.parametrize("batch, ctx, k", [(1, 8, 1), (3, 20, 4), (5, 40, 7)])
def test_a_draft_step_runs_k_passes_of_one_token_per_request(batch, ctx, k):
    timer = DraftStepTimer("d", random_model(CFG, seed=1), batch, max_len=ctx + k)
    rows = timer.rows(ctx, k)
    first, again = timer.run(rows), timer.run(rows)
    assert first.ms > 0 and again.ms > 0
    # in sync with the context: the first pass computes only the last token, each later one a draft token
    assert (first.passes, first.batched_tokens) == (again.passes, again.batched_tokens) == (k, batch * k)
    assert first.ctx_tokens == again.ctx_tokens == batch * sum(ctx + 1 + j for j in range(k))
    # the engine's drafter holds the last token and every draft but the last, as after any draft step
    assert (timer.lengths == ctx + k).all()


@pytest.mark.parametrize("ctx, k", [(30, 3), (0, 2), (10, 0)])
def test_a_step_outside_the_cache_is_refused_with_what_fits(ctx, k):
    timer = DraftStepTimer("d", random_model(CFG, seed=1), 2, max_len=32)
    with pytest.raises(ValueError, match=f"context {ctx} with k = {k}: .*ctx \\+ k <= 32"):
        timer.rows(ctx, k)


@pytest.mark.parametrize("batch, ctx, lag", [(1, 16, 8), (3, 40, 20)])
def test_a_catch_up_step_computes_the_missing_tokens_in_its_first_pass(batch, ctx, lag):
    timer = DraftStepTimer("d", random_model(CFG, seed=1), batch, max_len=ctx + 1)
    rows = timer.rows(ctx, 1)
    step = timer.run(rows, lag)
    assert (step.passes, step.batched_tokens) == (1, batch * (1 + lag))
    assert (timer.lengths == ctx + 1).all()  # back in sync with the context after the pass
    with pytest.raises(ValueError, match=f"catch-up of {ctx} tokens at context {ctx}"):
        timer.run(rows, ctx)
