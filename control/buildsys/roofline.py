"""Roofline cost models: a GPU SKU's forward-pass time for a model shape, fitted into a profile.

For one forward pass over ``batch`` requests of context ``ctx`` computing ``tokens`` tokens each,
the time per GPU is the sum over operator classes of max(bytes / bandwidth, FLOPs / compute):

- GEMMs (QKV, O, gate/up, down, LM head): read the weights (split by tensor parallelism) and the
  activations; 2 FLOPs per weight per computed token;
- attention: read every request's KV (split over the KV heads by tensor parallelism; replicated
  where there are fewer KV heads than GPUs), write the new tokens' KV; 4 * d * ctx FLOPs per token
  per layer;
- logits: written in fp32 and read back by the sampler;

plus a per-pass overhead (launch, sampling, scheduling: a property of the serving framework), a
per-layer kernel overhead, and with tensor parallelism two all-reduces per layer (latency plus
2 (tp - 1) / tp of the hidden states over the interconnect).

What a framework adds under load (``Framework``): verification by batch expansion (vLLM's 2024
scorer: every verified token reads its request's KV again), and host time serial with the GPU per
sequence in a pass (the profile's per-request term ``d``) and per generated token (the simulator's
``host_token_ms``); in vLLM 0.6 also output processing a deployment without speculation hides behind
the next pass but a speculative one pays, and the host preparation of each step's first draft pass.
These are what make speculation stop paying at moderate load on vLLM (docs/validation.md).

Ceilings prefer measured values (``GpuSku.measured_*``, DESIGN.md section 6); a SKU without
measurements uses its datasheet figures scaled by the H100's measured / datasheet ratio (the share
of the datasheet any real kernel reaches), so every SKU is judged by the same yardstick.

``roofline_profile`` evaluates the model on a decode grid (batch x context x tokens per request, the
region the controller optimises over: k + 1 = 1..K + 1 tokens per request) and fits the linear
cost model T = a * N_ctx + b * N_batched + c of DESIGN.md section 4, for the target and every draft,
into a normal profile (``source: roofline``) whose ``environment`` records how it was made.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.optimize import nnls

from control.buildsys.catalog import SKUS, GpuSku, ModelShape, get_model, get_sku
from control.errors import ConfigError
from control.goodput.cost import LinearCost, fit_linear_cost
from control.profile import PROFILE_SCHEMA, Profile, parse_profile

# The H100's measured ceilings over its datasheet (DESIGN.md section 6): 3.0 / 3.35 TB/s, 800 / 989 TFLOP/s.
_REF = SKUS["h100"]
BW_DERATE = _REF.measured_bw_tbs / _REF.mem_bw_tbs
FLOPS_DERATE = _REF.measured_bf16_tflops / _REF.bf16_tflops


# Batch expansion's copies of a request read its KV blocks while they are in L2, so they pay a share
# of an HBM read, bounded by L2's bandwidth: on an H100 0.36 (0.13 / 0.30 / 0.38 at k = 1 / 3 / 7), on
# an H200, whose HBM is faster and L2 not, 0.64 (benchmarks/verify_reread.py, docs/validation.md).
# A SKU without a measurement takes the H100's.
REREAD_SHARE = _REF.measured_reread_share


@dataclass(frozen=True, slots=True)
class Framework:
    """What the serving framework adds to the hardware's roofline.

    pass_overhead_ms: per forward pass outside the kernels (scheduling, sampling, launch gaps).
    layer_overhead_us: per layer per pass (kernel launches CUDA graphs do not hide, small-kernel tails).
    allreduce_latency_us: latency of one tensor-parallel all-reduce of a small message.
    attention_efficiency: share of the bandwidth ceiling decode attention reaches on the KV cache.
    verify_expansion: the verification pass scores k + 1 tokens per request by batch expansion (each
        request becomes k + 1 single-token sequences, each reading its own copy of the request's KV),
        instead of one multi-token query over the KV read once.
    reread_share: under batch expansion, what a copy's KV read costs as a share of a read from HBM
        (the copies of a request run side by side and read its blocks through L2); None: the SKU's
        measured share (``on_sku``).
    host_seq_us: host time per sequence in a target pass (scheduling, input preparation), serial
        with the GPU; with batch expansion every expanded sequence counts. Becomes the target's
        per-request term ``d``.
    host_token_us: host time per generated token (output processing, detokenisation, streaming).
    draft_host_prep: every draft pass prepares its inputs on the host (``host_seq_us`` per sequence
        per pass), as vLLM's MultiStepWorker did before it prepared draft steps on the GPU.
    draft_step_host_prep: the first draft pass of every speculative step prepares its inputs on the
        host (``host_seq_us`` per drafting sequence, once per step); later passes advance on the GPU.
    async_output: a deployment without speculation overlaps the per-token output processing
        (``host_token_us``) with the next pass; with a draft model configured it stays serial.
    plain_chunk_budget: a deployment without a speculative model runs chunked prefill with this token
        budget when its target's context exceeds ``LONG_CONTEXT_TOKENS``; with a draft model configured
        prefills run in iterations of their own. 0: never. A roofline profile records it resolved for
        its target (0 where the context is shorter).
    """

    name: str
    pass_overhead_ms: float
    layer_overhead_us: float
    allreduce_latency_us: float
    attention_efficiency: float
    note: str = ""
    verify_expansion: bool = False
    reread_share: float | None = None
    host_seq_us: float = 0.0
    host_token_us: float = 0.0
    draft_host_prep: bool = False
    draft_step_host_prep: bool = False
    async_output: bool = False
    plain_chunk_budget: int = 0


VLLM_HOST_SEQ_US = 35.0
# vLLM turns chunked prefill on by default for models of more than 32K tokens of context unless a
# speculative model (or LoRA, prefix caching, ...) is configured (PR 6666, July 2024:
# vllm/engine/arg_utils.py, use_long_context), with SchedulerConfig's default budget for chunked
# prefill, 512 tokens ("the best balance between ITL and TTFT on A100").
LONG_CONTEXT_TOKENS = 32768
VLLM_CHUNK_BUDGET = 512
TYPICAL_CTX = 1024  # the profile's typical context length (recorded in its grid)
DRAFT_FIT_TOKENS = 2  # draft fits use grid points of at most this many tokens per request
VLLM_HOST_TOKEN_US = 40.0

# Values are engineering estimates for each stack, written down once and used for every SKU and
# model; docs/validation.md shows how far they are from published measurements.
FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("trtllm", 0.25, 2.0, 8.0, 0.85,
                  "TensorRT-LLM C++ executor with CUDA graphs and its custom one-shot/two-shot all-reduce"),
        # Host time: vLLM's profile of v0.5.3 (Llama-3-8B, one H100, ShareGPT; blog.vllm.ai, 2024-09-05)
        # found the GPU busy 38% of the time, scheduling and input preparation 29%, the API server
        # (output processing, detokenisation) 33%. Speculative decoding in vLLM kept that serial
        # loop (no async output processing or multi-step scheduling with a draft model). At the
        # profile's load (max_num_seqs = 256 sequences, ~355 tokens of context) our roofline gives a
        # 11.8 ms GPU step, so 29/38 x 11.8 ms / 256 = 35 us per sequence and 33/38 x 11.8 / 256 =
        # 40 us per generated token. Verification: vLLM's speculative decoding when SmartSpec was
        # written (mid 2024) scored proposals with BatchExpansionTop1Scorer
        # (vllm/spec_decode/batch_expansion.py: "converts a list of sequences and multiple query
        # positions to a new batch of sequences, each with a single query position ... strictly less
        # efficient than MQA scoring").
        Framework("vllm", 0.8, 3.0, 15.0, 0.80,
                  "vLLM (Python scheduler and sampler per step, CUDA graphs for decode, NCCL/custom all-reduce; "
                  "speculative verification by batch expansion)", verify_expansion=True,
                  host_seq_us=VLLM_HOST_SEQ_US, host_token_us=VLLM_HOST_TOKEN_US),
        # vLLM as SmartSpec ran it (arXiv 2406.14066v2, 25 June 2024): ``vllm`` with every draft pass
        # prepared on the host. Until the draft runner advanced passes 2..k on the GPU (vLLM PR 6338,
        # "draft_model_runner: Implement prepare_inputs on GPU for advance_step", mid-July 2024),
        # MultiStepWorker ran the worker's execute_model once per proposal step, each preparing its
        # inputs on the CPU.
        Framework("vllm-0.5", 0.8, 3.0, 15.0, 0.80,
                  "vLLM before July 2024, as SmartSpec ran it: as vllm, with every draft pass prepared on the host",
                  verify_expansion=True, host_seq_us=VLLM_HOST_SEQ_US, host_token_us=VLLM_HOST_TOKEN_US,
                  draft_host_prep=True),
        # Later vLLM releases score proposals with MQAScorer (vllm/spec_decode/mqa_scorer.py): one
        # multi-token query per request over its KV, as TensorRT-LLM does; host costs as above.
        # Neither prepares draft passes on the host by default: from mid-2024 vLLM's MultiStepWorker
        # does so ("every step prepared on the CPU") only where its GPU multi-step path does not apply
        # (``draft_host_prep``: ``vllm-0.5``, and sensitivity runs).
        Framework("vllm-mqa", 0.8, 3.0, 15.0, 0.80,
                  "vLLM with multi-query scoring of proposals (MQAScorer); otherwise as vllm",
                  host_seq_us=VLLM_HOST_SEQ_US, host_token_us=VLLM_HOST_TOKEN_US),
        # vLLM 0.6 (autumn 2024, when TurboSpec was written), as TurboSpec ran it: ``vllm`` plus three
        # terms from vLLM's source that treat a deployment with a draft model differently from one
        # without:
        # - a model of more than 32K tokens of context (Llama-3.1-70B) gets chunked prefill with a
        #   512-token budget by default, unless a speculative model is configured (``plain_chunk_budget``);
        # - async output processing (vLLM 0.6.0) hides the per-token output processing behind the
        #   next pass, but vllm/config.py switches it off when a speculative model is configured
        #   ("Async output processing is not supported with speculative decoding currently"): Org
        #   overlaps it, every speculative deployment pays it;
        # - the draft's first pass of each step is prepared on the host by the worker's
        #   prepare_model_input (vllm/spec_decode/multi_step_worker.py, draft_model_runner.py: the GPU
        #   advance_step covers passes 2..k only).
        # Verification stays batch expansion: SpecDecodeWorker.create_worker falls back from the
        # MQAScorer to BatchExpansionTop1Scorer when the target does not run eagerly (CUDA graphs are
        # on by default) and where the draft's max_model_len is below the target's (Llama-160M 2048,
        # Vicuna-7B/13B 4096).
        Framework("vllm-0.6", 0.8, 3.0, 15.0, 0.80,
                  "vLLM 0.6 as TurboSpec ran it: as vllm, with async output processing and, past 32K tokens of "
                  "context, chunked prefill without speculation only, and the first draft pass of each step "
                  "prepared on the host",
                  verify_expansion=True, host_seq_us=VLLM_HOST_SEQ_US, host_token_us=VLLM_HOST_TOKEN_US,
                  draft_step_host_prep=True, async_output=True, plain_chunk_budget=VLLM_CHUNK_BUDGET),
        Framework("gpt-fast", 0.2, 3.0, 60.0, 0.85,
                  "gpt-fast (torch.compile + CUDA graphs; tensor parallelism through torch.distributed/NCCL)"),
    )
}


def on_sku(fw: Framework, gpu: GpuSku) -> Framework:
    """``fw`` with the share of an HBM read a batch-expansion copy pays resolved: the framework's own,
    else the SKU's measured one, else the H100's."""
    if fw.reread_share is not None:
        return fw
    share = gpu.measured_reread_share if gpu.measured_reread_share is not None else REREAD_SHARE
    return replace(fw, reread_share=share)


def get_framework(name: str | Framework) -> Framework:
    if isinstance(name, Framework):
        return name
    if name not in FRAMEWORKS:
        raise ConfigError(f"unknown framework '{name}'; known: {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def scaled_framework(name: str, host_scale: float = 1.0, draft_host_prep: bool | None = None) -> Framework:
    """The named framework with its host times multiplied by ``host_scale`` and, when given, host
    preparation of draft passes switched on or off (for sensitivity runs)."""
    if not (math.isfinite(host_scale) and host_scale >= 0):
        raise ConfigError(f"host_scale = {host_scale!r}: must be a finite number >= 0")
    fw = get_framework(name)
    fw = replace(fw, host_seq_us=fw.host_seq_us * host_scale, host_token_us=fw.host_token_us * host_scale)
    return fw if draft_host_prep is None else replace(fw, draft_host_prep=draft_host_prep)


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The bandwidth and compute the roofline divides by (per GPU)."""

    bw_bytes_s: float
    flops_s: float
    interconnect_bytes_s: float
    source: str

    @classmethod
    def of(cls, sku: GpuSku, fp8: bool = False) -> Ceilings:
        if sku.measured_bw_tbs:
            bw, bw_src = sku.measured_bw_tbs, "measured"
        else:
            bw, bw_src = sku.mem_bw_tbs * BW_DERATE, f"datasheet x {BW_DERATE:.3f}"
        peak = sku.fp8_tflops if fp8 else sku.bf16_tflops
        if fp8 and peak is None:
            raise ConfigError(f"SKU '{sku.name}' ({sku.arch}) has no fp8 tensor cores; use bf16")
        if sku.measured_bf16_tflops and not fp8:
            fl, fl_src = sku.measured_bf16_tflops, "measured"
        else:
            fl, fl_src = peak * FLOPS_DERATE, f"datasheet x {FLOPS_DERATE:.3f}"
        return cls(bw * 1e12, fl * 1e12, sku.interconnect_gbs * 1e9,
                   f"bandwidth {bw:.3g} TB/s ({bw_src}), compute {fl:.4g} TFLOP/s ({fl_src})")


@dataclass(frozen=True, slots=True)
class ModelCost:
    """Per-GPU byte and FLOP counts of one model under tensor parallelism ``tp``."""

    shape: ModelShape
    tp: int
    weight_bytes: float  # per GPU, read once per pass
    matmul_params: float  # per GPU
    kv_bytes_token: float  # per GPU, per context token
    act_bytes_token: float  # per GPU, per computed token (activations in/out of every op, logits)
    attn_flops_token_ctx: float  # per GPU, per (computed token x context token)

    @classmethod
    def of(cls, shape: ModelShape, tp: int, weight_bytes: float = 2.0, kv_bytes: float = 2.0) -> ModelCost:
        d, f, L, V = shape.hidden, shape.ffn, shape.layers, shape.vocab
        kvd = shape.kv_heads * shape.head_dim
        attn = d * d * 2 + d * kvd * 2
        mlp = 3 * d * f
        extra = 2 * d * d if shape.kind == "eagle_head" else 0
        matmul = L * (attn + mlp) + V * d + extra  # the input embedding is a lookup, not a GEMM
        kv_split = min(tp, shape.kv_heads)  # fewer KV heads than GPUs: heads are replicated
        act = 2.0 * L * (16 * d + 6 * f) / tp + 8.0 * V / tp  # bf16 activations; fp32 logits written + read
        return cls(
            shape=shape,
            tp=tp,
            weight_bytes=matmul * weight_bytes / tp,
            matmul_params=matmul / tp,
            kv_bytes_token=shape.kv_bytes_per_token(kv_bytes) / kv_split,
            act_bytes_token=act,
            attn_flops_token_ctx=4.0 * L * shape.heads * shape.head_dim / tp,
        )


@dataclass(frozen=True, slots=True)
class Roofline:
    """Forward-pass time of one model on one SKU with one framework (vectorised over inputs)."""

    sku: GpuSku
    model: ModelCost
    framework: Framework
    ceilings: Ceilings

    def forward_ms(self, n_ctx, n_batched, tokens_per_request=1.0):
        """Time in ms of one pass reading ``n_ctx`` KV tokens and computing ``n_batched`` tokens.

        ``tokens_per_request``: tokens each request computes in the pass (k + 1 when verifying);
        attention FLOPs scale with it.
        """
        m, cl, fw = self.model, self.ceilings, self.framework
        n_ctx = np.asarray(n_ctx, dtype=np.float64)
        nb = np.asarray(n_batched, dtype=np.float64)
        t = np.asarray(tokens_per_request, dtype=np.float64)
        gemm = np.maximum((m.weight_bytes + nb * m.act_bytes_token) / cl.bw_bytes_s,
                          2.0 * m.matmul_params * nb / cl.flops_s)
        attn_bytes = (n_ctx + nb) * m.kv_bytes_token
        attn = np.maximum(attn_bytes / (cl.bw_bytes_s * fw.attention_efficiency),
                          m.attn_flops_token_ctx * n_ctx * t / cl.flops_s)
        L = m.shape.layers
        t_s = gemm + attn + L * fw.layer_overhead_us * 1e-6
        if m.tp > 1:
            msg = nb * m.shape.hidden * 2.0
            per = fw.allreduce_latency_us * 1e-6 + 2.0 * (m.tp - 1) / m.tp * msg / cl.interconnect_bytes_s
            t_s = t_s + 2 * L * per
        return t_s * 1e3 + fw.pass_overhead_ms


@dataclass(frozen=True, slots=True)
class Grid:
    """The decode grid the linear model is fitted on."""

    batch: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    ctx: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    tokens: tuple[int, ...] = tuple(range(1, 10))  # k + 1 for k = 0..8

    def points(self, max_batch: int, max_ctx: int, kv_tokens: int, token_budget: int):
        B, S, T = np.meshgrid(np.array(self.batch, dtype=np.float64), np.array(self.ctx, dtype=np.float64),
                              np.array(self.tokens, dtype=np.float64), indexing="ij")
        B, S, T = B.ravel(), S.ravel(), T.ravel()
        keep = (max_batch >= B) & (max_ctx >= S) & (kv_tokens >= B * S) & (token_budget >= B * T)
        return B[keep], S[keep], T[keep]


@dataclass(frozen=True, slots=True)
class FitReport:
    name: str
    cost: LinearCost
    points: int
    max_abs_pct: float


def fit_relative(n_ctx, n_b, t) -> LinearCost:
    """Non-negative least squares on relative error: every grid point counts alike, so the
    cheap small-batch passes are fitted as well as the long ones (a plain fit lets the largest
    times dominate). Quality figures are those of ``fit_linear_cost`` on the same points."""
    X = np.stack([n_ctx, n_b, np.ones_like(t)], axis=1) / t[:, None]
    scale = np.abs(X).max(axis=0)
    coef, _ = nnls(X / scale, np.ones_like(t))
    a, b, c = coef / scale
    resid = t - (a * n_ctx + b * n_b + c)
    ss_res = float(resid @ resid)
    ss_tot = float(((t - t.mean()) ** 2).sum())
    dof = max(t.size - 3, 1)
    return LinearCost(float(a), float(b), float(c), r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
                      mape=float(np.mean(np.abs(resid) / t) * 100.0), resid_std_ms=float(math.sqrt(ss_res / dof)))


def fit_roofline(rf: Roofline, B, S, T, absolute: bool = True) -> tuple[LinearCost, float]:
    """Fit the linear model to the roofline on a grid. ``absolute`` (default) minimises squared
    error in ms, as the profiler does for measured points: the long, compute-bound passes of large
    batches drafting several tokens, where speculation stops paying, are fitted best. The relative
    fit favours small batches instead."""
    n_ctx, n_b = B * S, B * T
    t = rf.forward_ms(n_ctx, n_b, T)
    fit = fit_linear_cost(n_ctx, n_b, t) if absolute else fit_relative(n_ctx, n_b, t)
    pred = fit.predict(n_ctx, n_b)
    return fit, float(np.max(np.abs(pred - t) / t) * 100.0)


def kv_capacity_tokens(sku: GpuSku, models: list[ModelCost], tp: int, mem_fraction: float = 0.9,
                       reserve_gb: float = 2.0) -> int:
    """KV tokens that fit after the weights of every model (target and drafts) per GPU.

    Each token in flight holds KV in the target and in every stateful draft; ``reserve_gb`` per
    GPU covers activations and workspace. Drafts run unsplit on every GPU (their weights and KV are
    replicated), as TensorRT-LLM and vLLM run small drafts.
    """
    free = sku.memory_gb * 1e9 * mem_fraction - reserve_gb * 1e9 - sum(m.weight_bytes for m in models)
    per_token = sum(m.kv_bytes_token for m in models)
    if free <= 0:
        need = (sum(m.weight_bytes for m in models) + reserve_gb * 1e9) / 1e9
        raise ConfigError(
            f"the weights need {need:.1f} GB per GPU but a {sku.name} has {sku.memory_gb * mem_fraction:.0f} GB usable "
            f"at tp = {tp}; raise --tp"
        )
    return int(free // per_token)


def _slug(name: str) -> str:
    return name.lower()


def roofline_profile(
    sku: str,
    target: str,
    drafts: list[str],
    tp: int = 1,
    *,
    framework: str | Framework = "trtllm",
    fp8: bool = False,
    max_batch: int = 256,
    max_ctx: int | None = None,
    token_budget: int = 8192,
    ngram_ms: float | None = None,
    acceptance: dict[str, float] | None = None,
    grid: Grid | None = None,
    command: str | None = None,
) -> Profile:
    """A profile (``source: roofline``) for ``target`` with ``drafts`` on ``tp`` GPUs of ``sku``.

    Args:
        sku: GPU SKU name (h100, h200, b200, a100, l40s, l4).
        target / drafts: model names from ``control.buildsys.catalog.MODELS``. A draft whose shape is
            an EAGLE-style head becomes a drafter of kind ``eagle``; others ``draft_model``.
        tp: tensor parallelism of the target (drafts run unsplit, replicated on each GPU).
        framework: per-pass/per-layer overheads and all-reduce latency (``FRAMEWORKS``).
        fp8: fp8 weights and KV (Ada, Hopper, Blackwell only).
        ngram_ms: also offer an n-gram prompt-lookup drafter costing this many ms per step.
        acceptance: prior acceptance per drafter name (recorded in the profile; optional).
        command: the command line that produced the profile, recorded in ``environment``.
    """
    gpu, fw, tshape = _check_request(sku, target, drafts, tp, framework, ngram_ms)
    fw = on_sku(fw, gpu)  # its re-read share is recorded in the profile's framework
    wbytes = 1.0 if fp8 else 2.0
    ceil = Ceilings.of(gpu, fp8)
    tcost = ModelCost.of(tshape, tp, wbytes, wbytes)
    dshapes = [get_model(d) for d in drafts]
    dcosts = [ModelCost.of(s, 1, wbytes, wbytes) for s in dshapes]
    kv_tokens = kv_capacity_tokens(gpu, [tcost, *dcosts], tp)
    max_ctx = int(max_ctx or min(tshape.max_position, 131072))
    if fw.plain_chunk_budget and max_ctx <= LONG_CONTEXT_TOKENS:
        fw = replace(fw, plain_chunk_budget=0)  # the default applies to long-context models only
    grid = grid or Grid()
    span = _FitSpan(max_batch, max_ctx, kv_tokens, token_budget, grid)

    models: dict[str, dict] = {}
    fits = [_fit_target(Roofline(gpu, tcost, fw, ceil), span, sku, models)]
    drafter_entries = []
    for name, shape, cost in zip(drafts, dshapes, dcosts, strict=True):
        key = _slug(name)
        fits.append(_fit_draft(Roofline(gpu, cost, fw, ceil), shape, key, span, models))
        drafter_entries.append(_draft_entry(key, shape))
    if ngram_ms is not None:
        drafter_entries.append(_ngram_entry(ngram_ms))
    pair = "+".join([_slug(target), *(_slug(d) for d in drafts)] + (["ngram"] if ngram_ms is not None else []))
    env = {
        "generator": "specctl roofline",
        "command": command or _command(sku, target, drafts, tp, fw.name, fp8, max_batch, ngram_ms),
        "tp": tp,
        "precision": "fp8" if fp8 else "bf16",
        "ceilings": ceil.source,
        "framework": asdict(fw),
        "fits": {f.name: {"points": f.points, "max_abs_pct": round(f.max_abs_pct, 2)} for f in fits},
    }
    doc = {
        "schema": PROFILE_SCHEMA,
        "sku": gpu.name,
        "pair": pair,
        "source": "roofline",
        "environment": env,
        "models": models,
        "drafters": drafter_entries,
        "overhead_ms": 0.0,
        "acceptance": dict(acceptance or {}),
        "limits": {"max_batch": max_batch, "max_ctx": max_ctx, "kv_tokens": kv_tokens, "token_budget": token_budget},
        "grid": {"batch": list(grid.batch), "ctx": list(grid.ctx), "tokens_per_request": list(grid.tokens),
                 "typical_ctx": TYPICAL_CTX},
    }
    return parse_profile(doc, where=f"roofline profile {gpu.name}/{pair}")


def _check_request(sku: str, target: str, drafts: list[str], tp: int, framework: str | Framework,
                   ngram_ms: float | None):
    """(GPU, framework, target shape) of a roofline request, or a ConfigError naming the bad value."""
    if sku.lower() == "cpu":
        raise ConfigError("the cpu SKU is profiled by measurement (`specctl profile`), not by the roofline")
    gpu = get_sku(sku)
    if tp < 1 or tp & (tp - 1):
        raise ConfigError(f"tp = {tp}: tensor parallelism must be a power of two >= 1")
    fw = get_framework(framework)
    tshape = get_model(target)
    if tshape.kind != "llama":
        raise ConfigError(f"target '{target}' is a draft head, not a model; pick a Llama target")
    if tp > tshape.heads:
        raise ConfigError(f"tp = {tp} exceeds the {tshape.heads} attention heads of {target}")
    if not drafts and ngram_ms is None:
        raise ConfigError("give at least one --draft MODEL (or --ngram-ms) to build a speculative profile")
    if len(set(drafts)) != len(drafts):
        raise ConfigError(f"drafts must be distinct (got: {', '.join(drafts)})")
    return gpu, fw, tshape


@dataclass(frozen=True)
class _FitSpan:
    """The deployment limits a fit's grid points stay within."""

    max_batch: int
    max_ctx: int
    kv_tokens: int
    token_budget: int
    grid: Grid


def _fit_target(roof: Roofline, span: _FitSpan, sku: str, models: dict[str, dict]) -> FitReport:
    """Fit the target's step time over the whole grid; adds ``models["target"]``."""
    B, S, T = span.grid.points(span.max_batch, span.max_ctx, span.kv_tokens, span.token_budget)
    if B.size < 3:
        raise ConfigError(f"the fit grid is empty for {sku} (KV capacity {span.kv_tokens} tokens); "
                          "lower max_batch or raise tp")
    tfit, tmax = fit_roofline(roof, B, S, T)
    if roof.framework.host_seq_us:
        tfit = replace(tfit, d=roof.framework.host_seq_us / 1000.0)
    models["target"] = _coeffs(tfit)
    return FitReport("target", tfit, int(B.size), tmax)


def _fit_draft(roof: Roofline, shape: ModelShape, key: str, span: _FitSpan, models: dict[str, dict]) -> FitReport:
    """Fit a draft model's pass time; adds ``models[key]``. Draft passes compute one token per request
    (catch-up adds a few): fit on tokens 1..2."""
    dctx = min(span.max_ctx, shape.max_position) if shape.kind == "llama" else span.max_ctx
    dB, dS, dT = span.grid.points(span.max_batch, dctx, span.kv_tokens, span.token_budget)
    sel = dT <= DRAFT_FIT_TOKENS
    dfit, dmax = fit_roofline(roof, dB[sel], dS[sel], dT[sel])
    if roof.framework.draft_host_prep:
        # each draft pass prepares its sequences' inputs on the host: per sequence per pass
        dfit = replace(dfit, d=roof.framework.host_seq_us / 1000.0)
    models[key] = _coeffs(dfit)
    return FitReport(key, dfit, int(sel.sum()), dmax)


def _draft_entry(key: str, shape: ModelShape) -> dict:
    """The profile's drafter entry for a draft model: an EAGLE-style head is of kind ``eagle``."""
    kind = "eagle" if shape.kind == "eagle_head" else "draft_model"
    return {"name": key, "kind": kind, "model": key}


def _ngram_entry(ngram_ms: float) -> dict:
    """The profile's drafter entry for n-gram prompt lookup costing ``ngram_ms`` per step."""
    if not (math.isfinite(ngram_ms) and ngram_ms >= 0):
        raise ConfigError(f"ngram_ms = {ngram_ms!r}: must be a finite number >= 0")
    return {"name": "ngram", "kind": "ngram", "cost_ms": float(ngram_ms), "confidences": False}


def _coeffs(c: LinearCost) -> dict:
    out = {"a_ms_per_ctx_token": float(f"{c.a:.6g}"), "b_ms_per_batched_token": float(f"{c.b:.6g}"),
           "c_ms": float(f"{c.c:.6g}"), "r2": round(c.r2, 5), "mape": round(c.mape, 3),
           "resid_std_ms": round(c.resid_std_ms, 5)}
    if c.d:
        out["d_ms_per_request"] = float(f"{c.d:.6g}")
    return out


def _command(sku, target, drafts, tp, framework, fp8, max_batch, ngram_ms) -> str:
    parts = ["specctl roofline", f"--sku {sku}", f"--target {target}"]
    parts += [f"--draft {d}" for d in drafts]
    if tp != 1:
        parts.append(f"--tp {tp}")
    if framework != "trtllm":
        parts.append(f"--framework {framework}")
    if fp8:
        parts.append("--fp8")
    if max_batch != 256:
        parts.append(f"--max-batch {max_batch}")
    if ngram_ms is not None:
        parts.append(f"--ngram-ms {ngram_ms:g}")
    return " ".join(parts)


@dataclass
class StepTimes:
    """Convenience for validation: predicted target/draft pass times from the roofline itself."""

    sku: str
    target: str
    tp: int = 1
    framework: str = "trtllm"
    draft: str | None = None
    _rf: Roofline = field(init=False, repr=False)
    _rd: Roofline | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        gpu = get_sku(self.sku)
        fw = on_sku(get_framework(self.framework), gpu)
        ceil = Ceilings.of(gpu)
        self._rf = Roofline(gpu, ModelCost.of(get_model(self.target), self.tp), fw, ceil)
        if self.draft:
            self._rd = Roofline(gpu, ModelCost.of(get_model(self.draft), 1), fw, ceil)

    def target_ms(self, batch, ctx, tokens_per_request=1):
        """GPU time of one target pass computing ``tokens_per_request`` tokens for each of ``batch``
        requests; with batch expansion each of the t tokens reads its own copy of the request's KV
        (ctx + its offset), copies after the first at the framework's re-read share. Host time is not
        included."""
        t = np.asarray(tokens_per_request, dtype=np.float64)
        per_req = np.asarray(ctx, dtype=np.float64)
        fw = self._rf.framework
        if fw.verify_expansion:
            per_req = per_req + fw.reread_share * (per_req * (t - 1) + t * (t - 1) / 2)
        return self._rf.forward_ms(np.asarray(batch) * per_req, np.asarray(batch) * t, t)

    def draft_ms(self, batch, ctx):
        """GPU time of one draft pass over ``batch`` requests."""
        if self._rd is None:
            raise ConfigError("no draft model given")
        return self._rd.forward_ms(np.asarray(batch) * np.asarray(ctx), np.asarray(batch), 1)
