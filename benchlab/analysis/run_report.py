"""One run's report: what it measured, on what, how, and what it found, in one markdown file with its plots.

The aggregate stage writes the workspace's metrics/report.md with `write_run_report`; a committed results folder's
is rebuilt by `benchlab.analysis.folder_report`. Every figure in a report is read from the run's files or computed
from them (a ratio, a unit); a figure the files lack is a dash.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchlab.analysis.plot_style import by_reserved, grouped, memory_of
from benchlab.analysis.plots import make_plots
from benchlab.analysis.records import load_parity, uncommitted
from benchlab.analysis.summary import KINDS, UNCOMMITTED_NOTE, memory_cap_gib, not_run_reason, stopped_at, table
from benchlab.core.files import write_text
from benchlab.core.old_names import record_keys
from benchlab.core.profile_table import read_profile
from benchlab.core.record import REFERENCE_SEEDS
from benchlab.core.sections import AggregateParams

# The environment's rows: a label and how it reads from the record. Every other env.* key but SKIPPED_ENV is a
# library's version (env.torchao, env.liger_kernel, ...), listed where the record has it.
ENV_ROWS: list[tuple[str, Callable[[dict[str, Any]], str | None]]] = [
    ("GPU", lambda e: e.get("env.gpu") and f"{e['env.gpu']} x {e.get('env.gpu_count') or 1}"
     + (f", compute capability {e['env.gpu_capability']}" if e.get("env.gpu_capability") else "")
     or "none (a CPU run)"),
    ("driver", lambda e: e.get("env.driver")),
    ("CUDA / cuDNN", lambda e: e.get("env.cuda") and f"{e['env.cuda']} / {e.get('env.cudnn') or DASH}"),
    ("CPU", lambda e: e.get("env.cpu") and f"{e['env.cpu']}, {e.get('env.cpu_count', DASH)} cores, "
     f"{e.get('env.torch_threads', DASH)} torch threads"),
    ("Python / torch", lambda e: f"{e.get('env.python', DASH)} / {e.get('env.torch', DASH)}"),
    ("platform", lambda e: e.get("env.platform")),
]
SHOWN_ENV = {"env.gpu", "env.gpu_count", "env.gpu_capability", "env.driver", "env.cuda", "env.cudnn", "env.cpu",
             "env.cpu_count", "env.torch_threads", "env.python", "env.torch", "env.platform"}
SKIPPED_ENV = {"env.gpu_topology", "env.cuda_available", "env.cpu_bf16_native", "env.cxx_compiler"}
DASH = "–"


@dataclass(frozen=True)
class RunFiles:
    """Where one run's inputs are: the aggregate stage's paths, or a results folder's."""

    variants: Path
    steps: Path
    parity: Path
    profiles: Path

    @classmethod
    def of_folder(cls, folder: Path) -> "RunFiles":
        return cls(folder / "metrics/variants", folder / "plots/steps", folder / "metrics/parity",
                   folder / "plots/profiles")


def write_run_report(records: list[dict[str, Any]], files: RunFiles, agg: AggregateParams, report_md: Path,
                     plot_dir: Path, title: str, not_run: list[str] = ()) -> tuple[list[dict[str, Any]], str]:
    """Write the report and its PNGs (into plot_dir); return the summary's rows and its ratio line."""
    parity = load_parity(files.parity)
    rows, note = table(records, agg, parity)
    reference = agg.reference if any(r["variant"] == agg.reference and r["status"] == "ok" for r in rows) else None
    pngs = make_plots(rows, files.steps, plot_dir, reference=reference)
    links = [Path(os.path.relpath(p, report_md.parent)).as_posix() for p in pngs]
    sections = [f"# {title}\n", overview(rows), environment(records), settings(records, note),
                results_table(grouped(rows)), energy(rows), parity_section(parity, rows),
                plots(links), kernels(files.profiles, [r["variant"] for r in rows]), not_measured(records, not_run)]
    write_text(report_md, "\n".join(sections))
    return rows, note


