"""Decision policies: where k is chosen. Types at the seam live in ``control.policy.types``.

``build_policy`` is imported lazily: plans validate policy names with ``control.policy.spec``, and
the policies themselves depend on plans.
"""

from control.policy.spec import PolicySpec, parse_policy_spec
from control.policy.types import Decision, Policy, StepOutcome, StepView, Verifier

__all__ = ["Decision", "Policy", "PolicySpec", "StepOutcome", "StepView", "Verifier", "build_policy", "parse_policy_spec"]


def __getattr__(name: str):
    if name == "build_policy":
        from control.policy.registry import build_policy

        return build_policy
    raise AttributeError(name)
