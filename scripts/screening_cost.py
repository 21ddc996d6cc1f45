"""Where a screening run's time goes, three ways, each from an empty compile cache on its own screening worker:
whole-model compilation (`model`), regional compilation (`blocks`, compile_scope=blocks), and regional compilation
after the candidates were compiled ahead on one-layer models in parallel (`ahead`, benchlab/search/worker.py). The
same candidates each way; the script prints each run's breakdown and inductor's cache hits, and whether the three
ways rank the candidates alike. A maintainers' benchmark (issue 50), for a GPU: it needs params.yaml's preset set
to a GPU size and data prepared for it.

    python scripts/screening_cost.py data/prepared OUT.json [--ways model blocks ahead]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlab.core.params import load_params  # noqa: E402
from benchlab.core.record import ALLOCATED
from benchlab.search import runs, worker  # noqa: E402

# The start and four one-change candidates whose block or head graphs differ: each a compilation of its own.
CANDIDATES: list[dict[str, Any]] = [{}, {"loss": "onepass"}, {"weight_dtype": "bf16", "optimizer": "adamw_bf16_sr"},
                                    {"fp8": "blocks"}, {"activation_checkpointing": "selective"}]
WAYS = ("model", "blocks", "ahead")


def one_way(way: str, data_dir: str, cache: Path, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidates screened one way on a fresh worker with an empty cache; compiling ahead first for `ahead`."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / way)
    os.environ["TRITON_CACHE_DIR"] = str(cache / way / "triton")
    p = load_params()
    start = worker.start_of(p)
    tokens = p.batch_size(start) * p.shape.block_size
    out: dict[str, Any] = {"way": way, "runs": []}
    if way == "ahead":
        batch = [worker.ahead(replace(start, **c), "blocks") for c in candidates]
        cost = worker.precompile([s for s in batch if s is not None], data_dir, p.search.precompile_processes,
                                 os.cpu_count() or 1)
        out["ahead"] = cost
        print(f"{way}: compiled {cost['precompiled']} ahead in {cost['wall_s']:.1f} s, "
              f"{cost['precompile_failed']} failed", flush=True)
    screen = worker.Worker(data_dir)
    try:
        for changes in candidates:
            asked = {**changes, **({} if way == "model" else {"compile_scope": "blocks"})}
            began = time.perf_counter()
            rec = screen.screen(asked)
            wall = time.perf_counter() - began
            timed = rec.timed_ms
            row = {"candidate": worker.moves.Candidate(tuple(changes.items())).name, "status": rec.status,
                   "message": rec.message[:300], "wall_s": wall,
                   "tokens_per_sec": tokens / (statistics.median(timed) / 1000) if timed else None,
                   "peak_allocated_mb": rec.memory.get(ALLOCATED), **runs.breakdown(rec, wall)}
            out["runs"].append(row)
            print(f"{way}: {row['candidate']}: {rec.status}, {wall:.1f} s wall, warm-up {rec.warmup_s or 0:.1f} s, "
                  f"{row['tokens_per_sec'] or 0:,.0f} tokens/s, cache {rec.compile_hits} hits / "
                  f"{rec.compile_misses} compiled", flush=True)
    finally:
        screen.close()
    return out


def ranking(way: dict[str, Any]) -> list[str]:
    ok = [r for r in way["runs"] if r["tokens_per_sec"]]
    return [r["candidate"] for r in sorted(ok, key=lambda r: -r["tokens_per_sec"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("out")
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="screening-cost-") as tmp:
        results = [one_way(way, args.data_dir, Path(tmp), CANDIDATES) for way in args.ways]
    summary = {"ways": results, "rankings": {r["way"]: ranking(r) for r in results}}
    for r in results:
        walls = [x["wall_s"] for x in r["runs"]]
        print(f"{r['way']}: median screening wall {statistics.median(walls):.1f} s, all {sum(walls):.0f} s"
              + (f" (+{r['ahead']['wall_s']:.0f} s compiling ahead)" if "ahead" in r else "")
              + f"; ranking {' > '.join(ranking(r))}")
    Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
