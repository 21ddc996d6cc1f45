"""Write README.md's results sections from the committed result files; never by hand.

    python scripts/readme_results.py          # rewrite the sections in place
    python scripts/readme_results.py --check  # exit 1 if README.md is out of date

Each section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`.
"""

import json
import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from statistics import mean
from typing import get_args, get_type_hints

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.config import RunSettings  # noqa: E402  (the knob table lives there)


# Where result files are read from: the working tree, or the last commit (`--check`'s second look).
FROM_HEAD = False


def read(path: str) -> str:
    if FROM_HEAD:
        return subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    return (ROOT / path).read_text()


def load(path: str) -> dict:
    return json.loads(read(path))


def family_table(kernels_md: str) -> str:
    """The per-family block at the top of a profile stage's kernel table, and its closing line."""
    text = read(kernels_md)
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
    summary = read("results/h200/metrics/summary.md").strip()
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
    summary = read("metrics/summary.md").strip()
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
        "(85% and 10%). No knob of this table beat the recipe at batch 16; `fastest` and the later lean candidate "
        "are in the next section.",
        "",
        f"Against the recipe: {said} (CUDA graphs compared on reserved memory). {tail}",
    ])


def variants(run: str) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted((ROOT / run / "metrics/variants").glob("*.json"))}


def interval(r: dict) -> str:
    if not r.get("tokens_per_sec_pi95_low"):
        return "–"
    return f"{r['tokens_per_sec_pi95_low']:,.0f} to {r['tokens_per_sec_pi95_high']:,.0f}"


def overlap(a: dict, b: dict) -> str:
    if not (a.get("tokens_per_sec_pi95_low") and b.get("tokens_per_sec_pi95_low")):
        return "–"
    hit = a["tokens_per_sec_pi95_low"] <= b["tokens_per_sec_pi95_high"] and b["tokens_per_sec_pi95_low"] <= a["tokens_per_sec_pi95_high"]
    return "yes" if hit else "**no**"


# The earlier committed runs of the seed matrix's fp32 baseline (issue 7's figures, in-process repeats):
# each a 95% interval that the next run missed.
EARLIER_FP32 = [(45_126, 45_173), (45_256, 45_258), (45_234, 45_245)]


SEED = ["fp32_baseline", "tf32", "sdpa", "fp16", "bf16", "fused_adamw", "compile", "recipe"]
# Two runs of the seed matrix, side by side on GPU 0 of one machine per call (scripts/gpu_runs_and_knobs.sh):
# the first six variants in one call, compile and the recipe in a later one (another machine).
PAIRS = [("results/h200-runs/b1", "results/h200-runs/c1"), ("results/h200-runs/b2", "results/h200-runs/c2")]
REPEAT_LINE = re.compile(r"repeat \d+/\d+: ok \(([\d.]+) s, warm-up and compile ([\d.]+) s, timed ([\d.]+) s\)")


def repeat_costs(run: str) -> list[tuple[float, float, float]]:
    """(wall, warm-up, timed) seconds of each repeat, from the run's DVC log."""
    return [tuple(map(float, m.groups())) for m in REPEAT_LINE.finditer(read(f"{run}/dvc_log.txt"))]


