"""``specctl build --sku cpu``: train the CPU reference pair and write the engine directory.

Pipeline (each phase shows progress): read the corpus -> train a byte-level BPE tokenizer ->
train the target on the training files -> let the target continue training prompts greedily
(keeping its top-k next-token distribution) -> distill every draft from those sequences ->
measure each drafter's greedy acceptance on held-out files -> save every model in Hugging Face
layout with its own manifest, and the engine manifest (``control/executors/manifest.py``).

The build writes into a temporary sibling directory and moves it into place at the end, so an
interrupted build never leaves a half-written engine directory behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from control.buildsys.cpu.corpus import Corpus, load_corpus
from control.buildsys.cpu.progress import Reporter, SilentReporter
from control.buildsys.cpu.recipe import PairRecipe
from control.errors import ConfigError
from control.executors.manifest import ENGINES_SCHEMA, load_manifest

MODEL_SCHEMA = "specctl.model/v1"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse to replace anything that is not an engine directory, and an engine directory without --force;
    refuse a directory that cannot be written before the build spends its time."""
    if not out.exists():
        try:  # the build writes next to --out, then renames: probe that now, not after training
            out.parent.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.probe-").cleanup()
        except OSError as e:
            file = next((p for p in out.absolute().parents if p.is_file()), None)
            why = f"'{file}' is a file" if file is not None else e.strerror
            raise ConfigError(f"engine directory '{out}' cannot be created ({why}); choose a directory you can write") from e
        return
    if not out.is_dir():
        raise ConfigError(f"--out '{out}' is a file; give a directory for the engines")
    if not any(out.iterdir()):
        return
    manifest = out / "manifest.json"
    is_engine = False
    if manifest.is_file():
        try:
            is_engine = json.loads(manifest.read_text()).get("schema") == ENGINES_SCHEMA
        except (json.JSONDecodeError, AttributeError):
            is_engine = False
    if not is_engine:
        raise ConfigError(f"--out '{out}' exists and is not an engine directory; choose an empty or new directory")
    if not force:
        raise ConfigError(f"--out '{out}' already holds engines; pass --force to replace them, or choose another --out")


