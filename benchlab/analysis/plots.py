"""The matrix's PNG plots: throughput, memory, energy, step-time spread, loss curves.

Rows are grouped and coloured by kind (report.KINDS: the seed's matrix, the
knobs on the recipe, our own), with the reference variant (the recipe) drawn
as a dashed line across the bars, whiskers for the 95% interval of the next
run where there were repeats, and axes in the units a user thinks in:
thousands of tokens/s, GiB, tokens per joule. Every variant keeps its row:
one that was skipped, ran out of memory or diverged is drawn as a grey note
saying so. Loss curves of variants that compute the same function lie on one
another, so a second panel shows each one's difference from the curve the
ratios are taken against.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from benchlab.analysis.plot_style import (  # noqa: E402
    ENERGY_LABEL,
    KIND_COLORS,
    LINE_STYLES,
    MARKERS,
    MEMORY_LABELS,
    MIB_PER_GIB,
    NOTE_COLOR,
    REFERENCE_COLOR,
    RESERVED_NOTE,
    STEP_TIME_LABEL,
    THROUGHPUT_LABEL,
    WHISKER_NOTE,
    by_reserved,
    grouped,
    height,
    kind_of,
    legend,
    measured,
    memory_key,
    memory_of,
    note_unmeasured,
    variant_axis,
    whiskers,
)
from benchlab.core.files import atomic_path  # noqa: E402


def bar_figure(rows: list[dict[str, Any]], values: list[float | None], label: str, title: str,
               text: Callable[[dict[str, Any], float], str], reference: str | None = None,
               intervals: list[tuple[float, float] | None] | None = None,
               hatched: list[bool] | None = None) -> Figure:
    """Horizontal bars of `values`, one row each, coloured by kind; rows without a value get a note in place of a
    bar. `text(row, value)` labels each bar; `intervals` draws whiskers; the `reference` row's value is a dashed
    line across the plot; rows marked in `hatched` are hatched outlines."""
    has_value = [v is not None for v in values]
    marks = hatched or [False] * len(rows)
    fig, ax = plt.subplots(figsize=(9, height(len(rows))))
    drawn = [i for i, v in enumerate(values) if v is not None]
    colors = [KIND_COLORS[kind_of(rows[i])] for i in drawn]
    bars = ax.barh(drawn, [values[i] for i in drawn], color=colors, height=0.7)
    for bar, i, color in zip(bars, drawn, colors):
        if marks[i]:
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor(color)
    ends = {}
    for i, ci in enumerate(intervals or []):
        if ci is not None and values[i] is not None:
            ax.errorbar([values[i]], [i], xerr=[[values[i] - ci[0]], [ci[1] - values[i]]], color="black",
                        elinewidth=1.2, capsize=4, capthick=1.2, zorder=3)
            ends[i] = ci[1]
    for i in drawn:
        ax.text(max(values[i], ends.get(i, 0.0)), i, " " + text(rows[i], values[i]), va="center", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3}, zorder=4)  # over the reference line
    ref = next((values[i] for i in drawn if rows[i]["variant"] == reference), None)
    if ref is not None:
        ax.axvline(ref, color=REFERENCE_COLOR, linestyle="--", linewidth=1.0)
    variant_axis(ax, rows, has_value)
    note_unmeasured(ax, rows, has_value)
    legend(ax, rows, reference if ref is not None else None)
    ax.set_xlabel(label)
    ax.set_title(title)
    right = max([values[i] for i in drawn] + list(ends.values()), default=0.0)
    ax.set_xlim(0.0, 1.2 * right or 1.0)  # a fifth more than the longest bar or whisker, for its value label
    return fig


def _thousands(v: float) -> str:
    return f"{v:,.0f}k" if v >= 100 else f"{v:.1f}k"


def throughput_figure(rows: list[dict[str, Any]], reference: str | None = None) -> Figure:
    """Tokens/s in thousands, with each bar's speedup and whiskers where there were repeats."""
    values = [measured(r, "tokens_per_sec", 1000.0) for r in rows]
    vs = next((r["speedup_vs"] for r in rows if r.get("speedup_vs")), None)

    def text(r: dict[str, Any], v: float) -> str:
        return _thousands(v) + (f"  {r['speedup_x']:.2f}x" if r.get("speedup_x") is not None else "")

    label = THROUGHPUT_LABEL + (f"; {WHISKER_NOTE}" if any(whiskers(r) for r in rows) else "")
    title = "Throughput by variant" + (f" (speedup vs {vs})" if vs else "")
    return bar_figure(rows, values, label, title, text, reference, [whiskers(r, 1000.0) for r in rows])