def overview(rows: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return f"{len(rows)} variants: " + ", ".join(f"{n} {status}" for status, n in counts.items()) + ".\n"


def environment(records: list[dict[str, Any]]) -> str:
    """The machine and software of the first record (`check_one_env` saw to it that the rest match)."""
    first = records[0]
    lines = ["## Environment\n", "| | |", "| --- | --- |"]
    lines += [f"| {label} | {read(first) or DASH} |" for label, read in ENV_ROWS]
    libs = [f"{k.removeprefix('env.')} {v}" for k, v in sorted(first.items())
            if k.startswith("env.") and k not in SHOWN_ENV | SKIPPED_ENV and v not in (None, "")]
    lines.append(f"| libraries | {', '.join(libs) or DASH} |")
    dates = sorted(str(r["provenance.date_utc"]) for r in records if r.get("provenance.date_utc"))
    lines.append(f"| measured | {_when(dates[0], dates[-1]) if dates else DASH} |")
    commits = sorted({str(r.get("provenance.git_commit"))[:7] for r in records if r.get("provenance.git_commit")})
    sources = sorted({str(r.get("provenance.source_sha256"))[:12] for r in records
                      if r.get("provenance.source_sha256")})
    lines.append(f"| commit | {', '.join(commits) or DASH} (source sha256 {', '.join(sources) or DASH}) |")
    return "\n".join(lines) + "\n"


def _when(first: str, last: str) -> str:
    """'2026-12-01 10:40 to 10:46 UTC' from two ISO times; as written where they are not ISO."""
    try:
        a, b = (datetime.fromisoformat(t) for t in (first, last))
    except ValueError:
        return f"{first} to {last}"
    if a.tzinfo is None or b.tzinfo is None:
        return f"{first} to {last}"
    a, b = a.astimezone(timezone.utc), b.astimezone(timezone.utc)
    end = b.strftime("%H:%M") if a.date() == b.date() else b.strftime("%Y-%m-%d %H:%M")
    return f"{a.strftime('%Y-%m-%d %H:%M')} to {end} UTC"


def _values(records: list[dict[str, Any]], *keys: str) -> str:
    """The distinct values records hold under the first of `keys` they have, joined with ' or '; a dash for none."""
    found = []
    for r in records:
        value = next((r[k] for k in keys if r.get(k) is not None), None)
        if value is not None and value not in found:
            found.append(value)
    return " or ".join(map(str, found)) if found else DASH


def settings(records: list[dict[str, Any]], note: str) -> str:
    """Model, batch, steps, warm-up, repeats and memory cap as the records hold them; which row ratios are against."""
    caps = {memory_cap_gib(r) for r in records}
    cap = " or ".join(f"{c:g} GiB" if c else "none" for c in sorted(caps, key=lambda c: c or 0))
    text = (f"## Measurement\n\nModel {_values(records, 'params.model', 'model')}, batch "
            f"{_values(records, *record_keys('shape.batch_size'))} x "
            f"{_values(records, 'block_size', *record_keys('shape.block_size'))}"
            f" tokens{_own_batches(records)}, "
            f"{_values(records, 'params.bench.steps', 'steps')} steps per run of which "
            f"{_values(records, *record_keys('harness.warmup_steps'), 'warmup_steps')} are warm-up, left out of the timing; "
            f"{_values(records, 'params.bench.repeats', 'repeats')} repeat(s) asked, each in a fresh process; "
            f"GPU memory cap: {cap}.\n\n{note}\n")
    dirty = uncommitted(records)
    if dirty:
        text += (f"\n{', '.join(dirty)}: {UNCOMMITTED_NOTE} (the tree differed from its commit), so no commit names "
                 "their code; commit and rerun them for a result others can reproduce.\n")
    return text


def _own_batches(records: list[dict[str, Any]]) -> str:
    """' (sequences per step of ...: batch_4: 4)' for variants whose batch is not shape.batch_size; else empty.
    A record written before params.yaml was grouped by stage holds it under its old key (`record_keys`)."""
    common = [next((r[k] for k in record_keys("shape.batch_size") if k in r), None) for r in records]
    own = [f"{r['variant']}: {r['batch_size']}" for r, batch in zip(records, common, strict=True)
           if r.get("batch_size") is not None and batch is not None and r["batch_size"] != batch]
    return f" (sequences per step of variants with their own batch: {', '.join(own)})" if own else ""


def _num(value: Any, spec: str, suffix: str = "") -> str:
    return DASH if value is None else format(value, spec) + suffix


def results_table(rows: list[dict[str, Any]]) -> str:
    """The headline table, grouped by kind: throughput with its interval, ratios, memory, MFU, energy, parity."""
    vs = next((r["speedup_vs"] for r in rows if r.get("speedup_vs")), None) or "reference"
    head = ["variant", "kind", "status", "tokens/s", "95% interval (next run)", "runs", f"speedup vs {vs}",
            "peak memory GiB", f"memory vs {vs}", "MFU %", "tokens/J", "learns the same", "notes"]
    lines = ["## Results\n", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        mem = memory_of(r)
        cells = [r["variant"], KINDS.get(r.get("kind", "other"), "other"), r["status"],
                 _num(r.get("tokens_per_sec"), ",.0f"), r.get("tokens_per_sec_pi95") or DASH,
                 _num(r.get("repeats") if r["status"] == "ok" else None, "d"), _num(r.get("speedup_x"), ".2f", "x"),
                 DASH if mem is None else f"{mem / 1024:.2f}" + (" reserved" if by_reserved(r) else ""),
                 _num(r.get("mem_change_pct"), "+.1f", "%"), _num(r.get("mfu_pct"), ".1f"),
                 _num(r.get("tokens_per_joule"), ",.1f"), r.get("learns_same") or DASH,
                 _notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    mfu = ("MFU: model FLOPs per second over the GPU's datasheet peak; a dash where it is undefined (a CPU, a GPU "
           "without a peak in benchlab/run/mfu.py).")
    return "\n".join(lines) + f"\n\n{mfu}\n"


def _notes(r: dict[str, Any]) -> str:
    """An ok row's warnings, and a multi-process row's scaling against its one-process counterpart."""
    if r["status"] != "ok":
        return "see below"
    notes = [r["notes"]] if r.get("notes") else []
    if r.get("scaling_efficiency_pct") is not None:
        notes.append(f"{r.get('world_size')} ranks at {r['scaling_efficiency_pct']:.1f}% scaling efficiency against "
                     f"{r['scaling_ref']}")
    return "; ".join(notes).replace("|", "/")


def energy(rows: list[dict[str, Any]]) -> str:
    """Board power and tokens per joule where measured; the records' own reason where not, in one line where every
    row shares it."""
    ok = [r for r in rows if r["status"] == "ok"]
    cells = {r["variant"]: (f"{r['power_w_mean']:.0f}", f"{r['tokens_per_joule']:,.1f}")
             if r.get("power_w_mean") is not None and r.get("tokens_per_joule") is not None
             else (r.get("energy_note") or "not recorded: the record predates power measurement", DASH) for r in ok}
    reasons = {power for power, tpj in cells.values() if tpj == DASH}
    if not ok or (len(reasons) == 1 and all(tpj == DASH for _, tpj in cells.values())):
        return "## Energy\n\n" + (f"Every variant: {reasons.pop()}.\n" if ok else "No variant ran ok.\n")
    lines = ["## Energy\n", "| variant | board power W (mean over the timed steps) | tokens per joule |",
             "| --- | --- | --- |"]
    lines += [f"| {name} | {power} | {tpj} |" for name, (power, tpj) in cells.items()]
    return "\n".join(lines) + "\n"


def parity_section(parity: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The parity verdicts, with the reference's own two-seed spread that the tolerance is judged by."""
    head = "## Does it learn the same? (parity)\n\n"
    records = {k: v for k, v in parity.items() if k != REFERENCE_SEEDS}
    if not records:
        return head + ("No parity records (metrics/parity is missing or empty): this run did not check whether the "
                       "variants learn the same. `dvc repro` runs the parity stages.\n")
    seeds = parity.get(REFERENCE_SEEDS)
    text = head
    if seeds:
        tails = " and ".join(_num(t, ".4f") for t in seeds.get("tail_losses") or [])
        text += (f"The reference, {seeds.get('reference', DASH)}, trained {seeds.get('steps', DASH)} steps with "
                 f"batch-order seeds {', '.join(map(str, seeds.get('seeds') or [])) or DASH}: mean loss over the last "
                 f"{seeds.get('tail_steps', DASH)} steps {tails or DASH}, a gap of "
                 f"{_num(seeds.get('noise_nats'), '.4f')} nats from the batch order alone; tolerance "
                 f"{_num(seeds.get('tolerance'), 'g')} nats ({tolerance_words(seeds)}).\n\n")
    cols = ["variant", "verdict", "tail loss", "reference tail loss", "gap nats", "val loss", "reference val loss",
            "data passes", "steps (tail)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    in_table = [r["variant"] for r in rows if r["variant"] in records]
    order = in_table + sorted(set(records) - set(in_table))
    for name in order:
        p = records[name]
        verdict = next((r["learns_same"] for r in rows if r["variant"] == name), None)
        cells = [name, verdict or p.get("verdict") or DASH, _num(p.get("tail_loss"), ".4f"),
                 _num(p.get("reference_tail_loss"), ".4f"), _num(p.get("gap_nats"), "+.4f"),
                 _num(p.get("val_loss"), ".4f"), _num(p.get("reference_val_loss"), ".4f"),
                 _num(p.get("data_passes"), "g"), f"{p.get('steps', DASH)} ({p.get('tail_steps', DASH)})"]
        lines.append("| " + " | ".join(cells) + " |")
    return text + "\n".join(lines) + "\n\nThe curves: plots/parity/ (`dvc plots show`).\n"


def plots(links: list[str]) -> str:
    return "## Plots\n\n" + "\n\n".join(f"![{Path(link).stem.replace('_', ' ')}]({link})" for link in links) + "\n"


def kernels(profiles: Path, variants: list[str]) -> str:
    """Each profiled variant's kernel families side by side: device ms per step and share of kernel time; a CPU
    profile's top ops."""
    head = "## Where the time goes (profiled variants)\n\n"
    found = {v: read_profile((profiles / f"{v}_kernels.md").read_text(encoding="utf-8")) for v in variants
             if (profiles / f"{v}_kernels.md").is_file()}
    if not found:
        return head + "No profiles (plots/profiles is missing or holds no `<variant>_kernels.md`).\n"
    gpu = {v: fams for v, (_, fams, _) in found.items() if fams}
    text = head + "Each variant's whole tables: plots/profiles/<variant>_kernels.md.\n\n"
    if gpu:
        names: list[str] = []
        for fams in gpu.values():
            names += [f for f in fams if f not in names]
        lines = ["| kernel family (device ms per traced step, share) | " + " | ".join(gpu) + " |",
                 "|" + " --- |" * (len(gpu) + 1)]
        lines += [f"| {fam} | " + " | ".join(f"{fams[fam][0]:.2f} ms ({fams[fam][1]:.0f}%)" if fam in fams else DASH
                                              for fams in gpu.values()) + " |" for fam in names]
        text += "\n".join(lines) + "\n\n"
    for v, (header, fams, ops) in found.items():
        what = "" if fams else (f"; top ops by self CPU time: {', '.join(ops)}" if ops else "")
        text += f"- {v}: {header or 'no header'}{what}\n"
    return text


def tolerance_words(seeds: dict[str, Any]) -> str:
    """Whether the reference's run lets the tolerance judge: it ran, and its two orders end closer than it."""
    if seeds.get("status") != "ok":
        return f"the reference {seeds.get('status', DASH)}: {seeds.get('message') or DASH}"
    noise, tolerance = seeds.get("noise_nats"), seeds.get("tolerance")
    if noise is None or tolerance is None:
        return DASH
    if noise > tolerance:
        return "below that gap: no verdict; a tolerance above the gap, or a longer run, gives one"
    return "above that gap: verdicts are the optimization's, not the batch order's"


def not_measured(records: list[dict[str, Any]], not_run: list[str] = ()) -> str:
    """Every variant without a measurement, with its record's own reason; an oom row with the memory it reached."""
    missing = [r for r in records if r["status"] != "ok"]
    head = "## Skipped and failed\n\n"
    if not_run:
        head += (f"Not run (the run stopped before them; the same command again runs them): {', '.join(not_run)}."
                 "\n\n")
    if not missing:
        return head + "Every variant that ran, ran ok.\n"
    lines = ["| variant | status | why | stopped at |", "| --- | --- | --- | --- |"]
    for r in missing:
        where = stopped_at(r).removeprefix(" at ") if r["status"] == "oom" else ""
        why = (r.get("message") or not_run_reason(r)).replace("|", "/").replace("\n", " ")
        lines.append(f"| {r['variant']} | {r['status']} | {why} | {where or DASH} |")
    return head + "\n".join(lines) + "\n"

