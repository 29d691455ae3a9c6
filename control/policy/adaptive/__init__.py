"""``adaptive``: our policy, as named stages over a typed step plan (``policy.py`` lists them)."""

from control.policy.adaptive.policy import AdaptivePolicy

__all__ = ["AdaptivePolicy"]