class _Laps:
    """Wall and CPU seconds per build phase."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._t = time.perf_counter()
        self._c = time.process_time()

    def lap(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.wall[name] = round(t - self._t, 2)
        self.cpu[name] = round(c - self._c, 2)
        self._t, self._c = t, c


@dataclass
class _Trained:
    """What the build trained and measured, ready to save."""

    corpus: Corpus
    tok: Any
    vocab: int
    target: Any
    t_stats: Any
    drafts: dict[str, Any]
    d_stats: dict[str, Any]
    acc: dict[str, dict]
    eval_desc: dict[str, Any]


def build_cpu_pair(out_dir: str | Path, recipe: PairRecipe, *, seed: int = 0, corpus_dir: str | Path | None = None,
                   reporter: Reporter | None = None, force: bool = False) -> dict:
    """Build the pair into ``out_dir``; returns the engine manifest (as written).

    1. read the corpus, train the tokenizer, encode; 2. train the target; 3. distill the drafts on the
    target's greedy continuations; 4. measure held-out acceptance; 5. save into a temporary directory,
    validate its manifest, and move it into place."""
    reporter = reporter or SilentReporter()
    out = Path(out_dir)
    check_out_dir(out, force)
    if seed < 0:
        raise ConfigError(f"--seed {seed} must be an integer >= 0")
    t_start = time.perf_counter()
    load_start = _loadavg()
    laps = _Laps()
    trained = _train(recipe, seed, corpus_dir, reporter, laps)
    reporter.phase("save", None)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        tok_json = tmp / "tokenizer.json"
        trained.tok.save(str(tok_json))
        common = {
            "seed": seed,
            "corpus": trained.corpus.describe(),
            "tokenizer_sha256": sha256_file(tok_json),
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "recipe": recipe.name,
        }
        model_meta = _save_models(tmp, tok_json, trained, recipe, common)
        tok_json.unlink()
        laps.lap("save")
        laps.wall["total"] = round(time.perf_counter() - t_start, 2)
        laps.cpu["total"] = round(sum(laps.cpu.values()), 2)
        manifest = _engine_manifest(trained, recipe, seed, common, model_meta, laps, load_start)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        load_manifest(tmp)  # the contract every consumer reads: validate before moving into place
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    reporter.log(f"wrote {out} in {laps.wall['total']:.0f} s")
    return manifest


def _train(recipe: PairRecipe, seed: int, corpus_dir, reporter: Reporter, laps: _Laps) -> _Trained:
    """Steps 1-4: corpus and tokenizer, target, distilled drafts, held-out acceptance."""
    import torch

    from control.buildsys.cpu.acceptance import heldout_prompts, measure_acceptance
    from control.buildsys.cpu.tokenizer import encode_files, special_ids, train_tokenizer
    from control.buildsys.cpu.train import distill, init_model, make_config, native_bf16, train_lm

    reporter.phase("read corpus", None)
    corpus: Corpus = load_corpus(corpus_dir, max_train_bytes=recipe.max_train_bytes,
                                 max_heldout_files=recipe.max_heldout_files)
    reporter.log(f"corpus {corpus.name}: {len(corpus.train)} training files ({corpus.train_bytes / 1e6:.1f} MB), "
                 f"{len(corpus.heldout)} held out")
    laps.lap("corpus")

    reporter.phase("train tokenizer", None)
    tok = train_tokenizer([f.text for f in corpus.train], recipe.vocab)
    specials = special_ids(tok)
    vocab = tok.get_vocab_size()
    laps.lap("tokenizer")

    reporter.phase("encode corpus", None)
    train_files = encode_files(tok, [f.text for f in corpus.train])
    heldout_files = encode_files(tok, [f.text for f in corpus.heldout])
    stream = torch.from_numpy(np.concatenate(train_files).astype(np.int64))
    reporter.log(f"tokenizer: vocab {vocab}; {stream.numel():,} training tokens "
                 f"({corpus.train_bytes / max(stream.numel(), 1):.2f} bytes/token)")
    laps.lap("encode")

    bf16 = recipe.bf16_autocast and native_bf16()
    if recipe.bf16_autocast and not bf16:
        reporter.log("training in fp32: this CPU has no native bf16, and emulated bf16 autocast is ~20x slower")
    cfg_t = make_config(recipe.target, vocab, recipe.max_position, specials["bos"], specials["eos"])
    target = init_model(cfg_t, seed)
    t_stats = train_lm(target, stream, recipe.target_train, seed + 1, reporter, bf16=bf16)
    reporter.log(f"target: {target.num_parameters() / 1e6:.2f}M parameters, loss {t_stats.first_loss:.2f} -> "
                 f"{t_stats.final_loss:.2f} in {t_stats.seconds:.0f} s ({t_stats.tokens_per_s:.0f} tokens/s)")
    laps.lap("train_target")

    data = _distill_data(target, stream, recipe, seed, reporter)
    laps.lap("generate")
    drafts = {}
    for i, spec in enumerate(recipe.drafts):
        cfg_d = make_config(spec, vocab, recipe.max_position, specials["bos"], specials["eos"])
        drafts[spec.name] = init_model(cfg_d, seed + 100 + i)
    d_stats = dict(zip(drafts, distill(list(drafts.values()), data, recipe.distill.train, seed + 3, reporter,
                                       bf16=bf16), strict=True))
    laps.lap("distill")

    ev = recipe.eval
    acc = measure_acceptance(target, drafts, heldout_prompts(heldout_files, ev.prompts, ev.prompt), ev.generate, reporter)
    for name, a in acc.items():
        reporter.log(f"held-out acceptance {name}: mean {a['mean']:.3f} (std {a['std']:.3f}, "
                     f"p10 {a['p10']:.3f}, p90 {a['p90']:.3f})")
    laps.lap("acceptance")
    eval_desc = {"prompts": ev.prompts, "prompt_tokens": ev.prompt, "generated_tokens": ev.generate,
                 "definition": "rate at which the drafter's next-token guess equals the target's greedy token "
                               "along the target's greedy continuation of held-out prompts"}
    return _Trained(corpus, tok, vocab, target, t_stats, drafts, d_stats, acc, eval_desc)


def _distill_data(target, stream, recipe: PairRecipe, seed: int, reporter: Reporter):
    """The target's greedy continuations (with top-k soft labels) of random training prompts."""
    import torch

    from control.buildsys.cpu.generate import greedy_generate
    from control.buildsys.cpu.train import DistillData

    ds = recipe.distill
    g = torch.Generator().manual_seed(seed + 2)
    starts = torch.randint(0, stream.numel() - ds.prompt - 1, (ds.sequences,), generator=g)
    prompts = stream[starts[:, None] + torch.arange(ds.prompt)]
    reporter.phase("target writes data", ds.sequences * ds.generate)
    chunks = [greedy_generate(target, prompts[i: i + ds.gen_batch], ds.generate, topk=ds.topk, reporter=reporter)
              for i in range(0, ds.sequences, ds.gen_batch)]
    return DistillData(torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks]),
                       torch.cat([c[2] for c in chunks]))