def memory_figure(rows: list[dict[str, Any]], mem_key: str, reference: str | None = None) -> Figure:
    """Peak memory in GiB of what each row is compared by (`memory_of`), labelled by mem_key's peak; the reserved
    peak, hatched and labelled so, for a row whose allocated peak misses CUDA graphs' pools."""
    reserved = [by_reserved(r) for r in rows]
    values = [None if (mib := memory_of(r)) is None else mib / MIB_PER_GIB for r in rows]

    def text(r: dict[str, Any], v: float) -> str:
        return (f"{v:.2f}" if v < 10 else f"{v:.1f}") + (" reserved" if by_reserved(r) else "")

    label = MEMORY_LABELS[mem_key] + (f"; {RESERVED_NOTE}" if any(reserved) else "")
    return bar_figure(rows, values, label, "Peak memory by variant", text, reference, hatched=reserved)


def energy_figure(rows: list[dict[str, Any]], reference: str | None = None) -> Figure:
    """Tokens per joule where the board's power was measured; a row without it says so in grey."""
    values = [measured(r, "tokens_per_joule") for r in rows]
    shown = [r if v is not None or r["status"] != "ok" else {**r, "status": "not measured",
                                                                 "notes": (r.get("energy_note") or "").removeprefix(
                                                                     "not measured: ")}
             for r, v in zip(rows, values)]
    return bar_figure(shown, values, ENERGY_LABEL, "Energy by variant", lambda r, v: f"{v:,.0f}", reference)


def step_time_figure(rows: list[dict[str, Any]], steps: dict[str, pd.DataFrame]) -> Figure:
    """Box plots of each measured variant's timed steps on a log axis labelled in plain milliseconds."""
    timed = {r["variant"]: steps[r["variant"]].query("timed == 1").step_ms.dropna()
             for r in rows if r["status"] == "ok" and r["variant"] in steps}
    has_value = [r["variant"] in timed and not timed[r["variant"]].empty for r in rows]
    fig, ax = plt.subplots(figsize=(9, height(len(rows))))
    positions = [i for i, h in enumerate(has_value) if h]
    if positions:
        boxes = ax.boxplot([timed[rows[i]["variant"]] for i in positions], positions=positions,
                           orientation="horizontal", widths=0.6, patch_artist=True, medianprops={"color": "black"})
        for box, i in zip(boxes["boxes"], positions):
            box.set_facecolor(KIND_COLORS[kind_of(rows[i])])
    ax.set_xscale("log")
    # Major ticks at 1, 2 and 5 per decade, written as plain numbers; the
    # default 10^k labels plus minor labels crowd into one another.
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    variant_axis(ax, rows, has_value)
    note_unmeasured(ax, rows, has_value)
    legend(ax, rows, None)
    ax.set_xlabel(STEP_TIME_LABEL)
    ax.set_title("Step-time distribution")
    return fig


def baseline_name(rows: list[dict[str, Any]], baseline: str | None) -> str | None:
    """The named baseline, else the row the others were compared with (report.summarize's speedup_vs)."""
    if baseline is not None:
        return baseline
    named = next((r["speedup_vs"] for r in rows if r.get("speedup_vs")), None)
    return named or next((r["variant"] for r in rows if r.get("speedup_x") == 1.0), None)


def _line_style(i: int, n_points: int) -> dict[str, Any]:
    """The i-th curve's line style and marker; markers start at staggered steps so equal curves show each one."""
    every = max(n_points // 8, 1)
    return {"linestyle": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)],
            "markevery": (i % every, every), "markersize": 4, "linewidth": 1}


