"""Memory-fit check: weights + KV cache at the recipe's batch and length + activation headroom vs the
SKU's memory per GPU. Figures are per GPU, in GB (1e9 bytes, as the vendors quote memory).

- Weights: parameters x bytes per parameter / tp. Quantized precisions (fp8, nvfp4) quantize the
  decoder layers; embeddings and the LM head stay bf16, as ModelOpt checkpoints keep them. nvfp4
  costs 4.5 bits per weight (4-bit values plus one fp8 scale per 16). The draft (or EAGLE head) is
  sharded like the target on the PyTorch backend; on TensorRT engines the draft engine is a
  separate tp = 1 engine, counted whole on GPU 0.
- KV cache: 2 x layers x kv_heads x head_dim x bytes per token, for max_batch x (max_seq_len +
  max_draft_len) tokens, sharded by tp (KV heads split across GPUs); fp8 KV with fp8/nvfp4
  precisions. Draft models and EAGLE heads keep their own KV cache; n-gram keeps none.
- Activations: fp32 logits for every token the verify pass scores (max_batch x (max_draft_len + 1)
  x vocab x 4) plus the MLP intermediates of one iteration (max_num_tokens x ffn x 3 x 2 / tp),
  plus ``memory.headroom_gb`` for the CUDA context, workspaces and CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.buildsys.catalog import ModelShape
from control.buildsys.recipe import Recipe
from control.buildsys.trtllm_rules import Method
from control.errors import ConfigError

GB = 1e9
BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 4.5 / 8}
EMBEDDING_BYTES = 2.0  # embeddings and lm_head stay 16-bit at every precision
LOGIT_BYTES = 4.0  # logits are fp32
ACTIVATION_BYTES = 2.0
MLP_INTERMEDIATES = 3  # gate, up and their product, each max_num_tokens x ffn
MAX_FITS_BATCH = 4096  # the largest batch size a fit reports


def _weights(shape: ModelShape, precision: str) -> float:
    emb = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    body = shape.params - emb
    return body * BYTES[precision] + emb * EMBEDDING_BYTES


@dataclass(frozen=True, slots=True)
class MemoryFit:
    sku: str
    memory_gb: float
    tp: int
    weights_gb: float
    draft_weights_gb: float
    kv_gb: float
    draft_kv_gb: float
    activations_gb: float
    headroom_gb: float
    max_batch: int
    max_seq_len: int
    fits_batch: int  # the largest max_batch that would fit (0 if not even 1)

    @property
    def total_gb(self) -> float:
        return (self.weights_gb + self.draft_weights_gb + self.kv_gb + self.draft_kv_gb + self.activations_gb
                + self.headroom_gb)

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.memory_gb

    def lines(self) -> list[str]:
        rows = [
            ("target weights", self.weights_gb),
            ("draft weights", self.draft_weights_gb),
            (f"target KV cache ({self.max_batch} x {self.max_seq_len} tokens)", self.kv_gb),
            ("draft KV cache", self.draft_kv_gb),
            ("activations (logits + MLP)", self.activations_gb),
            ("runtime headroom", self.headroom_gb),
        ]
        out = [f"memory per GPU on {self.sku} (tp={self.tp}):"]
        out += [f"  {name:<44} {gb:8.2f} GB" for name, gb in rows]
        verdict = "fits" if self.fits else "DOES NOT FIT"
        out.append(f"  {'total':<44} {self.total_gb:8.2f} GB of {self.memory_gb:.0f} GB "
                   f"({100 * self.total_gb / self.memory_gb:.0f}%): {verdict}")
        return out

    def summary(self) -> str:
        return (f"{self.total_gb:.1f} GB of {self.memory_gb:.0f} GB per GPU on {self.sku} (weights {self.weights_gb:.1f} + "
                f"draft {self.draft_weights_gb:.1f} + KV {self.kv_gb:.1f} + draft KV {self.draft_kv_gb:.1f} + activations "
                f"{self.activations_gb:.1f} + headroom {self.headroom_gb:.1f})")


def memory_fit(recipe: Recipe, backend: str = "pytorch", max_batch: int | None = None) -> MemoryFit:
    """The fit of ``recipe`` on its SKU (GPU SKUs only)."""
    if recipe.is_cpu:
        raise ConfigError("memory fit applies to GPU SKUs; the cpu reference pair is sized by its own build")
    gpu = recipe.gpu()
    tp = recipe.tp
    B = recipe.max_batch if max_batch is None else max_batch
    spec = recipe.speculation
    K = spec.max_draft_len
    target = recipe.target_shape()
    draft = recipe.draft_shape()
    prec = recipe.precision
    kv_bytes = BYTES["fp8"] if prec in ("fp8", "nvfp4") else BYTES["bf16"]
    tokens = B * (recipe.max_seq_len + K)
    weights = _weights(target, prec) / tp
    kv = target.kv_bytes_per_token(kv_bytes) * tokens / tp
    draft_w = draft_kv = 0.0
    if draft is not None and spec.method != Method.ngram:
        shard = 1 if backend == "tensorrt" and spec.method == Method.draft_target else tp
        draft_w = _weights(draft, prec) / shard
        draft_kv = draft.kv_bytes_per_token(kv_bytes) * tokens / shard
    logits = B * (K + 1) * target.vocab * LOGIT_BYTES
    mlp = recipe.max_num_tokens * target.ffn * MLP_INTERMEDIATES * ACTIVATION_BYTES / tp
    acts = logits + mlp
    fit = MemoryFit(
        sku=gpu.name, memory_gb=gpu.memory_gb, tp=tp, weights_gb=weights / GB, draft_weights_gb=draft_w / GB,
        kv_gb=kv / GB, draft_kv_gb=draft_kv / GB, activations_gb=acts / GB, headroom_gb=recipe.memory.headroom_gb,
        max_batch=B, max_seq_len=recipe.max_seq_len, fits_batch=0,
    )
    per_req = (fit.kv_gb + fit.draft_kv_gb + logits / GB) / B
    fixed = fit.total_gb - per_req * B
    fits_batch = max(int((gpu.memory_gb - fixed) // per_req), 0) if per_req > 0 else B
    return MemoryFit(**{**{f: getattr(fit, f) for f in fit.__dataclass_fields__}, "fits_batch": min(fits_batch, MAX_FITS_BATCH)})


def require_fit(recipe: Recipe, backend: str = "pytorch") -> MemoryFit:
    """``memory_fit`` that refuses, with the numbers and what would fit, when the recipe does not."""
    fit = memory_fit(recipe, backend)
    if not fit.fits:
        hint = (f"max_batch {fit.fits_batch} would fit at this length" if fit.fits_batch >= 1
                else "even batch 1 does not fit: raise tp, use fp8/nvfp4 where the SKU supports it, or a bigger SKU")
        raise ConfigError(f"recipe does not fit: {fit.summary()}; {hint}")
    return fit