def _save_models(tmp: Path, tok_json: Path, tr: _Trained, recipe: PairRecipe, common: dict) -> dict[str, dict]:
    """Each model in Hugging Face layout with its tokenizer and a manifest; returns the manifests by name."""
    from control.executors.reference.model import save_pretrained

    models = [("target", "target", tr.target, tr.t_stats, None)] + [
        (name, "draft", m, tr.d_stats[name], tr.acc[name]) for name, m in tr.drafts.items()
    ]
    model_meta = {}
    for name, role, model, stats, a in models:
        d = tmp / name
        save_pretrained(model, d)
        shutil.copyfile(tok_json, d / "tokenizer.json")
        (d / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
            "pad_token": "<|pad|>", "model_max_length": recipe.max_position}, indent=2) + "\n")
        meta = {
            "schema": MODEL_SCHEMA,
            "name": name,
            "role": role,
            "params": model.num_parameters(),
            "shape": {"hidden": model.config.hidden_size, "layers": model.config.num_hidden_layers,
                      "heads": model.config.num_attention_heads, "ffn": model.config.intermediate_size,
                      "vocab": tr.vocab, "tied_embeddings": model.config.tie_word_embeddings},
            "training": {**stats.to_dict(), "kind": "language model" if role == "target" else
                         "distilled from the target's greedy continuations (top-k soft labels)"},
            "weights_sha256": sha256_file(d / "model.safetensors"),
            "config_sha256": sha256_file(d / "config.json"),
            **common,
        }
        if a is not None:
            meta["heldout_acceptance"] = {**a, **tr.eval_desc}
        (d / "manifest.json").write_text(json.dumps(meta, indent=2) + "\n")
        model_meta[name] = meta
    return model_meta


def _engine_manifest(tr: _Trained, recipe: PairRecipe, seed: int, common: dict, model_meta: dict[str, dict],
                     laps: _Laps, load_start) -> dict:
    """The engine directory's manifest (``control.executors.manifest``)."""
    import torch

    acc = tr.acc
    return {
        "schema": ENGINES_SCHEMA,
        "sku": "cpu",
        "name": recipe.name,
        "target": "target",
        "drafters": [
            {"name": name, "kind": "draft_model", "model": name, "params": model_meta[name]["params"],
             "acceptance": acc[name]["mean"]}
            for name in tr.drafts
        ] + [{"name": "ngram", "kind": "ngram", "acceptance": acc["ngram"]["mean"]}],
        "quick": recipe.quick,
        "seed": seed,
        "corpus": tr.corpus.describe(),
        "params": {name: m["params"] for name, m in model_meta.items()},
        "acceptance": {name: {k: v for k, v in a.items() if k != "per_prompt"} for name, a in acc.items()},
        "acceptance_eval": tr.eval_desc,
        "hashes": {"tokenizer": common["tokenizer_sha256"], **{name: m["weights_sha256"] for name, m in model_meta.items()}},
        "timings_s": laps.wall,
        "cpu_seconds": laps.cpu,
        "machine": {"cpu": cpu_model_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "loadavg_1m_start": load_start, "loadavg_1m_end": _loadavg()},
        "recipe": recipe.to_dict(),
        "built_at": common["built_at"],
    }
