"""Render a TensorRT-engine deployment the way a user does and put the stand-ins where the engines go.

1. ``specctl build --recipe build/recipes/h100-llama3.1-8b-{draft,ngram}.yaml --backend tensorrt
   --dry-run --profile P --out D`` (the cpu recipes build the reference pair for the ``llm`` model and
   have no TensorRT path, so the repository comes from a GPU recipe; ``--profile`` is what a user
   without a measured profile passes).
2. What ``build.sh``'s last step does: replace ``@OUT@`` with ``D`` in the model configs and the plan.
3. The engines ``build.sh`` would build go to ``D/engines/{target,draft}``: here the tiny reference
   checkpoints, and ``tensorrt_llm`` / ``tensorrt_llm_draft`` run ``standin/model.py`` on the
   Python backend with their rendered configs otherwise unchanged.
4. Extra copies of the rendered ``specctl_bls`` under other names, each with its own plan (a
   different policy) or ``max_batch``, so one Triton start serves every case.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from control.cli import main
from control.plan import parse_plan

ROOT = Path(__file__).resolve().parents[4]
STANDIN = Path(__file__).parent / "standin" / "model.py"
RECIPES = {"draft": ROOT / "build" / "recipes" / "h100-llama3.1-8b-draft.yaml",
           "ngram": ROOT / "build" / "recipes" / "h100-llama3.1-8b-ngram.yaml"}


def set_param(config: str, key: str, value: str) -> str:
    """Set a ``parameters`` entry's string_value in a config.pbtxt."""
    pat = re.compile(r'(key: "' + re.escape(key) + r'"\s*value: \{\s*string_value: ")[^"]*(")')
    new, n = pat.subn(lambda m: m.group(1) + value + m.group(2), config)
    if n != 1:
        raise AssertionError(f"config has {n} parameters named {key!r}")
    return new


def render(out: Path, which: str, profile: Path) -> Path:
    rc = main(["build", "--recipe", str(RECIPES[which]), "--backend", "tensorrt", "--dry-run",
               "--profile", str(profile), "--out", str(out)])
    if rc != 0:
        raise AssertionError(f"specctl build --recipe {RECIPES[which].name} exited {rc}")
    for f in [*out.glob("triton_repo/*/config.pbtxt"), out / "plan.yaml"]:  # build.sh's sed step
        f.write_text(f.read_text().replace("@OUT@", str(out)))
    return out


def add_param(config: str, key: str, value: str) -> str:
    """Append a ``parameters`` entry to a config.pbtxt."""
    return config.rstrip("\n") + f'\nparameters: {{\n  key: "{key}"\n  value: {{\n    string_value: "{value}"\n  }}\n}}\n'


def full_verify_target(repo: Path, name: str) -> Path:
    """A copy of the stand-in ``tensorrt_llm`` under ``name`` that answers a verify with all k + 1
    tokens it was asked for (``standin_verify_output: all``), as an engine decoding on to
    ``request_output_len`` does."""
    dst = repo / name
    shutil.copytree(repo / "tensorrt_llm", dst)
    cfg = (dst / "config.pbtxt").read_text().replace('name: "tensorrt_llm"', f'name: "{name}"')
    (dst / "config.pbtxt").write_text(add_param(cfg, "standin_verify_output", "all"))
    return dst


def plan_variant(src: Path, dst: Path, policy: str) -> Path:
    doc = yaml.safe_load(src.read_text())
    doc["policy"] = policy
    doc["version"] = int(doc["version"]) + 1
    parse_plan(doc, where=str(dst))  # validate before a Triton model trips over it
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


def bls_variant(repo: Path, src_name: str, name: str, **params: str) -> Path:
    src = repo / src_name
    dst = repo / name
    shutil.copytree(src, dst)
    cfg = (dst / "config.pbtxt").read_text().replace(f'name: "{src_name}"', f'name: "{name}"')
    for k, v in params.items():
        cfg = set_param(cfg, k, v)
    (dst / "config.pbtxt").write_text(cfg)
    return dst


def install_standins(deploy: Path, engines: Path) -> None:
    """Engines where build.sh puts them; the tensorrtllm models on the Python backend."""
    for sub in ("target", "draft"):
        shutil.copytree(engines / sub, deploy / "engines" / sub)
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        d = deploy / "triton_repo" / model
        if not d.is_dir():
            continue
        cfg = (d / "config.pbtxt").read_text()
        if 'backend: "tensorrtllm"' not in cfg:
            raise AssertionError(f"{d}/config.pbtxt is not a tensorrtllm model config")
        (d / "config.pbtxt").write_text(cfg.replace('backend: "tensorrtllm"', 'backend: "python"'))
        shutil.copy(STANDIN, d / "1" / "model.py")


def build_repository(work: Path, engines: Path, profile: Path) -> Path:
    """The model repository every test in this area talks to; returns its path.

    Models: ``tensorrt_llm``, ``tensorrt_llm_draft`` (stand-ins), ``specctl_bls`` (as rendered: the
    plan's adaptive policy, drafting with the draft model), ``specctl_bls_fixed`` (``fixed:3``,
    ``max_batch`` 2), ``specctl_bls_static`` (``static-schedule:1=4,2=1``), ``specctl_bls_ngram``
    (rendered from the n-gram recipe: prompt lookup, no draft model) and ``specctl_bls_all``
    (``fixed:3`` over ``tensorrt_llm_all``, a target that answers every verify with k + 1 tokens).
    """
    main_dir = render(work / "deploy", "draft", profile)
    install_standins(main_dir, engines)
    repo = main_dir / "triton_repo"
    plan = main_dir / "plan.yaml"
    bls_variant(repo, "specctl_bls", "specctl_bls_fixed", max_batch="2",
                plan=str(plan_variant(plan, main_dir / "plan-fixed3.yaml", "fixed:3")))
    bls_variant(repo, "specctl_bls", "specctl_bls_static",
                plan=str(plan_variant(plan, main_dir / "plan-static.yaml", "static-schedule:1=4,2=1")))
    full_verify_target(repo, "tensorrt_llm_all")
    bls_variant(repo, "specctl_bls", "specctl_bls_all", tensorrt_llm_model_name="tensorrt_llm_all",
                plan=str(main_dir / "plan-fixed3.yaml"))
    ngram_dir = render(work / "deploy-ngram", "ngram", profile)
    shutil.copytree(ngram_dir / "triton_repo" / "specctl_bls", repo / "specctl_bls_ngram")
    cfg = repo / "specctl_bls_ngram" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "specctl_bls"', 'name: "specctl_bls_ngram"'))
    return repo
