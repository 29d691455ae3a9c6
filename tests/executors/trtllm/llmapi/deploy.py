"""Render an LLM API deployment the way a user does, and point it at tiny checkpoints.

1. ``specctl build --recipe build/recipes/h100-llama3.1-8b-{draft,ngram}.yaml --backend pytorch
   --dry-run --profile P --out D`` (a GPU recipe: the cpu recipes build the reference pair for
   ``specctl serve`` and have no LLM API path).
2. What ``build.sh``'s first step does: replace ``@OUT@`` with ``D`` in the llm config and the
   options; what docs/gpu.md's serving step does: the llm model's code from ``triton_repo/llm``.
3. The checkpoints the recipe names (downloaded or quantized on a GPU host) are the tiny reference
   checkpoints here: the config's ``model`` and the options' ``speculative_model`` point at them.
4. More models in the same repository (another name, its own options file) so one Triton start
   serves every case; the control-plane URL and token in every llm config.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from control.cli import main
from control.triton.repo import write_token_file
from tests.executors.trtllm.bls.deploy import set_param

ROOT = Path(__file__).resolve().parents[4]
STANDIN = Path(__file__).parent / "standin"  # the stand-in `tensorrt_llm` package lives here
RECIPES = {"draft": ROOT / "build" / "recipes" / "h100-llama3.1-8b-draft.yaml",
           "ngram": ROOT / "build" / "recipes" / "h100-llama3.1-8b-ngram.yaml"}


def render(out: Path, which: str, profile: Path) -> Path:
    rc = main(["build", "--recipe", str(RECIPES[which]), "--backend", "pytorch", "--dry-run",
               "--profile", str(profile), "--out", str(out)])
    if rc != 0:
        raise AssertionError(f"specctl build --recipe {RECIPES[which].name} --backend pytorch exited {rc}")
    for f in (out / "triton_repo" / "llm" / "config.pbtxt", out / "llm_api_options.yaml"):  # build.sh step 1
        f.write_text(f.read_text().replace("@OUT@", str(out)))
    (out / "triton_repo" / "llm" / "1").mkdir(exist_ok=True)
    shutil.copy(ROOT / "triton_repo" / "llm" / "1" / "model.py", out / "triton_repo" / "llm" / "1" / "model.py")
    return out


def add_param(config: str, key: str, value: str) -> str:
    if f'key: "{key}"' in config:
        return set_param(config, key, value)
    return config.rstrip("\n") + f'\nparameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def install_model(repo: Path, deploy: Path, name: str, engines: Path, *, options: dict | None = None,
                  standin: bool = True, **params: str) -> Path:
    """``deploy``'s llm model as ``repo/name`` on the tiny checkpoints, with its own options file.

    ``standin``: put the stand-in ``tensorrt_llm`` package in the model's version directory, which the
    Python backend puts on the model's ``sys.path`` (its stub does not read PYTHONPATH).
    """
    dst = repo / name
    shutil.copytree(deploy / "triton_repo" / "llm", dst)
    if standin:
        shutil.copytree(STANDIN / "tensorrt_llm", dst / "1" / "tensorrt_llm")
    opts = yaml.safe_load((deploy / "llm_api_options.yaml").read_text())
    sc = opts.get("speculative_config") or {}
    for key in ("speculative_model", "speculative_model_dir"):  # 1.3's name, and 1.2's (which 1.2.1 still accepts)
        if key in sc:
            sc[key] = str(engines / "draft")
    opts.update(options or {})
    opts_path = deploy / f"llm_api_options-{name}.yaml"
    opts_path.write_text(yaml.safe_dump(opts, sort_keys=False))
    cfg = (dst / "config.pbtxt").read_text().replace('name: "llm"', f'name: "{name}"')
    cfg = set_param(cfg, "model", str(engines / "target"))
    cfg = set_param(cfg, "llm_api_options", str(opts_path))
    for k, v in params.items():
        cfg = add_param(cfg, k, v)
    (dst / "config.pbtxt").write_text(cfg)
    return dst


def build_repository(work: Path, engines: Path, profile: Path, control_url: str, token: str,
                     fail_token: int) -> Path:
    """Models: ``llm`` (draft-target: TensorRT-LLM's draft model on the compiled schedule, per-request
    metrics to the agent) and ``llm_ngram`` (n-gram through the drafter hook, the agent deciding k
    every iteration). Both follow and report to the control plane at ``control_url``."""
    repo = work / "repo"
    repo.mkdir()
    common = {"control_url": control_url, "control_token_file": str(write_token_file(work / "control-token", token))}
    draft = render(work / "deploy-draft", "draft", profile)
    install_model(repo, draft, "llm", engines, options={"standin_fail_token": fail_token}, **common)
    ngram = render(work / "deploy-ngram", "ngram", profile)
    install_model(repo, ngram, "llm_ngram", engines, **common)
    return repo
