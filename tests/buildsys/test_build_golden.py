"""Golden tests of `specctl build --recipe ... --dry-run` per SKU and backend, and the rules the
generated configs must obey (TensorRT-LLM sources cited in control/buildsys/trtllm_rules.py).

Regenerate the goldens after an intended change with ``SPECCTL_UPDATE_GOLDEN=1 pytest tests/buildsys``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from control.buildsys.memfit import memory_fit, require_fit
from control.buildsys.profiles import pick_drafter, resolve_profile
from control.buildsys.recipe import load_recipe, parse_recipe
from control.buildsys.trtllm_rules import (
    BACKEND_METHODS,
    cuda_graph_batch_sizes,
    lookup,
    reaches_zero,
    to_line,
    validate_schedule,
)
from control.cli import main
from control.errors import ConfigError
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "build" / "recipes").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SPECCTL_UPDATE_GOLDEN") == "1"
COMPARED = ("llm_api_options.yaml", "build.sh")


def _cases():
    for path in RECIPES:
        r = load_recipe(path)
        if r.is_cpu:
            continue
        for backend, methods in BACKEND_METHODS.items():
            if r.method in methods:
                yield pytest.param(path, backend, id=f"{path.stem}-{backend}")


def _profiles_dir(tmp: Path, recipe) -> Path:
    """A synthetic profile with known coefficients under profiles/<sku>/<pair>.yaml (stands in for
    the measured or roofline profile the build would find); drafter kinds cover every method."""
    prof = make_profile(max_batch=256).to_dict()
    prof.update(sku=recipe.sku, pair=recipe.pair)
    prof["models"]["head"] = {"a_ms_per_ctx_token": 1e-6, "b_ms_per_batched_token": 0.002, "c_ms": 0.4}
    prof["drafters"].append({"name": "eagle", "kind": "eagle", "model": "head"})
    d = tmp / "profiles" / recipe.sku
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{recipe.pair}.yaml").write_text(yaml.safe_dump(prof))
    return tmp / "profiles"


def _build(tmp_path, path, backend, capsys):
    recipe = load_recipe(path)
    out = tmp_path / "out"
    rc = main(["build", "--recipe", str(path), "--backend", backend, "--out", str(out), "--dry-run",
               "--profiles-dir", str(_profiles_dir(tmp_path, recipe))])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    return recipe, out, printed.out


@pytest.mark.parametrize(("path", "backend"), list(_cases()))
def test_generated_configs_match_golden(tmp_path, capsys, path, backend):
    recipe, out, printed = _build(tmp_path, path, backend, capsys)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    compared = [f for f in files if f in COMPARED or f.endswith("config.pbtxt")]
    assert "build.sh" in compared and "plan.yaml" in files and "specctl.yaml" in files
    gold = GOLDEN / f"{path.stem}-{backend}"
    for rel in compared:
        text = (out / rel).read_text()
        g = gold / rel
        if UPDATE:
            g.parent.mkdir(parents=True, exist_ok=True)
            g.write_text(text)
        assert g.is_file(), f"no golden {g.relative_to(ROOT)}; run with SPECCTL_UPDATE_GOLDEN=1 and review"
        assert text == g.read_text(), f"{rel} differs from its golden {g.relative_to(ROOT)}"
    if not UPDATE:
        have = sorted(p.relative_to(gold).as_posix() for p in gold.rglob("*") if p.is_file())
        assert have == compared, "golden directory has files the build no longer writes"
    assert "fits" in printed and "GB of" in printed  # the memory fit printed its numbers
    _check_rules(recipe, backend, out)


def _check_rules(recipe, backend, out: Path) -> None:
    """What every generated config must obey, whatever the golden says."""
    deploy = yaml.safe_load((out / "specctl.yaml").read_text())
    if backend == "pytorch":
        opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
        line = deploy["trtllm_line"]
        assert opts["max_batch_size"] == recipe.max_batch and opts["tensor_parallel_size"] == recipe.tp
        sc = opts.get("speculative_config")
        if sc is not None:
            sched = {int(k): v for k, v in sc["draft_len_schedule"].items()}
            validate_schedule(sched, sc["max_draft_len"], line)
            assert "max_concurrency" not in sc  # mutually exclusive with a schedule (1.3)
            assert not {"acceptance_rate_threshold", "acceptance_length_threshold"} & set(sc)  # one-way gate stays off
            assert set(k for k in sched if k <= recipe.max_batch) <= set(opts["cuda_graph_config"]["batch_sizes"])
            assert opts["cuda_graph_config"]["enable_padding"] is True
            if sc.get("eagle3_one_model") or sc["decoding_type"] == "MTP":
                assert not reaches_zero(sched, recipe.max_batch, line)  # TensorRT-LLM PR #16888
            canon = {int(k): v for k, v in deploy["draft_len_schedule"]["canonical"].items()}
            assert all(lookup(sched, b, line) == lookup(canon, b, "1.3") for b in range(1, recipe.max_batch + 2))
    else:
        script = (out / "build.sh").read_text()
        assert "trtllm-build" in script and "--use_paged_context_fmha enable" in script
        cfg = (out / "triton_repo/tensorrt_llm/config.pbtxt").read_text()
        assert 'key: "enable_kv_cache_reuse"' in cfg and "@OUT@/engines/target" in cfg
        if recipe.method.value in ("draft_target", "ngram"):
            assert "--speculative_decoding_mode draft_tokens_external" in script
            assert f"--max_draft_len {recipe.speculation.max_draft_len}" in script
            assert (out / "triton_repo/specctl_bls/1/model.py").is_file()
            for name in ("input_ids", "input_lengths", "request_output_len", "draft_input_ids", "output_ids"):
                assert f'name: "{name}"' in cfg
        if recipe.method.value == "draft_target":
            assert (out / "triton_repo/tensorrt_llm_draft/config.pbtxt").is_file()


def test_every_gpu_recipe_fits_and_cpu_recipes_validate():
    assert len(RECIPES) >= 28
    skus = set()
    for path in RECIPES:
        r = load_recipe(path)
        skus.add(r.sku)
        if not r.is_cpu:
            for backend, methods in BACKEND_METHODS.items():
                if r.method in methods:
                    assert memory_fit(r, backend).fits, path.name
    assert skus == {"h100", "h200", "b200", "a100", "l40s", "l4", "cpu"}


BASE = {"schema": "specctl.recipe/v1", "sku": "h100", "target": "llama-3.1-8b", "max_batch": 8,
        "speculation": {"method": "draft_target", "draft": "llama-3.2-1b", "max_draft_len": 4}}


@pytest.mark.parametrize(("change", "message"), [
    ({"sku": "a100", "precision": "fp8"}, "fp8 needs Ada, Hopper or Blackwell; a100 is ampere"),
    ({"precision": "nvfp4"}, "nvfp4 needs Blackwell; h100 is hopper"),
    ({"tp": 3}, "tp = 3 does not divide target 'llama-3.1-8b''s 8 KV heads"),
    ({"target": "llama-2-7b", "max_input_len": 1024, "max_seq_len": 4096}, "draft 'llama-3.2-1b' has vocab 128256, target 'llama-2-7b' has 32000"),
    ({"speculation": {"method": "ngram", "max_draft_len": 17}}, "max_draft_len 17 is above what ngram supports (16)"),
    ({"speculation": {"method": "mtp", "max_draft_len": 1}}, "method mtp needs a target with MTP modules"),
    ({"speculation": {"method": "eagle3", "draft": "eagle3-llama-3.1-70b", "max_draft_len": 3}}, "hidden size 8192"),
    ({"sku": "cpu", "target": "reference", "speculation": {"method": "eagle3", "max_draft_len": 3}},
     "eagle3 cannot run on sku cpu"),
    ({"sku": "v100"}, "unknown sku 'v100'"),
])
def test_invalid_recipes_fail_with_the_reason(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_recipe({**BASE, **change})


def test_backend_method_combinations():
    eagle3 = parse_recipe({**BASE, "speculation": {"method": "eagle3", "draft": "eagle3-llama-3.1-8b", "max_draft_len": 3}})
    with pytest.raises(ConfigError, match="eagle3 has no tensorrt path"):
        eagle3.check_backend("tensorrt")
    eagle3.check_backend("pytorch")


def test_memory_fit_refuses_with_numbers():
    big = parse_recipe({**BASE, "max_batch": 512, "max_seq_len": 8192})
    fit = memory_fit(big)
    assert not fit.fits
    with pytest.raises(ConfigError, match=r"does not fit: \d+\.\d GB of 80 GB per GPU on h100 .*max_batch \d+ would fit"):
        require_fit(big)
    # The suggested batch is the largest that fits.
    assert memory_fit(big, max_batch=fit.fits_batch).fits and not memory_fit(big, max_batch=fit.fits_batch + 1).fits
    # fp8 halves the weights and the KV cache; tp=2 halves them per GPU.
    bf16 = memory_fit(parse_recipe(BASE))
    fp8 = memory_fit(parse_recipe({**BASE, "precision": "fp8"}))
    tp2 = memory_fit(parse_recipe({**BASE, "tp": 2}))
    assert fp8.kv_gb == pytest.approx(bf16.kv_gb / 2) and fp8.weights_gb < 0.6 * bf16.weights_gb
    assert tp2.weights_gb == pytest.approx(bf16.weights_gb / 2) and tp2.kv_gb == pytest.approx(bf16.kv_gb / 2)


def test_cli_without_dry_run_refuses_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    path = ROOT / "build/recipes/h100-llama3.1-8b-draft.yaml"
    rc = main(["build", "--recipe", str(path), "--out", str(out),
               "--profiles-dir", str(_profiles_dir(tmp_path, load_recipe(path)))])
    err = capsys.readouterr().err
    assert rc == 3 and "needs TensorRT-LLM" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "precision": "nvfp4"}))
    assert main(["build", "--recipe", str(bad), "--out", str(out), "--dry-run"]) == 2
    assert "nvfp4 needs Blackwell" in capsys.readouterr().err and not out.exists()


def test_profile_resolution_prefers_measured(tmp_path):
    recipe = load_recipe(ROOT / "build/recipes/h100-llama3.1-8b-ngram.yaml")
    pdir = _profiles_dir(tmp_path, recipe)
    f = pdir / recipe.sku / f"{recipe.pair}.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["source"] = "measured"
    f.write_text(yaml.safe_dump(doc))
    res = resolve_profile(recipe, pdir)
    assert res.profile.source == "measured" and res.drafter == "ngram" and res.origin.startswith("file:")
    other = load_recipe(ROOT / "build/recipes/l4-llama3.1-8b-ngram.yaml")  # no file for l4: roofline
    try:
        import control.buildsys.roofline  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="no measured profile for l4/.*pass --profile"):
            resolve_profile(other, pdir)
    else:
        assert resolve_profile(other, pdir).origin == "roofline"
    with pytest.raises(ConfigError, match="no eagle drafter"):
        pick_drafter(make_profile(), load_recipe(ROOT / "build/recipes/h100-llama3.1-8b-eagle3.yaml"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 8)), min_size=1, max_size=8))
def test_schedule_rewrite_for_1_2_runs_the_same_k(pairs):
    canonical = {}
    for b, k in pairs:
        canonical[b] = k
    kmax = canonical[min(canonical)]
    if kmax == 0 or any(v > kmax for v in canonical.values()):
        return
    validate_schedule(canonical, kmax, "1.3")
    old = to_line(canonical, "1.2")
    validate_schedule(old, kmax, "1.2")
    for b in range(1, max(canonical) + 5):
        assert lookup(old, b, "1.2") == lookup(canonical, b, "1.3")


def test_schedule_validators_encode_each_line():
    validate_schedule({4: 4, 8: 2}, 4, "1.3")  # 1.3: the smallest key carries max_draft_len
    with pytest.raises(ConfigError, match="lacks batch size 1"):
        validate_schedule({4: 4, 8: 2}, 4, "1.2")  # 1.2 requires key 1
    with pytest.raises(ConfigError, match=r"draft_len_schedule\[1\] = 3 must equal max_draft_len = 4"):
        validate_schedule({1: 3, 8: 2}, 4, "1.2")
    with pytest.raises(ConfigError, match="exceeds max_draft_len"):
        validate_schedule({1: 4, 8: 5}, 4, "1.3")
    with pytest.raises(ConfigError, match="key 0"):
        validate_schedule({0: 4}, 4, "1.3")
    # Lookup semantics: 1.3 keys are upper bounds (0 above the last), 1.2 keys lower bounds.
    assert [lookup({4: 4, 8: 2}, b, "1.3") for b in (1, 4, 5, 8, 9)] == [4, 4, 2, 2, 0]
    assert [lookup({1: 4, 4: 2}, b, "1.2") for b in (1, 3, 4, 100)] == [4, 4, 2, 2]
    assert cuda_graph_batch_sizes(24, {5: 3, 24: 1, 40: 1}) == [1, 2, 4, 5, 8, 16, 24]
