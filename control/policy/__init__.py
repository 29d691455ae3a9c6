"""Decision policies: where k is chosen. Types at the seam live in ``control.policy.types``; the
policy-name grammar lives below plans and policies both, in ``control.policyspec``."""

from control.policy.registry import build_policy
from control.policy.types import Decision, Policy, StepOutcome, StepView, Verifier
from control.policyspec import PolicySpec, parse_policy_spec

__all__ = ["Decision", "Policy", "PolicySpec", "StepOutcome", "StepView", "Verifier", "build_policy", "parse_policy_spec"]
