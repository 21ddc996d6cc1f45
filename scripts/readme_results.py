"""Write README.md's results sections from the committed result files; never by hand.

    python scripts/readme_results.py          # rewrite the sections in place
    python scripts/readme_results.py --check  # exit 1 if README.md is out of date

Each section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`.
"""

import json
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import get_args, get_type_hints

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.config import RunSettings  # noqa: E402  (the knob table lives there)


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


def bf16_note() -> str:
    """What bf16 costs on this CPU, from the committed fp32 and bf16 rows."""
    env = load("metrics/env.json")
    fp32, bf16 = load("metrics/variants/fp32_baseline.json"), load("metrics/variants/bf16.json")
    native = "computes bf16 natively" if env["cpu_bf16_native"] else "has no native bf16"
    return (f"This CPU ({env['cpu']}) {native}: a bf16 step takes {bf16['step_ms_median'] / 1000:.2f} s against "
            f"{fp32['step_ms_median'] / 1000:.2f} s in fp32 ({bf16['step_ms_median'] / fp32['step_ms_median']:.1f}x).")


def cpu_section() -> str:
    summary = (ROOT / "metrics/summary.md").read_text().strip()
    ev, tr = load("metrics/eval.json"), load("metrics/records/train.json")
    return "\n".join([
        f"The default `dvc repro` on this repository's CPU machine (`metrics/`): the `{tr['model']}` model trained "
        f"{tr['params.train.steps']} steps reaches validation loss {ev['val_loss']:.3f} (perplexity {ev['val_perplexity']:.0f}) "
        f"on {ev['eval_tokens']:,} held-out tokens. "
        + bf16_note() + " The matrix at that size:",
        "",
        summary,
    ])


