import pytest

from control.buildsys.cpu.corpus import load_corpus
from control.errors import ConfigError


def _tree(root, n=60):
    for i in range(n):
        d = root / f"pkg{i % 3}"
        d.mkdir(exist_ok=True)
        (d / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    (root / "latin1.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: skipped
    (root / "big.py").write_text("x = 1\n" * 50_000)  # larger than the cap: skipped
    sp = root / "site-packages"
    sp.mkdir()
    (sp / "thirdparty.py").write_text("import os\n")  # third-party code is not the corpus
    (root / "notes.txt").write_text("not python")


def test_split_is_deterministic_disjoint_and_filtered(tmp_path):
    _tree(tmp_path)
    a = load_corpus(tmp_path, heldout_fraction=0.2, max_file_bytes=100_000)
    b = load_corpus(tmp_path, heldout_fraction=0.2, max_file_bytes=100_000)
    names = lambda files: [f.path for f in files]  # noqa: E731
    assert names(a.train) == names(b.train) and names(a.heldout) == names(b.heldout)
    assert a.sha256 == b.sha256
    assert not set(names(a.train)) & set(names(a.heldout))
    every = set(names(a.train)) | set(names(a.heldout))
    assert every == {f"pkg{i % 3}/mod{i}.py" for i in range(60)}
    assert a.skipped == 2
    assert 3 <= len(a.heldout) <= 25  # about a fifth of 60


def test_content_change_changes_fingerprint(tmp_path):
    _tree(tmp_path)
    a = load_corpus(tmp_path, heldout_fraction=0.2)
    (tmp_path / "pkg0" / "mod0.py").write_text("changed = True\n")
    assert load_corpus(tmp_path, heldout_fraction=0.2).sha256 != a.sha256


def test_train_byte_cap(tmp_path):
    _tree(tmp_path)
    full = load_corpus(tmp_path, heldout_fraction=0.2)
    capped = load_corpus(tmp_path, heldout_fraction=0.2, max_train_bytes=200)
    assert 200 <= sum(len(f.text) for f in capped.train) < full.train_bytes
    assert [f.path for f in capped.heldout] == [f.path for f in full.heldout]


def test_missing_or_empty_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(tmp_path / "nope")
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="usable"):
        load_corpus(tmp_path)


def test_stdlib_is_the_default():
    c = load_corpus(max_train_bytes=50_000, max_heldout_files=3)
    assert c.name.startswith("python-") and c.name.endswith("-stdlib")
    assert len(c.heldout) == 3 and c.train
    assert all("site-packages" not in f.path for f in c.train)
