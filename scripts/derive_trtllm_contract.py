#!/usr/bin/env python3
"""Re-derive specctl's TensorRT-LLM contract from TensorRT-LLM's source, or check it against the source.

The contract (``control/executors/trtllm/contract/trtllm-<version>.json``) lists every upstream name
specctl's adapters rely on: module, class, constructor parameters, method parameters, config fields,
instance attributes, module attributes and strings, each with the upstream file it comes from. This
script reads those files from a local TensorRT-LLM tree (a ``git clone --branch v<version>`` of
NVIDIA/TensorRT-LLM, an unpacked wheel, or any directory holding the listed files at their
repository paths) with ``ast`` (nothing is imported, no GPU needed) and, for each entry, reports what
the source has.

    python scripts/derive_trtllm_contract.py --root ../TensorRT-LLM --version 1.2.1 --check
    python scripts/derive_trtllm_contract.py --root ../TensorRT-LLM --version 1.2.1 --write

``--check`` exits 1 listing every contract name the source lacks; ``--write`` rewrites the contract's
entries with what the source has (only the names the contract lists: adding a name is a decision,
made by editing the contract), after which ``git diff`` shows what changed between releases.

The repository is too large to clone on a small machine; its files can also be read one at a time
with the stored-code tools (``read_file`` repo NVIDIA/TensorRT-LLM, path as in the contract) and
saved under ``--root`` at the same paths. Which commit each was read at goes in the contract's
``source`` note.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

CONTRACT_DIR = Path(__file__).resolve().parents[1] / "control" / "executors" / "trtllm" / "contract"
LISTS = ("init", "fields", "attributes")


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return [n for n in names if n not in ("self", "cls")]


def _own(cls: ast.ClassDef) -> dict:
    """What one class body defines: fields (annotated names), methods (parameters), attributes (self.X =)."""
    out: dict = {"fields": [], "methods": {}, "attributes": []}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out["fields"].append(node.target.id)
        elif isinstance(node, ast.Assign):
            out["attributes"] += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out["methods"][node.name] = _params(node)
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                    sub, ast.AnnAssign | ast.AugAssign) else []
                out["attributes"] += [t.attr for t in targets if isinstance(t, ast.Attribute)
                                      and isinstance(t.value, ast.Name) and t.value.id == "self"]
    return out


def describe_class(classes: dict[str, ast.ClassDef], name: str) -> dict | None:
    """A class with what it inherits from bases defined in the same file (nearest definition wins)."""
    cls = classes.get(name)
    if cls is None:
        return None
    merged: dict = {"fields": [], "methods": {}, "attributes": []}
    for base in cls.bases:
        b = describe_class(classes, base.id) if isinstance(base, ast.Name) and base.id != name else None
        if b is not None:
            merged["fields"] += b["fields"]
            merged["methods"].update(b["methods"])
            merged["attributes"] += b["attributes"]
    own = _own(cls)
    merged["fields"] += own["fields"]
    merged["methods"].update(own["methods"])
    merged["attributes"] += own["attributes"]
    merged["init"] = merged["methods"].get("__init__", [])
    return merged


def derive_entry(root: Path, entry: dict) -> tuple[dict, list[str]]:
    """The entry as the source has it, and the contract names the source lacks."""
    path = root / entry["file"]
    if not path.is_file():
        return entry, [f"{entry['id']}: {entry['file']} is not under {root}"]
    text = path.read_text()
    missing: list[str] = []
    new = dict(entry)
    for s in entry.get("strings", []):
        if s not in text:
            missing.append(f"{entry['id']}: string {s!r} not in {entry['file']}")
    if "class" not in entry:
        return new, missing
    found = describe_class(_classes(ast.parse(text, str(path))), entry["class"])
    if found is None:
        return new, missing + [f"{entry['id']}: class {entry['class']} not in {entry['file']}"]
    for key in LISTS:
        have = set(found[key]) | (set(found["fields"]) if key == "attributes" else set())
        missing += [f"{entry['id']}: {key[:-1] if key != 'init' else 'parameter'} {n!r} not in {entry['class']}"
                    for n in entry.get(key, []) if n not in have]
        if key in entry:
            new[key] = [n for n in entry[key] if n in have]
    for meth, params in entry.get("methods", {}).items():
        if meth not in found["methods"]:
            missing.append(f"{entry['id']}: method {meth} not in {entry['class']}")
            continue
        missing += [f"{entry['id']}: {meth} has no parameter {p!r}" for p in params if p not in found["methods"][meth]]
        new.setdefault("methods", {})[meth] = found["methods"][meth]
    return new, missing


def derive(root: Path, contract: dict) -> tuple[dict, list[str]]:
    entries, missing = [], []
    for e in contract["names"]:
        new, miss = derive_entry(root, e)
        entries.append(new)
        missing += miss
    return {**contract, "names": entries}, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, type=Path, help="TensorRT-LLM source tree (repository layout)")
    ap.add_argument("--version", required=True, help="the contract to check or rewrite, e.g. 1.2.1")
    ap.add_argument("--contract", type=Path, help="the contract file (default: the repository's for --version)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 listing contract names the source lacks")
    mode.add_argument("--write", action="store_true", help="rewrite the contract from the source")
    args = ap.parse_args(argv)
    path = args.contract or CONTRACT_DIR / f"trtllm-{args.version}.json"
    if not path.is_file():
        print(f"no contract {path.name}; have: {', '.join(p.name for p in sorted(CONTRACT_DIR.glob('*.json')))}",
              file=sys.stderr)
        return 2
    if not args.root.is_dir():
        print(f"--root {args.root} is not a directory; give a TensorRT-LLM source tree", file=sys.stderr)
        return 2
    contract = json.loads(path.read_text())
    if contract.get("version") != args.version:
        print(f"{path.name} is the contract of {contract.get('version')!r}, not --version {args.version}", file=sys.stderr)
        return 2
    derived, missing = derive(args.root, contract)
    for m in missing:
        print(f"missing: {m}")
    if args.write:
        path.write_text(json.dumps(derived, indent=1) + "\n")
    elif not args.check:
        print(json.dumps(derived, indent=1))
    return 1 if missing and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
