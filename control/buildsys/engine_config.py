"""``--backend tensorrt`` (TensorRT-LLM 1.2.x): checkpoint conversion and ``trtllm-build`` commands
for target, draft and EAGLE engines, the ``tensorrt_llm`` / ``tensorrt_llm_draft`` model configs for
the Triton ``tensorrtllm`` backend, and our streaming speculative BLS model.

Sources (TensorRT-LLM 1.2 tree):
- ``examples/draft_target_model/README.md``: the target needs ``--speculative_decoding_mode
  draft_tokens_external`` and ``--max_draft_len``; both engines ``--use_paged_context_fmha enable``
  (each step resends the prefix, so the KV cache must be reused: ``enable_kv_cache_reuse`` in the
  model configs); ``--gather_generation_logits`` when draft logits are used.
- ``examples/eagle/README.md`` + ``examples/eagle/convert_checkpoint.py``: ``--eagle_model_dir``,
  ``--max_draft_len``, ``--num_eagle_layers``; ``trtllm-build --speculative_decoding_mode eagle``.
- ``examples/models/core/llama/convert_checkpoint.py`` and ``examples/quantization/quantize.py``
  (``--qformat fp8|nvfp4 --kv_cache_dtype fp8``) for the target and draft checkpoints.
- ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``: tensor names and
  the backend parameters (``gpt_model_path``, ``gpt_model_type``, ``enable_kv_cache_reuse``,
  ``exclude_input_in_output``, ``kv_cache_free_gpu_mem_fraction``, ...).
"""

from __future__ import annotations

import yaml

from control.buildsys.artifacts import BuildArtifacts, Step
from control.buildsys.llmapi_config import compile_build_plan
from control.buildsys.memfit import MemoryFit
from control.buildsys.profiles import ResolvedProfile
from control.buildsys.recipe import Recipe
from control.buildsys.triton_launch import serve_script, triton_launch
from control.buildsys.trtllm_rules import Method
from control.executors.trtllm.tensors import TRTLLM_INPUTS, TRTLLM_OUTPUTS
from control.executors.trtllm.version import PINNED

DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16", "nvfp4": "bfloat16"}
# With a separate draft engine, how the KV-cache memory is shared between the target and the draft.
TARGET_KV_SHARE, DRAFT_KV_SHARE = 0.8, 0.2


def _checkpoint(recipe: Recipe, model_dir: str, out: str, tp: int, what: str) -> Step:
    dtype = DTYPE[recipe.precision]
    if recipe.precision in ("fp8", "nvfp4"):
        return Step(f"quantize the {what} to {recipe.precision} (examples/quantization/quantize.py)",
                    ["python3", "examples/quantization/quantize.py", "--model_dir", model_dir, "--dtype", dtype,
                     "--qformat", recipe.precision, "--kv_cache_dtype", "fp8", "--output_dir", out,
                     "--tp_size", str(tp)])
    return Step(f"convert the {what} to a TensorRT-LLM checkpoint (examples/models/core/llama/convert_checkpoint.py)",
                ["python3", "examples/models/core/llama/convert_checkpoint.py", "--model_dir", model_dir,
                 "--output_dir", out, "--dtype", dtype, "--tp_size", str(tp)])


def _build(recipe: Recipe, ckpt: str, out: str, what: str, extra: list[str], max_input: int | None = None) -> Step:
    argv = ["trtllm-build", "--checkpoint_dir", ckpt, "--output_dir", out, "--gemm_plugin", "auto",
            "--use_paged_context_fmha", "enable", "--max_batch_size", str(recipe.max_batch),
            "--max_input_len", str(max_input or recipe.max_input_len), "--max_seq_len", str(recipe.max_seq_len),
            "--max_num_tokens", str(recipe.max_num_tokens), *extra]
    return Step(f"build the {what} engine", argv)


