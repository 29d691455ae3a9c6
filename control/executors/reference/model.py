"""A Llama-architecture decoder in one file: RMSNorm, RoPE (theta and llama3/linear scaling), GQA,
SwiGLU, tied or untied embeddings; Hugging Face parameter names so checkpoints load as they are.

Two forward paths:
- ``forward_train(tokens)``: a dense (B, T) causal pass without a cache, for training.
- ``forward(batch, cache)``: packed variable-length decoding over a slot-indexed KV cache. Tokens of
  all requests are concatenated (no padding), so every matmul runs once over all of them; attention
  runs per request over that request's cache rows (a view, no gather copy). A request contributes
  ``length`` new tokens at positions start .. start + length - 1 (a prefill chunk, one decode token,
  or k + 1 verification tokens); their K/V are written to the cache and each new token attends to
  the cache up to and including itself.

The cache only stores tensors; which rows are valid (the request's length) is the caller's
business, so rolling back rejected draft tokens is just lowering that length.

Batch invariance (``model.batch_invariant``, on by default): a token's logits are bitwise the same
whether it is decoded alone, verified inside a block of k + 1 draft tokens, or packed with any other
requests. That is what makes greedy speculative decoding lossless by construction rather than up to
near-ties: without it, fp32 CPU kernels round differently for different batch shapes (MKL picks
other GEMM kernels for very few rows; vectorised element-wise loops compute the scalar tail of a
thread's chunk with a different exp; attention over a longer key range reduces in another order),
and any of these can flip a greedy argmax. So the forward
(1) pads the packed rows to a multiple of ``GEMM_ROWS`` and runs every matrix product of the
    target (the linear layers, both attention products) on ``GEMM_ROWS`` or ``GEMM_MAX_ROWS`` rows:
    MKL picks its fp32 GEMM kernel, and with two threads whether to split the reduction, from the
    shape, and which shapes agree differs between CPUs (on AVX2 any multiple of 4 rows agreed, on
    AVX-512 4 and 16 rows differ, and with a 1408-wide reduction on two threads 64 rows differ
    from 16 while 16 and 32 agree), so each weight sees only those two shapes; two threads then
    split every element-wise op (the SwiGLU exp) into chunks without a scalar tail when widths
    are multiples of 32;
(2) computes attention per request with explicit matmuls, the query at position p over keys
    0 .. round_up(p + 1, ``KEY_BLOCK``) - 1 (masked beyond p), a range that depends on p alone.
The padding costs compute at tiny batches (16 rows for 1) and the bounded shape a call per 32 rows.
``tests/executors/reference/test_invariance.py`` checks the property on 1 and 2 threads; other thread counts
are not verified. Drafts, whose outputs only propose tokens, may turn it off for speed (fused SDPA, no padding). On CUDA the same padding is applied but
cuBLAS makes no such promise: there greedy output can differ at a near-tie (bf16 makes ties likelier).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from control.errors import ConfigError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    architectures: list[str] = field(default_factory=lambda: ["LlamaForCausalLM"])
    model_type: str = "llama"
    torch_dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> LlamaConfig:
        arch = d.get("architectures") or [d.get("model_type", "?")]
        if not any(a in SUPPORTED_ARCHITECTURES for a in arch) or d.get("model_type", "llama") != "llama":
            raise ConfigError(
                f"{where}: architecture {arch} (model_type {d.get('model_type')!r}) is not supported; "
                f"the reference executor runs {', '.join(SUPPORTED_ARCHITECTURES)} checkpoints"
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in required if k not in d]
        if missing:
            raise ConfigError(f"{where}: missing {', '.join(missing)}")
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        cfg = cls(**kw)
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ConfigError(f"{where}: hidden_size {cfg.hidden_size} is not divisible by num_attention_heads {cfg.num_attention_heads}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(
                f"{where}: num_attention_heads {cfg.num_attention_heads} is not a multiple of num_key_value_heads {cfg.num_key_value_heads}"
            )
        rs = cfg.rope_scaling
        if rs is not None:
            kind = rs.get("rope_type", rs.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise ConfigError(f"{where}: rope_scaling type {kind!r} is not supported (supported: llama3, linear)")
        return cfg

    def to_dict(self) -> dict:
        return asdict(self)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies with the config's theta and scaling (HF's llama3 and linear rules)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    factor = float(rs.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_ctx = float(rs.get("original_max_position_embeddings", 8192))
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled)
    return inv


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (N, H, D) with rotate-half layout (HF's); cos/sin: (N, D/2)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@dataclass
class Segment:
    """One request's new tokens in a packed batch: cache slot, first position, token count."""

    slot: int
    start: int
    length: int


