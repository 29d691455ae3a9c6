"""Load an engine directory (``control/executors/manifest.py``) for the reference executor."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from control.errors import ConfigError
from control.executors.manifest import EngineManifest, load_manifest
from control.executors.reference.drafters import SelfSpec
from control.executors.reference.model import LlamaForCausalLM, load_pretrained

SUPPORTED_DRAFTERS = ("draft_model", "self_spec", "ngram")


@dataclass
class LoadedEngine:
    """The target, the drafters (name -> draft model, SelfSpec for self-speculation, None for n-gram
    lookup) and the tokenizer."""

    engine_dir: Path
    manifest: EngineManifest
    target: LlamaForCausalLM
    drafters: dict[str, LlamaForCausalLM | SelfSpec | None]
    tokenizer: object  # tokenizers.Tokenizer

    @property
    def name(self) -> str:
        extra = self.manifest.model_extra or {}
        return str(extra.get("name") or self.engine_dir.name)

    @property
    def bos_token_id(self) -> int | None:
        return self.target.config.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self.target.config.eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with the model's BOS token first when it has one."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ([self.bos_token_id] if self.bos_token_id is not None else []) + list(ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tokenizer(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises plain Exceptions for malformed files
        raise ConfigError(f"{path}: not a tokenizers tokenizer.json ({str(e).splitlines()[0][:120]})") from None


def load_engine_dir(engine_dir: str | Path, device: str = "cpu", dtype=None) -> LoadedEngine:
    """Read the manifest, the target and every supported drafter, and the shared tokenizer.

    Raises ConfigError, naming the file and what to do, for a missing or malformed directory, a
    drafter kind this executor cannot run, a draft whose vocabulary or tokenizer differs from the
    target's, or weights that do not fit their config.
    """
    d = Path(engine_dir)
    m = load_manifest(d)
    tdir = d / m.target
    tok_path = tdir / "tokenizer.json"
    if not tok_path.is_file():
        raise ConfigError(f"'{tdir}' has no tokenizer.json; every model directory of an engine needs the shared tokenizer")
    tokenizer = _tokenizer(tok_path)
    tok_sha = _sha(tok_path)
    for spec in m.drafters:
        if spec.kind not in SUPPORTED_DRAFTERS:
            raise ConfigError(f"{d / 'manifest.json'}: drafter '{spec.name}' is of kind {spec.kind}, which the reference "
                              f"executor does not run (it runs: {', '.join(SUPPORTED_DRAFTERS)})")
        if spec.kind == "draft_model":
            t = d / spec.model / "tokenizer.json"
            if not t.is_file():
                raise ConfigError(f"'{d / spec.model}' has no tokenizer.json; drafts must ship the target's tokenizer")
            if _sha(t) != tok_sha:
                raise ConfigError(f"drafter '{spec.name}': '{t}' differs from the target's tokenizer.json; a draft must "
                                  "share the target's vocabulary (rebuild the engines)")
    target = load_pretrained(tdir, device=device, dtype=dtype)
    vocab = target.config.vocab_size
    if tokenizer.get_vocab_size() > vocab:
        raise ConfigError(f"'{tok_path}' has {tokenizer.get_vocab_size()} tokens but the target's vocab_size is {vocab}")
    drafters: dict[str, LlamaForCausalLM | SelfSpec | None] = {}
    for spec in m.drafters:
        if spec.kind == "ngram":
            drafters[spec.name] = None
            continue
        if spec.kind == "self_spec":
            if spec.window < 1:
                raise ConfigError(f"{d / 'manifest.json'}: drafter '{spec.name}' (self_spec) needs window >= 1 "
                                  f"(got sink={spec.sink}, window={spec.window})")
            drafters[spec.name] = SelfSpec(spec.sink, spec.window)
            continue
        model = load_pretrained(d / spec.model, device=device, dtype=dtype)
        if model.config.vocab_size != vocab:
            raise ConfigError(f"drafter '{spec.name}' has vocab_size {model.config.vocab_size}; the target has {vocab}")
        model.batch_invariant = False  # a draft only proposes; the target's pass decides (see model.py)
        drafters[spec.name] = model
    return LoadedEngine(d, m, target, drafters, tokenizer)
