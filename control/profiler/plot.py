"""Measured vs predicted pass times, one panel per model, coloured by batch size (PNG, Agg)."""

from __future__ import annotations

import csv
from pathlib import Path

from control.profile import Profile
from control.profiler.timing import Point


def write_points_csv(points: list[Point], path: str | Path) -> Path:
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch", "ctx", "tokens_per_request", "passes", "n_ctx", "n_batched", "ms_median", "ms_min",
                    "ms_max"])
        for p in points:
            w.writerow([p.model, p.batch, p.ctx, p.tokens, p.passes, p.n_ctx, p.n_batched, f"{p.ms:.6f}",
                        f"{p.ms_min:.6f}", f"{p.ms_max:.6f}"])
    return path


def plot_fit(points: list[Point], profile: Profile, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import NullFormatter

    keys = list(profile.models)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 4.4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        pts = [p for p in points if p.model == key]
        c = profile.models[key].to_cost()
        meas = np.array([p.ms for p in pts])
        pred = np.array([c.predict(p.n_ctx, p.n_batched, p.passes, p.batch * p.passes) for p in pts])  # per request and pass
        batch = np.array([p.batch for p in pts])
        cmap = plt.get_cmap("viridis")
        uniq = sorted(set(batch.tolist()))
        for i, b in enumerate(uniq):
            sel = batch == b
            ax.scatter(pred[sel], meas[sel], s=18, color=cmap(i / max(len(uniq) - 1, 1)), label=f"B={b}")
        lo, hi = min(meas.min(), pred.min()) * 0.9, max(meas.max(), pred.max()) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("predicted ms")
        ax.set_ylabel("measured ms (median)")
        d = f" d={c.d:.3g}" if c.d else ""
        ax.set_title(f"{key}\na={c.a:.2e} b={c.b:.3g} c={c.c:.3g}{d} ms\nR²={c.r2:.3f}  MAPE={c.mape:.1f}%", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    env = profile.environment
    fig.suptitle(f"{profile.sku}/{profile.pair}: T = a·N_ctx + b·N_batched + c  "
                 f"({env.get('device_name', '')}, {env.get('dtype', '')}, torch {env.get('torch', '')})", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
