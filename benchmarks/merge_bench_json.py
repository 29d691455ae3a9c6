"""Replace some policies' rows of one specctl.bench/v1 file with those of another (same loads,
seeds and workload), e.g. after re-running one policy that changed.

    python benchmarks/merge_bench_json.py BASE.json OVERRIDE.json OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.report import load_json  # noqa: E402


def main() -> None:
    base, over, out = (Path(p) for p in sys.argv[1:4])
    b, o = load_json(base), load_json(over)
    pols = {r["policy"] for r in o["results"]}
    keep = [(r, d) for r, d in zip(b["results"], b["details"], strict=True) if r["policy"] not in pols]
    new = list(zip(o["results"], o["details"], strict=True))
    missing = {(r["load"], r["seed"]) for r, _ in keep} - {(r["load"], r["seed"]) for r, _ in new}
    if missing:
        raise SystemExit(f"{over} lacks (load, seed) points {sorted(missing)[:5]} that {base} has")
    rows = keep + new
    b["results"] = [r for r, _ in rows]
    b["details"] = [d for _, d in rows]
    b["meta"]["rerun"] = {"policies": sorted(pols), "from": over.name, "meta": o.get("meta", {})}
    out.write_text(json.dumps(b, indent=1))
    print(f"{out}: {len(keep)} rows kept, {len(new)} from {over.name} ({', '.join(sorted(pols))})")


if __name__ == "__main__":
    main()
