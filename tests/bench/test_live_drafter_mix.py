"""The live bench's drafter mix: which drafters drafted in a run, diffed from the server's counts."""

from control.bench.live import _delta
from control.bench.metrics import sum_counts
from control.bench.report import aggregate, drafter_mix, markdown_table
from control.commands.bench import _drafter_note
from tests.bench.test_live_policy_shares import _stats


def _row(policy: str, seed: int, steps: dict[str, int] | None) -> dict:
    extra = {"k_hist": [1, 1]} if steps is None else {"k_hist": [1, 1], "drafter_steps": steps}
    keys = ("mean_latency_s", "p50_latency_s", "p99_latency_s", "ttft_s", "tpot_s", "goodput_tok_s",
            "slo_attainment", "acceptance_rate", "spec_step_share")
    return {"policy": policy, "load": 1.0, "seed": seed, **{k: 1.0 for k in keys}, "extra": extra}


def test_a_run_counts_only_its_own_drafting_steps_per_drafter():
    before = _stats(drafter_steps={"draft": 40, "ngram": 5})
    after = _stats(drafter_steps={"draft": 70, "ngram": 15})
    assert _delta(after, before)["drafter_steps"] == {"draft": 30, "ngram": 10}
    # an executor that reports no drafters: an empty mix, not a crash
    assert _delta(_stats(), _stats())["drafter_steps"] == {}


def test_replicas_add_up_by_name():
    assert sum_counts([{"draft": 3, "ngram": 1}, {"draft": 2, "small": 4}]) == {"draft": 5, "ngram": 1, "small": 4}


def test_the_mix_is_shares_of_drafting_steps_and_dashes_without_any():
    assert drafter_mix({"draft-tiny": 30, "ngram": 10}) == "draft-tiny:75 ngram:25"
    assert drafter_mix({"draft-tiny": 1000, "ngram": 1}) == "draft-tiny:100"  # below half a percent: left out
    assert drafter_mix({"draft": 0}) == "-" and drafter_mix(None) == "-"
    assert _drafter_note({"drafter_steps": {"draft": 3, "ngram": 1}}) == ", drafters draft:75 ngram:25%"
    assert _drafter_note({}) == ""


def test_the_table_sums_repeats_and_shows_the_column_only_where_runs_report_it():
    rows = [_row("adaptive", 0, {"a": 30, "b": 10}), _row("adaptive", 1, {"a": 10, "b": 30}),
            _row("none", 0, {"a": 0, "b": 0})]
    assert aggregate(rows)[(1.0, "adaptive")]["drafter_steps"] == {"a": 40, "b": 40}
    text = markdown_table(rows)
    assert "drafters (% of drafting request-steps)" in text
    assert "| a:50 b:50 |" in text and text.rstrip().endswith("| - |")  # none drafted nothing
    sim = markdown_table([_row("adaptive", 0, None)])  # simulator rows carry no mix: no empty column
    assert "drafters" not in sim
