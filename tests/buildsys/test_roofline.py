"""Roofline cost models and the profiles they produce."""

from __future__ import annotations

import numpy as np
import pytest

from control.buildsys.roofline import StepTimes, roofline_profile
from control.errors import ConfigError
from control.plan import compile_plan


def test_profile_is_valid_and_fits_the_roofline():
    p = roofline_profile("h100", "llama-3.1-8b", ["llama-3.2-1b", "eagle3-llama-3.1-8b"], ngram_ms=0.1)
    assert p.source == "roofline" and p.sku == "h100"
    assert [d.kind.value for d in p.drafters] == ["draft_model", "eagle", "ngram"]
    assert "specctl roofline --sku h100" in p.environment["command"]
    for name, m in p.models.items():
        assert m.mape < 15, name
    compile_plan(p, max_k=8)  # a normal profile: plans compile from it


def test_bandwidth_bound_decode_scales_with_weights_and_sku():
    h100 = StepTimes("h100", "llama-3.1-8b")
    a100 = StepTimes("a100", "llama-3.1-8b")
    t_h, t_a = float(h100.target_ms(1, 128)), float(a100.target_ms(1, 128))
    # batch-1 decode reads the weights: time ratio follows the bandwidth ratio (3.0 vs 1.83 TB/s)
    assert t_a / t_h == pytest.approx(3.0 / 1.828, rel=0.08)
    # 16 GB of bf16 weights at 3 TB/s: a bit over 5.3 ms
    assert 5.3 < t_h < 6.5


def test_long_context_makes_verification_cheap_relative_to_decode():
    """MagicDec: at long context the target is KV-bound even at large batch, so verifying k + 1
    tokens costs little more than decoding one; at short context and large batch it does not."""
    st = StepTimes("h100", "llama-3.1-8b")
    ratio_long = float(st.target_ms(64, 32000, 4) / st.target_ms(64, 32000, 1))
    ratio_short = float(st.target_ms(256, 128, 4) / st.target_ms(256, 128, 1))
    assert ratio_long < 1.1 < ratio_short


def test_tensor_parallelism_splits_weights_and_adds_all_reduce():
    t1 = float(StepTimes("h100", "llama-3.1-70b", tp=4).target_ms(1, 128))
    t8 = float(StepTimes("h100", "llama-3.1-70b", tp=8).target_ms(1, 128))
    assert t8 < t1 < 2 * t8 + 1.0  # weights halve; the all-reduces do not
    p = roofline_profile("h100", "llama-3.1-70b", ["llama-3.1-8b"], tp=8)
    assert p.environment["tp"] == 8 and p.limits.kv_tokens > 100_000


@pytest.mark.parametrize("kwargs,match", [
    ({"sku": "h800"}, "unknown GPU SKU 'h800'"),
    ({"sku": "cpu"}, "profiled by measurement"),
    ({"target": "gpt-9"}, "unknown model 'gpt-9'"),
    ({"target": "llama-3.1-70b"}, "raise --tp"),
    ({"tp": 3}, "power of two"),
    ({"sku": "a100", "fp8": True}, "no fp8"),
    ({"drafts": []}, "at least one --draft"),
    ({"target": "eagle3-llama-3.1-8b"}, "draft head"),
])
def test_bad_input_names_the_value(kwargs, match):
    args = {"sku": "h100", "target": "llama-3.1-8b", "drafts": ["llama-3.2-1b"]}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        roofline_profile(args.pop("sku"), args.pop("target"), args.pop("drafts"), **args)


def test_committed_profiles_match_what_the_roofline_gives_today():
    """profiles/<sku>/*.yaml are generated; regenerating them must reproduce the committed numbers."""
    from pathlib import Path

    from control.profile import load_profile

    root = Path(__file__).resolve().parents[2] / "profiles"
    files = [f for f in root.glob("*/*.yaml") if load_profile(f).source == "roofline"]
    assert files
    for f in files:
        p = load_profile(f)
        cmd = p.environment["command"].split()
        sku, target = cmd[cmd.index("--sku") + 1], cmd[cmd.index("--target") + 1]
        drafts = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--draft"]
        tp = int(cmd[cmd.index("--tp") + 1]) if "--tp" in cmd else 1
        opts = {"fp8": "--fp8" in cmd}  # the generating command's options, as `specctl roofline` passes them
        for flag, key, typ in (("--framework", "framework", str), ("--max-batch", "max_batch", int)):
            if flag in cmd:
                opts[key] = typ(cmd[cmd.index(flag) + 1])
        again = roofline_profile(sku, target, drafts, tp, **opts)
        for name, m in p.models.items():
            np.testing.assert_allclose(
                [m.a_ms_per_ctx_token, m.b_ms_per_batched_token, m.c_ms],
                [again.models[name].a_ms_per_ctx_token, again.models[name].b_ms_per_batched_token,
                 again.models[name].c_ms], rtol=1e-5, err_msg=str(f))