def engine_steps(recipe: Recipe) -> list[Step]:
    spec = recipe.speculation
    target = recipe.target_path or recipe.target
    gather = ["--gather_generation_logits"] if spec.draft_logits else []
    steps: list[Step] = []
    if spec.method == Method.eagle:
        steps.append(Step("convert target + EAGLE-1 head into one checkpoint (examples/eagle/convert_checkpoint.py)",
                          ["python3", "examples/eagle/convert_checkpoint.py", "--model_dir", target,
                           "--eagle_model_dir", spec.draft_path or spec.draft, "--output_dir", "$OUT/ckpt/target",
                           "--dtype", DTYPE[recipe.precision], "--max_draft_len", str(spec.max_draft_len),
                           "--num_eagle_layers", str(spec.eagle_layers), "--tp_size", str(recipe.tp)]))
        steps.append(_build(recipe, "$OUT/ckpt/target", "$OUT/engines/target", "target + EAGLE",
                            ["--speculative_decoding_mode", "eagle"]))
        return steps
    steps.append(_checkpoint(recipe, target, "$OUT/ckpt/target", recipe.tp, "target"))
    # The BLS resends the whole sequence every step, so both engines take inputs up to max_seq_len - 1.
    whole = recipe.max_seq_len - 1
    # The target verifies drafts it is handed (draft_input_ids): draft model or our n-gram proposer.
    steps.append(_build(recipe, "$OUT/ckpt/target", "$OUT/engines/target", "target (verifies external drafts)",
                        ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len",
                         str(spec.max_draft_len), *gather], max_input=whole))
    if spec.method == Method.draft_target:
        steps.append(_checkpoint(recipe, spec.draft_path or spec.draft, "$OUT/ckpt/draft", 1, "draft model"))
        steps.append(_build(recipe, "$OUT/ckpt/draft", "$OUT/engines/draft", "draft", gather, max_input=whole))
    return steps


def _param(key: str, value) -> str:
    return f'parameters: {{\n  key: "{key}"\n  value: {{\n    string_value: "{value}"\n  }}\n}}'


def tensorrt_llm_config(name: str, engine_dir: str, recipe: Recipe, kv_fraction: float, *, draft_logits: bool,
                        gpu_device_ids: str | None = None) -> str:
    """A filled ``tensorrt_llm`` model config (the tensorrtllm backend's template, the inputs we send);
    ``gpu_device_ids`` where several engine models share a multi-GPU host (``triton_launch``)."""
    def io(items, kind):
        rows = []
        for t in items:
            if kind == "input" and t.name == "draft_logits" and not draft_logits:
                continue
            opt = "\n    optional: true" if (kind == "input" and t.optional) else ""
            reshape = "\n    reshape: { shape: [ ] }" if t.scalar else ""
            ragged = "\n    allow_ragged_batch: true" if t.ragged else ""
            rows.append(f'  {{\n    name: "{t.name}"\n    data_type: {t.dtype}\n    dims: {t.dims}{reshape}{ragged}{opt}\n  }}')
        return ",\n".join(rows)

    params = [
        ("max_beam_width", 1), ("FORCE_CPU_ONLY_INPUT_TENSORS", "no"), ("gpt_model_type", "inflight_fused_batching"),
        ("gpt_model_path", engine_dir), ("batch_scheduler_policy", "guaranteed_no_evict"),
        ("kv_cache_free_gpu_mem_fraction", kv_fraction), ("enable_kv_cache_reuse", "true"),
        ("exclude_input_in_output", "true"), ("enable_chunked_context", "false"),
        ("iter_stats_max_iterations", 1000), ("request_stats_max_iterations", 1000),
        ("normalize_log_probs", "true"), ("decoding_mode", "top_k_top_p"),
        ("speculative_decoding_fast_logits", "0"),
    ] + ([("gpu_device_ids", gpu_device_ids)] if gpu_device_ids else [])
    return "\n".join([
        f'name: "{name}"', 'backend: "tensorrtllm"', f"max_batch_size: {recipe.max_batch}",
        "model_transaction_policy {\n  decoupled: false\n}",
        f"dynamic_batching {{\n  preferred_batch_size: [ {recipe.max_batch} ]\n  max_queue_delay_microseconds: 0\n}}",
        f"input [\n{io(TRTLLM_INPUTS, 'input')}\n]", f"output [\n{io(TRTLLM_OUTPUTS, 'output')}\n]",
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]",
        *[_param(k, v) for k, v in params],
    ]) + "\n"


