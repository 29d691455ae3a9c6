"""The tensorrtllm backend's request semantics on top of the reference Llama model, greedy.

It stands in for a ``tensorrt_llm`` / ``tensorrt_llm_draft`` engine where TensorRT-LLM cannot run:
the same input and output tensors (``tensors``), the same answers for greedy decoding:

- no ``draft_input_ids``: generate ``request_output_len`` tokens (stop after ``end_id``);
- with ``draft_input_ids``: one pass over the sequence plus the drafts, accept the longest draft
  prefix the model agrees with, and answer it plus the model's own next token (``verify_output``
  "accepted"); or, with "all", go on decoding until ``request_output_len`` = k + 1 tokens (or
  ``end_id``), the shape the stock BLS's ``_spec_generate`` consumes. Callers must read both.

Every request is independent (the whole sequence is resent each step, as with the real engines,
which reuse its KV cache; here it is recomputed).
"""

from __future__ import annotations

import numpy as np
import torch

from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.executors.trtllm.tensors import check_request

# What a verify request answers: the accepted prefix plus one token, or all request_output_len tokens.
VERIFY_OUTPUTS = ("accepted", "all")


class ReferenceTrtllmModel:
    """A greedy tensorrtllm-semantics model over a reference ``LlamaForCausalLM``."""

    def __init__(self, model: LlamaForCausalLM, verify_output: str = "accepted") -> None:
        if verify_output not in VERIFY_OUTPUTS:
            raise ValueError(f"verify_output {verify_output!r}: use one of {', '.join(VERIFY_OUTPUTS)}")
        self.verify_output = verify_output
        self.model = model.eval()
        self.dtype = next(model.parameters()).dtype
        self.calls = 0

    @torch.no_grad()
    def _greedy(self, ids: np.ndarray, n: int, end_id: int | None) -> np.ndarray:
        cache = KVCache(self.model.config, 1, ids.size + n + 1, dtype=self.dtype)
        x = torch.as_tensor(ids, dtype=torch.long)
        logits = self.model(x, [Segment(0, 0, ids.size)], cache, logits_at=torch.tensor([ids.size - 1]))
        out = []
        pos = ids.size
        for _ in range(n):
            tok = int(logits[-1].argmax())
            out.append(tok)
            if end_id is not None and tok == end_id:
                break
            logits = self.model(torch.tensor([tok]), [Segment(0, pos, 1)], cache)
            pos += 1
        return np.asarray(out, dtype=np.int64)

    @torch.no_grad()
    def _verify(self, ids: np.ndarray, draft: np.ndarray, end_id: int | None) -> np.ndarray:
        seq = np.concatenate([ids, draft])
        cache = KVCache(self.model.config, 1, seq.size + 1, dtype=self.dtype)
        at = torch.arange(ids.size - 1, seq.size)
        pred = self.model(torch.as_tensor(seq, dtype=torch.long), [Segment(0, 0, seq.size)], cache,
                          logits_at=at).argmax(-1).numpy()
        ok = pred[: draft.size] == draft
        a = int(np.argmin(np.append(ok, False)))
        out = pred[: a + 1].astype(np.int64)
        if end_id is not None:
            hit = np.flatnonzero(out == end_id)
            if hit.size:
                out = out[: hit[0] + 1]
        return out

    def __call__(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, out_len, draft, end_id = check_request(req)
        self.calls += 1
        if draft.size:
            if out_len != draft.size + 1:
                raise ValueError(f"request_output_len {out_len} with {draft.size} draft tokens: expected {draft.size + 1}")
            toks = self._verify(ids, draft, end_id)
            if self.verify_output == "all" and toks.size < out_len and (end_id is None or toks[-1] != end_id):
                toks = np.concatenate([toks, self._greedy(np.concatenate([ids, toks]), out_len - toks.size, end_id)])
        else:
            toks = self._greedy(ids, out_len, end_id)
        if not bool(np.asarray(req.get("exclude_input_in_output", [[False]])).reshape(-1)[0]):
            toks = np.concatenate([ids, toks])
        return {"output_ids": toks.astype(np.int32)[None, None, :],
                "sequence_length": np.array([[toks.size]], dtype=np.int32)}


class ReferenceEngineClient:
    """``EngineClient`` over named reference models (e.g. ``tensorrt_llm`` and ``tensorrt_llm_draft``)."""

    def __init__(self, models: dict[str, ReferenceTrtllmModel]) -> None:
        self.models = models

    def run(self, model: str, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]:
        if model not in self.models:
            raise KeyError(f"no model '{model}' (have: {', '.join(self.models)})")
        m = self.models[model]
        out: list[dict[str, np.ndarray] | Exception] = []
        for r in requests:
            try:
                out.append(m(r))
            except Exception as e:  # that request failed, as the engine would answer it
                out.append(e)
        return out
