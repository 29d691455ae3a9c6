"""What a GPU host runs to start Triton for a ``--backend tensorrt`` build (issue 18 item 5): TP > 1
with target + draft needs upstream's ``launch_triton_server.py --multi-model`` (orchestrator mode,
world size 1) and ``gpu_device_ids`` in each engine model's config; TP > 1 with one engine needs
``--world_size tp``; TP = 1 a plain ``tritonserver``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from control.buildsys.recipe import load_recipe
from control.buildsys.triton_launch import ADMIN_APIS, ADMIN_HEADER, SCRIPT, triton_launch
from control.buildsys.trtllm_rules import BACKEND_METHODS, Method
from control.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENGINE_RECIPES = [p for p in sorted((ROOT / "build" / "recipes").glob("*.yaml"))
                  if not load_recipe(p).is_cpu and load_recipe(p).method in BACKEND_METHODS["tensorrt"]]


def test_launch_modes():
    plain = triton_launch(1, True).argv("R")
    assert plain[:3] == ["tritonserver", "--model-repository=R", "--exit-on-error=true"]
    # Triton's administration behind the key, as `specctl serve` starts it (tests/e2e/test_admin_apis.py)
    assert plain[3:] == [f'--grpc-restricted-protocol={ADMIN_APIS}:{ADMIN_HEADER}="$ADMIN_KEY"',
                         f'--http-restricted-api={ADMIN_APIS}:{ADMIN_HEADER}="$ADMIN_KEY"']
    mpi = triton_launch(4, False)
    assert mpi.argv("R") == ["python3", SCRIPT, "--model_repo=R", "--world_size=4"] and not mpi.gpu_device_ids
    multi = triton_launch(2, True)
    # upstream asserts world_size 1 with --multi-model (it spawns each model's workers itself)
    assert multi.argv("R") == ["python3", SCRIPT, "--model_repo=R", "--world_size=1", "--multi-model"]
    assert multi.gpu_device_ids == {"tensorrt_llm": "0,1", "tensorrt_llm_draft": "0"}


def _gpu_ids(config: str) -> str | None:
    m = re.search(r'key: "gpu_device_ids"\s*value: \{\s*string_value: "([^"]*)"', config)
    return None if m is None else m.group(1)


@pytest.mark.parametrize("path", ENGINE_RECIPES, ids=lambda p: p.stem)
def test_every_engine_build_says_how_to_start_triton(tmp_path, capsys, path):
    recipe = load_recipe(path)
    out = tmp_path / "out"
    assert main(["build", "--recipe", str(path), "--backend", "tensorrt", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    two = recipe.method == Method.draft_target
    launch = yaml.safe_load((out / "specctl.yaml").read_text())["launch"]
    serve = (out / "serve.sh").read_text()
    target = (out / "triton_repo/tensorrt_llm/config.pbtxt").read_text()
    draft = out / "triton_repo/tensorrt_llm_draft/config.pbtxt"
    if recipe.tp == 1:
        assert launch["mode"] == "tritonserver" and 'tritonserver --model-repository="$OUT/triton_repo"' in serve
        assert 'ADMIN_KEY="${SPECCTL_TRITON_ADMIN_KEY:-' in serve and "umask 077" in serve
        assert _gpu_ids(target) is None
        return
    assert f"tp = {recipe.tp}: start Triton with serve.sh" in printed
    if not two:
        assert launch == {"mode": "mpi", "world_size": recipe.tp, "gpu_device_ids": {},
                          "command": f"python3 {SCRIPT} --model_repo=$OUT/triton_repo --world_size={recipe.tp}"}
        assert _gpu_ids(target) is None
        return
    assert launch["mode"] == "multi-model" and launch["world_size"] == 1
    assert f"{SCRIPT} --model_repo=\"$OUT/triton_repo\" --world_size=1 --multi-model" in serve
    assert _gpu_ids(target) == ",".join(str(g) for g in range(recipe.tp))  # every GPU of the target's TP group
    assert _gpu_ids(draft.read_text()) == "0"  # the tp = 1 draft beside the target's first shard, as memfit counts it


def test_tp_above_one_is_shipped_with_a_draft():
    """The recipes this guards: 70B draft-target at tp 2..8 on engines."""
    multi = [p.stem for p in ENGINE_RECIPES if load_recipe(p).tp > 1 and load_recipe(p).method == Method.draft_target]
    assert {"h100-llama3.1-70b-draft", "l4-llama3.1-70b-draft"} <= set(multi)