def bls_config(recipe: Recipe, *, draft_model: str | None) -> str:
    """Our streaming speculative BLS model: decoupled, token ids in, streamed token ids out."""
    params = [("tensorrt_llm_model_name", "tensorrt_llm"), ("tensorrt_llm_draft_model_name", draft_model or ""),
              ("drafter", recipe.method.value), ("ngram_size", recipe.speculation.ngram_size),
              ("max_draft_len", recipe.speculation.max_draft_len), ("plan", "@OUT@/plan.yaml"),
              ("max_batch", recipe.max_batch)]
    inputs = [("input_ids", "TYPE_INT32", "[ -1 ]", False), ("max_tokens", "TYPE_INT32", "[ 1 ]", False),
              ("end_id", "TYPE_INT32", "[ 1 ]", True), ("stream", "TYPE_BOOL", "[ 1 ]", True),
              ("num_draft_tokens", "TYPE_INT32", "[ 1 ]", True)]
    # step_*: one entry per engine step the response covers (drafts verified = the chosen k unless the
    # drafter proposed fewer; accepted), so k is observable per step
    outputs = [("output_ids", "TYPE_INT32", "[ -1 ]"), ("step_draft_tokens", "TYPE_INT32", "[ -1 ]"),
               ("step_accepted_draft_tokens", "TYPE_INT32", "[ -1 ]"), ("total_draft_tokens", "TYPE_INT32", "[ 1 ]"),
               ("total_accepted_draft_tokens", "TYPE_INT32", "[ 1 ]"), ("acceptance_rate", "TYPE_FP32", "[ 1 ]")]
    ins = ",\n".join(f'  {{\n    name: "{n}"\n    data_type: {d}\n    dims: {dims}' + ("\n    optional: true" if o else "")
                     + "\n  }" for n, d, dims, o in inputs)
    outs = ",\n".join(f'  {{\n    name: "{n}"\n    data_type: {d}\n    dims: {dims}\n  }}' for n, d, dims in outputs)
    return "\n".join([
        'name: "specctl_bls"', 'backend: "python"', "max_batch_size: 0",
        "model_transaction_policy {\n  decoupled: true\n}", f"input [\n{ins}\n]", f"output [\n{outs}\n]",
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]", *[_param(k, v) for k, v in params],
    ]) + "\n"


def tensorrt_artifacts(recipe: Recipe, resolved: ResolvedProfile, fit: MemoryFit, version: str = PINNED) -> BuildArtifacts:
    from importlib import resources

    art = BuildArtifacts()
    spec = recipe.speculation
    art.steps.extend(engine_steps(recipe))
    plan = compile_build_plan(recipe, resolved)
    art.add("plan.yaml", plan.to_yaml())
    frac = recipe.memory.kv_cache_free_fraction
    two = spec.method == Method.draft_target
    launch = triton_launch(recipe.tp, two)
    gpus = launch.gpu_device_ids
    art.add("triton_repo/tensorrt_llm/config.pbtxt",
            tensorrt_llm_config("tensorrt_llm", "@OUT@/engines/target", recipe, round(frac * (TARGET_KV_SHARE if two else 1.0), 3),
                                draft_logits=spec.draft_logits, gpu_device_ids=gpus.get("tensorrt_llm")))
    if two:
        art.add("triton_repo/tensorrt_llm_draft/config.pbtxt",
                tensorrt_llm_config("tensorrt_llm_draft", "@OUT@/engines/draft", recipe, round(frac * DRAFT_KV_SHARE, 3),
                                    draft_logits=False, gpu_device_ids=gpus.get("tensorrt_llm_draft")))
    if spec.method in (Method.draft_target, Method.ngram):
        art.add("triton_repo/specctl_bls/config.pbtxt", bls_config(recipe, draft_model="tensorrt_llm_draft" if two else None))
        src = resources.files("control.executors.trtllm").joinpath("bls_model.py").read_text()
        art.add("triton_repo/specctl_bls/1/model.py", src)
    else:
        art.notes.append("EAGLE-1 engines draft inside the target engine: k is the engine's tree, so no BLS "
                         "orchestrator is generated; clients call tensorrt_llm directly")
    for sub in ("tensorrt_llm", "tensorrt_llm_draft"):  # Triton needs a version directory per model
        if f"triton_repo/{sub}/config.pbtxt" in art.files:
            art.add(f"triton_repo/{sub}/1/.keep", "")
    configs = " ".join(f'"$OUT/{p}"' for p in art.files if p.endswith(".pbtxt"))
    art.steps.append(Step("point the Triton model configs at this directory", [],
                          raw=f'sed -i "s|@OUT@|$OUT|g" {configs} "$OUT/plan.yaml"'))
    art.add("specctl.yaml", yaml.safe_dump({
        "schema": "specctl.deployment/v1", "sku": recipe.sku, "pair": recipe.pair, "backend": "tensorrt",
        "trtllm_version": version, "trtllm_line": "1.2", "method": spec.method.value,
        "control": "bls-per-step" if spec.method != Method.eagle else "engine",
        "plan": "plan.yaml", "profile": resolved.describe(), "memory_fit": fit.lines(),
        "launch": launch.to_dict(),
    }, sort_keys=False))
    art.add("build.sh", art.script(f"{recipe.sku}/{recipe.pair}: TensorRT-LLM {version} engines"))
    art.add("serve.sh", serve_script(launch, f"{recipe.sku}/{recipe.pair}"))
    if launch.mode != "tritonserver":
        art.notes.append(f"tp = {recipe.tp}: start Triton with serve.sh ({launch.describe()}), not a plain tritonserver")
    return art
