"""The batch-sweep plot of a committed run whose aggregate stage did not run (a time limit cut it).

    python scripts/sweep_plot.py results/h200-small

Reads the run's variant records (metrics/variants/*.json) and writes <run>/batch_sweep.png with the same
function the aggregate stage uses, so the figure shows only what the run measured.
"""

import argparse
import json
from pathlib import Path

from benchlab.plots import batch_figure, batch_sweeps, memory_key, save_png
from benchlab.report import summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    run = ap.parse_args().run
    results = [json.loads(p.read_text()) for p in sorted((run / "metrics" / "variants").glob("*.json"))]
    rows = summarize(results, baseline="", tolerance=0.0)
    sweeps = batch_sweeps(rows)
    if not sweeps:
        raise SystemExit(f"{run}: no variants that differ only in batch size")
    save_png(batch_figure(sweeps, memory_key(rows)), run / "batch_sweep.png")
    print(f"wrote {run / 'batch_sweep.png'}: " + "; ".join(", ".join(r["variant"] for r in s) for s in sweeps))


if __name__ == "__main__":
    main()
