"""Exact replay of a real model pair's acceptance: record it once, replay it in the simulator.

``record_acceptance`` runs the target's greedy decoding over a prompt set, then at every output
position runs each drafter for ``max_k`` tokens on that context and counts how many of them match
the target's continuation (``lead``), with what the drafter proposed (``avail``) and its confidence
per token. Greedy decoding makes this exact: a step that drafts k tokens there accepts min(lead, k),
whatever the batch, policy or history, because the target's forward and (while recording and
replaying) the drafts' are batch invariant (``control/executors/reference/model.py``).

``replay_run`` simulates one configuration on a record with a measured profile's step times
(``control/executors/sim``): all prompts arrive at once and run ``batch`` at a time (continuous
batching), so "tokens per modelled second" is the batch's throughput on the profile's clock.
"""

from __future__ import annotations

import json
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from control.errors import ConfigError
from control.executors.sim import ReplayAcceptance, SimConfig, SimEngine, SimResult
from control.profile import Profile

SCHEMA = "specctl.replay/v1"
RECORD_BATCH = 32  # prompts drafted together while recording (the drafts are batch invariant)
MIN_TOKEN_BUDGET = 2048  # the reference engine's default token budget floor
STDLIB_MIN_BYTES = 4000  # stdlib files shorter than this are skipped when drawing prompts
I64 = np.int64


@dataclass
class ReplayRecord:
    """What a recording holds (arrays over requests r, output positions p, drafters d, draft slots j)."""

    prompt_set: str
    engine: str
    drafters: tuple[str, ...]
    kinds: tuple[str, ...]
    max_k: int
    prompt_tokens: np.ndarray  # (N,)
    output_tokens: np.ndarray  # (N,)
    lead: np.ndarray  # (N, P, m) int16
    avail: np.ndarray  # (N, P, m) int16
    conf: np.ndarray  # (N, P, m, K) float32, NaN where none
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.prompt_tokens.shape[0])

    def acceptance(self, rows: np.ndarray | None = None) -> ReplayAcceptance:
        has_conf = np.array([k != "ngram" for k in self.kinds])
        rep = ReplayAcceptance(self.lead, self.avail, self.conf, has_conf)
        return rep if rows is None else rep.subset(rows)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        head = {"schema": SCHEMA, "prompt_set": self.prompt_set, "engine": self.engine, "drafters": list(self.drafters),
                "kinds": list(self.kinds), "max_k": self.max_k, "meta": self.meta}
        with p.open("wb") as f:
            np.savez_compressed(f, header=np.array(json.dumps(head)), prompt_tokens=self.prompt_tokens,
                                output_tokens=self.output_tokens, lead=self.lead, avail=self.avail,
                                conf=self.conf.astype(np.float32))
        return p

    @classmethod
    def load(cls, path: str | Path) -> ReplayRecord:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"replay record '{p}' does not exist; record one with `specctl record-acceptance`")
        try:
            z = np.load(p, allow_pickle=False)
            head = json.loads(str(z["header"]))
            arrays = {k: z[k] for k in ("prompt_tokens", "output_tokens", "lead", "avail", "conf")}
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"'{p}' is not a replay record ({e}); record one with `specctl record-acceptance`") from None
        if head.get("schema") != SCHEMA:
            raise ConfigError(f"'{p}': schema {head.get('schema')!r}, expected {SCHEMA}")
        return cls(head["prompt_set"], head["engine"], tuple(head["drafters"]), tuple(head["kinds"]), int(head["max_k"]),
                   arrays["prompt_tokens"].astype(I64), arrays["output_tokens"].astype(I64), arrays["lead"],
                   arrays["avail"], arrays["conf"].astype(np.float32), head.get("meta", {}))


