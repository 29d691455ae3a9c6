"""``--backend pytorch``: the LLM API options YAML, the quantization step, and the Triton ``llm`` model.

The options file is what ``LLM(**options)`` / ``trtllm-serve --extra_llm_api_options`` read
(TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``; unknown keys are rejected there, so our own
settings go in ``specctl.yaml`` beside it). Keys emitted and why:

- ``speculative_config``: ``decoding_type`` (llm_args.py ``*DecodingConfig.decoding_type``),
  ``max_draft_len``, the draft path (``speculative_model``; on 1.2 its older name
  ``speculative_model_dir``, which 1.3 still accepts as an alias), and ``draft_len_schedule``
  compiled from the plan for the SKU's profile (``trtllm_rules`` has the per-line semantics).
  ``max_concurrency`` is never set (mutually exclusive with a schedule), nor the acceptance-rate
  off switch (one-way; our gate replaces it).
- ``cuda_graph_config``: ``enable_padding: true`` (a schedule turns it on anyway) and batch sizes that
  include every schedule key.
- ``disable_overlap_scheduler: true`` for two-model speculation, as TensorRT-LLM's speculative
  decoding docs configure draft/target.
- ``enable_iter_perf_stats: true`` so ``get_stats`` reports iterations for our telemetry;
  per-request acceptance comes from ``SamplingParams(return_perf_metrics=True)`` at request time.
"""

from __future__ import annotations

import json

import yaml

from control.buildsys.artifacts import BuildArtifacts, Step
from control.buildsys.memfit import MemoryFit
from control.buildsys.profiles import ResolvedProfile
from control.buildsys.recipe import Recipe
from control.buildsys.trtllm_rules import (
    DECODING_TYPE,
    PER_STEP_K,
    Method,
    cuda_graph_batch_sizes,
    lookup,
    one_model,
    reaches_zero,
    to_line,
    validate_schedule,
)
from control.errors import ConfigError
from control.executors.trtllm.version import PINNED
from control.plan import Plan, compile_plan, trtllm_schedule, typical_ctx
from control.policyspec import MAX_K_LIMIT

QUANT_FORMAT = {"fp8": "fp8", "nvfp4": "nvfp4"}


def compile_build_plan(recipe: Recipe, resolved: ResolvedProfile) -> Plan:
    """The controller's plan for this deployment, compiled from the resolved profile."""
    return compile_plan(resolved.profile, max_k=min(recipe.speculation.max_draft_len, MAX_K_LIMIT),
                        default_drafter=resolved.drafter, reason=f"specctl build {recipe.sku}/{recipe.pair}")


def schedule_for(recipe: Recipe, plan: Plan, line: str) -> tuple[dict[int, int], dict[int, int]]:
    """(canonical 1.3-form schedule, the same schedule in ``line``'s form), validated for the line."""
    ctx = recipe.typical_ctx or typical_ctx(plan.profile)
    om = one_model(recipe.method, line)
    canonical = trtllm_schedule(plan, ctx=ctx, acc=plan.prior_rate(), max_batch=recipe.max_batch, one_model=om)
    if not canonical:
        return {}, {}
    native = to_line(canonical, line)
    max_k = max(canonical.values())
    validate_schedule(native, max_k, line)
    if om and reaches_zero(native, recipe.max_batch, line):
        raise ConfigError(f"schedule {native} drives a one-model drafter to k = 0 (TensorRT-LLM PR #16888); "
                          f"this is a bug in the schedule compiler")
    for b in range(1, recipe.max_batch + 1):  # both forms must run the plan's k at every batch size
        if lookup(native, b, line) != lookup(canonical, b, "1.3"):
            raise ConfigError(f"schedule rewrite for TensorRT-LLM {line} changes k at batch {b} (a generator bug)")
    return canonical, native


