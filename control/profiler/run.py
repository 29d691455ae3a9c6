"""Profile an executor's models: sweep, fit T_fwd = a*N_ctx + b*N_batched + c per model, write the
profile (``specctl.profile/v1``, ``source: measured``) with its environment.

- ``profile_engine_dir``: the models of an engine directory (the CPU pair, or checkpoints).
- ``profile_shapes``: random-weight models of catalog shapes (a GPU host profiles an 8B target with
  1B and 160M drafts in one command).

The few-second calibration that ``specctl serve`` runs for an engine with no committed profile is
``control.executors.reference.calibrate.quick_profile``.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from control.buildsys.catalog import SKUS
from control.buildsys.cpu.progress import Reporter, SilentReporter
from control.goodput.cost import fit_draft_cost, fit_linear_cost, fit_target_cost
from control.profile import PROFILE_SCHEMA, CostCoeffs, Profile, parse_profile
from control.profiler.grid import CPU_GRID, GPU_GRID, Grid
from control.profiler.models import ProfiledModel, default_dtype, engine_models, resolve_device, shape_models
from control.profiler.timing import Point, sweep_draft_steps, sweep_model, time_ngram


@dataclass
class ProfileResult:
    profile: Profile
    points: list[Point] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)


def sku_from_device_name(name: str) -> str:
    """The catalog SKU a GPU's name mentions (longest first: L40S before L4), else ``cuda``."""
    words = name.lower().replace("-", " ").split()
    for sku in sorted(SKUS, key=len, reverse=True):
        if any(w == sku or w.startswith(sku) and not w[len(sku):].isalnum() for w in words):
            return sku
    return "cuda"


def detect_sku(device: torch.device) -> str:
    return sku_from_device_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu"


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    from control import __version__
    from control.buildsys.cpu.pair import cpu_model_name

    env = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model_name(),
        "cpu": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "specctl": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
    if os.environ.get("OMP_WAIT_POLICY"):
        env["omp_wait_policy"] = os.environ["OMP_WAIT_POLICY"]
    with contextlib.suppress(OSError):
        env["loadavg_1m_start"] = round(os.getloadavg()[0], 2)
    return env


def sweep_and_fit(models: list[ProfiledModel], grid: Grid, reporter: Reporter):
    points: list[Point] = []
    coeffs: dict[str, CostCoeffs] = {}
    for m in models:
        if m.role == "target":
            pts = sweep_model(m.key, m.model, grid, tuple(sorted({k + 1 for k in grid.ks})), reporter)
        else:  # a draft's passes as the engine runs them, its host work per pass included
            pts = sweep_draft_steps(m.key, m.model, grid, reporter)
        if len(pts) < 3:
            from control.errors import ConfigError

            raise ConfigError(f"model '{m.key}': only {len(pts)} grid point(s) fit its positions/KV budget; "
                              "widen --batch/--ctx or raise --kv-budget-gb")
        # a target's passes vary the tokens per request (k + 1), and a draft's catch-up steps those of
        # their first pass, so a per-request term (per request and pass) can be told apart from a
        # per-token one
        args = ([p.n_ctx for p in pts], [p.n_batched for p in pts], [p.ms for p in pts])
        if len({p.tokens for p in pts}) < 2:
            fit = fit_linear_cost(*args, passes=[p.passes for p in pts])
        elif m.role == "target":
            fit = fit_target_cost(*args, requests=[p.batch for p in pts])
        else:
            fit = fit_draft_cost(*args, passes=[p.passes for p in pts], request_passes=[p.batch * p.passes for p in pts])
        coeffs[m.key] = CostCoeffs.from_cost(fit)
        points += pts
    return coeffs, points


def _assemble(sku: str, pair: str, coeffs: dict[str, CostCoeffs], models: list[ProfiledModel], ngram_ms: float,
              acceptance: dict[str, float], grid: Grid, env: dict, max_ctx: int, kv_tokens: int | None,
              n_points: int) -> Profile:
    drafters = [{"name": m.key, "kind": "draft_model", "model": m.key} for m in models if m.role == "draft"]
    drafters.append({"name": "ngram", "kind": "ngram", "cost_ms": round(ngram_ms, 5), "confidences": False})
    with contextlib.suppress(OSError):
        env["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    limits = {"max_batch": max(grid.batches), "max_ctx": max_ctx}
    if kv_tokens:
        limits["kv_tokens"] = kv_tokens
    doc = {
        "schema": PROFILE_SCHEMA,
        "sku": sku,
        "pair": pair,
        "source": "measured",
        "environment": env,
        "models": {k: c.model_dump() for k, c in coeffs.items()},
        "drafters": drafters,
        "acceptance": {k: min(max(v, 0.0), 0.99) for k, v in acceptance.items()},
        "limits": limits,
        "grid": {**grid.to_dict(), "typical_ctx": grid.typical_ctx, "points": n_points,
                 "params": {m.key: m.params for m in models}},
    }
    return parse_profile(doc, where=f"profile {sku}/{pair}")


def profile_engine_dir(engine_dir: str | Path, device: str = "cpu", grid: Grid | None = None,
                       reporter: Reporter | None = None, sku: str | None = None) -> ProfileResult:
    reporter = reporter or SilentReporter()
    dev = resolve_device(device)
    dtype = default_dtype(dev)
    manifest, models = engine_models(engine_dir, dev, dtype)
    grid = grid or (GPU_GRID if dev.type == "cuda" else CPU_GRID)
    env = environment(dev, dtype)
    env["engine_dir"] = Path(engine_dir).name
    env["engine_hashes"] = getattr(manifest, "hashes", None) or {}
    coeffs, points = sweep_and_fit(models, grid, reporter)
    ngram_ms = time_ngram(grid.ctxs, models[0].model.config.vocab_size)
    acc = {d.name: d.acceptance for d in manifest.drafters if d.acceptance is not None}
    pair = getattr(manifest, "name", None) or "+".join(m.source for m in models)
    target_cfg = models[0].model.config
    prof = _assemble(sku or detect_sku(dev), pair, coeffs, models, ngram_ms, acc, grid, env,
                     target_cfg.max_position_embeddings, None, len(points))
    return ProfileResult(prof, points, {m.key: m.params for m in models})


def profile_shapes(target: str, drafts: tuple[str, ...] | None, device: str = "cuda", grid: Grid | None = None,
                   reporter: Reporter | None = None, sku: str | None = None) -> ProfileResult:
    """Random-weight models of catalog shapes; timing only (no acceptance in the profile)."""
    reporter = reporter or SilentReporter()
    dev = resolve_device(device)
    dtype = default_dtype(dev)
    grid = grid or (GPU_GRID if dev.type == "cuda" else CPU_GRID)
    reporter.phase("allocate random weights", None)
    models = shape_models(target, drafts, dev, dtype)
    env = environment(dev, dtype)
    env["weights"] = "random (timing only)"
    coeffs, points = sweep_and_fit(models, grid, reporter)
    ngram_ms = time_ngram(grid.ctxs, models[0].model.config.vocab_size)
    from control.profiler.timing import kv_bytes_per_token

    kv_tokens = None
    if grid.kv_budget_gb is not None:
        kv_tokens = int(grid.kv_budget_gb * 2**30 / kv_bytes_per_token(models[0].model))
    pair = "+".join(m.source for m in models)
    prof = _assemble(sku or detect_sku(dev), pair, coeffs, models, ngram_ms, {}, grid, env,
                     models[0].model.config.max_position_embeddings, kv_tokens, len(points))
    return ProfileResult(prof, points, {m.key: m.params for m in models})