# -- prompt sets ---------------------------------------------------------------------------------------
def stdlib_prompts(encode: Callable[[str], list[int]], n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens cut from this Python's standard library sources at random
    places (the first token, BOS where the tokenizer has one, is kept)."""
    files = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if p.stat().st_size > STDLIB_MIN_BYTES)
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    while len(out) < n:
        ids = encode(files[int(rng.integers(len(files)))].read_text(errors="replace"))
        if len(ids) < length + 1:
            continue
        s = int(rng.integers(1, len(ids) - length))
        out.append(ids[:1] + ids[s: s + length - 1])
    return out


def prompt_set_name(n: int, length: int, seed: int) -> str:
    return f"stdlib:n={n},len={length},seed={seed}"


# -- recording ---------------------------------------------------------------------------------------
def greedy_continuations(loaded, prompts: list[list[int]], max_tokens: int) -> list[np.ndarray]:
    """The target's greedy continuation of each prompt (``max_tokens`` tokens, EOS ignored)."""
    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, ReferenceEngine

    cfg = EngineConfig(max_batch=min(len(prompts), RECORD_BATCH), max_k=0, batch_invariant=True,
                       max_len=max(len(p) for p in prompts) + max_tokens + 1)
    eng = ReferenceEngine(loaded.target, {}, None, cfg)
    res = eng.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [np.asarray(r.token_ids, dtype=I64) for r in res]


def _match(drafts: np.ndarray, count: np.ndarray, cont: np.ndarray) -> np.ndarray:
    """(n,) leading tokens of each row's drafts (n, K) that equal its continuation (n, K)."""
    K = drafts.shape[1]
    ok = (drafts == cont) & (np.arange(K)[None, :] < count[:, None])
    return np.cumprod(ok, axis=1).sum(axis=1)


def _record_ngram(prompts, conts, max_k: int, lead, avail, d: int) -> None:
    from control.executors.step.ngram import ngram_propose

    for r, (p, g) in enumerate(zip(prompts, conts, strict=True)):
        ctx = np.concatenate([np.asarray(p, dtype=I64), g])
        P = len(p)
        for pos in range(g.size):
            prop = ngram_propose(ctx[: P + pos], max_k)
            want = g[pos: pos + prop.size]
            m = int(np.cumprod(prop[: want.size] == want).sum())
            avail[r, pos, d] = prop.size
            lead[r, pos, d] = m


def _record_model(model, prompts, conts, max_k: int, lead, avail, conf, d: int, progress=None) -> None:
    """Draft ``max_k`` tokens at every position of every prompt with a batch-invariant draft model,
    ``RECORD_BATCH`` prompts at a time, rolling its cache back to the matching prefix as the engine does."""
    import torch

    from control.executors.reference.drafters import DraftModelDrafter, DraftRows
    from control.executors.reference.kvpool import KVPool

    T = conts[0].size
    was = model.batch_invariant
    model.batch_invariant = True
    try:
        for c0 in range(0, len(prompts), RECORD_BATCH):
            rows_i = np.arange(c0, min(c0 + RECORD_BATCH, len(prompts)))
            n = rows_i.size
            L = max(len(prompts[i]) for i in rows_i) + T + max_k + 1
            pool = KVPool(model.config, {0: model.config}, 1, n, L, model.lm_head.weight.device,
                          model.lm_head.weight.dtype)
            drafter = DraftModelDrafter("record", model, pool.drafts[0], pool.draft_len[:, 0])
            tok = np.zeros((n, L), dtype=I64)
            P = np.array([len(prompts[i]) for i in rows_i], dtype=I64)
            cont = np.full((n, T + max_k), -1, dtype=I64)
            for j, i in enumerate(rows_i):
                tok[j, : P[j]] = prompts[i]
                tok[j, P[j]: P[j] + T] = conts[i]
                cont[j, :T] = conts[i]
            slots = np.arange(n, dtype=I64)
            with torch.inference_mode():
                for pos in range(T):
                    nt = P + pos
                    rows = DraftRows(slots, np.full(n, max_k, dtype=I64), None, tok, nt, np.zeros(n, dtype=bool),
                                     np.ones(n, dtype=np.float32), np.zeros(n, dtype=I64), np.ones(n, dtype=np.float32),
                                     [None] * n)
                    res = drafter.propose(rows, model.lm_head.weight.device)
                    m = _match(res.drafts, res.count, cont[:, pos: pos + max_k])
                    lead[rows_i, pos, d] = m
                    avail[rows_i, pos, d] = res.count
                    conf[rows_i, pos, d, :] = res.confidence
                    pool.draft_len[:, 0] = np.minimum(pool.draft_len[:, 0], nt + m)
            if progress:
                progress(f"drafted {rows_i[-1] + 1}/{len(prompts)} prompts")
    finally:
        model.batch_invariant = was


def record_acceptance(loaded, prompts: list[list[int]], max_tokens: int, max_k: int, prompt_set: str,
                      drafters: list[str] | None = None,
                      progress: Callable[[str], None] | None = None) -> ReplayRecord:
    """Record ``lead``, ``avail`` and confidences for every prompt, output position and drafter."""
    names = list(drafters or loaded.drafters)
    unknown = [d for d in names if d not in loaded.drafters]
    if unknown:
        raise ConfigError(f"drafter {unknown[0]!r} is not in this engine; it has: {', '.join(loaded.drafters)}")
    if not (1 <= max_k <= 16):
        raise ConfigError(f"max_k = {max_k!r}: must be in 1..16")
    if max_tokens < 2:
        raise ConfigError(f"max_tokens = {max_tokens!r}: must be >= 2 (a request drafts from its second token on)")
    t0 = time.perf_counter()
    conts = greedy_continuations(loaded, prompts, max_tokens)
    if progress:
        progress(f"target: {len(prompts)} greedy continuations of {max_tokens} tokens ({time.perf_counter() - t0:.1f} s)")
    N, m = len(prompts), len(names)
    lead = np.zeros((N, max_tokens, m), dtype=np.int16)
    avail = np.zeros((N, max_tokens, m), dtype=np.int16)
    conf = np.full((N, max_tokens, m, max_k), np.nan, dtype=np.float32)
    kinds = []
    for d, name in enumerate(names):
        model = loaded.drafters[name]
        if model is None:
            kinds.append("ngram")
            _record_ngram(prompts, conts, max_k, lead, avail, d)
        elif hasattr(model, "config"):
            kinds.append("draft_model")
            _record_model(model, prompts, conts, max_k, lead, avail, conf, d, progress)
        else:
            raise ConfigError(f"drafter {name!r} is self-speculation; recording supports draft models and n-gram lookup")
        if progress:
            progress(f"{name}: mean lead at k = {max_k}: {lead[:, 1:, d].mean():.2f} ({time.perf_counter() - t0:.1f} s)")
    return ReplayRecord(prompt_set, loaded.name, tuple(names), tuple(kinds), max_k,
                        np.array([len(p) for p in prompts], dtype=I64), np.full(N, max_tokens, dtype=I64),
                        lead, avail, conf, {"record_s": round(time.perf_counter() - t0, 2),
                                            "drafts_batch_invariant": True})


# -- replay ------------------------------------------------------------------------------------------
def parse_config(spec: str, drafters: tuple[str, ...]) -> tuple[str, list[str] | None]:
    """``none``, ``fixed:K@DRAFTER``, ``adaptive`` or ``adaptive@D1+D2``: (policy spec, plan drafters)."""
    from control.policyspec import parse_policy_spec

    pol, _, ds = spec.partition("@")
    parse_policy_spec(pol)
    if not ds:
        return pol, None
    names = ds.split("+")
    for d in names:
        if d not in drafters:
            raise ConfigError(f"configuration {spec!r}: drafter {d!r} is not recorded; recorded: {', '.join(drafters)}")
    return pol, names


def replay_run(record: ReplayRecord, profile: Profile, spec: str, batch: int, *, seed: int = 0,
               rows: np.ndarray | None = None, wrap: Callable | None = None,
               plan_profile: Profile | None = None) -> SimResult:
    """Simulate configuration ``spec`` (``parse_config``) on the record at ``batch`` requests at a time
    (``rows``: a subset of the recorded requests; ``wrap``: applied to the policy, e.g. to log its steps).
    ``profile`` is the clock; ``plan_profile`` (default: the same) is what the policy's plan is
    compiled from, e.g. a stale profile, whose mispricing the policy must then correct online."""
    from control.plan import compile_plan
    from control.policy import build_policy

    if batch < 1:
        raise ConfigError(f"batch {batch!r}: must be >= 1")
    planned = plan_profile or profile
    for d in record.drafters:
        profile.drafter(d)  # names the profile's drafters if one is missing
        planned.drafter(d)
    pol, plan_drafters = parse_config(spec, record.drafters)
    rows = np.arange(record.n) if rows is None else np.asarray(rows)
    P, O = record.prompt_tokens[rows], record.output_tokens[rows]  # noqa: E741 - prompt and output lengths
    plan = compile_plan(planned, policy=pol, max_k=record.max_k, drafters=plan_drafters or list(record.drafters),
                        default_drafter=(plan_drafters or [None])[0], reason="replay")
    cost = profile.step_cost(list(record.drafters))
    entries = [profile.drafter(d) for d in record.drafters]
    prefill = tuple(profile.models[e.model].to_cost() if e.model else None for e in entries)
    cfg = SimConfig(max_batch=batch, token_budget=max(MIN_TOKEN_BUDGET, batch * (record.max_k + 1)),
                    max_k=record.max_k, seed=seed, prefill_one_drafter=True, record_series=False,
                    default_drafter=record.drafters.index(plan.default_drafter))
    engine = SimEngine(cost, record.drafters, np.zeros(rows.size), P, O, record.acceptance(rows), cfg,
                       mape={"target": profile.models["target"].mape}, prefill_costs=prefill)
    policy = build_policy(pol, plan, seed=seed)
    res = engine.run(wrap(policy) if wrap else policy)
    res.policy = spec
    return res


def tokens_per_s(res: SimResult) -> float:
    """Generated tokens per modelled second of busy time."""
    return float(res.output_tokens.sum()) / res.busy_s if res.busy_s > 0 else 0.0


def fixed_configs(record: ReplayRecord, ks: list[int] | None = None) -> list[str]:
    """Every fixed configuration: no speculation, and fixed k for each recorded drafter."""
    ks = ks or list(range(1, record.max_k + 1))
    return ["none"] + [f"fixed:{k}@{d}" for d in record.drafters for k in ks]