def knobs_section() -> str:
    """The knob table of the README, one row per field of RunSettings."""
    hints = get_type_hints(RunSettings)
    rows = ["| knob | values | default | what it does | applied at (benchlab/optimize.py order) | skipped where |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in fields(RunSettings):
        choices = get_args(hints[f.name])
        values = " \\| ".join(f"`{c}`" for c in choices if c is not type(None)) if choices else hints[f.name].__name__
        if hints[f.name] is bool:
            values = "`true` \\| `false`"
        elif set(choices) == {int, type(None)}:
            values = "integer or unset"
        default = f.default if f.default is not MISSING else "–"
        default = {True: "true", False: "false", None: "unset"}.get(default, default) if isinstance(default, (bool, type(None))) else default
        skip = f.metadata["skip"]
        where = (skip.__doc__ or "").strip() if skip else "runs everywhere"
        rows.append(f"| `{f.name}` | {values} | `{default}` | {f.metadata['doc']} | {f.metadata['applied']} | {where} |")
    return "\n".join(rows)


KNOB_RUNS = ["results/h200-knobs/recipe-lean", "results/h200-knobs/knobs-a", "results/h200-knobs/knobs-b"]
KNOB_ORDER = ["recipe", "ckpt_selective", "ckpt_full", "loss_chunked", "loss_fused", "cuda_graphs", "fp8", "accum_4",
              "lean", "batch_512"]
FP32_PEAK_MB = ("results/h200/metrics/variants/fp32_baseline.json", "peak_mem_allocated_mb")


def knob_rows() -> dict[str, dict]:
    found = {}
    for run in KNOB_RUNS:
        for path in sorted((ROOT / run / "metrics/variants").glob("*.json")):
            found[path.stem] = {**json.loads(path.read_text()), "run": run.rsplit("/", 1)[1]}
    return found


def h200_knobs_section() -> str:
    rows = knob_rows()
    recipe = rows["recipe"]
    fp32_peak = load(FP32_PEAK_MB[0])[FP32_PEAK_MB[1]]
    table = ["| variant | run | repeats | status | tokens/s | next run 95% | vs recipe | wall tokens/s | step ms median | p90 "
             "| peak alloc MiB | peak reserved MiB | vs fp32 peak % | val loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in KNOB_ORDER:
        r = rows.get(name)
        if r is None:
            continue
        if r["status"] != "ok":
            table.append(f"| {name} | {r['run']} | – | {r['status']}: {r['message'][:70]} | – | – | – | – | – | – | – | – | – | – |")
            continue
        pi = (f"{r['tokens_per_sec_pi95_low']:,.0f} to {r['tokens_per_sec_pi95_high']:,.0f}"
              if r.get("tokens_per_sec_pi95_low") else "–")
        alloc = f"{r['peak_mem_allocated_mb']:,.0f}" + ("" if r.get("peak_mem_allocated_comparable", True) else " (misses graph pools)")
        mem = r["peak_mem_reserved_mb"] if not r.get("peak_mem_allocated_comparable", True) else r["peak_mem_allocated_mb"]
        table.append(
            f"| {name} | {r['run']} | {r['repeats']} | ok | {r['tokens_per_sec']:,.0f} | {pi} | "
            f"{r['tokens_per_sec'] / recipe['tokens_per_sec']:.3f} | {r['tokens_per_sec_wall']:,.0f} | "
            f"{r['step_ms_median']:.2f} | {r['step_ms_p90']:.2f} | {alloc} | {r['peak_mem_reserved_mb']:,.0f} | "
            f"{100 * mem / fp32_peak:.1f} | {r['val_loss']:.4f} |")
    env = load(f"{KNOB_RUNS[0]}/metrics/env.json")
    lean = rows["lean"]
    def cost(name: str) -> str:
        r = rows[name]
        speed = 100 * (1 - r["tokens_per_sec"] / recipe["tokens_per_sec"])
        mem_key = "peak_mem_reserved_mb" if not r.get("peak_mem_allocated_comparable", True) else "peak_mem_allocated_mb"
        mem = 100 * (1 - r[mem_key] / recipe[mem_key])
        return f"{speed:.1f}% of the recipe's tokens/s and {'saves' if mem >= 0 else 'adds'} {abs(mem):.0f}% of its peak"

    said = ", ".join(f"`{n}` costs {cost(n)}" for n in KNOB_ORDER[1:-2] if rows.get(n, {}).get("status") == "ok")
    tail = (f"The recipe's p90 step is {100 * (recipe['step_ms_p90'] / recipe['step_ms_median'] - 1):.1f}% above its "
            f"median, and its wall-clock tokens/s {recipe['host_overhead_pct']:.1f}% below the event-timed figure.")
    return "\n".join([
        f"`gpt2_124m`, batch {recipe['batch_size']} x {recipe['block_size']} tokens (variants' own batch where named), "
        f"{recipe['steps']} steps per run of which {recipe['warmup_steps']} are warm-up; on {env['gpu']} "
        f"(driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}), {recipe['provenance.date_utc'][:10]}, "
        f"source `{recipe['provenance.source_sha256'][:12]}` in every row (files: `results/h200-knobs/`). "
        "Three DVC runs in one session on one machine: `recipe-lean` with 3 fresh-process repeats, `knobs-a` and "
        "`knobs-b` with one run each, so their ratio to the recipe crosses runs (minutes apart); "
        "memory is compared with the fp32 baseline's 32,611 MiB of `results/h200/` (same machine type).",
        "",
        *table,
        "",
        f"`lean` ({lean['tokens_per_sec'] / recipe['tokens_per_sec']:.1%} of the recipe's tokens/s, "
        f"{100 * lean['peak_mem_allocated_mb'] / fp32_peak:.1f}% of the fp32 baseline's peak) misses both of its bars "
        "(85% and 10%); no knob beat the recipe at batch 16, so there is no `fastest` result yet (its run was cut "
        "by the session's device time).",
        "",
        f"Against the recipe: {said} (CUDA graphs compared on reserved memory). {tail}",
    ])


SECTIONS = {"knobs": knobs_section, "h200-knobs": h200_knobs_section, "h200": h200_section,
            "h200-repeats": repeats_section, "cpu": cpu_section}


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