def runs_section() -> str:
    """Run-to-run: the same variant in two separate DVC runs on one machine (fresh processes, fresh scratch copies)."""
    rows = ["| variant | machine | run b tokens/s | run b next run 95% | run c tokens/s | run c next run 95% | overlap "
            "| CV % (b, c) | p90 over median (b, c) | wall tokens/s (b) | wall below events (b) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    found: dict[str, tuple[dict, dict, str]] = {}
    for i, (b, c) in enumerate(PAIRS):
        vb, vc = variants(b), variants(c)
        for name in vb:
            found[name] = (vb[name], vc[name], f"{i + 1}")
    for name in SEED:
        rb, rc, call = found[name]
        rows.append(
            f"| {name} | {call} | {rb['tokens_per_sec']:,.0f} | {interval(rb)} | {rc['tokens_per_sec']:,.0f} | "
            f"{interval(rc)} | {overlap(rb, rc)} | {rb['tokens_per_sec_cv_pct']:.2f}, {rc['tokens_per_sec_cv_pct']:.2f} | "
            f"{100 * (rb['step_ms_p90'] / rb['step_ms_median'] - 1):+.1f}%, {100 * (rc['step_ms_p90'] / rc['step_ms_median'] - 1):+.1f}% | "
            f"{rb['tokens_per_sec_wall']:,.0f} | {rb['host_overhead_pct']:.2f}% |")
    recipe_b, recipe_c, _ = found["recipe"]
    first = found["fp32_baseline"][0]
    env = load(f"{PAIRS[0][0]}/metrics/env.json")
    sources = sorted({r[k]['provenance.source_sha256'][:12] for r in found.values() for k in (0, 1)})
    costs = [cost for run in (r for pair in PAIRS for r in pair) for cost in repeat_costs(run)]
    wall, timed = sum(c[0] for c in costs), sum(c[2] for c in costs)
    warm = sum(c[1] for c in costs)
    a = {**variants("results/h200-runs/a"), **variants("results/h200-runs/a-compile")}
    cross = [name for name in SEED if name in a and overlap(a[name], found[name][0]) != "yes"]
    return "\n".join([
        f"{env['gpu']} (GPU 0 of `nvidia-h200-x2`), driver {env['driver']}, torch {env['torch']}, "
        f"{first['provenance.date_utc'][:10]}, source `{', '.join(sources)}` (tree clean), "
        f"{first['repeats']} fresh-process repeats of {first['steps']} steps ({first['warmup_steps']} warm-up) per variant "
        "(files: `results/h200-runs/b1`, `c1`, `b2`, `c2`). Runs b and c of each call were started together in two "
        "scratch copies; the per-GPU timing lock let one variant's repeats run at a time, so they took turns. The "
        "other GPU ran another job meanwhile (the loss-head study above); "
        + ("no record flags interference." if not any(r[k].get("interference_suspected") for r in found.values()
                                                          for k in (0, 1)) else "some records flag interference."),
        "",
        *rows,
        "",
        f"Intervals overlap between the two runs for {sum(overlap(rb, rc) == 'yes' for rb, rc, _ in found.values())} of "
        f"{len(found)} variants. The recipe's CV is {recipe_b['tokens_per_sec_cv_pct']:.2f}% "
        f"and {recipe_c['tokens_per_sec_cv_pct']:.2f}% (bar 2%), its p90 step "
        f"{100 * (recipe_b['step_ms_p90'] / recipe_b['step_ms_median'] - 1):.1f}% and "
        f"{100 * (recipe_c['step_ms_p90'] / recipe_c['step_ms_median'] - 1):.1f}% above its median (bar 5%).",
        "",
        f"What a repeat costs: {len(costs)} repeats took {wall:,.0f} s of wall time, of which {warm:,.0f} s were warm-up "
        f"(compilation included) and {timed:,.0f} s the timed steps; the rest ({100 * (wall - warm - timed) / wall:.0f}%) is "
        "a fresh process's start-up, building the model, the validation loss and the exit. Repeat lines now name each part.",
        "",
        f"Across machines the interval does not hold: against run a of the same variants on another H200 "
        f"(`results/h200-runs/a`, `a-compile`), {len(cross)} of {len([n for n in SEED if n in a])} variants fall outside "
        f"({', '.join(cross)}); fp32 differs by {100 * (a['fp32_baseline']['tokens_per_sec'] / first['tokens_per_sec'] - 1):+.2f}%.",
    ])


PARITY_TOLERANCE = 0.05  # nats, mean training loss over the last 50 of 300 steps, against tf32 (README says why)


def step_losses(run: str, name: str) -> list[float]:
    rows = read(f"{run}/plots/steps/{name}.csv").splitlines()[1:]
    return [float(row.split(",")[1]) for row in rows]


def fastest_section() -> str:
    """fastest and lean beside the recipe (one run), then their loss curves over 300 steps of real text."""
    run, parity = "results/h200-knobs/inline-lean", "results/h200-parity/real-text"
    rows = variants(run)
    recipe, fp32 = rows["recipe"], rows["fp32_baseline"]
    env = load(f"{run}/metrics/env.json")
    table = ["| variant | what | tokens/s | next run 95% | vs recipe | step ms median | p90 | peak alloc MiB | of fp32's peak | val loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    what = {"recipe": "the public recipe", "loss_inline": "`fastest`: the recipe, only the loss leaves the compiled region",
            "lean_cce": "lean candidate: the recipe, every block checkpointed, cut-cross-entropy loss",
            "fp32_baseline": "fp32, manual attention, for-loop AdamW, eager"}
    for name in ("recipe", "loss_inline", "lean_cce", "fp32_baseline"):
        r = rows[name]
        table.append(f"| {name} | {what[name]} | {r['tokens_per_sec']:,.0f} | {interval(r)} | "
                     f"{r['tokens_per_sec'] / recipe['tokens_per_sec']:.3f} | {r['step_ms_median']:.2f} | {r['step_ms_p90']:.2f} | "
                     f"{r['peak_mem_allocated_mb']:,.0f} | {100 * r['peak_mem_allocated_mb'] / fp32['peak_mem_allocated_mb']:.1f}% | "
                     f"{r['val_loss']:.4f} |")
    fast, lean = rows["loss_inline"], rows["lean_cce"]
    curves = {name: step_losses(parity, name) for name in ("tf32", "recipe", "loss_inline", "lean_cce")}
    pv = variants(parity)
    corpus = load(f"{parity}/parity_corpus.json")
    ref = curves["tf32"]
    ptable = ["| variant | val loss | vs tf32 | train loss, mean of the last 50 steps | vs tf32 | largest gap of a 25-step mean | within tolerance |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    verdict = {}
    for name, losses in curves.items():
        gap = mean(losses[-50:]) - mean(ref[-50:])
        windows = max(abs(mean(losses[i:i + 25]) - mean(ref[i:i + 25])) for i in range(0, len(ref), 25))
        verdict[name] = abs(gap) <= PARITY_TOLERANCE
        ptable.append(f"| {name} | {pv[name]['val_loss']:.4f} | {pv[name]['val_loss'] - pv['tf32']['val_loss']:+.4f} | "
                      f"{mean(losses[-50:]):.4f} | {gap:+.4f} | {windows:.4f} | {'yes' if verdict[name] else '**no**'} |")
    small = variants("results/h200-parity/small-corpus")
    small_bytes = len(read("data/corpus/python_docs.txt").encode())
    tokens = 300 * small["tf32"]["tokens_per_step"]
    return "\n".join([
        f"`gpt2_124m`, batch {recipe['batch_size']} x {recipe['block_size']}, {recipe['repeats']} fresh-process repeats of "
        f"{recipe['steps']} steps ({recipe['warmup_steps']} warm-up), one DVC run; {env['gpu']} (GPU 1 of `nvidia-h200-x2`), "
        f"torch {env['torch']}, {recipe['provenance.date_utc'][:10]}, source `{recipe['provenance.source_sha256'][:12]}` "
        f"(files: `{run}/`). `loss_cce` alone was cut by the run's time limit. GPU 0 ran the seed-matrix runs "
        "meanwhile (next section); "
        + (f"records flagging interference (other processes kept the host's cores busy): "
           f"{', '.join(n for n, r in rows.items() if r.get('interference_suspected'))}, by "
           f"{max(r.get('cpu_busy_others_pct_max') or 0 for r in rows.values()):.0f}% of all cores at most."
           if any(r.get("interference_suspected") for r in rows.values()) else "no record flags interference."),
        "",
        *table,
        "",
        f"- `fastest` runs {fast['tokens_per_sec'] / recipe['tokens_per_sec']:.3f}x the recipe, and their intervals "
        f"{'do not overlap' if overlap(fast, recipe) != 'yes' else 'overlap'} (bar 1.10x: **missed**)"
        + ("; the recipe's record flags interference, so part of that gap may be the neighbours'" if
           recipe.get("interference_suspected") and not fast.get("interference_suspected") else "")
        + ". It is not "
        "profiled yet; the likely source is the logits: returned from the compiled graph they must be written out "
        "whole, kept inside it the compiler may fuse the cross-entropy with what produces them. The peak falls "
        f"from {recipe['peak_mem_allocated_mb']:,.0f} to {fast['peak_mem_allocated_mb']:,.0f} MiB.",
        f"- `lean_cce` holds {100 * lean['peak_mem_allocated_mb'] / fp32['peak_mem_allocated_mb']:.1f}% of the fp32 "
        f"baseline's peak in the same run (bar 10%: met) but runs at {lean['tokens_per_sec'] / recipe['tokens_per_sec']:.1%} "
        "of the recipe (bar 85%: **missed**). It is not profiled; the likely causes are that with its gradient "
        "filter off cut-cross-entropy's backward visits every vocabulary block, and that checkpointing reruns "
        "every block's forward. It also misses loss parity (below), so the "
        "`lean` variant stays the one of `results/h200-knobs/recipe-lean` (above).",
        "",
        f"Learning parity: 300 steps from the same seed, one run each, on {corpus['corpus_bytes'] / 1e6:.0f} MB of real text "
        f"(the GPU machine's Python sources, `scripts/bench_prepare.py corpus`; a 4,096-token BPE; 300 steps read less "
        f"than one epoch), learning rate {pv['recipe']['params.train.lr']:g} "
        f"with warm-up and cosine decay; same machine type, source `{pv['recipe']['provenance.source_sha256'][:12]}` "
        f"(files: `{parity}/`).",
        "",
        *ptable,
        "",
        f"Tolerance: {PARITY_TOLERANCE} nats on the last 50 steps' mean training loss against tf32 (fp32 is 3.7x slower "
        "and TF32 matmuls are what the public recipe keeps for fp32 work). Why that much: bf16 autocast itself "
        f"costs the recipe {mean(curves['recipe'][-50:]) - mean(ref[-50:]):+.3f} here, and the recipe is the accepted "
        "reference; a variant may stray as far again, but not further. Two bf16 variants that compute the same "
        f"function (`recipe`, `loss_inline`) differ by {abs(mean(curves['recipe'][-50:]) - mean(curves['loss_inline'][-50:])):.3f}.",
        "",
        f"On the embedded corpus ({small_bytes / 1e3:,.0f} KB) the same 300 steps read {tokens / 1e6:.1f}M tokens, many "
        "times its size, and memorising dominates: final training loss "
        f"{small['tf32']['final_train_loss']:.2f} for tf32 against {small['recipe']['final_train_loss']:.2f} for the recipe "
        "(`results/h200-parity/small-corpus/`). Parity needs text the run does not repeat.",
    ])


def small_section() -> str:
    rows = variants("results/h200-small")
    base = rows["fp32_baseline"]
    env = load("results/h200-small/metrics/env.json")
    table = ["| variant | tokens/s | vs fp32 | step ms median | p90 | peak alloc MiB | val loss |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("fp32_baseline", "tf32", "sdpa", "fp16", "bf16", "fused_adamw", "compile", "recipe"):
        r = rows.get(name)
        if r is None:
            table.append(f"| {name} | not run (the session's device time ran out) | – | – | – | – | – |")
            continue
        table.append(f"| {name} | {r['tokens_per_sec']:,.0f} | {r['tokens_per_sec'] / base['tokens_per_sec']:.2f} | "
                     f"{r['step_ms_median']:.2f} | {r['step_ms_p90']:.2f} | {r['peak_mem_allocated_mb']:,.0f} | {r['val_loss']:.4f} |")
    return "\n".join([
        f"`{base['model']}`, batch {base['batch_size']} x {base['block_size']}, {base['steps']} steps of which "
        f"{base['warmup_steps']} warm-up, one run per variant (no interval); {env['gpu']}, torch {env['torch']}, "
        f"{base['provenance.date_utc'][:10]}, source `{base['provenance.source_sha256'][:12]}` (files: `results/h200-small/`).",
        "",
        *table,
        "",
        f"At this size a step is a few milliseconds of small kernels, so the GPU waits on the launches: autocast alone "
        f"changes little or loses (bf16 {rows['bf16']['tokens_per_sec'] / base['tokens_per_sec']:.2f}x, fp16 "
        f"{rows['fp16']['tokens_per_sec'] / base['tokens_per_sec']:.2f}x: its casts and the GradScaler's checks are more "
        f"launches), while what removes launches wins: fused AdamW {rows['fused_adamw']['tokens_per_sec'] / base['tokens_per_sec']:.2f}x "
        f"(one kernel over all parameters instead of several per tensor), compile "
        f"{rows['compile']['tokens_per_sec'] / base['tokens_per_sec']:.2f}x (fused elementwise kernels). At GPT-2 124M the "
        f"same knobs rank the other way (above): there the matmuls dominate and the tensor cores decide.",
    ])


def x2_section() -> str:
    run1, run2 = variants("results/h200x2/gpt2_124m-1"), variants("results/h200x2/gpt2_124m-2")
    one, ddp, b32, fsdp = run2["one_b16"], run2["ddp_2"], run1["one_b32"], run1["fsdp2_2"]
    env = load("results/h200x2/gpt2_124m-2/metrics/env.json")
    bw = {row["size_mb"]: row["busbw_gb_s"] for row in load("results/h200x2/allreduce_bw.json")["rows"]}
    table = ["| variant | run | GPUs | global batch | tokens/s | per GPU | vs one GPU at 16 | step ms | peak MiB per GPU | val loss | train loss, last step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    run3, big = variants("results/h200x2/gpt2_124m-3"), variants("results/h200x2/gpt2_350m-1")
    fsdp_windows = [float(t) for t in re.findall(r"bench@fsdp2_2 .*?timed ([\d.]+) s", read("results/h200x2/gpt2_124m-3/dvc_log.txt"))]
    timed_steps = run3["ddp_2"]["steps"] - run3["ddp_2"]["warmup_steps"]
    listed = [("one_b16", "2", one), ("ddp_2", "2", ddp), ("one_b16", "1", run1["one_b16"]), ("one_b32", "1", b32),
              ("fsdp2_2", "1", fsdp), *((name, "3", run3[name]) for name in ("one_b16", "ddp_2", "one_b32")),
              ("one_b16, `gpt2_350m`", "350m-1", big["one_b16"])]
    for name, run, r in listed:
        table.append(f"| {name} | {run} | {r['world_size']} | {r['batch_size']} | {r['tokens_per_sec']:,.0f} | "
                     f"{r['tokens_per_sec_per_gpu']:,.0f} | {r['tokens_per_sec'] / one['tokens_per_sec']:.3f}x | {r['step_ms_median']:.2f} | "
                     f"{max(r['peak_mem_per_rank_mb']):,.0f} | {r['val_loss']:.4f} | {r['final_train_loss']:.4f} |")
    profile = read("results/h200x2/gpt2_124m-1/plots/profiles/fsdp2_2_kernels.md")
    comm_pct = float(re.search(r"\| communication \| [\d.]+ \| ([\d.]+) \|", profile).group(1))
    steps = read("results/h200x2/gpt2_124m-1/plots/steps/fsdp2_2.csv").splitlines()[1:]
    timed = [float(row.split(",")[3]) for row in steps if row.split(",")[4] == "1"]
    t_c, t_2 = one["step_ms_median"], ddp["step_ms_median"]
    exposed = t_2 - t_c
    grad_gb = 4 * 124_373_760 / 1e9  # fp32 gradients of GPT-2 124M (tied head, vocab 50304), the bytes DDP all-reduces
    t_ar2 = grad_gb / bw[64] * 1000  # ms at the 64 MB message's bus bandwidth (DDP's buckets are 25 MB: an upper bound on speed)
    f = 1 - exposed / t_ar2
    def predict(n: int, nic_gb_s: float | None = None) -> str:
        factor = 2 * (n - 1) / n
        t_ar = exposed * factor if nic_gb_s is None else grad_gb * factor / nic_gb_s * 1000
        step = t_c + t_ar
        return f"{n * 16 * 1024 / step * 1000:,.0f} | {100 * t_c / step:.1f}%"
    return "\n".join([
        f"GPT-2 124M, the public recipe (bf16, SDPA, TF32, fused AdamW, compile), 16 sequences of 1024 per GPU; "
        f"{env['gpu']} x {env['gpu_count']} (`nvidia-h200-x2`), torch {env['torch']}, {one['provenance.date_utc'][:10]}, "
        f"source `{one['provenance.source_sha256'][:12]}`, 2 fresh-process repeats per variant (files: `results/h200x2/`). "
        "Runs 1 and 2: two DVC runs on one machine (source above); run 1 lost `ddp_2` to its time limit, run 2 "
        f"measured it beside `one_b16`. Run 3 (`gpt2_124m-3`) and `gpt2_350m-1`: a later machine, source "
        f"`{run3['one_b16']['provenance.source_sha256'][:12]}`, with FSDP2's blocks compiled one by one; its time limit "
        f"cut `fsdp2_2` after both repeats but before the stage wrote its record (the log's timed windows, "
        f"{' and '.join(f'{t:.1f}' for t in fsdp_windows)} s for {timed_steps} steps of 32 x 1024 tokens, put it near "
        f"{timed_steps * 32 * 1024 / mean(fsdp_windows) / 1e3:,.0f}K tokens/s, still far below DDP), the DDP variants with "
        "`gradient_as_bucket_view` and 100 MiB buckets never started, and at `gpt2_350m` only `one_b16` finished.",
        "",
        *table,
        "",
        f"- DDP: {ddp['tokens_per_sec'] / one['tokens_per_sec']:.3f}x the one-GPU tokens/s in the same run, "
        f"{run3['ddp_2']['tokens_per_sec'] / run3['one_b16']['tokens_per_sec']:.3f}x in run 3 "
        f"(bar 1.93x: **missed**); efficiency {100 * ddp['tokens_per_sec'] / (2 * one['tokens_per_sec']):.1f}%. "
        f"Validation loss {ddp['val_loss'] - b32['val_loss']:+.4f} against one GPU at the same global batch (run 1).",
        f"- FSDP2 (bf16 parameters, fp32 reduce-scatter): efficiency {100 * fsdp['tokens_per_sec'] / (2 * one['tokens_per_sec']):.1f}%, "
        f"{fsdp['tokens_per_sec'] / ddp['tokens_per_sec']:.1%} of DDP's tokens/s (bar 95%: **missed**), "
        f"{max(fsdp['peak_mem_per_rank_mb']):,.0f} MiB per GPU against DDP's {max(ddp['peak_mem_per_rank_mb']):,.0f}; "
        f"its training loss follows one GPU's at batch 32 ({fsdp['final_train_loss'] - b32['final_train_loss']:+.4f} at the last step) "
        f"but its validation loss differs by {fsdp['val_loss'] - b32['val_loss']:+.4f} (not explained yet: on CPU "
        "the same settings, bf16 parameters on two gloo ranks, agree with one process within 2e-3, a slow test of "
        "`tests/test_distributed.py`). Its profile "
        f"(`plots/profiles/fsdp2_2_kernels.md`) has {comm_pct:.0f}% of kernel time in NCCL all-gathers and "
        f"reduce-scatters, with timed steps from {min(timed):.0f} to {max(timed):.0f} ms: the collectives do not "
        "overlap compute.",
        f"- All-reduce bus bandwidth (`scripts/allreduce_bw.py`, fp32): "
        + ", ".join(f"{size} MB {gbs:.0f} GB/s" for size, gbs in bw.items()) + ".",
        "",
        "Scaling model, filled from these files (124M; at 350M only one GPU was measured):",
        f"- `T_c` = {t_c:.2f} ms (`one_b16`), `T_2` = {t_2:.2f} ms (`ddp_2`): {exposed:.2f} ms exposed per step.",
        f"- `G` = {grad_gb:.2f} GB of fp32 gradients; at the 64 MB bus bandwidth ({bw[64]:.0f} GB/s) one all-reduce "
        f"takes `T_ar(2)` = {t_ar2:.2f} ms, so `f = 1 - (T_2 - T_c) / T_ar(2)` = {f:.2f}: no overlap with backward "
        "(below zero: the exposed time exceeds a whole all-reduce at that rate; 25 MB buckets run slower than 64 MB messages).",
        "- With no overlap, the exposed time grows with `2(n-1)/n`; across nodes the per-GPU NIC rate takes over "
        "(assumed 50 GB/s, 400 Gb/s InfiniBand per GPU: **not measured**).",
        "",
        "| GPUs | predicted tokens/s, DDP as measured | efficiency | pick |",
        "| --- | --- | --- | --- |",
        f"| 4 | {predict(4)} | DDP, once its all-reduce overlaps backward (then efficiency tends to 100%); FSDP2 as measured is slower |",
        f"| 8 | {predict(8)} | DDP, for the same reason; FSDP2 only to buy a larger batch per GPU |",
        f"| 16, two nodes | {predict(16, 50.0)} | DDP with overlap; else HSDP (shard within a node, replicate across) to cut the bytes on the slow link |",
    ])


SECTIONS = {"knobs": knobs_section, "h200-knobs": h200_knobs_section, "h200": h200_section,
            "h200-repeats": repeats_section, "cpu": cpu_section, "h200-runs": runs_section,
            "h200-small": small_section, "h200x2": x2_section, "h200-fastest": fastest_section}


def render(readme: str) -> str:
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n)(?:.*?\n)?(<!-- /results:{name} -->)", re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no <!-- results:{name} --> section")
        readme = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), readme)
    return readme


def committed_readme_holds() -> bool:
    """After a local `dvc repro` the working tree's metrics/ are this machine's, not the committed ones: the
    README still holds when it is the committed README and matches the committed files."""
    global FROM_HEAD
    try:
        head = subprocess.run(["git", "show", "HEAD:README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False  # not a git checkout: the working tree is all there is
    if head.stdout != (ROOT / "README.md").read_text():
        return False
    FROM_HEAD = True
    try:
        return render(head.stdout) == head.stdout
    finally:
        FROM_HEAD = False


def main() -> None:
    path = ROOT / "README.md"
    current = path.read_text()
    if "--check" in sys.argv:
        if render(current) == current:
            return
        if committed_readme_holds():
            print("README.md matches the committed result files; this working tree's metrics/ differ from them "
                  "(a local dvc repro)")
            return
        print("README.md results are out of date: run python scripts/readme_results.py")
        sys.exit(1)
    path.write_text(render(current))


if __name__ == "__main__":
    main()
