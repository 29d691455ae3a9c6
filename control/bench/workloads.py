"""Workloads: who arrives when, with how many prompt tokens, wanting how many output tokens.

Sources (DESIGN.md section 9):
- ``poisson``: synthetic Poisson arrivals with length distributions (``poisson:in=128,out=128``,
  ``in=lognormal:1000:500`` for mean 1000 and std 500, ``in=uniform:64:512``);
- trace replay from the shared workloads folder (``SPECCTL_WORKLOADS``, else ``<repo>/../shared/workloads``):
  ``azure-conv``, ``azure-code`` (Azure LLM inference trace 2023) and ``mooncake`` (Mooncake FAST'25
  conversation trace), with explicit time and length scaling recorded in ``notes``;
- prompt sets with Poisson arrivals: ``sharegpt`` (ShareGPT first user turns) and ``spec-bench``
  (Spec-Bench questions, with categories);
- your own trace: a ``.jsonl`` or ``.csv`` file (``load_workload_file``), one request per record or
  row with ``arrival_s`` (seconds; omitted in every row: Poisson arrivals at the given rate),
  ``output_tokens`` and either ``input_tokens`` or ``prompt`` (text; tokens estimated as below).

Token counts of prompt sets are estimated as ceil(characters / 4) (no tokenizer of the served
model exists here); their output lengths follow a lognormal matched to the Azure conversation
trace's outputs (mean 211, std 163 tokens, measured on the file). Every workload also names its
acceptance family (``chat`` or ``code``), which picks the simulator's acceptance processes.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from control.bench.acceptance import SPEC_BENCH_CATEGORIES
from control.errors import ConfigError

I64 = np.int64
REPO_ROOT = Path(__file__).resolve().parents[2]
CONV_OUTPUT_MEAN, CONV_OUTPUT_STD = 211.0, 163.0  # Azure conv trace outputs (workloads README, measured)

TRACES = {
    "azure-conv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", "chat"),
    "azure-code": ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", "code"),
    "mooncake": ("mooncake_fast25/conversation_trace.jsonl", "chat"),
}
PROMPT_SETS = {
    "sharegpt": ("sharegpt/ShareGPT_V3_filtered_500.json", "chat"),
    "spec-bench": ("spec_bench/question.jsonl", "chat"),
}
KINDS = ("poisson", *TRACES, *PROMPT_SETS)
ACCEPTED = "poisson[:in=DIST,out=DIST], azure-conv, azure-code, mooncake, sharegpt, spec-bench, FILE.jsonl, FILE.csv"
FILE_SUFFIXES = (".jsonl", ".csv")
FILE_FIELDS = "arrival_s (optional), input_tokens or prompt, output_tokens"


def workloads_dir() -> Path:
    """The shared workloads folder: ``$SPECCTL_WORKLOADS``, else ``<repo root>/../shared/workloads``."""
    env = os.environ.get("SPECCTL_WORKLOADS")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "workloads"


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival (seconds from the start); category -1 = none."""

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    category: np.ndarray
    categories: tuple[str, ...] = ()
    family: str = "chat"
    notes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.arrival_s.shape[0]
        for nm in ("prompt_tokens", "output_tokens", "category"):
            if getattr(self, nm).shape[0] != n:
                raise ConfigError(f"workload '{self.name}': {nm} has {getattr(self, nm).shape[0]} entries, arrivals {n}")
        if n == 0:
            raise ConfigError(f"workload '{self.name}' has no requests")
        if np.any(self.prompt_tokens < 1) or np.any(self.output_tokens < 1):
            raise ConfigError(f"workload '{self.name}': every request needs >= 1 prompt and >= 1 output token")
        if np.any(np.diff(self.arrival_s) < 0):
            raise ConfigError(f"workload '{self.name}': arrivals must be sorted")

    @property
    def n(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def rate(self) -> float:
        """Mean arrival rate in requests per second (n - 1 gaps over the span)."""
        return (self.n - 1) / self.span_s if self.span_s > 0 else math.inf

    def head(self, n: int) -> Workload:
        """The first ``n`` requests."""
        if n < 1:
            raise ConfigError(f"requests = {n}: must be >= 1")
        n = min(n, self.n)
        return replace(self, arrival_s=self.arrival_s[:n], prompt_tokens=self.prompt_tokens[:n],
                       output_tokens=self.output_tokens[:n], category=self.category[:n],
                       notes={**self.notes, "requests": n})

    def window(self, seconds: float) -> Workload:
        """Requests arriving in the first ``seconds`` (of the current time axis)."""
        keep = self.arrival_s - self.arrival_s[0] <= seconds
        return self.head(int(keep.sum()))

    def with_rate(self, rate: float) -> Workload:
        """Scale the time axis so the mean arrival rate is ``rate`` req/s; the factor is recorded."""
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"arrival rate {rate!r} must be a finite number > 0 req/s")
        if self.n < 2 or self.span_s <= 0:
            return self
        factor = rate / self.rate
        t0 = self.arrival_s[0]
        prev = float(self.notes.get("time_scale", 1.0))
        return replace(self, arrival_s=(self.arrival_s - t0) / factor,
                       notes={**self.notes, "time_scale": prev * factor, "rate_req_s": rate})

    def scale_lengths(self, factor: float, max_ctx: int | None = None) -> Workload:
        """Multiply prompt and output lengths by ``factor`` (>= 1 token each), clip to ``max_ctx``."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ConfigError(f"length scale {factor!r} must be a finite number > 0")
        p = np.maximum(np.round(self.prompt_tokens * factor), 1).astype(I64)
        o = np.maximum(np.round(self.output_tokens * factor), 1).astype(I64)
        clipped = 0
        if max_ctx is not None:
            over = p + o > max_ctx
            clipped = int(over.sum())
            o = np.where(over, np.maximum(max_ctx - np.minimum(p, max_ctx - 1), 1), o)
            p = np.minimum(p, max_ctx - o)
        prev = float(self.notes.get("length_scale", 1.0))
        return replace(self, prompt_tokens=p, output_tokens=o,
                       notes={**self.notes, "length_scale": prev * factor, "clipped_to_max_ctx": clipped})

    def at_time_zero(self) -> Workload:
        """Everyone arrives at t = 0 (a saturated system, for capacity measurement)."""
        return replace(self, arrival_s=np.zeros(self.n), notes={**self.notes, "saturated": True})

    def describe(self) -> str:
        p, o = self.prompt_tokens, self.output_tokens
        return (f"{self.name}: {self.n} requests over {self.span_s:.0f} s ({self.rate:.2f} req/s), prompt "
                f"{p.mean():.0f} +- {p.std():.0f} tokens, output {o.mean():.0f} +- {o.std():.0f} tokens")


# -- length distributions ---------------------------------------------------------------------------

def parse_dist(text: str, what: str):
    """``128`` (fixed), ``lognormal:MEAN:STD``, ``uniform:LO:HI`` -> sampler(rng, n)."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            v = int(parts[0])
            if v < 1:
                raise ValueError
            return lambda rng, n: np.full(n, v, dtype=I64)
        kind, a, b = parts[0], float(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        raise ConfigError(f"{what} = '{text}': write a token count (128), lognormal:MEAN:STD or uniform:LO:HI") from None
    if kind == "lognormal":
        if a < 1 or b < 0:
            raise ConfigError(f"{what} = '{text}': lognormal needs MEAN >= 1 and STD >= 0")
        return lambda rng, n: lognormal_lengths(rng, n, a, b)
    if kind == "uniform":
        if not (1 <= a <= b):
            raise ConfigError(f"{what} = '{text}': uniform needs 1 <= LO <= HI")
        return lambda rng, n: rng.integers(int(a), int(b) + 1, size=n).astype(I64)
    raise ConfigError(f"{what} = '{text}': unknown distribution '{kind}'; accepted: N, lognormal:MEAN:STD, uniform:LO:HI")


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, std: float) -> np.ndarray:
    if std <= 0:
        return np.full(n, max(int(round(mean)), 1), dtype=I64)
    s2 = math.log1p((std / mean) ** 2)
    mu = math.log(mean) - s2 / 2
    return np.maximum(np.round(rng.lognormal(mu, math.sqrt(s2), size=n)), 1).astype(I64)


