"""The matrix's PNG plots: throughput, memory, step-time spread, loss curves."""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from benchlab.io import atomic_path  # noqa: E402


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _bars(rows: list[dict[str, Any]], key: str, label: str, title: str, path: Path) -> None:
    ok = [r for r in rows if r.get(key) is not None]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(ok), 2) + 1))
    ax.barh([r["variant"] for r in ok], [r[key] for r in ok], color="tab:blue")
    for i, r in enumerate(ok):
        extra = f"  {r['speedup_x']:.2f}x" if key == "tokens_per_sec" and r.get("speedup_x") else ""
        ax.text(r[key], i, f" {r[key]:,.0f}{extra}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(label)
    ax.set_title(title)
    _save(fig, path)


def make_plots(rows: list[dict[str, Any]], steps_dir: Path, out_dir: Path) -> list[Path]:
    """Write the four PNGs into out_dir; only measured values are drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / n for n in ("throughput.png", "memory.png", "step_times.png", "loss_curves.png")]
    _bars(rows, "tokens_per_sec", "tokens/s (median)", "Throughput by variant", paths[0])
    mem_key = "peak_mem_allocated_mb" if any(r.get("peak_mem_allocated_mb") for r in rows) else "peak_rss_mb"
    _bars(rows, mem_key, f"{mem_key} (MiB)", "Peak memory by variant", paths[1])
    steps = {r["variant"]: pd.read_csv(steps_dir / f"{r['variant']}.csv") for r in rows if r["status"] == "ok"}
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(steps), 2) + 1))
    ax.boxplot([s.loc[s.timed == 1, "step_ms"] for s in steps.values()], vert=False, tick_labels=list(steps))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("step time, ms (timed steps, first repeat; log scale)")
    ax.set_title("Step-time distribution")
    _save(fig, paths[2])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, s in steps.items():
        ax.plot(s.step, s.loss, label=name, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss curves (same seed, same data order)")
    ax.legend(fontsize=8)
    _save(fig, paths[3])
    return paths