GEMM_ROWS = 16  # batch-invariant mode: rows are padded to a multiple of this many
GEMM_MAX_ROWS = 2 * GEMM_ROWS  # batch-invariant mode: every matmul takes GEMM_ROWS or GEMM_MAX_ROWS rows
KEY_BLOCK = 64  # attention key ranges are padded to a multiple of this (batch-invariant mode)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _linear(layer: nn.Linear, x: torch.Tensor, invariant: bool) -> torch.Tensor:
    """``layer(x)``; batch-invariant: ``x`` (M, in) with M a multiple of GEMM_ROWS, at most GEMM_MAX_ROWS per product."""
    if not invariant or x.shape[0] <= GEMM_MAX_ROWS:
        return layer(x)
    return torch.cat([F.linear(rows, layer.weight) for rows in x.split(GEMM_MAX_ROWS)])


def _matmul_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for a (B, M, K), b (B, K, N), M a multiple of GEMM_ROWS, at most GEMM_MAX_ROWS per product."""
    if a.shape[1] <= GEMM_MAX_ROWS:
        return torch.matmul(a, b)
    return torch.cat([torch.matmul(rows, b) for rows in a.split(GEMM_MAX_ROWS, dim=1)], dim=1)


class KVCache:
    """Per-layer K and V tensors of shape (slots, kv_heads, storage, head_dim). Storage only.

    ``max_len`` is the usable length; the storage is rounded up to a multiple of ``KEY_BLOCK`` so
    the batch-invariant attention can read padded key ranges (the padding is always masked).
    """

    def __init__(self, cfg: LlamaConfig, slots: int, max_len: int, device="cpu", dtype=torch.float32) -> None:
        shape = (slots, cfg.num_key_value_heads, _round_up(max_len, KEY_BLOCK), cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.slots = slots
        self.max_len = max_len

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def _qkv(self, x, cos, sin, invariant: bool = False):
        n = x.shape[0]
        q = apply_rope(_linear(self.q_proj, x, invariant).view(n, self.h, self.d), cos, sin)
        k = apply_rope(_linear(self.k_proj, x, invariant).view(n, self.hkv, self.d), cos, sin)
        v = _linear(self.v_proj, x, invariant).view(n, self.hkv, self.d)
        return q, k, v

    def forward_train(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self._qkv(x.reshape(B * T, -1), cos.repeat(B, 1), sin.repeat(B, 1))
        q = q.view(B, T, self.h, self.d).transpose(1, 2)
        k = k.view(B, T, self.hkv, self.d).transpose(1, 2)
        v = v.view(B, T, self.hkv, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.hkv != self.h)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))

    def forward(self, x, cos, sin, segments: list[Segment], kc: torch.Tensor, vc: torch.Tensor,
                invariant: bool = False, tri: torch.Tensor | None = None,
                window: tuple[int, int] | None = None) -> torch.Tensor:
        """Rows of ``x`` beyond the segments' tokens are padding: their output is zero."""
        q, k, v = self._qkv(x, cos, sin, invariant)
        out = torch.zeros_like(q) if invariant else torch.empty_like(q)
        off = 0
        for seg in segments:
            t = seg.length
            end = seg.start + t
            kc[seg.slot, :, seg.start:end] = k[off:off + t].transpose(0, 1)
            vc[seg.slot, :, seg.start:end] = v[off:off + t].transpose(0, 1)
            qs = q[off:off + t].transpose(0, 1)  # (H, t, D)
            if invariant:
                o = self._attend_invariant(qs, seg.slot, seg.start, end, kc, vc, tri)
            elif window is not None and end > window[0] + window[1]:
                sink, recent = window  # StreamingLLM: the first ``sink`` keys and the last ``recent``
                ks = torch.cat([kc[seg.slot, :, :sink], kc[seg.slot, :, end - recent:end]], dim=1)
                vs = torch.cat([vc[seg.slot, :, :sink], vc[seg.slot, :, end - recent:end]], dim=1)
                o = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=self.hkv != self.h)
            elif t == 1:
                o = F.scaled_dot_product_attention(qs, kc[seg.slot, :, :end], vc[seg.slot, :, :end],
                                                   enable_gqa=self.hkv != self.h)
            else:
                o = F.scaled_dot_product_attention(qs, kc[seg.slot, :, :end], vc[seg.slot, :, :end],
                                                   attn_mask=tri[seg.start:end, :end].logical_not(),
                                                   enable_gqa=self.hkv != self.h)
            out[off:off + t] = o.transpose(0, 1)
            off += t
        return _linear(self.o_proj, out.reshape(x.shape[0], -1), invariant)

    def _attend_invariant(self, qs, slot: int, start: int, end: int, kc, vc, tri) -> torch.Tensor:
        """Causal attention of queries at positions start..end-1 whose every output row is bitwise
        independent of how many queries are computed together.

        The query at position p attends over keys 0 .. round_up(p + 1, KEY_BLOCK) - 1 (the tail is
        masked), a range that depends on p alone, so its matmuls reduce in the same order whether
        it is decoded alone or verified in a block; a block that crosses a KEY_BLOCK boundary is
        computed in one group per key range. Each group's queries are padded to a multiple of
        GEMM_ROWS and multiplied at most GEMM_MAX_ROWS rows at a time, so the kernel never changes.
        """
        h, hkv, d = self.h, self.hkv, self.d
        g = h // hkv
        t = qs.shape[1]
        out = []
        r0 = 0
        while r0 < t:
            keys = _round_up(start + r0 + 1, KEY_BLOCK)
            r1 = min(t, keys - start)  # rows whose key range is ``keys``
            n = r1 - r0
            rows = _round_up(n, GEMM_ROWS)
            qg = qs[:, r0:r1]
            if rows > n:
                qg = torch.cat([qg, qg.new_zeros(h, rows - n, d)], dim=1)
            scores = _matmul_rows(qg.reshape(hkv, g * rows, d), kc[slot, :, :keys].transpose(1, 2))
            scores = scores.view(h, rows, keys).mul_(d ** -0.5)
            scores.masked_fill_(tri[start + r0:start + r0 + rows, :keys], float("-inf"))
            p = torch.softmax(scores, dim=-1)
            o = _matmul_rows(p.view(hkv, g * rows, keys), vc[slot, :, :keys]).view(h, rows, d)
            out.append(o[:, :n])
            r0 = r1
        return out[0] if len(out) == 1 else torch.cat(out, dim=1)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        gate, up = _linear(self.gate_proj, x, invariant), _linear(self.up_proj, x, invariant)
        return _linear(self.down_proj, F.silu(gate) * up, invariant)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tri: torch.Tensor | None = None  # tri[i, j] = key j is after query i (masked)
        self.batch_invariant = True

    def _rope(self, positions: torch.Tensor):
        need = int(positions.max()) + 1 if positions.numel() else 1
        if self._rope_cache is None or self._rope_cache[0].shape[0] < need or self._rope_cache[0].device != positions.device:
            n = max(need, self.config.max_position_embeddings, 2 * (self._rope_cache[0].shape[0] if self._rope_cache else 0))
            t = torch.arange(n, device=positions.device, dtype=torch.float64)
            freqs = torch.outer(t, self.inv_freq.to(positions.device, torch.float64))
            dtype = self.lm_head.weight.dtype
            self._rope_cache = (freqs.cos().to(dtype), freqs.sin().to(dtype))
        cos, sin = self._rope_cache
        return cos[positions], sin[positions]

    def num_parameters(self) -> int:
        seen, total = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

    def forward_train(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) of a dense causal pass; no cache."""
        B, T = tokens.shape
        cos, sin = self._rope(torch.arange(T, device=tokens.device))
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = h + layer.self_attn.forward_train(layer.input_layernorm(h), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.model.norm(h))

    def _causal_mask(self, n: int, device) -> torch.Tensor:
        if self._tri is None or self._tri.shape[0] < n or self._tri.device != torch.device(device):
            n = _round_up(max(n, 2 * (self._tri.shape[0] if self._tri is not None else 0)), KEY_BLOCK)
            self._tri = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
        return self._tri

    def forward(self, input_ids: torch.Tensor, segments: list[Segment], cache: KVCache,
                logits_at: torch.Tensor | None = None, window: tuple[int, int] | None = None) -> torch.Tensor:
        """Packed decoding pass. ``input_ids``: (N,) tokens of all segments concatenated.

        Returns logits (N, vocab), or only at the packed indices ``logits_at`` (saves the vocab
        projection for prefill tokens whose logits nobody needs). ``window = (sink, recent)``
        restricts attention to the first ``sink`` and the last ``recent`` positions (a StreamingLLM
        KV budget, for self-speculation as in MagicDec); one-token segments only, never invariant.
        """
        for s in segments:
            if s.start + s.length > cache.max_len:
                raise ConfigError(f"sequence of {s.start + s.length} tokens exceeds the KV cache's {cache.max_len} positions")
            if window is not None and s.length != 1:
                raise ValueError("a sink+window forward takes one-token segments only")
        n = input_ids.shape[0]
        starts = torch.tensor([s.start for s in segments], dtype=torch.long)
        lengths = torch.tensor([s.length for s in segments], dtype=torch.long)
        offsets = torch.cumsum(lengths, 0) - lengths
        positions = (torch.arange(n) - torch.repeat_interleave(offsets - starts, lengths)).to(input_ids.device)
        invariant = self.batch_invariant and window is None
        pad = _round_up(max(n, 1), GEMM_ROWS) - n if invariant else 0
        if pad:
            positions = torch.cat([positions, positions.new_zeros(pad)])
        cos, sin = self._rope(positions)
        h = self.model.embed_tokens(input_ids)
        if pad:
            h = torch.cat([h, h.new_zeros(pad, h.shape[1])])
        tri = self._causal_mask(cache.k[0].shape[2] + GEMM_ROWS, input_ids.device)
        for i, layer in enumerate(self.model.layers):
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, segments, cache.k[i], cache.v[i], invariant, tri,
                                    window)
            h = h + layer.mlp(layer.post_attention_layernorm(h), invariant)
        h = self.model.norm(h)
        h = h[logits_at] if logits_at is not None else h[:n]
        m = h.shape[0]
        if invariant:
            padded = torch.cat([h, h.new_zeros(_round_up(m, GEMM_ROWS) - m, h.shape[1])]) if m % GEMM_ROWS else h
            return _linear(self.lm_head, padded, True)[:m]
        return self.lm_head(h)


def save_pretrained(model: LlamaForCausalLM, out_dir: str | Path, extra_config: dict | None = None) -> Path:
    """Write config.json and model.safetensors in Hugging Face layout."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg.update(extra_config or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def load_pretrained(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype | None = None) -> LlamaForCausalLM:
    """Load a Hugging Face layout checkpoint (config.json + *.safetensors, sharded or not)."""
    from safetensors.torch import load_file

    d = Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"'{d}' has no config.json; expected a Hugging Face model directory (config.json, *.safetensors)")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    cfg = LlamaConfig.from_dict(raw, where=str(cfg_path))
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"'{d}' has no *.safetensors weights (only safetensors checkpoints are supported)")
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f), device="cpu"))
    if cfg.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    expected = set(model.state_dict().keys())
    missing = sorted(expected - set(state))
    unexpected = sorted(k for k in set(state) - expected if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise ConfigError(
            f"'{d}': weights do not match a {cfg.num_hidden_layers}-layer Llama "
            f"(missing: {missing[:3]}{'...' if len(missing) > 3 else ''}; unexpected: {unexpected[:3]}{'...' if len(unexpected) > 3 else ''})"
        )
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [k for k in sorted(expected) if tuple(state[k].shape) != shapes[k]]
    if wrong:
        k = wrong[0]
        raise ConfigError(f"'{d}': weight {k} has shape {tuple(state[k].shape)} but config.json implies {shapes[k]} "
                          "(do the weights belong to this config?)")
    model.load_state_dict({k: state[k] for k in expected}, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg).float()
    return model.to(device=device, dtype=dtype).eval()