def poisson_arrivals(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def poisson(n: int, rate: float, prompt: str = "128", output: str = "128", seed: int = 0) -> Workload:
    """Synthetic Poisson arrivals at ``rate`` req/s with length distributions for prompt and output."""
    if n < 1:
        raise ConfigError(f"requests = {n}: must be >= 1")
    rng = np.random.default_rng([seed, 11])
    p = parse_dist(prompt, "in")(rng, n)
    o = parse_dist(output, "out")(rng, n)
    return Workload(f"poisson:in={prompt},out={output}", poisson_arrivals(rng, n, rate), p, o,
                    np.full(n, -1, dtype=I64), family="chat",
                    notes={"source": "synthetic Poisson", "rate_req_s": rate, "seed": seed})


# -- files ------------------------------------------------------------------------------------------

def _path(rel: str, root: Path | None) -> Path:
    base = Path(root) if root else workloads_dir()
    p = base / rel
    if not p.is_file():
        raise ConfigError(
            f"workload file '{p}' does not exist; set SPECCTL_WORKLOADS to the folder holding "
            f"'{rel}' (or use a poisson workload)"
        )
    return p


def _azure_time(s: str) -> float:
    # '2023-11-16 18:17:03.9799600': seven fractional digits; datetime takes six.
    head, _, frac = s.strip().partition(".")
    t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def load_azure(kind: str = "conv", root: Path | None = None) -> Workload:
    name = f"azure-{kind}"
    rel, family = TRACES[name]
    p = _path(rel, root)
    t, ctx, gen = [], [], []
    with p.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ConfigError(f"{p}: expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {header!r}")
        for i, row in enumerate(reader, start=2):
            try:
                t.append(_azure_time(row[0]))
                ctx.append(int(row[1]))
                gen.append(int(row[2]))
            except (ValueError, IndexError):
                raise ConfigError(f"{p}: line {i} is malformed ({','.join(row)[:80]!r}); expected TIMESTAMP,int,int") from None
    return _from_columns(name, family, p, np.array(t), np.array(ctx), np.array(gen))


def load_mooncake(root: Path | None = None) -> Workload:
    rel, family = TRACES["mooncake"]
    p = _path(rel, root)
    t, ctx, gen = [], [], []
    with p.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                t.append(float(rec["timestamp"]) / 1000.0)
                ctx.append(int(rec["input_length"]))
                gen.append(int(rec["output_length"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise ConfigError(f"{p}: line {i} is not a record with timestamp, input_length, output_length") from None
    return _from_columns("mooncake", family, p, np.array(t), np.array(ctx), np.array(gen))


def _from_columns(name, family, path, t, ctx, gen) -> Workload:
    if t.size == 0:
        raise ConfigError(f"{path}: no requests")
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    ctx = np.maximum(ctx[order], 1).astype(I64)
    gen = gen[order].astype(I64)
    keep = gen >= 1  # a request that generated nothing has no decode phase to simulate
    return Workload(name, t[keep], ctx[keep], gen[keep], np.full(int(keep.sum()), -1, dtype=I64), family=family,
                    notes={"source": f"trace {path.name}", "dropped_zero_output": int((~keep).sum())})


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def load_sharegpt(root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    p = _path(PROMPT_SETS["sharegpt"][0], root)
    try:
        data = json.loads(p.read_text())
        lens = [estimate_tokens(d["conversations"][0]["value"]) for d in data]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        raise ConfigError(f"{p}: expected a list of {{id, conversations: [{{from, value}}]}}") from None
    if not lens:
        raise ConfigError(f"{p}: no prompts")
    return np.array(lens, dtype=I64), np.full(len(lens), -1, dtype=I64)


def spec_bench_category(raw: str) -> str:
    """Spec-Bench's raw categories: MT-bench's eight (writing, roleplay, ...) pool into mt_bench."""
    return raw if raw in SPEC_BENCH_CATEGORIES else "mt_bench"


def load_spec_bench(root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    p = _path(PROMPT_SETS["spec-bench"][0], root)
    lens, cats = [], []
    with p.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                lens.append(estimate_tokens(rec["turns"][0]))
                cats.append(SPEC_BENCH_CATEGORIES.index(spec_bench_category(str(rec["category"]))))
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                raise ConfigError(f"{p}: line {i} is not a record with category and turns") from None
    return np.array(lens, dtype=I64), np.array(cats, dtype=I64)


def prompt_set(kind: str, n: int, rate: float, seed: int = 0, root: Path | None = None) -> Workload:
    """``n`` requests drawn (with replacement) from a prompt set, Poisson arrivals at ``rate``."""
    lens, cats = load_sharegpt(root) if kind == "sharegpt" else load_spec_bench(root)
    rng = np.random.default_rng([seed, 13])
    pick = rng.integers(0, lens.size, size=n)
    out = lognormal_lengths(rng, n, CONV_OUTPUT_MEAN, CONV_OUTPUT_STD)
    categories = SPEC_BENCH_CATEGORIES if kind == "spec-bench" else ()
    return Workload(kind, poisson_arrivals(rng, n, rate), lens[pick], out, cats[pick], categories=categories,
                    family=PROMPT_SETS[kind][1],
                    notes={"source": f"prompt set {PROMPT_SETS[kind][0]}", "rate_req_s": rate, "seed": seed,
                           "prompt_tokens": "ceil(chars / 4)",
                           "output_tokens": f"lognormal mean {CONV_OUTPUT_MEAN:.0f} std {CONV_OUTPUT_STD:.0f} (Azure conv)"})


def _file_records(p: Path):
    """(line number, record dict) per request of a JSONL or CSV workload file."""
    with p.open(newline="") as f:
        if p.suffix == ".csv":
            reader = csv.DictReader(f)
            for i, row in enumerate(reader, start=2):
                yield i, {k.strip(): v.strip() for k, v in row.items() if k is not None and v not in (None, "")}
            return
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p}: line {i} is not JSON ({e.msg}); expected {{{FILE_FIELDS}}}") from None
            if not isinstance(rec, dict):
                raise ConfigError(f"{p}: line {i} is not a JSON object; expected {{{FILE_FIELDS}}}")
            yield i, rec


def _file_number(p: Path, line: int, rec: dict, key: str, integer: bool) -> float:
    v = rec[key]
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
        if not math.isfinite(x) or x < 0 or (integer and (x != int(x) or x < 1)):
            raise ValueError
    except (TypeError, ValueError):
        want = "an integer >= 1" if integer else "a finite number >= 0"
        shown = repr(v)[:40] if isinstance(v, str) else json.dumps(v)[:40]
        raise ConfigError(f"{p}: line {line}: {key} = {shown}: must be {want}") from None
    return x


def load_workload_file(path: str | Path, *, rate: float = 1.0, seed: int = 0) -> Workload:
    """A workload from a JSONL or CSV file (see the module doc); a bad row is named by its line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"workload file '{p}' does not exist")
    t, ctx, gen, has_t = [], [], [], []
    for line, rec in _file_records(p):
        unknown = sorted(set(rec) - {"arrival_s", "input_tokens", "prompt", "output_tokens"})
        if unknown:
            raise ConfigError(f"{p}: line {line}: unknown field '{unknown[0]}'; accepted: {FILE_FIELDS}")
        if "output_tokens" not in rec or ("input_tokens" in rec) == ("prompt" in rec):
            raise ConfigError(f"{p}: line {line}: needs output_tokens and exactly one of input_tokens or prompt")
        has_t.append("arrival_s" in rec)
        t.append(_file_number(p, line, rec, "arrival_s", False) if has_t[-1] else 0.0)
        ctx.append(int(_file_number(p, line, rec, "input_tokens", True)) if "input_tokens" in rec
                   else estimate_tokens(str(rec["prompt"])))
        gen.append(int(_file_number(p, line, rec, "output_tokens", True)))
    if not t:
        raise ConfigError(f"{p}: no requests; each line or row needs {FILE_FIELDS}")
    if any(has_t) and not all(has_t):
        raise ConfigError(f"{p}: line {_file_line(p, has_t)}: arrival_s is missing; give it in every row or in none")
    arrivals = np.array(t) if all(has_t) else poisson_arrivals(np.random.default_rng([seed, 17]), len(t), rate)
    order = np.argsort(arrivals, kind="stable")
    return Workload(p.stem, arrivals[order] - arrivals[order][0], np.array(ctx, dtype=I64)[order],
                    np.array(gen, dtype=I64)[order], np.full(len(t), -1, dtype=I64),
                    notes={"source": f"file {p.name}",
                           "arrivals": "from the file" if all(has_t) else f"Poisson at {rate:g} req/s"})


def _file_line(p: Path, has_t: list[bool]) -> int:
    """The line of the first record without arrival_s."""
    missing = has_t.index(False)
    return next(line for k, (line, _) in enumerate(_file_records(p)) if k == missing)


def load_workload(spec: str, *, requests: int | None = None, rate: float = 1.0, seed: int = 0,
                  root: Path | None = None) -> Workload:
    """A workload by name (see module doc). Traces keep their own timing (rescale with ``with_rate``);
    prompt sets and Poisson draw ``requests`` arrivals at ``rate`` req/s."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"workload {spec!r} is empty; accepted: {ACCEPTED}")
    if spec.strip().lower().endswith(FILE_SUFFIXES):
        w = load_workload_file(spec.strip(), rate=rate, seed=seed)
        return w.head(requests) if requests and requests < w.n else w
    name, _, arg = spec.strip().partition(":")
    name = name.lower()
    if name == "poisson":
        opts = {"in": "128", "out": "128"}
        for part in filter(None, arg.split(",")):
            k, sep, v = part.partition("=")
            if not sep or k not in opts:
                raise ConfigError(f"workload '{spec}': option '{part}' is not in=DIST or out=DIST")
            opts[k] = v
        return poisson(requests or 2000, rate, opts["in"], opts["out"], seed)
    if arg:
        raise ConfigError(f"workload '{spec}': '{name}' takes no options; accepted: {ACCEPTED}")
    if name in ("azure-conv", "azure-code"):
        w = load_azure(name.split("-")[1], root)
    elif name == "mooncake":
        w = load_mooncake(root)
    elif name in PROMPT_SETS:
        return prompt_set(name, requests or 2000, rate, seed, root)
    else:
        raise ConfigError(f"unknown workload '{spec}'; accepted: {ACCEPTED}")
    return w.head(requests) if requests else w