def llmapi_options(recipe: Recipe, native: dict[int, int], line: str, model_dir: str, draft_dir: str | None) -> dict:
    spec = recipe.speculation
    opts: dict = {
        "backend": "pytorch",
        "tensor_parallel_size": recipe.tp,
        "max_batch_size": recipe.max_batch,
        "max_seq_len": recipe.max_seq_len,
        "max_num_tokens": recipe.max_num_tokens,
        "kv_cache_config": {
            "free_gpu_memory_fraction": recipe.memory.kv_cache_free_fraction,
            "enable_block_reuse": True,
        },
        "enable_iter_perf_stats": True,
    }
    if recipe.precision in ("fp8", "nvfp4"):
        opts["kv_cache_config"]["dtype"] = "fp8"
    if native:
        sc: dict = {"decoding_type": DECODING_TYPE[spec.method], "max_draft_len": max(native.values())}
        if draft_dir is not None:
            sc["speculative_model" if line == "1.3" else "speculative_model_dir"] = draft_dir
        if spec.method == Method.ngram:
            sc["max_matching_ngram_size"] = spec.ngram_size
        if spec.method == Method.eagle3:
            sc["eagle3_one_model"] = one_model(spec.method, line)
        if spec.method == Method.mtp:
            sc["num_nextn_predict_layers"] = spec.max_draft_len
        sc["draft_len_schedule"] = dict(native)
        opts["speculative_config"] = sc
        if not one_model(spec.method, line):
            opts["disable_overlap_scheduler"] = True
    opts["cuda_graph_config"] = {"enable_padding": True,
                                 "batch_sizes": cuda_graph_batch_sizes(recipe.max_batch, native)}
    return opts


