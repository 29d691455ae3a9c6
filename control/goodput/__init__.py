"""The math: cost models, accepted-length models, acceptance estimators, the goodput optimiser.

Pure Python + numpy/scipy; no I/O. See DESIGN.md section 4.
"""

from control.goodput.acceptance import (
    chain_expected,
    chain_survival,
    confidence_survival,
    expected_from_survival,
    positional_expected,
    survival_from_rates,
    tree_batched_tokens,
    tree_expected,
)
from control.goodput.cost import LinearCost, RecursiveCost, fit_linear_cost
from control.goodput.optimizer import (
    Choice,
    Constraints,
    Curve,
    admit_parametric,
    admit_slots,
    best_uniform_k,
    confidence_cuts,
    slo_ok,
    uniform_curve,
)
from control.goodput.stepcost import DrafterCost, DrafterKind, StepCostModel

__all__ = [
    "Choice", "Constraints", "Curve", "DrafterCost", "DrafterKind", "LinearCost", "RecursiveCost",
    "StepCostModel", "admit_parametric", "admit_slots", "best_uniform_k", "chain_expected", "chain_survival",
    "confidence_cuts", "confidence_survival", "expected_from_survival", "fit_linear_cost",
    "positional_expected", "slo_ok", "survival_from_rates", "tree_batched_tokens", "tree_expected",
    "uniform_curve",
]
