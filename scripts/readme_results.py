"""Write README.md's results sections from the committed result files; never by hand.

    python scripts/readme_results.py          # rewrite the sections in place
    python scripts/readme_results.py --check  # exit 1 if README.md is out of date

Each section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def family_table(kernels_md: str) -> str:
    """The per-family block at the top of a profile stage's kernel table, and its closing line."""
    text = (ROOT / kernels_md).read_text()
    families = text[text.index("| family |") : text.index("\n\n", text.index("| family |"))]
    return families + "\n\n" + text.strip().splitlines()[-1]


# shared/GPU.md's reference points for GPT-2 124M, batch 16, on the same
# machine type: tokens/s and peak allocated GiB. The recipe's tokens/s is the
# range over the two machines measured there.
REFERENCE = {
    "fp32_baseline": ((45.1e3, 45.1e3), 31.9),
    "tf32": ((120.6e3, 120.6e3), 31.9),
    "sdpa": ((54.8e3, 54.8e3), 22.8),
    "best": ((478e3, 488.5e3), 11.5),
}


def reference_table() -> str:
    rows = ["| variant | ours tokens/s | reference tokens/s | ours / reference | ours peak GiB | reference peak GiB |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, ((low, high), gib) in REFERENCE.items():
        r = load(f"results/h200/metrics/variants/{name}.json")
        ours = r["tokens_per_sec"]
        ref = f"{low:,.0f}" if low == high else f"{low:,.0f} to {high:,.0f}"
        ratio = f"{ours / low:.3f}" if low == high else f"{ours / high:.3f} to {ours / low:.3f}"
        rows.append(f"| {name} | {ours:,.0f} | {ref} | {ratio} | {r['peak_mem_allocated_mb'] / 1024:.1f} | {gib} |")
    return "\n".join(rows)


def h200_section() -> str:
    summary = (ROOT / "results/h200/metrics/summary.md").read_text().strip()
    base, best = load("results/h200/metrics/variants/fp32_baseline.json"), load("results/h200/metrics/variants/best.json")
    speedup = best["tokens_per_sec"] / base["tokens_per_sec"]
    mem = best["peak_mem_allocated_mb"] / base["peak_mem_allocated_mb"]
    return "\n".join([
        f"`gpt2_124m`, batch {best['batch_size']} x {best['block_size']} tokens, {best['steps']} steps per run of which "
        f"the first {best['warmup_steps']} are warm-up, {best['repeats']} repeats per variant; "
        f"run on {best['provenance.date_utc'][:10]} (files and how they were made: `results/h200/`).",
        "",
        summary,
        "",
        f"`best` against `fp32_baseline`: {speedup:.2f}x the tokens/s ({best['tokens_per_sec']:,.0f} against "
        f"{base['tokens_per_sec']:,.0f}), {100 * mem:.1f}% of its peak allocated memory, MFU {best['mfu_pct']:.1f}% "
        "of the 989 TFLOP/s dense bf16 peak.",
        "",
        "Against the reference points of `shared/GPU.md` (same machine type, other runs; `best` is that",
        "page's public recipe: bf16 autocast, SDPA, TF32, fused AdamW, torch.compile):",
        "",
        reference_table(),
        "",
        "Where `best` spends a step (profile stage, kernel device time, `results/h200/plots/profiles/`):",
        "",
        family_table("results/h200/plots/profiles/best_kernels.md"),
    ])


def repeats_section() -> str:
    rows = ["| variant | repeats | tokens/s (median) | 95% CI (t) | CV across repeats % | step ms median | val loss spread across repeats |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("fp32_baseline", "best"):
        r = load(f"results/h200-repeats/metrics/variants/{name}.json")
        rows.append(f"| {name} | {r['repeats']} | {r['tokens_per_sec']:,.0f} | {r['tokens_per_sec_ci95_low']:,.0f} to "
                    f"{r['tokens_per_sec_ci95_high']:,.0f} | {r['tokens_per_sec_cv_pct']:.2f} | {r['step_ms_median']:.2f} | "
                    f"{r['val_loss_repeat_spread']:.4f} |")
    env = load("results/h200-repeats/metrics/env.json")
    return f"On {env['gpu']} (driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}); files: `results/h200-repeats/`.\n\n" + "\n".join(rows)


def cpu_section() -> str:
    summary = (ROOT / "metrics/summary.md").read_text().strip()
    ev, tr = load("metrics/eval.json"), load("metrics/train.json")
    return "\n".join([
        f"The default `dvc repro` on this repository's CPU machine (`metrics/`): the `{tr['model']}` model trained "
        f"{tr['params.train.steps']} steps reaches validation loss {ev['val_loss']:.3f} (perplexity {ev['val_perplexity']:.0f}) "
        f"on {ev['eval_tokens']:,} held-out tokens. The matrix at that size:",
        "",
        summary,
    ])


SECTIONS = {"h200": h200_section, "h200-repeats": repeats_section, "cpu": cpu_section}


def render(readme: str) -> str:
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n)(?:.*?\n)?(<!-- /results:{name} -->)", re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no <!-- results:{name} --> section")
        readme = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), readme)
    return readme


def main() -> None:
    path = ROOT / "README.md"
    current = path.read_text()
    fresh = render(current)
    if "--check" in sys.argv:
        if fresh != current:
            print("README.md results are out of date: run python scripts/readme_results.py")
            sys.exit(1)
        return
    path.write_text(fresh)


if __name__ == "__main__":
    main()
