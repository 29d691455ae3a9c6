"""The TensorRT-LLM contract (control/executors/trtllm/contract/trtllm-<version>.json) against our code, the
stand-in, and the script that re-derives it from a source tree."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import yaml

from control.executors.trtllm.drafter_hook import drafter_init_kwargs
from control.executors.trtllm.llmapi import DECODING_CLASSES, NESTED_CLASSES, sampling_kwargs
from control.executors.trtllm.version import PINNED, SUPPORTED, load_contract
from control.triton.llmapi_host import SINGLE_PROCESS_ENV
from tests.executors.trtllm.llmapi.deploy import ROOT, STANDIN

GOLDEN = ROOT / "tests" / "buildsys" / "golden"
PKG = STANDIN / "tensorrt_llm"
# Contract class -> where the stand-in mimics it (file under the stand-in package, class there).
STANDIN_CLASSES = {
    "Drafter": ("_torch/speculative/drafter.py", "Drafter"), "LlmRequest": ("_standin.py", "_GenRequest"),
    "SamplingParams": ("_standin.py", "SamplingParams"), "GenerationResultBase": ("_standin.py", "RequestOutput"),
    "GenerationResult": ("_standin.py", "RequestOutput"), "CompletionOutput": ("_standin.py", "CompletionOutput"),
    "LLM": ("_standin.py", "LLM"),
    **{c: ("_configs.py", c) for c in ("DecodingBaseConfig", "NGramDecodingConfig", "DraftTargetDecodingConfig",
                                        "Eagle3DecodingConfig", "MTPDecodingConfig", "UserProvidedDecodingConfig",
                                        "KvCacheConfig", "CudaGraphConfig")},
}


def _script():
    spec = importlib.util.spec_from_file_location("derive_trtllm_contract", ROOT / "scripts" / "derive_trtllm_contract.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entries(version: str = PINNED) -> dict[str, dict]:
    return {e["id"]: e for e in load_contract(version)["names"]}


def test_every_pinned_release_has_a_contract_naming_its_sources():
    for version in SUPPORTED:
        doc = load_contract(version)
        assert doc["version"] == version and doc["source"]["ref"] == f"v{version}"
        for e in doc["names"]:
            assert e["file"].startswith(("tensorrt_llm/", "cpp/")) and e["checked"] and e["module"], e["id"]
            assert all((ROOT / f).is_file() for f in e["used_by"]), e["id"]
            assert {"class", "strings"} & set(e), f"{e['id']}: nothing to check in the source"


def test_our_code_uses_only_contract_names():
    c = _entries()
    assert set(drafter_init_kwargs(4)) <= set(c["Drafter"]["init"])
    hook = (ROOT / "control/executors/trtllm/drafter_hook.py").read_text()
    read = set(re.findall(r"\br\.(py_\w+|get_tokens)", hook)) | set(re.findall(r'"(py_\w+)"', hook))
    assert read and read <= set(c["LlmRequest"]["attributes"]) | set(c["LlmRequest"]["methods"])
    kw = sampling_kwargs(5, temperature=0.7, top_k=3, top_p=0.9, seed=1, end_id=2, stop_token_ids=[4], stop=["a"],
                         bad=["b"], ignore_eos=True)
    assert set(kw) <= set(c["SamplingParams"]["fields"])
    for cls in (*DECODING_CLASSES.values(), *NESTED_CLASSES.values(), "UserProvidedDecodingConfig"):
        assert c[cls]["module"] == "tensorrt_llm.llmapi"
    llmapi = (ROOT / "control/executors/trtllm/llmapi.py").read_text()
    for name in ("avg_decoded_tokens_per_iter", "decoding_iter"):
        assert f'"{name}"' in llmapi and name in c["GenerationResultBase"]["attributes"]
    for name in ("total_draft_tokens", "total_accepted_draft_tokens"):
        assert f'"{name}"' in llmapi and f'"{name}"' in c["SpeculativeDecodingMetrics"]["strings"]
    assert SINGLE_PROCESS_ENV in c["TLLM_WORKER_USE_SINGLE_PROCESS"]["strings"]


def test_the_standin_llm_takes_only_contract_options():
    known = re.search(r"KNOWN_OPTIONS = (\{.*?\})", (PKG / "_standin.py").read_text(), re.S).group(1)
    assert set(eval(known)) - {"standin_fail_token"} <= set(_entries()["LlmArgs"]["fields"])  # noqa: S307 - our own literal


def _fields(c: dict, cls: str) -> set[str]:
    return set(c[cls].get("fields", [])) | set(c["DecodingBaseConfig"]["fields"] if cls.endswith("DecodingConfig") else [])


@pytest.mark.parametrize("gold", sorted(GOLDEN.glob("*-pytorch")), ids=lambda p: p.name)
def test_generated_options_use_only_contract_fields(gold):
    """Every key specctl build writes into llm_api_options.yaml is a field of the class that reads it."""
    c = _entries()
    opts = yaml.safe_load((gold / "llm_api_options.yaml").read_text())
    assert set(opts) <= set(c["LlmArgs"]["fields"])
    for key, cls in NESTED_CLASSES.items():
        assert set(opts.get(key) or {}) <= _fields(c, cls), key
    sc = dict(opts.get("speculative_config") or {})
    if sc:
        alias = {"speculative_model_dir": "speculative_model"}  # the alias DecodingBaseConfig validates
        keys = {alias.get(k, k) for k in sc}
        assert keys <= _fields(c, DECODING_CLASSES[sc["decoding_type"]]), sorted(keys)


@pytest.mark.parametrize("cid", sorted(STANDIN_CLASSES))
def test_the_standin_carries_every_contract_name(cid):
    mod = _script()
    c = _entries()[cid]
    rel, cls = STANDIN_CLASSES[cid]
    import ast

    found = mod.describe_class(mod._classes(ast.parse((PKG / rel).read_text())), cls)
    assert found is not None
    assert set(c.get("init", [])) <= set(found["init"])
    assert set(c.get("fields", [])) <= set(found["fields"])
    assert set(c.get("attributes", [])) <= set(found["attributes"]) | set(found["fields"])
    for meth, params in c.get("methods", {}).items():
        assert set(params) <= set(found["methods"][meth]), meth


def _tree(tmp: Path) -> Path:
    """A source tree in TensorRT-LLM's layout holding the stand-in's drafter and configs."""
    root = tmp / "src"
    for rel, dst in (("_torch/speculative/drafter.py", "tensorrt_llm/_torch/speculative/drafter.py"),
                     ("_configs.py", "tensorrt_llm/llmapi/llm_args.py")):
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PKG / rel, root / dst)
    return root


def test_the_script_checks_and_rewrites_a_contract_from_a_source_tree(tmp_path, capsys):
    mod = _script()
    root = _tree(tmp_path)
    contract = tmp_path / "trtllm-1.2.1.json"
    shutil.copy(mod.CONTRACT_DIR / "trtllm-1.2.1.json", contract)
    args = ["--root", str(root), "--version", "1.2.1", "--contract", str(contract)]
    assert mod.main([*args, "--check"]) == 1
    missing = capsys.readouterr().out.splitlines()
    assert not [m for m in missing if m.startswith(("missing: Drafter:", "missing: NGramDecodingConfig:"))]
    assert "missing: SamplingParams: tensorrt_llm/sampling_params.py is not under" in "\n".join(missing)
    drafter = root / "tensorrt_llm/_torch/speculative/drafter.py"  # a release that renamed a constructor argument
    drafter.write_text(drafter.read_text().replace("max_total_draft_tokens: int = None", "max_total_tokens: int = None"))
    assert mod.main([*args, "--check"]) == 1
    assert "missing: Drafter: parameter 'max_total_draft_tokens' not in Drafter" in capsys.readouterr().out
    assert mod.main([*args, "--write"]) == 0
    rewritten = {e["id"]: e for e in yaml.safe_load(contract.read_text())["names"]}
    assert "max_total_draft_tokens" not in rewritten["Drafter"]["init"] and "max_draft_len" in rewritten["Drafter"]["init"]
    assert mod.main(["--root", str(root), "--version", "1.3.0", "--contract", str(contract)]) == 2


def test_docs_gpu_lists_every_contract_name():
    doc = (ROOT / "docs" / "gpu.md").read_text()
    start = doc.index("## TensorRT-LLM names the code relies on")
    table = doc[start:doc.index("\n## ", start + 1)]  # up to the next section
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    for e in load_contract(PINNED)["names"]:
        name = e.get("class", e["id"])
        assert any(f".{name}`" in r or f"`{name}`" in r for r in rows if f"`{e['file']}`" in r), e["id"]
    assert all(r.endswith("| no |") for r in rows)  # nothing has run on a GPU yet
