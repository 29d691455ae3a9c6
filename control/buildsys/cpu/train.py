"""Training loops of the CPU pair: the target as a language model, the drafts by distillation.

Deterministic for a seed: initialisation and batch sampling draw from local ``torch.Generator``s
(no global RNG state), and CPU kernels are deterministic for a fixed thread count. Matmuls run
under bf16 autocast when asked (master weights and optimiser state stay fp32; the saved
checkpoints are fp32). A CPU without native bf16 (no AVX-512 BF16 or AMX: an AVX2 EPYC) emulates
bf16 matmuls, which made the full target's training step 185 s against 8 s in fp32, so there the
recipe's autocast is turned off (``native_bf16``).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from control.buildsys.cpu.progress import Reporter
from control.buildsys.cpu.recipe import ModelSpec, TrainSpec
from control.executors.reference.model import LlamaConfig, LlamaForCausalLM


def make_config(spec: ModelSpec, vocab: int, max_position: int, bos: int, eos: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads or spec.heads,
        max_position_embeddings=max_position, tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=bos, eos_token_id=eos,
    )


def init_model(cfg: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """GPT-2 style init (std 0.02, residual projections scaled by 1/sqrt(2 L)) from a local generator."""
    g = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    resid_std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                std = resid_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.normal_(0.0, std, generator=g)
    return model


def lr_at(step: int, spec: TrainSpec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(spec.steps - spec.warmup, 1)
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.95), eps=1e-8)


def native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (oneDNN's check), so autocast pays."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: assume it does not
        return False


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


@dataclass
class TrainStats:
    steps: int
    tokens: int
    seconds: float
    cpu_seconds: float  # process CPU time: the wall time an idle machine would need, times the threads used
    first_loss: float
    final_loss: float  # mean over the last tenth of the steps
    bf16_autocast: bool = False  # matmuls ran under bf16 autocast

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "seconds": round(self.seconds, 2),
                "cpu_seconds": round(self.cpu_seconds, 2),
                "tokens_per_s": round(self.tokens_per_s, 1), "first_loss": round(self.first_loss, 4),
                "final_loss": round(self.final_loss, 4), "bf16_autocast": self.bf16_autocast}


def train_lm(model: LlamaForCausalLM, stream: torch.Tensor, spec: TrainSpec, seed: int, reporter: Reporter,
             bf16: bool = True, label: str = "target") -> TrainStats:
    """Next-token training on random windows of the token ``stream`` (1-D int64)."""
    if stream.numel() < spec.seq + 2:
        from control.errors import ConfigError

        raise ConfigError(f"the training corpus has {stream.numel()} tokens; {label} needs at least {spec.seq + 2}")
    g = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model, spec)
    model.train()
    offsets = torch.arange(spec.seq + 1)
    losses: list[float] = []
    reporter.phase(f"train {label}", spec.steps)
    t0 = time.perf_counter()
    c0 = time.process_time()
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        starts = torch.randint(0, stream.numel() - spec.seq - 1, (spec.batch,), generator=g)
        window = stream[starts[:, None] + offsets]
        with _autocast(bf16):
            logits = model.forward_train(window[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        dt = time.perf_counter() - t0
        reporter.advance(1, loss=losses[-1], tok_s=(step + 1) * spec.batch * spec.seq / dt)
    model.eval()
    tail = losses[-max(len(losses) // 10, 1):]
    return TrainStats(spec.steps, spec.steps * spec.batch * spec.seq, time.perf_counter() - t0,
                      time.process_time() - c0, losses[0], sum(tail) / len(tail), bf16)


@dataclass
class DistillData:
    """Sequences (N, L) and the teacher's top-k next-token distribution at positions 0..L-2."""

    tokens: torch.Tensor  # (N, L) int64
    topk_ids: torch.Tensor  # (N, L-1, K) int64
    topk_probs: torch.Tensor  # (N, L-1, K) float32


def distill(drafts: list[LlamaForCausalLM], data: DistillData, spec: TrainSpec, seed: int, reporter: Reporter,
            bf16: bool = True) -> list[TrainStats]:
    """Train each draft to match the teacher's distribution (cross-entropy against its top-k soft
    labels, renormalised) on the same batches of teacher-written sequences."""
    g = torch.Generator().manual_seed(seed)
    opts = [make_optimizer(d, spec) for d in drafts]
    for d in drafts:
        d.train()
    n = data.tokens.shape[0]
    losses: list[list[float]] = [[] for _ in drafts]
    times = [0.0 for _ in drafts]
    cpu = [0.0 for _ in drafts]
    reporter.phase("distill drafts", spec.steps)
    for step in range(spec.steps):
        rows = torch.randint(0, n, (min(spec.batch, n),), generator=g)
        x = data.tokens[rows, :-1]
        ids = data.topk_ids[rows]
        probs = data.topk_probs[rows]
        probs = probs / probs.sum(-1, keepdim=True)
        info = {}
        for i, (d, opt) in enumerate(zip(drafts, opts, strict=True)):
            ts, cs = time.perf_counter(), time.process_time()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, spec)
            with _autocast(bf16):
                logits = d.forward_train(x)
            logp = F.log_softmax(logits.float(), dim=-1)
            loss = -(probs * torch.gather(logp, -1, ids)).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
            opt.step()
            losses[i].append(loss.item())
            times[i] += time.perf_counter() - ts
            cpu[i] += time.process_time() - cs
            info[f"loss{i}"] = losses[i][-1]
        reporter.advance(1, **info)
    stats = []
    tokens = spec.steps * min(spec.batch, n) * (data.tokens.shape[1] - 1)
    for i, d in enumerate(drafts):
        d.eval()
        tail = losses[i][-max(len(losses[i]) // 10, 1):]
        stats.append(TrainStats(spec.steps, tokens, times[i], cpu[i], losses[i][0], sum(tail) / len(tail), bf16))
    return stats