def llm_model_config(recipe: Recipe, control: str, model: str, version: str = PINNED) -> str:
    """Triton ``llm`` model config (Python backend, decoupled) on the TensorRT-LLM executor.

    The model's code (``model.py``) is the project's ``triton_repo/llm/1/model.py``
    (``control/triton/llm_model.py``, which builds ``executor: trtllm`` with
    ``control/triton/llmapi_host.py``); this config names the executor and what it loads (``model``: the target checkpoint ``LLM(model, ...)`` takes), with the
    request/response names DESIGN.md section 5 keeps compatible with tensorrtllm_backend's ensemble
    and BLS models and the same inputs as the reference path's config (``text_input`` or
    ``input_ids``; ``policy`` and ``stats`` are ours).
    """
    def tensor(name, dtype, dims="[ 1 ]", optional=True):
        return (f"  {{\n    name: \"{name}\"\n    data_type: {dtype}\n    dims: {dims}\n"
                + ("    optional: true\n" if optional else "") + "  }")

    inputs = [tensor("text_input", "TYPE_STRING"), tensor("input_ids", "TYPE_INT32", "[ -1 ]"),
              tensor("max_tokens", "TYPE_INT32"), tensor("stream", "TYPE_BOOL"), tensor("temperature", "TYPE_FP32"),
              tensor("top_k", "TYPE_INT32"), tensor("top_p", "TYPE_FP32"), tensor("random_seed", "TYPE_UINT64"),
              tensor("stop_words", "TYPE_STRING", "[ -1 ]"), tensor("bad_words", "TYPE_STRING", "[ -1 ]"),
              tensor("end_id", "TYPE_INT32"), tensor("ignore_eos", "TYPE_BOOL"), tensor("num_draft_tokens", "TYPE_INT32"),
              tensor("policy", "TYPE_STRING"),
              tensor("stats", "TYPE_BOOL"), tensor("stop", "TYPE_BOOL")]
    # Speculation metrics under tensorrtllm_backend's names and under ours (what `specctl generate`
    # and `specctl bench` read, as from the reference path's config).
    outputs = [tensor("text_output", "TYPE_STRING", "[ -1 ]", False), tensor("output_ids", "TYPE_INT32", "[ -1 ]", False),
               tensor("total_draft_tokens", "TYPE_INT32", optional=False),
               tensor("total_accepted_draft_tokens", "TYPE_INT32", optional=False),
               tensor("drafted_tokens", "TYPE_INT32", optional=False),
               tensor("accepted_tokens", "TYPE_INT32", optional=False),
               tensor("acceptance_rate", "TYPE_FP32", optional=False)]
    params = {"executor": "trtllm", "trtllm_version": version, "llm_api_options": "@OUT@/llm_api_options.yaml",
              "model": model,
              "plan": "@OUT@/plan.yaml", "control": control, "sku": recipe.sku, "pair": recipe.pair}
    ptxt = "\n".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return (f'name: "llm"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy {{ decoupled: true }}\n'
            f"input [\n{','.join(chr(10) + i for i in inputs).lstrip(chr(10))}\n]\n"
            f"output [\n{','.join(chr(10) + o for o in outputs).lstrip(chr(10))}\n]\n"
            f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{ptxt}\n")


def pytorch_artifacts(recipe: Recipe, resolved: ResolvedProfile, line: str, fit: MemoryFit,
                      version: str = PINNED) -> BuildArtifacts:
    art = BuildArtifacts()
    spec = recipe.speculation
    plan = compile_build_plan(recipe, resolved)
    canonical, native = schedule_for(recipe, plan, line)
    model_dir = recipe.target_path or recipe.target
    draft_dir = spec.draft_path or spec.draft
    quant = QUANT_FORMAT.get(recipe.precision)
    if quant:
        art.steps.append(Step(
            f"quantize the target to {quant} with TensorRT Model Optimizer (TensorRT-LLM's PyTorch backend loads "
            f"ModelOpt HF checkpoints): run from Model-Optimizer/examples/llm_ptq",
            ["scripts/huggingface_example.sh", "--model", model_dir, "--quant", quant, "--export_fmt", "hf",
             "--output_dir", "$OUT/quantized/target"]))
        model_dir = "@OUT@/quantized/target"
        if spec.method == Method.draft_target:
            art.steps.append(Step(f"quantize the draft model to {quant} the same way",
                                  ["scripts/huggingface_example.sh", "--model", draft_dir, "--quant", quant,
                                   "--export_fmt", "hf", "--output_dir", "$OUT/quantized/draft"]))
            draft_dir = "@OUT@/quantized/draft"
    per_step = spec.method in PER_STEP_K["pytorch"]
    control = "drafter-hook" if per_step else "static-schedule"
    opts = llmapi_options(recipe, native, line, model_dir, draft_dir if spec.method != Method.ngram else None)
    if not native:
        art.notes.append("the profile predicts speculation never pays for this recipe at any batch size: the options "
                         "run without speculative_config (the controller can still enable the drafter hook)")
    art.add("llm_api_options.yaml", f"# TensorRT-LLM {version} LLM API options, generated by `specctl build`.\n"
            + yaml.safe_dump(opts, sort_keys=False))
    art.add("plan.yaml", plan.to_yaml())
    art.add("specctl.yaml", yaml.safe_dump({
        "schema": "specctl.deployment/v1", "sku": recipe.sku, "pair": recipe.pair, "backend": "pytorch",
        "trtllm_version": version, "trtllm_line": line, "model": model_dir, "method": spec.method.value, "control": control,
        "llm_api_options": "llm_api_options.yaml", "plan": "plan.yaml", "profile": resolved.describe(),
        "draft_len_schedule": {"canonical": canonical, line: native},
        "memory_fit": fit.lines(),
    }, sort_keys=False))
    art.add("triton_repo/llm/config.pbtxt", llm_model_config(recipe, control, model_dir, version))
    art.steps.append(Step("point the configs at this directory", [],
                          raw='sed -i "s|@OUT@|$OUT|g" "$OUT/triton_repo/llm/config.pbtxt" "$OUT/llm_api_options.yaml"'))
    art.add("build.sh", art.script(f"{recipe.sku}/{recipe.pair}: TensorRT-LLM {version} PyTorch backend"))
    art.notes.append(f"draft_len_schedule (TensorRT-LLM {line} form): {json.dumps(native) if native else 'none'}")
    return art
