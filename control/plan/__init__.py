"""The plan: what the control-plane service pushes and the in-process controller applies.

- ``schema``: the wire document (``Plan`` and its parts: ``SLO``, ``GateParams``, ``BanditParams``,
  ``AcceptanceState``, ``KTable``), ``parse_plan`` and ``load_plan``.
- ``compile``: ``compile_plan`` (profile + acceptance + constraints -> ``Plan``), ``typical_ctx`` and
  ``trtllm_schedule`` (the plan as TensorRT-LLM's ``draft_len_schedule``).
- ``schedule``: the ``draft_len_schedule`` rules TensorRT-LLM enforces, its lookup and compact form.

The k tables' maths (``tabulate_k``, ``k_by_batch``, ``threshold_batch``) live in
``control.goodput.tabulate``; they are re-exported here for the callers that compile plans.
"""

from control.goodput.tabulate import k_by_batch, tabulate_k, threshold_batch
from control.plan.compile import (
    DEFAULT_ACC_BUCKETS,
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_CTX_BUCKETS,
    DEFAULT_TYPICAL_CTX,
    compile_plan,
    trtllm_schedule,
    typical_ctx,
)
from control.plan.schedule import compress_schedule, schedule_lookup, validate_trtllm_schedule
from control.plan.schema import (
    PLAN_SCHEMA,
    SLO,
    AcceptanceState,
    BanditParams,
    GateParams,
    KTable,
    Plan,
    load_plan,
    parse_plan,
)

__all__ = [
    "DEFAULT_ACC_BUCKETS", "DEFAULT_BATCH_BUCKETS", "DEFAULT_CTX_BUCKETS", "DEFAULT_TYPICAL_CTX", "PLAN_SCHEMA",
    "SLO", "AcceptanceState", "BanditParams", "GateParams", "KTable", "Plan", "compile_plan", "compress_schedule",
    "k_by_batch", "load_plan", "parse_plan", "schedule_lookup", "tabulate_k", "threshold_batch", "trtllm_schedule",
    "typical_ctx", "validate_trtllm_schedule",
]
