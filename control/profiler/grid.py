"""The sweep grid of the profiler: batch sizes x context lengths x draft lengths, per device."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from control.errors import ConfigError


@dataclass(frozen=True)
class Grid:
    """Target passes run B requests x (k + 1) tokens at context ctx for every (B, ctx, k); draft
    passes run B requests x 1 token at context ctx for every (B, ctx)."""

    batches: tuple[int, ...]
    ctxs: tuple[int, ...]
    ks: tuple[int, ...]
    warmup: int = 2
    repeats: int = 5
    kv_budget_gb: float | None = None  # per model; points whose KV cache would not fit are skipped

    def __post_init__(self) -> None:
        for name in ("batches", "ctxs"):
            vals = getattr(self, name)
            if not vals or any(v < 1 for v in vals):
                raise ConfigError(f"profile grid: {name} = {list(vals)} must be a non-empty list of integers >= 1")
        if not self.ks or any(k < 0 for k in self.ks):
            raise ConfigError(f"profile grid: k = {list(self.ks)} must be a non-empty list of integers >= 0")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError(f"profile grid: repeats {self.repeats} must be >= 1 and warmup {self.warmup} >= 0")

    @property
    def max_k(self) -> int:
        return max(self.ks)

    @property
    def typical_ctx(self) -> int:
        s = sorted(self.ctxs)
        return s[(len(s) - 1) // 2]

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("batches", "ctxs", "ks"):
            d[k] = list(d[k])
        if d["kv_budget_gb"] is None:
            d.pop("kv_budget_gb")
        return d

    def with_overrides(self, **kw) -> Grid:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


# A 2-core CPU: small batches, contexts up to 1k, k up to 7.
CPU_GRID = Grid(batches=(1, 2, 4, 8, 16), ctxs=(32, 128, 512, 1024), ks=(0, 1, 2, 4, 7), warmup=2, repeats=7)
# A GPU: batches up to 64, contexts up to 8k; each model's KV cache capped at 24 GB.
GPU_GRID = Grid(batches=(1, 2, 4, 8, 16, 32, 64), ctxs=(128, 512, 2048, 8192), ks=(0, 1, 3, 5, 7), warmup=3,
                repeats=7, kv_budget_gb=24.0)


def parse_int_list(text: str, what: str, minimum: int) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); a bad item names itself and the rule."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{what} {text!r}: expected a comma-separated list of integers >= {minimum}")
    out = []
    for t in items:
        try:
            v = int(t)
        except ValueError:
            raise ConfigError(f"{what} {text!r}: {t!r} is not an integer (expected integers >= {minimum}, e.g. 1,2,4)") from None
        if v < minimum:
            raise ConfigError(f"{what} {text!r}: {v} is below {minimum}")
        out.append(v)
    return tuple(sorted(set(out)))
