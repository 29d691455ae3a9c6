"""What a verification pass costs on a real GPU where the roofline only has ceilings (docs/validation.md).

Two measurements behind the crossovers of TurboSpec Tables 4-5 (issue 21 item 1):

1. **KV re-reads under batch expansion.** vLLM's batch-expansion scorer turns a request verifying
   k + 1 tokens into k + 1 sequences whose block tables point at the request's KV blocks, and its
   paged-attention kernel runs one thread block per (head, sequence), heads fastest, so a request's
   copies run close together. The roofline charges every copy a full read of its KV from HBM; the
   copies may hit L2 instead. A paged decode-attention kernel (Triton; blocks of 16 tokens; the same
   grid order) is timed on three layouts of the same queries:

   - ``plain``: B sequences, one per request (no speculation);
   - ``shared``: B (k + 1) sequences, the copies of a request pointing at its blocks (batch expansion);
   - ``distinct``: B (k + 1) sequences with a block copy each (what the roofline charges).

   ``paid = (shared - plain) / (distinct - plain)``: the share of the re-reads' HBM time a GPU pays.
2. **GEMMs at N tokens.** One decoder layer's four weight GEMMs (qkv, o, gate + up, down; split for
   tensor parallelism) at N = batch x (k + 1) tokens, against the roofline's
   max(bytes / bandwidth, FLOPs / compute) at its H100 ceilings.

    python benchmarks/verify_reread.py --device cuda [--quick] [--json OUT]

Needs a CUDA GPU and Triton (``--device cpu`` with ``TRITON_INTERPRET=1`` runs the kernel check only).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from control.buildsys.catalog import MODELS, SKUS

BLOCK_TOKENS = 16  # vLLM's default KV block size
TILE_TOKENS = 64  # tokens a kernel iteration reads (4 blocks)
BOUND_TBS = 2.0  # a distinct-layout cell at this HBM rate or more is bandwidth-bound
MAX_KERNEL_ERROR = 0.05  # bf16 inputs, float32 accumulation
MIN_DOT_ROWS = 16  # tl.dot's smallest operand side: a KV head's query rows are padded to it


@dataclass(frozen=True)
class Shape:
    """One layer of a model on one GPU (heads split by tensor parallelism)."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    ffn: int
    tp: int

    @classmethod
    def of(cls, model: str, tp: int) -> Shape:
        s = MODELS[model]
        return cls(f"{model}/tp{tp}", s.heads // tp, max(1, s.kv_heads // tp), s.head_dim, s.hidden, s.ffn, tp)


SHAPES = [("vicuna-7b", 1), ("vicuna-13b", 1), ("vicuna-33b", 2), ("llama-3.1-70b", 4), ("llama-3.1-8b", 1)]


def expanded_tables(batch: int, ctx: int, copies: int, shared: bool):
    """Block tables and lengths for ``batch`` requests of ``ctx`` tokens, each verified as ``copies`` sequences.

    Copy j of a request attends to ctx + j tokens (the context and the draft tokens before it).
    Returns (tables [batch * copies, max_blocks] int32, lens [batch * copies] int32, blocks used).
    ``shared``: a request's copies use its blocks (batch expansion); else each copy has its own.
    """
    max_blocks = -(-(ctx + copies) // BLOCK_TOKENS)
    seqs = batch * copies
    req = torch.arange(seqs) // copies
    owner = req if shared else torch.arange(seqs)
    tables = (owner[:, None] * max_blocks + torch.arange(max_blocks)[None, :]).to(torch.int32)
    lens = (ctx + 1 + torch.arange(seqs) % copies).to(torch.int32)
    n_blocks = (batch if shared else seqs) * max_blocks
    return tables, lens, n_blocks


def reference_attention(q, k_cache, v_cache, tables, lens):
    """Decode attention, one query per (sequence, head), by gathering each sequence's blocks.

    q [S, H, D]; k_cache, v_cache [blocks, KVH, BLOCK_TOKENS, D]; tables [S, max_blocks]; lens [S].
    Returns [S, H, D] in float32.
    """
    S, H, D = q.shape
    group = H // k_cache.shape[1]
    out = torch.empty(S, H, D, dtype=torch.float32, device=q.device)
    for s in range(S):
        n = int(lens[s])
        blk = tables[s, : -(-n // BLOCK_TOKENS)].long()
        k = k_cache[blk].permute(1, 0, 2, 3).reshape(k_cache.shape[1], -1, D)[:, :n].float()  # [KVH, n, D]
        v = v_cache[blk].permute(1, 0, 2, 3).reshape(v_cache.shape[1], -1, D)[:, :n].float()
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [H, n, D]
        w = torch.softmax(torch.einsum("hd,hnd->hn", q[s].float(), k) / D**0.5, dim=-1)
        out[s] = torch.einsum("hn,hnd->hd", w, v)
    return out


def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(q, kc, vc, tables, lens, out, scale, table_stride,
                     HEADS: tl.constexpr, GROUP: tl.constexpr, KV_HEADS: tl.constexpr,
                     DIM: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr):
        head = tl.program_id(0)  # heads fastest, as vLLM's paged_attention grid (heads, sequences)
        seq = tl.program_id(1)
        kvh = head // GROUP
        n = tl.load(lens + seq)
        d = tl.arange(0, DIM)
        t = tl.arange(0, TILE)
        qv = tl.load(q + (seq * HEADS + head) * DIM + d).to(tl.float32) * scale
        m_i = tl.full([1], float("-inf"), tl.float32)
        l_i = tl.zeros([1], tl.float32)
        acc = tl.zeros([DIM], tl.float32)
        for start in range(0, n, TILE):
            pos = start + t
            live = pos < n
            phys = tl.load(tables + seq * table_stride + pos // BLOCK, mask=live, other=0).to(tl.int64)
            off = ((phys * KV_HEADS + kvh) * BLOCK + pos % BLOCK)[:, None] * DIM + d[None, :]
            k = tl.load(kc + off, mask=live[:, None], other=0.0).to(tl.float32)
            s = tl.where(live, tl.sum(k * qv[None, :], 1), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m_i - m_new)
            v = tl.load(vc + off, mask=live[:, None], other=0.0).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            m_i = m_new
        tl.store(out + (seq * HEADS + head) * DIM + d, (acc / l_i).to(out.dtype.element_ty))

    @triton.jit
    def packed_decode(q, kc, vc, tables, lens, out, scale, table_stride,
                      HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, KV_HEADS: tl.constexpr,
                      DIM: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr, DOT: tl.constexpr):
        seq = tl.program_id(0)  # sequences fastest, as FlashAttention's grid (batch before heads)
        kvh = tl.program_id(1)
        n = tl.load(lens + seq)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM)
        t = tl.arange(0, TILE)
        qh = kvh * GROUP + g  # the query heads sharing this KV head, one matrix row each
        rows = g < GROUP
        qv = tl.load(q + (seq * HEADS + qh)[:, None] * DIM + d[None, :], mask=rows[:, None], other=0.0)
        qv = (qv.to(tl.float32) * scale).to(DOT)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
        for start in range(0, n, TILE):
            pos = start + t
            live = pos < n
            phys = tl.load(tables + seq * table_stride + pos // BLOCK, mask=live, other=0).to(tl.int64)
            off = ((phys * KV_HEADS + kvh) * BLOCK + pos % BLOCK)[:, None] * DIM + d[None, :]
            k = tl.load(kc + off, mask=live[:, None], other=0.0).to(DOT)
            s = tl.where(live[None, :], tl.dot(qv, tl.trans(k)), float("-inf"))  # [GROUP_PAD, TILE]
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(vc + off, mask=live[:, None], other=0.0).to(DOT)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v)
            m_i = m_new
        tl.store(out + (seq * HEADS + qh)[:, None] * DIM + d[None, :], (acc / l_i[:, None]).to(out.dtype.element_ty),
                 mask=rows[:, None])

    def per_head(q, k_cache, v_cache, tables, lens):
        S, H, D = q.shape
        kvh = k_cache.shape[1]
        out = torch.empty_like(q)
        paged_decode[(H, S)](q, k_cache, v_cache, tables, lens, out, D**-0.5, tables.stride(0),
                             HEADS=H, GROUP=H // kvh, KV_HEADS=kvh, DIM=D, BLOCK=BLOCK_TOKENS, TILE=TILE_TOKENS)
        return out

    def packed(q, k_cache, v_cache, tables, lens):
        S, H, D = q.shape
        kvh = k_cache.shape[1]
        out = torch.empty_like(q)
        pad = max(MIN_DOT_ROWS, triton.next_power_of_2(H // kvh))
        packed_decode[(S, kvh)](q, k_cache, v_cache, tables, lens, out, D**-0.5, tables.stride(0),
                                HEADS=H, GROUP=H // kvh, GROUP_PAD=pad, KV_HEADS=kvh, DIM=D, BLOCK=BLOCK_TOKENS,
                                TILE=TILE_TOKENS, DOT=tl.bfloat16 if q.is_cuda else tl.float32)
        return out

    return {"per-head": per_head, "packed": packed}, triton


def check_kernel(attend, device: str) -> float:
    """Max abs error of a kernel against the reference on a small GQA case, shared and distinct."""
    torch.manual_seed(0)
    worst = 0.0
    for shared in (True, False):
        tables, lens, n_blocks = expanded_tables(3, 37, 4, shared)
        q = torch.randn(12, 8, 64, device=device, dtype=torch.bfloat16)
        kc = torch.randn(n_blocks, 2, BLOCK_TOKENS, 64, device=device, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        tables, lens = tables.to(device), lens.to(device)
        got = attend(q, kc, vc, tables, lens).float()
        want = reference_attention(q, kc, vc, tables, lens)
        worst = max(worst, float((got - want).abs().max()))
    return worst


def _bench_ms(fn, triton) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=40))  # flushes L2 between runs


def reread_rows(kernels, triton, shapes, batches, ctxs, ks, device="cuda"):
    """One row per (kernel, shape, context, batch, k): the three layouts' times and the share paid."""
    rows = []
    for (kname, attend), sh, ctx, b in itertools.product(kernels.items(), shapes, ctxs, batches):
        plain = _attn_ms(attend, triton, sh, b, ctx, 1, True, device)
        for k in ks:
            shared = _attn_ms(attend, triton, sh, b, ctx, k + 1, True, device)
            distinct = _attn_ms(attend, triton, sh, b, ctx, k + 1, False, device)
            extra = distinct["ms"] - plain["ms"]
            paid = (shared["ms"] - plain["ms"]) / extra if extra > 0 else float("nan")
            rows.append(dict(kernel=kname, shape=sh.name, ctx=ctx, batch=b, k=k, plain_ms=plain["ms"],
                             shared_ms=shared["ms"], distinct_ms=distinct["ms"], paid=paid,
                             plain_tbs=plain["tbs"], distinct_tbs=distinct["tbs"]))
            print(f"  {kname} {sh.name} ctx {ctx} batch {b} k {k}: plain {plain['ms']:.3f} "
                  f"shared {shared['ms']:.3f} distinct {distinct['ms']:.3f} ms, paid {paid:.2f}, "
                  f"HBM {distinct['tbs']:.2f} TB/s", flush=True)
    return rows


def reread_share(rows, kernel: str, k: int | None = None) -> tuple[float, int]:
    """Least-squares share of the re-reads' HBM time paid, over ``kernel``'s bandwidth-bound cells
    (distinct layout at >= ``BOUND_TBS``), all k or one: (share, cells). Weighted by time, as a pass is."""
    cells = [r for r in rows if r["kernel"] == kernel and r["distinct_tbs"] >= BOUND_TBS and k in (None, r["k"])]
    extra = torch.tensor([r["distinct_ms"] - r["plain_ms"] for r in cells], dtype=torch.float64)
    paid = torch.tensor([r["shared_ms"] - r["plain_ms"] for r in cells], dtype=torch.float64)
    return (float(extra @ paid / (extra @ extra)) if cells else float("nan")), len(cells)


def _attn_ms(attend, triton, sh: Shape, batch: int, ctx: int, copies: int, shared: bool, dev: str) -> dict:
    tables, lens, n_blocks = expanded_tables(batch, ctx, copies, shared)
    q = torch.randn(batch * copies, sh.heads, sh.head_dim, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(n_blocks, sh.kv_heads, BLOCK_TOKENS, sh.head_dim, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    tables, lens = tables.to(dev), lens.to(dev)
    ms = _bench_ms(partial(attend, q, kc, vc, tables, lens), triton)
    read = float(lens.sum()) * sh.kv_heads * sh.head_dim * 2 * 2  # K and V, bf16, once per (sequence, KV head)
    del q, kc, vc
    torch.cuda.empty_cache()
    return {"ms": ms, "tbs": read / ms / 1e9}


def _layer_gemms(xs, ws):
    return [torch.mm(x, w) for x, w in zip(xs, ws, strict=True)]


def gemm_rows(triton, shapes, tokens, dev="cuda"):
    h100 = SKUS["h100"]  # the roofline's measured H100 ceilings (control/buildsys/roofline.py, Ceilings)
    bw, flops = h100.measured_bw_tbs * 1e12, h100.measured_bf16_tflops * 1e12
    rows = []
    for sh in shapes:
        qkv = (sh.heads + 2 * sh.kv_heads) * sh.head_dim
        mats = [(sh.hidden, qkv), (sh.heads * sh.head_dim, sh.hidden), (sh.hidden, 2 * sh.ffn // sh.tp),
                (sh.ffn // sh.tp, sh.hidden)]
        ws = [torch.randn(i, o, device=dev, dtype=torch.bfloat16) for i, o in mats]
        for n in tokens:
            xs = [torch.randn(n, i, device=dev, dtype=torch.bfloat16) for i, _ in mats]
            ms = _bench_ms(partial(_layer_gemms, xs, ws), triton)
            roof = sum(max((i * o + n * (i + o)) * 2 / bw, 2 * n * i * o / flops)
                       for i, o in mats) * 1e3
            rows.append(dict(shape=sh.name, tokens=n, ms=ms, roofline_ms=roof, ratio=ms / roof))
            print(f"  {sh.name} N {n}: {ms:.4f} ms, roofline {roof:.4f} ms, x{ms / roof:.2f}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"error: {flag} {text!r}: expected comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise SystemExit(f"error: {flag} {text!r}: expected comma-separated positive integers")
    return values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda: the measurements; cpu: the kernel check only (needs TRITON_INTERPRET=1)")
    ap.add_argument("--quick", action="store_true", help="a small grid (a minute)")
    ap.add_argument("--batches", help="comma-separated batch sizes (default 16,64,128)")
    ap.add_argument("--ctxs", help="comma-separated context lengths (default 350,1024)")
    ap.add_argument("--ks", help="comma-separated draft lengths (default 1,3,7)")
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM sweep")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args(argv)
    grid = dict(batches=[16, 64], ctxs=[350], ks=[1, 3, 7]) if args.quick else \
        dict(batches=[16, 64, 128], ctxs=[350, 1024], ks=[1, 3, 7])
    for name in ("batches", "ctxs", "ks"):
        if getattr(args, name):
            grid[name] = _int_list(getattr(args, name), f"--{name}")
    tokens = [1, 16, 64, 128, 256, 512, 1024] if args.quick else \
        [1, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096]
    try:
        kernels, triton = _triton_kernel()
    except ImportError as exc:
        print(f"error: this benchmark needs Triton ({exc}); run it on a CUDA host with torch's Triton", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA GPU; use a GPU host", file=sys.stderr)
        return 2
    for name, attend in kernels.items():
        err = check_kernel(attend, args.device)
        print(f"{name} kernel vs reference: max abs error {err:.4f}", flush=True)
        if err > MAX_KERNEL_ERROR:
            print(f"error: the {name} kernel disagrees with the reference attention", file=sys.stderr)
            return 1
    if args.device == "cpu":
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    shapes = [Shape.of(m, tp) for m, tp in SHAPES]
    t0 = time.perf_counter()
    print("KV re-reads (attention, one layer):", flush=True)
    rr = reread_rows(kernels, triton, shapes, **grid)
    gm = []
    if not args.no_gemm:
        print("GEMMs (one layer):", flush=True)
        gm = gemm_rows(triton, shapes, tokens)
    print(f"done in {time.perf_counter() - t0:.0f} s\nShare of the re-reads' HBM time paid (cells at >= {BOUND_TBS} TB/s):")
    for name in kernels:
        by_k = ", ".join("k {} {:.2f} ({} cells)".format(k, *reread_share(rr, name, k)) for k in grid["ks"])
        print("  {}: {:.2f} over {} cells; {}".format(name, *reread_share(rr, name), by_k))
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "reread": rr, "gemm": gm,
                                         "shapes": [asdict(s) for s in shapes]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
