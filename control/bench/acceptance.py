"""Acceptance parameters per workload family, drafter and category (``data/acceptance.yaml``).

The table says, for a workload family (chat, code) and a drafter (by model name, else by kind),
the Beta distribution of per-request acceptance rates, the per-position decay, and where each
number comes from. Spec-Bench categories shift a drafter's rate by the category's logit offset,
derived from the Spec-Bench leaderboard (see the YAML for the derivation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import brentq

from control.errors import ConfigError
from control.goodput.acceptance import MAX_RATE

TABLE_PATH = Path(__file__).with_name("data") / "acceptance.yaml"
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True, slots=True)
class RateParams:
    """Per-request rate ~ Beta(mean * concentration, (1 - mean) * concentration); decay per position."""

    mean: float
    concentration: float
    decay: float
    source: str

    def __post_init__(self) -> None:
        if not (0.0 < self.mean < 1.0):
            raise ConfigError(f"acceptance mean {self.mean!r} must be in (0, 1)")
        if not (self.concentration > 0 and math.isfinite(self.concentration)):
            raise ConfigError(f"acceptance concentration {self.concentration!r} must be > 0")
        if not (0.0 < self.decay <= 1.0):
            raise ConfigError(f"acceptance decay {self.decay!r} must be in (0, 1]")

    def with_mean(self, mean: float, source: str) -> RateParams:
        return RateParams(float(np.clip(mean, 0.01, 0.99)), self.concentration, self.decay, source)


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def rate_from_tau(tau: float, k: int) -> float:
    """The per-token rate a with (1 - a^(k+1)) / (1 - a) = tau (expected generated tokens at draft length k)."""
    if not (1.0 < tau < k + 1):
        raise ConfigError(f"mean accepted length {tau!r} must be in (1, {k + 1}) for k = {k}")
    return float(brentq(lambda a: (1 - a ** (k + 1)) / (1 - a) - tau, 1e-9, 1 - 1e-9))


class AcceptanceTable:
    def __init__(self, doc: dict, where: str = "acceptance table") -> None:
        if not isinstance(doc, dict) or doc.get("schema") != "specctl.acceptance/v1":
            raise ConfigError(f"{where}: expected schema: specctl.acceptance/v1")
        self.where = where
        self.families: dict[str, dict[str, RateParams]] = {}
        fams = doc.get("families") or {}
        for name, fam in fams.items():
            base = dict(self.families.get(fam.get("inherit"), {})) if fam.get("inherit") else {}
            for d, p in (fam.get("drafters") or {}).items():
                try:
                    base[d] = RateParams(float(p["mean"]), float(p["concentration"]), float(p.get("decay", 1.0)),
                                         str(p.get("source", "")))
                except (KeyError, TypeError, ValueError) as e:
                    raise ConfigError(f"{where}: families.{name}.drafters.{d}: {e}") from None
            self.families[name] = base
        self.spec_bench = doc.get("spec_bench") or {}

    @classmethod
    @lru_cache(maxsize=4)
    def load(cls, path: str | None = None) -> AcceptanceTable:
        p = Path(path) if path else TABLE_PATH
        if not p.is_file():
            raise ConfigError(f"acceptance table '{p}' does not exist")
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"acceptance table '{p}' is not valid YAML: {e}") from None
        return cls(doc, where=f"acceptance table '{p}'")

    def params(self, family: str, drafter: str, kind: str) -> RateParams:
        if family not in self.families:
            raise ConfigError(f"unknown workload family '{family}' in {self.where}; known: {', '.join(self.families)}")
        fam = self.families[family]
        if drafter in fam:
            return fam[drafter]
        if kind in fam:
            return fam[kind]
        raise ConfigError(f"{self.where}: family '{family}' has no entry for drafter '{drafter}' or kind '{kind}'")

    def category_shift(self, kind: str, category: str) -> tuple[float, str]:
        """Logit shift of a Spec-Bench category relative to the drafter's overall rate, and its source."""
        sb = self.spec_bench
        group = sb.get("ngram" if kind == "ngram" else "draft_model")
        if not group or category not in group.get("speedup", {}):
            return 0.0, "no category data"
        k = int(sb.get("k_assumed", 5))
        ov = group["overall"]
        tau_cat = ov["tau"] * group["speedup"][category] / ov["speedup"]
        a_cat = rate_from_tau(min(tau_cat, k + 0.99), k)
        a_all = rate_from_tau(ov["tau"], k)
        return _logit(a_cat) - _logit(a_all), (
            f"Spec-Bench leaderboard (A100, Vicuna-7B): {category} speedup {group['speedup'][category]} vs overall "
            f"{ov['speedup']} at tau {ov['tau']} -> rate {a_cat:.3f} vs {a_all:.3f} at k = {k}")


@dataclass(frozen=True)
class RequestRates:
    """What the simulator's acceptance processes need for one workload and drafter set."""

    rates: np.ndarray  # (n_requests, m)
    decay: np.ndarray  # (m,)
    informativeness: np.ndarray  # (m,), NaN = drafter reports no confidences
    means: dict[str, float]  # pooled configured mean rate per drafter (before category shifts)
    sources: dict[str, str]


def request_rates(workload, drafters: list[tuple[str, str, bool]], seed: int = 0,
                  informativeness: float = 0.5, table: AcceptanceTable | None = None,
                  overrides: dict[str, float] | None = None) -> RequestRates:
    """Draw each request's per-token rate under every drafter.

    ``drafters``: (name, kind, reports_confidences). A latent difficulty u_r ~ U(0, 1) per request
    is shared by all drafters (comonotone: a request easy for one drafter is easy for all); drafter
    d's rate is the u_r-quantile of its Beta (with the request's category shift). ``overrides``
    replaces a drafter's mean (e.g. a measured acceptance), keeping its spread and decay.
    """
    from scipy.stats import beta as beta_dist

    table = table or AcceptanceTable.load()
    n = workload.n
    rng = np.random.default_rng([seed, 17])
    u = rng.uniform(0.0, 1.0, size=n)
    m = len(drafters)
    rates = np.empty((n, m))
    decay = np.empty(m)
    info = np.full(m, np.nan)
    means, sources = {}, {}
    cats = workload.category
    for i, (name, kind, conf) in enumerate(drafters):
        base = table.params(workload.family, name, kind)
        if overrides and name in overrides:
            base = base.with_mean(float(overrides[name]), f"override {overrides[name]}")
        means[name], sources[name] = base.mean, base.source
        decay[i] = base.decay
        if conf and kind != "ngram":
            info[i] = informativeness
        mean_r = np.full(n, base.mean)
        if workload.categories:
            for ci, cname in enumerate(workload.categories):
                sel = cats == ci
                if sel.any():
                    shift, _ = table.category_shift(kind, cname)
                    mean_r[sel] = _sigmoid(_logit(base.mean) + shift)
        a = mean_r * base.concentration
        b = (1.0 - mean_r) * base.concentration
        rates[:, i] = beta_dist.ppf(u, a, b)
    return RequestRates(np.clip(rates, 0.0, MAX_RATE), decay, info, means, sources)
