"""Per-request speculative-decoding metrics in vLLM's ``metrics.speculative_decoding`` shape.

The ``llm`` model streams one response per engine step that produced tokens for the request, with
the request's running totals of drafted and accepted tokens. A response whose drafted total grew is
one speculative step that accepted (accepted growth) of (drafted growth) draft tokens. Steps that
produced no token are merged into the next response, so a step count can only be an undercount.

``acceptance_histogram`` is dense: index j counts the steps that accepted exactly j draft tokens,
over j = 0..num_spec_tokens (the deployment's largest k), as vLLM sends it and aiperf reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecTracker:
    num_spec_tokens: int  # the deployment's largest draft length k
    drafted: int = 0
    accepted: int = 0
    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)

    def update(self, drafted_total: int, accepted_total: int) -> None:
        """One response's running totals."""
        d, a = drafted_total - self.drafted, accepted_total - self.accepted
        if d > 0:
            self.per_step_drafted.append(d)
            self.per_step_accepted.append(max(0, min(a, d)))
        self.drafted, self.accepted = max(self.drafted, drafted_total), max(self.accepted, accepted_total)

    def payload(self) -> dict[str, Any]:
        steps = len(self.per_step_drafted)
        width = max([self.num_spec_tokens, *self.per_step_drafted])
        hist = [0] * (width + 1)
        for a in self.per_step_accepted:
            hist[a] += 1
        return {
            "num_spec_steps": steps,
            "num_spec_tokens": width,
            "num_draft_tokens": self.drafted,
            "num_accepted_draft_tokens": self.accepted,
            "acceptance_histogram": hist,
            "mean_acceptance_length": 1.0 + self.accepted / steps if steps else 1.0,
            "draft_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "per_step_drafted": list(self.per_step_drafted),
            "per_step_accepted": list(self.per_step_accepted),
        }