def loss_figure(rows: list[dict[str, Any]], steps: dict[str, pd.DataFrame], baseline: str | None,
                reference: str | None = None) -> Figure:
    """Loss per step (top) and each curve minus the baseline's (bottom); colours by kind, shapes per variant,
    the reference curve in black."""
    fig, (ax_loss, ax_diff) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
    curves = {r["variant"]: r for r in rows if r["variant"] in steps}
    base = steps[baseline].set_index("step").loss if baseline in curves else None
    identical = []
    for i, (name, r) in enumerate(curves.items()):
        s = steps[name]
        style = _line_style(i, len(s))
        if name == reference:
            style.update(color=REFERENCE_COLOR, linewidth=1.8, zorder=3)
        else:
            style["color"] = KIND_COLORS[kind_of(r)]
        label = name if r["status"] == "ok" else f"{name} ({r['status']})"
        ax_loss.plot(s.step, s.loss, label=label + (" (reference)" if name == reference else ""), **style)
        if base is not None:
            diff = (s.set_index("step").loss - base).dropna()
            ax_diff.plot(diff.index, diff.values, **style)
            if name != baseline and not diff.abs().any():
                identical.append(name)
    ax_loss.set_ylabel("training loss (nats)")
    ax_loss.set_title("Loss curves (same seed, same data order)")
    if curves:
        ax_loss.legend(fontsize=7, ncols=1 + len(curves) // 12, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       frameon=False)
    ax_diff.axhline(0.0, color="0.6", linewidth=0.8)
    ax_diff.set_xlabel("optimizer step")
    ax_diff.set_ylabel(f"loss minus {baseline or 'baseline'} (nats)")
    if base is None:
        note = f"no loss curve for the baseline ({baseline or 'none named'})"
    else:
        note = f"equal to {baseline} at every step: {', '.join(identical)}" if identical else ""
    ax_diff.text(0.01, 0.03, note, transform=ax_diff.transAxes, fontsize=8, color=NOTE_COLOR)
    return fig


def read_steps(rows: list[dict[str, Any]], steps_dir: Path) -> dict[str, pd.DataFrame]:
    """Each variant's per-step CSV that has rows (a skipped variant's has a header only)."""
    frames = {r["variant"]: pd.read_csv(steps_dir / f"{r['variant']}.csv") for r in rows
              if (steps_dir / f"{r['variant']}.csv").is_file()}
    return {name: frame for name, frame in frames.items() if len(frame)}


def save_png(fig: Figure, path: Path) -> None:
    """The figure as a PNG at path, written whole or not at all, then closed. No software version in the file,
    so the same figure gives the same bytes."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def batch_sweeps(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows whose knobs differ in `batch_size` alone, grouped, smallest batch first; only groups of two or
    more batch sizes (a sweep). A row that ran out of memory stays in its group."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        settings = r.get("settings") or {}
        if settings.get("batch_size") is None:
            continue
        key = repr(sorted((k, repr(v)) for k, v in settings.items() if k != "batch_size"))
        groups.setdefault(key, []).append(r)
    return [sorted(g, key=lambda r: r["settings"]["batch_size"]) for g in groups.values()
            if len({r["settings"]["batch_size"] for r in g}) >= 2]


def batch_figure(sweeps: list[list[dict[str, Any]]], mem_key: str) -> Figure:
    """Thousands of tokens/s (top) and peak memory in GiB (bottom) against sequences per step, one line per sweep;
    a batch without a measurement (out of memory, skipped) is a grey cross on the axis, labelled with its status."""
    fig, (ax_tps, ax_mem) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, sweep in enumerate(sweeps):
        label = ", ".join(r["variant"] for r in sweep)
        ok = [r for r in sweep if r["status"] == "ok"]
        style = _line_style(i, len(ok))
        for ax, value in ((ax_tps, lambda r: measured(r, "tokens_per_sec", 1000.0)),
                          (ax_mem, lambda r: None if (mib := memory_of(r)) is None else mib / MIB_PER_GIB)):
            points = [(r["settings"]["batch_size"], value(r)) for r in ok if value(r) is not None]
            ax.plot([b for b, _ in points], [v for _, v in points], label=label, **{**style, "markevery": 1})
        for r in sweep:
            if r["status"] != "ok":
                for ax in (ax_tps, ax_mem):
                    ax.plot([r["settings"]["batch_size"]], [0], marker="x", color=NOTE_COLOR, clip_on=False)
                ax_tps.annotate(r["status"], (r["settings"]["batch_size"], 0), textcoords="offset points",
                                xytext=(0, 6), ha="center", fontsize=8, color=NOTE_COLOR)
    ax_mem.set_xscale("log", base=2)
    ax_mem.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_mem.set_xlabel("batch (sequences per optimizer step)")
    ax_tps.set_ylabel(THROUGHPUT_LABEL.split(",")[0] + ")")
    reserved = any(by_reserved(r) for sweep in sweeps for r in sweep)
    ax_mem.set_ylabel(MEMORY_LABELS[mem_key] + ("\n(reserved under CUDA graphs)" if reserved else ""))
    for ax in (ax_tps, ax_mem):
        ax.set_ylim(bottom=0)
    ax_tps.legend(fontsize=8)
    ax_tps.set_title("Batch sweeps: variants that differ only in batch size")
    return fig


def make_plots(rows: list[dict[str, Any]], steps_dir: Path, out_dir: Path, baseline: str | None = None,
               reference: str | None = None) -> list[Path]:
    """Write throughput, memory, step-time and loss PNGs into out_dir, energy.png where any power was measured and
    batch_sweep.png where some variants differ only in batch size. Loss differences are taken from `baseline`,
    by default the row the ratios are against; `reference` is drawn as the reference line."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = grouped(rows)
    steps = read_steps(rows, steps_dir)
    mem_key = memory_key(rows)
    figures = {
        "throughput.png": throughput_figure(rows, reference),
        "memory.png": memory_figure(rows, mem_key, reference),
        "step_times.png": step_time_figure(rows, steps),
        "loss_curves.png": loss_figure(rows, steps, baseline_name(rows, baseline), reference),
    }
    if any(measured(r, "tokens_per_joule") is not None for r in rows):
        figures["energy.png"] = energy_figure(rows, reference)
    sweeps = batch_sweeps(rows)
    if sweeps:
        figures["batch_sweep.png"] = batch_figure(sweeps, mem_key)
    for name, fig in figures.items():
        save_png(fig, out_dir / name)
    return [out_dir / name for name in figures]
