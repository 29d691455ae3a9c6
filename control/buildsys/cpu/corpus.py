"""The training corpus of the CPU pair: Python sources found on this machine.

By default the standard library of the running interpreter (``sysconfig.get_paths()["stdlib"]``,
without ``site-packages``); ``--corpus DIR`` points at any other tree of ``*.py`` files. Files are
read in sorted order and split into training and held-out sets by a hash of their relative path,
so the split is the same on every run and does not depend on the seed (acceptance numbers of
different seeds are measured on the same held-out files).
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from control.errors import ConfigError

SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the corpus root, posix separators
    text: str


@dataclass
class Corpus:
    """Training and held-out files of one corpus, plus a fingerprint of exactly what was read."""

    name: str
    root: Path
    train: list[SourceFile]
    heldout: list[SourceFile]
    skipped: int = 0
    sha256: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def train_bytes(self) -> int:
        return sum(len(f.text.encode()) for f in self.train)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "root": str(self.root),
            "files_train": len(self.train),
            "files_heldout": len(self.heldout),
            "files_skipped": self.skipped,
            "bytes_train": self.train_bytes,
            "bytes_heldout": sum(len(f.text.encode()) for f in self.heldout),
            "sha256": self.sha256,
            **self.meta,
        }


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_heldout(rel: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def _shuffle_key(rel: str) -> bytes:
    return hashlib.sha256(b"order:" + rel.encode()).digest()


def load_corpus(root: str | Path | None = None, *, heldout_fraction: float = 0.04, max_file_bytes: int = 200_000,
                max_train_bytes: int | None = None, max_heldout_files: int | None = None,
                heldout_only: bool = False) -> Corpus:
    """Read the corpus: ``*.py`` files under ``root`` (default: this interpreter's standard library).

    Files that are not UTF-8 or larger than ``max_file_bytes`` (generated tables) are skipped.
    ``max_train_bytes`` caps the training text (the quick build uses a fixed, hash-ordered subset).
    ``heldout_only`` reads just the held-out files (to re-measure acceptance of a built pair).
    """
    default = root is None
    base = stdlib_root() if default else Path(root)
    if not base.is_dir():
        raise ConfigError(f"corpus directory '{base}' does not exist; pass --corpus DIR with *.py files")
    if not 0.0 < heldout_fraction < 0.5:
        raise ConfigError(f"held-out fraction {heldout_fraction!r} must be in (0, 0.5)")
    rels = sorted(
        p.relative_to(base).as_posix()
        for p in base.rglob("*.py")
        if p.is_file() and not (SKIP_DIRS & set(p.relative_to(base).parts[:-1]))
    )
    train: list[SourceFile] = []
    heldout: list[SourceFile] = []
    skipped = 0
    train_chars = 0
    digest = hashlib.sha256()
    # Hash order: a cap on the training bytes then takes a spread of the tree, not one package.
    for rel in sorted(rels, key=_shuffle_key):
        held = _is_heldout(rel, heldout_fraction)
        if held and max_heldout_files is not None and len(heldout) >= max_heldout_files:
            continue
        if not held and (heldout_only or max_train_bytes is not None and train_chars >= max_train_bytes):
            continue
        raw = (base / rel).read_bytes()
        if len(raw) > max_file_bytes or not raw.strip():
            skipped += 1
            continue
        try:
            text = raw.decode("utf-8").replace("\r\n", "\n")
        except UnicodeDecodeError:
            skipped += 1
            continue
        if held:
            heldout.append(SourceFile(rel, text))
        else:
            train.append(SourceFile(rel, text))
            train_chars += len(text)
        digest.update(rel.encode() + b"\0" + raw + b"\0")
    if (len(train) < 2 and not heldout_only) or not heldout:
        raise ConfigError(
            f"corpus '{base}' has {len(train)} training and {len(heldout)} held-out usable *.py files; "
            "need at least 2 and 1 (point --corpus at a larger source tree)"
        )
    import platform

    name = f"python-{platform.python_version()}-stdlib" if default else base.name
    return Corpus(name=name, root=base, train=train, heldout=heldout, skipped=skipped, sha256=digest.hexdigest())
