"""GPU SKUs and model shapes: the facts the roofline model, memory-fit checks and recipes share.

GPU figures are vendor datasheet values (dense, no sparsity); ``measured_*`` are ceilings measured on
our own hardware where we have them (DESIGN.md section 6), which the roofline prefers. Model shapes
are from each model's published ``config.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GpuSku:
    name: str
    arch: str  # ampere | ada | hopper | blackwell
    sm: int  # compute capability x 10
    memory_gb: float  # per GPU
    mem_bw_tbs: float  # HBM/GDDR bandwidth, TB/s
    bf16_tflops: float  # dense
    fp8_tflops: float | None  # dense; None where unsupported
    fp4_tflops: float | None  # dense nvfp4; Blackwell only
    interconnect_gbs: float  # per-GPU all-reduce bandwidth (NVLink, or PCIe)
    measured_bw_tbs: float | None = None  # device-to-device copy, bytes read + written
    measured_bf16_tflops: float | None = None  # large bf16 matmul
    # batch expansion's copies of a request: the share of their KV's HBM read time they pay, reading
    # it through L2 (benchmarks/verify_reread.py, FlashAttention's grid order; docs/validation.md)
    measured_reread_share: float | None = None

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops is not None

    @property
    def supports_nvfp4(self) -> bool:
        return self.fp4_tflops is not None


SKUS: dict[str, GpuSku] = {
    s.name: s
    for s in (
        GpuSku("h100", "hopper", 90, 80, 3.35, 989, 1979, None, 450, measured_bw_tbs=3.0, measured_bf16_tflops=800,
               measured_reread_share=0.36),
        GpuSku("h200", "hopper", 90, 141, 4.8, 989, 1979, None, 450, measured_reread_share=0.64),
        GpuSku("b200", "blackwell", 100, 180, 8.0, 2250, 4500, 9000, 900),
        GpuSku("a100", "ampere", 80, 80, 2.04, 312, None, None, 300),
        GpuSku("l40s", "ada", 89, 48, 0.864, 362, 733, None, 32),
        GpuSku("l4", "ada", 89, 24, 0.3, 121, 242.5, None, 32),
    )
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    rope_theta: float = 10000.0
    max_position: int = 4096
    kind: str = "llama"  # llama | eagle_head
    mtp_layers: int = 0  # multi-token-prediction modules (num_nextn_predict_layers); 0 = no MTP

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameter count (weights only)."""
        d, f, L = self.hidden, self.ffn, self.layers
        kv = self.kv_heads * self.head_dim
        attn = d * d * 2 + d * kv * 2  # q, o + k, v
        mlp = 3 * d * f
        norms = 2 * d
        emb = self.vocab * d * (1 if self.tied_embeddings else 2)
        extra = 2 * d * d if self.kind == "eagle_head" else 0  # EAGLE's fc fusing features with embeddings
        return L * (attn + mlp + norms) + emb + d + extra

    def kv_bytes_per_token(self, dtype_bytes: float = 2.0) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, rope_theta=500000.0, max_position=131072),
        ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, rope_theta=500000.0, max_position=131072),
        ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        # Vicuna v1.5 7B/13B are Llama-2 fine-tunes (same shapes); Vicuna-33B v1.3 is LLaMA-1 33B.
        ModelShape("vicuna-7b", 32, 4096, 32, 32, 11008, 32000),
        ModelShape("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
        ModelShape("vicuna-13b", 40, 5120, 40, 40, 13824, 32000),
        ModelShape("vicuna-33b", 60, 6656, 52, 52, 17920, 32000, max_position=2048),
        ModelShape("llama-68m", 2, 768, 12, 12, 3072, 32000, max_position=2048),
        ModelShape("llama-160m", 12, 768, 12, 12, 3072, 32000, max_position=2048),
        ModelShape("tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, max_position=2048),
        ModelShape("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, tied_embeddings=True, rope_theta=500000.0,
                   max_position=131072),
        # EAGLE3 head for Llama-3.1-8B: one decoder layer at the target's width; its own 32k draft vocab.
        ModelShape("eagle3-llama-3.1-8b", 1, 4096, 32, 8, 14336, 32000, rope_theta=500000.0, max_position=131072,
                   kind="eagle_head"),
        # EAGLE3 head for Llama-3.1/3.3-70B: one decoder layer at the target's width, 32k draft vocab.
        ModelShape("eagle3-llama-3.1-70b", 1, 8192, 64, 8, 28672, 32000, rope_theta=500000.0, max_position=131072,
                   kind="eagle_head"),
        # EAGLE-1 head for Llama-3.1-8B (the TensorRT engine path supports EAGLE-1 only): one layer, and
        # it predicts through the target's own vocabulary.
        ModelShape("eagle-llama-3.1-8b", 1, 4096, 32, 8, 14336, 128256, rope_theta=500000.0, max_position=131072,
                   kind="eagle_head"),
    )
}


def get_sku(name: str) -> GpuSku:
    key = name.lower()
    if key not in SKUS:
        raise ConfigError(f"unknown GPU SKU '{name}'; known: {', '.join(SKUS)} (and 'cpu' for the reference pair)")
    return SKUS[key]


def get_model(name: str) -> ModelShape:
    key = name.lower()
    if key not in MODELS:
        raise ConfigError(f"unknown model '{name}'; known shapes: {', '.join(MODELS)}")
    return MODELS[key]
