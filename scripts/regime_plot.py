"""Where a training step goes in the two regimes on the H200, from committed results only.

    python scripts/regime_plot.py [OUT.png]   # default: results/h200-small/regimes.png

Top: each regime's step split by CUDA graphs, from two variants of one run that differ only in
`compile_mode: reduce-overhead`: the graph-replayed step bounds the GPU's own work (the same kernels, launched
as one graph), and what the graphs took off is time the GPU spent waiting for the host to launch kernels.
Bottom: each regime's traced step by kernel family, as shares of its GPU time, with the gaps between kernels
(the GPU idle), from the profile stage; a regime whose run has no profile of the variant (a time limit cut it)
gets no bottom bar, and the plot says so.
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
# (label, run, variant) of the profiles for the bottom panel, in the top panel's order.
# The launch-bound recipe beside its own step under CUDA graphs shows where the gaps go.
PROFILES = [("gpt_small, 16 x 256: recipe", "results/h200-small", "recipe"),
            ("gpt_small, 16 x 256: cuda_graphs", "results/h200-small", "cuda_graphs"),
            ("gpt2_124m, 16 x 1024: recipe", "results/h200", "recipe")]


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
    profiled = [(label, *families(run, v)) for label, run, v in PROFILES
                if (ROOT / run / "plots/profiles" / f"{v}_trace.json.gz").is_file()]
    missing = [label for label, run, v in PROFILES if label not in {p[0] for p in profiled}]
    names = list(dict.fromkeys(k for _, fams, _ in profiled for k in sorted(fams, key=lambda k: -fams[k])))
    colors = dict(zip(names, plt.get_cmap("tab10").colors))
    for i, (label, fams, gpu_ms) in enumerate(profiled):
        left = 0.0
        for name in names:
            share = 100 * fams.get(name, 0.0) / gpu_ms
            bottom.barh(i, share, left=left, color=colors[name], label=name if i == 0 else None)
            if share > 6:
                bottom.text(left + share / 2, i, f"{fams[name]:.2f}", ha="center", va="center", fontsize=7)
            left += share
        gap = gpu_ms - sum(fams.values())
        bottom.barh(i, 100 - left, left=left, color="0.8", label="gaps between kernels (GPU idle)" if i == 0 else None)
        bottom.text(101, i, f"traced step {gpu_ms:.2f} ms\n(gaps {gap:.2f} ms)", va="center", fontsize=8)
    bottom.set_yticks(range(len(profiled)), [p[0] for p in profiled])
    bottom.set_xlim(0, 125)
    bottom.set_xlabel("share of one traced step's GPU time (%), kernels summed by family (torch.profiler; "
                      "labels in ms)" + (f"\nno profile of {'; '.join(missing)}" if missing else ""))
    bottom.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45 if missing else -0.35))
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
