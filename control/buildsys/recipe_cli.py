"""``specctl build --recipe R [--backend pytorch|tensorrt] --out DIR [--dry-run]``.

Validates the recipe, checks the memory fit (printing its numbers, refusing what does not fit),
resolves the profile (measured if one exists, roofline otherwise), compiles the plan and the
engine-native schedule, and writes everything a GPU host needs into ``--out``. ``--dry-run`` writes
and prints it without running anything; without it, the build steps run here, which needs
TensorRT-LLM and a GPU: otherwise a clear error and nothing is written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from control.errors import ConfigError, MissingDependencyError
from control.executors.trtllm.version import PINNED, SUPPORTED


def register_recipe_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recipe builds (GPU SKUs, TensorRT-LLM)")
    g.add_argument("--recipe", help="build recipe YAML (build/recipes/<sku>-<pair>.yaml)")
    g.add_argument("--backend", choices=("pytorch", "tensorrt", "reference"),
                   help="pytorch: LLM API config (default on GPU SKUs); tensorrt: TensorRT engines (TensorRT-LLM 1.2.x); "
                        "reference: the cpu pair")
    g.add_argument("--trtllm-version", choices=tuple(SUPPORTED), default=PINNED,
                   help=f"TensorRT-LLM release the output targets and records (default: {PINNED}, the pinned release)")
    g.add_argument("--profile", help="profile YAML to compile the plan from (default: measured under "
                                     "profiles/<sku>/, roofline otherwise)")
    g.add_argument("--profiles-dir", help="where measured profiles live (default: the repository's profiles/)")
    g.add_argument("--out", help="output directory")
    g.add_argument("--dry-run", action="store_true", help="write and print everything, run nothing")
    g.add_argument("--force", action="store_true", help="replace a non-empty --out")
    g.add_argument("--trtllm-root", default=os.environ.get("TRTLLM_ROOT"),
                   help="TensorRT-LLM checkout whose examples/ the build steps run (default: $TRTLLM_ROOT)")


def _generate(args: argparse.Namespace):
    from control.buildsys.memfit import require_fit
    from control.buildsys.profiles import resolve_profile
    from control.buildsys.recipe import load_recipe
    from control.executors.trtllm.version import line_of

    recipe = load_recipe(args.recipe)
    backend = args.backend or ("reference" if recipe.is_cpu else "pytorch")
    recipe.check_backend(backend)
    if recipe.is_cpu:
        return recipe, backend, None, None, _cpu_artifacts(recipe, args)
    version = args.trtllm_version
    line = line_of(version)
    if backend == "tensorrt" and line != "1.2":
        raise ConfigError(f"--backend tensorrt needs TensorRT-LLM 1.2.x (trtllm-build and the Triton C++ backend were "
                          f"removed in 1.3); got --trtllm-version {version}")
    fit = require_fit(recipe, backend)
    resolved = resolve_profile(recipe, args.profiles_dir, args.profile)
    if backend == "pytorch":
        from control.buildsys.llmapi_config import pytorch_artifacts

        art = pytorch_artifacts(recipe, resolved, line, fit, version=version)
    else:
        from control.buildsys.engine_config import tensorrt_artifacts

        art = tensorrt_artifacts(recipe, resolved, fit, version=version)
    return recipe, backend, version, (fit, resolved), art


def _cpu_artifacts(recipe, args):
    from control.buildsys.artifacts import BuildArtifacts, Step

    art = BuildArtifacts()
    argv = ["specctl", "build", "--sku", "cpu", "--out", "$OUT"] + (["--quick"] if recipe.quick else [])
    art.steps.append(Step("train and save the CPU reference pair (DESIGN.md section 8)", argv))
    art.steps.append(Step("profile it on this machine", ["specctl", "profile", "--engines", "$OUT", "--out",
                                                         f"profiles/cpu/{recipe.pair}.yaml"]))
    art.add("build.sh", art.script(f"cpu/{recipe.pair}: the reference pair"))
    art.notes.append("the cpu sku runs the reference executor: no TensorRT-LLM, no memory fit (the pair is sized by its build)")
    return art


def run_recipe(args: argparse.Namespace) -> int:
    if not args.recipe:
        raise ConfigError("--recipe FILE is required for this build (see build/recipes/)")
    if not args.out:
        raise ConfigError("--out DIR is required: where the configs, commands and Triton repository go")
    recipe, backend, version, extra, art = _generate(args)
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    head = f"specctl build: {recipe.sku}/{recipe.pair} ({recipe.method.value}), backend {backend}"
    con.print(f"[bold]{head}[/bold]" + (f", TensorRT-LLM {version}" if version else ""))
    if extra is not None:
        fit, resolved = extra
        for row in fit.lines():
            con.print(row)
        con.print(f"plan compiled from the {resolved.describe()}")
    for n in art.notes:
        con.print(f"note: {n}")
    if args.dry_run:
        out = _write(art, args)
        con.print(f"\nwrote {len(art.files)} files to {out} (dry run: nothing executed):")
        for rel in sorted(art.files):
            con.print(f"  {rel}")
        for rel in ("llm_api_options.yaml", "build.sh"):
            if rel in art.files:
                con.rule(rel)
                con.print(art.files[rel], markup=False)
        return 0
    if recipe.is_cpu:
        raise ConfigError("the cpu sku is built by `specctl build --sku cpu --out DIR`; use --dry-run to see the steps")
    _require_gpu_toolchain(backend, args)
    return _execute(art, args, con)


def _write(art, args) -> Path:
    from control.buildsys.artifacts import write_atomically

    return write_atomically(art, args.out, overwrite=args.force)


def _require_gpu_toolchain(backend: str, args) -> None:
    from control.executors.trtllm import require_tensorrt_llm

    require_tensorrt_llm("specctl build without --dry-run")
    if shutil.which("nvidia-smi") is None:
        raise MissingDependencyError("specctl build without --dry-run needs an NVIDIA GPU (nvidia-smi not found); "
                                     "use --dry-run here and run build.sh on the GPU host")
    if backend == "tensorrt" and shutil.which("trtllm-build") is None:
        raise MissingDependencyError("trtllm-build is not on PATH: TensorRT engines need TensorRT-LLM 1.2.x")
    if not args.trtllm_root or not (Path(args.trtllm_root) / "examples").is_dir():
        raise MissingDependencyError("pass --trtllm-root (or set TRTLLM_ROOT) to a TensorRT-LLM checkout: the build "
                                     "steps run its examples/ scripts")


def _execute(art, args, con) -> int:
    """Stage the outputs, run build.sh there with progress, move into place only on success."""
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise ConfigError(f"output directory '{out}' is not empty; choose another --out or pass --force")
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.build.", dir=out.parent if out.parent.exists() else None))
    try:
        from control.buildsys.artifacts import write_atomically

        write_atomically(art, stage, overwrite=True)
        env = {**os.environ, "OUT": str(stage)}
        with con.status("running build.sh (conversion, engine builds)..."):
            proc = subprocess.run(["bash", str(stage / "build.sh")], cwd=args.trtllm_root, env=env)
        if proc.returncode != 0:
            raise ConfigError(f"build.sh failed with exit code {proc.returncode}; nothing was written to '{out}'")
        if out.exists():
            shutil.rmtree(out)
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    con.print(f"built into {out}")
    return 0
