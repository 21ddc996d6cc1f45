"""Where a training step goes in the two regimes on the H200, from committed results only.

    python scripts/regime_plot.py [OUT.png]   # default: results/h200-small/regimes.png

Top: each regime's step split by CUDA graphs, from two variants of one run that differ only in
`compile_mode: reduce-overhead`: the graph-replayed step bounds the GPU's own work (the same kernels, launched
as one graph), and what the graphs took off is time the GPU spent waiting for the host to launch kernels.
Bottom: the GPU-bound regime's kernel time by family, from the profile stage (the launch-bound run's profiles
were cut by its time limit, so it has no bottom bar).
"""

import gzip
import json
import sys
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.profiling import kernel_summary  # noqa: E402  (the profile stage's own per-family sums)

OUT = ROOT / "results/h200-small/regimes.png"
# (label, run, variant without graphs, the same with CUDA graphs)
PAIRS = [("gpt_small, 16 x 256: recipe", "results/h200-small", "recipe", "cuda_graphs"),
         ("gpt2_124m, 16 x 1024: recipe", "results/h200", "recipe", "cuda_graphs")]
PROFILE_RUN, PROFILE_VARIANT = "results/h200", "recipe"


def step_ms(run: str, variant: str) -> float:
    return float(json.loads((ROOT / run / "metrics/variants" / f"{variant}.json").read_text())["step_ms_median"])


def families(run: str, variant: str) -> tuple[dict[str, float], float]:
    """Kernel ms per step by family, and the traced step's GPU time (first to last kernel), from the run's trace."""
    steps = yaml.safe_load((ROOT / run / "params.yaml").read_text())["profile"]["steps"]
    with gzip.open(ROOT / run / "plots/profiles" / f"{variant}_trace.json.gz", "rt") as f:
        summary = kernel_summary(json.load(f)["traceEvents"], steps)
    return dict(summary["families"]), summary["gpu_step_ms"]


def main(out: Path = OUT) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), height_ratios=(1, 1))
    for i, (label, run, plain, graphs) in enumerate(PAIRS):
        total, replay = step_ms(run, plain), step_ms(run, graphs)
        work, wait = min(replay, total), max(total - replay, 0.0)
        top.barh(i, 100 * work / total, color="tab:blue", label="the same step under CUDA graphs" if i == 0 else None)
        top.barh(i, 100 * wait / total, left=100 * work / total, color="tab:orange",
                 label="taken off by CUDA graphs (GPU waiting for launches)" if i == 0 else None)
        top.text(1, i, f" {work:.2f} ms", va="center", color="white", fontsize=8)
        if wait / total > 0.1:
            top.text(100 * work / total + 1, i, f"{wait:.2f} ms", va="center", fontsize=8)
        top.text(101, i, f"step {total:.2f} ms" + (f"\n(under graphs {replay:.2f})" if wait / total <= 0.1 else ""),
                 va="center", fontsize=8)
    top.set_yticks(range(len(PAIRS)), [p[0] for p in PAIRS])
    top.set_xlim(0, 125)
    top.set_xlabel("share of the median step (%)")
    top.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    top.set_title("Where the step goes: launch-bound (gpt_small) against GPU-bound (GPT-2 124M)")
    fams, gpu_ms = families(PROFILE_RUN, PROFILE_VARIANT)
    left = 0.0
    colors = plt.get_cmap("tab10").colors
    for j, (name, ms) in enumerate(sorted(fams.items(), key=lambda kv: -kv[1])):
        bottom.barh(0, ms, left=left, color=colors[j % len(colors)], label=f"{name} {ms:.2f} ms")
        left += ms
    bottom.barh(0, gpu_ms - left, left=left, color="0.8", label=f"gaps between kernels {gpu_ms - left:.2f} ms")
    bottom.set_yticks([0], ["gpt2_124m: recipe"])
    bottom.set_xlabel("GPU time of one traced step (ms), kernels summed by family (torch.profiler)")
    bottom.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
