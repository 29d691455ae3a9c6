"""benchmarks/verify_reread.py's layouts and reference attention (the kernels need Triton and a GPU).

The three layouts must describe the same attention: batch expansion's copies of a request see its
context plus the draft tokens before them, whether their block tables share the request's blocks or
point at copies of them; otherwise the GPU's timings compare different work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("verify_reread", ROOT / "benchmarks" / "verify_reread.py")
vr = importlib.util.module_from_spec(_spec)
sys.modules["verify_reread"] = vr  # its dataclasses resolve their module
_spec.loader.exec_module(vr)


def test_copies_see_the_context_and_the_drafts_before_them():
    tables, lens, n_blocks = vr.expanded_tables(batch=3, ctx=37, copies=4, shared=True)
    assert lens.tolist() == [38, 39, 40, 41] * 3
    assert n_blocks == 3 * 3  # 41 tokens in blocks of 16
    assert tables.shape == (12, 3)
    assert torch.equal(tables[0], tables[3]) and not torch.equal(tables[0], tables[4])  # a request's copies share
    _, _, n_distinct = vr.expanded_tables(batch=3, ctx=37, copies=4, shared=False)
    assert n_distinct == 12 * 3


def test_shared_and_copied_blocks_give_the_same_attention():
    torch.manual_seed(0)
    t_shared, lens, n_shared = vr.expanded_tables(batch=2, ctx=21, copies=3, shared=True)
    t_own, lens_own, _ = vr.expanded_tables(batch=2, ctx=21, copies=3, shared=False)
    assert torch.equal(lens, lens_own)
    kc = torch.randn(n_shared, 2, vr.BLOCK_TOKENS, 8)
    vc = torch.randn_like(kc)
    # distinct layout: sequence s's own blocks hold a copy of its request's blocks
    src = t_shared.reshape(-1).long()
    kc_own, vc_own = kc[src], vc[src]
    assert torch.equal(t_own.reshape(-1).long(), torch.arange(src.numel()))
    q = torch.randn(6, 4, 8)
    a = vr.reference_attention(q, kc, vc, t_shared, lens)
    b = vr.reference_attention(q, kc_own, vc_own, t_own, lens)
    assert torch.allclose(a, b)


def test_reference_attention_is_softmax_attention_over_the_gathered_tokens():
    torch.manual_seed(1)
    tables, lens, n = vr.expanded_tables(batch=1, ctx=20, copies=2, shared=True)
    kc = torch.randn(n, 1, vr.BLOCK_TOKENS, 4)
    vc = torch.randn_like(kc)
    q = torch.randn(2, 2, 4)  # two query heads over one KV head
    got = vr.reference_attention(q, kc, vc, tables, lens)
    k = kc[tables[1].long()].reshape(-1, 4)[: int(lens[1])]
    v = vc[tables[1].long()].reshape(-1, 4)[: int(lens[1])]
    want = torch.softmax(q[1] @ k.T / 2.0, dim=-1) @ v
    assert torch.allclose(got[1], want, atol=1e-6)


def test_without_triton_or_a_gpu_it_says_what_it_needs():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_reread.py")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2
    assert "Triton" in r.stderr or "CUDA" in r.stderr


@pytest.mark.parametrize("sku", ["h100", "h200"])
def test_the_catalog_share_is_the_stored_measurement(sku):
    """Each SKU's measured_reread_share is the pooled fit of its run kept in profiles/<sku>/
    verify_reread.json (FlashAttention's grid order, bandwidth-bound cells); the share grows with the
    copies, which L2's bandwidth bounds."""
    import json

    from control.buildsys.catalog import get_sku

    rows = json.loads((ROOT / "profiles" / sku / "verify_reread.json").read_text())["reread"]
    share, cells = vr.reread_share(rows, "packed")
    assert cells >= 60 and abs(share - get_sku(sku).measured_reread_share) < 0.01
    by_k = [vr.reread_share(rows, "packed", k)[0] for k in (1, 3, 7)]
    assert by_k == sorted(by_k) and by_k[0] < by_k[2] < 0.7


def test_a_bad_grid_is_refused_by_name():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_reread.py"), "--ks", "1,x"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0 and "--ks '1,x'" in r.stderr and "positive integers" in r.stderr
