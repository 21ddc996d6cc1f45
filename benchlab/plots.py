"""The matrix's PNG plots: throughput, memory, step-time spread, loss curves.

Every variant keeps its row: one that was skipped, ran out of memory or
diverged is drawn as a grey note saying so, not left out, so a reader sees
the whole matrix. Loss curves of variants that compute the same function lie
on one another, so a second panel shows each one's difference from the
baseline's curve.
"""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from benchlab.io import atomic_path  # noqa: E402

# Axis labels in words; the memory one depends on which peak was measured.
THROUGHPUT_LABEL = "throughput (tokens/s, median over timed steps)"
MEMORY_LABELS = {
    "peak_mem_allocated_mb": "peak GPU memory allocated (MiB)",
    "peak_rss_mb": "peak process memory, RSS (MiB)",
}
RESERVED_NOTE = "hatched: reserved, where CUDA graphs hide their pools from the allocated peak"
STEP_TIME_LABEL = "step time (ms, log scale; timed steps of the first repeat)"
NOTE_COLOR = "0.45"  # grey for rows that have no measurement
NOTE_CHARS = 70  # a reason longer than this is cut; the summary table has it whole
# Line styles and markers that differ in shape, not only colour, so curves
# stay apart in greyscale and where they cross.
LINE_STYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "x", "P", "*"]


def status_note(row: dict[str, Any]) -> str:
    """'skipped: <reason>' for a row without a measurement, cut short to fit beside a bar."""
    reason = (row.get("notes") or "").split(";")[0].strip()
    if len(reason) > NOTE_CHARS:
        reason = reason[: NOTE_CHARS - 1].rstrip() + "…"
    return f"{row['status']}: {reason}" if reason else row["status"]


def memory_key(rows: list[dict[str, Any]]) -> str:
    """CUDA's peak allocated where any row has it, else the CPU's peak RSS (what report._mem compares)."""
    return "peak_mem_allocated_mb" if any(r.get("peak_mem_allocated_mb") for r in rows) else "peak_rss_mb"


def _variant_axis(ax: Any, rows: list[dict[str, Any]], has_value: list[bool]) -> None:
    """One labelled row per variant, top to bottom in params order; unmeasured names in grey."""
    ax.set_yticks(range(len(rows)), [r["variant"] for r in rows])
    for tick, measured in zip(ax.get_yticklabels(), has_value):
        if not measured:
            tick.set_color(NOTE_COLOR)
    ax.set_ylim(len(rows) - 0.5, -0.5)


def _note_unmeasured(ax: Any, rows: list[dict[str, Any]], has_value: list[bool]) -> None:
    for i, (r, measured) in enumerate(zip(rows, has_value)):
        if not measured:
            ax.text(0.01, i, status_note(r), transform=ax.get_yaxis_transform(), va="center",
                    fontsize=8, color=NOTE_COLOR, style="italic")


def _height(n_rows: int) -> float:
    return 0.45 * max(n_rows, 2) + 1.2


def bar_figure(rows: list[dict[str, Any]], key: str, label: str, title: str, hatched: list[bool] | None = None,
               hatch_word: str = "") -> Figure:
    """Horizontal bars of rows[key]; rows without the value get a note in place of a bar. Rows marked in `hatched`
    are drawn as hatched outlines, their value labels followed by `hatch_word`."""
    values = [r.get(key) if r["status"] == "ok" else None for r in rows]
    has_value = [v is not None for v in values]
    marks = hatched or [False] * len(rows)
    fig, ax = plt.subplots(figsize=(8, _height(len(rows))))
    drawn = [i for i, v in enumerate(values) if v is not None]
    bars = ax.barh(drawn, [values[i] for i in drawn], color="tab:blue")
    for bar, i in zip(bars, drawn):
        if marks[i]:
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor("tab:blue")
    for i, (r, v) in enumerate(zip(rows, values)):
        if v is not None:
            speedup = f"  {r['speedup_x']:.2f}x" if key == "tokens_per_sec" and r.get("speedup_x") else ""
            ax.text(v, i, f" {v:,.0f}{speedup}" + (f" {hatch_word}" if marks[i] else ""), va="center", fontsize=8)
    _variant_axis(ax, rows, has_value)
    _note_unmeasured(ax, rows, has_value)
    ax.set_xlabel(label)
    ax.set_title(title)
    ax.margins(x=0.15)  # room for the value labels right of the longest bar
    return fig


def memory_of(row: dict[str, Any], mem_key: str) -> float | None:
    """What a row's memory is compared on: mem_key's peak, or the reserved peak where CUDA graphs hide their pools
    from the allocated one (report.summarize sets row["mem_reserved"])."""
    return row.get("peak_mem_reserved_mb") if row.get("mem_reserved") else row.get(mem_key)


def memory_figure(rows: list[dict[str, Any]], mem_key: str) -> Figure:
    """Peak memory bars of what the rows are compared on: mem_key's peak, but the reserved peak, hatched and
    labelled so, for a row whose allocated peak misses CUDA graphs' pools (row["mem_reserved"])."""
    reserved = [r["status"] == "ok" and bool(r.get("mem_reserved")) for r in rows]
    shown = [{**r, "_mem": memory_of(r, mem_key)} for r in rows]
    label = MEMORY_LABELS[mem_key] + (f"; {RESERVED_NOTE}" if any(reserved) else "")
    return bar_figure(shown, "_mem", label, "Peak memory by variant", hatched=reserved, hatch_word="reserved")


def step_time_figure(rows: list[dict[str, Any]], steps: dict[str, pd.DataFrame]) -> Figure:
    """Box plots of each measured variant's timed steps on a log axis labelled in plain milliseconds."""
    timed = {r["variant"]: steps[r["variant"]].query("timed == 1").step_ms.dropna()
             for r in rows if r["status"] == "ok" and r["variant"] in steps}
    has_value = [r["variant"] in timed and not timed[r["variant"]].empty for r in rows]
    fig, ax = plt.subplots(figsize=(8, _height(len(rows))))
    positions = [i for i, h in enumerate(has_value) if h]
    if positions:
        ax.boxplot([timed[rows[i]["variant"]] for i in positions], positions=positions, orientation="horizontal",
                   widths=0.6)
    ax.set_xscale("log")
    # Major ticks at 1, 2 and 5 per decade, written as plain numbers; the
    # default 10^k labels plus minor labels crowd into one another.
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    _variant_axis(ax, rows, has_value)
    _note_unmeasured(ax, rows, has_value)
    ax.set_xlabel(STEP_TIME_LABEL)
    ax.set_title("Step-time distribution")
    return fig


def baseline_name(rows: list[dict[str, Any]], baseline: str | None) -> str | None:
    """The named baseline, else the row the others were compared with (its speedup is exactly 1)."""
    if baseline is not None:
        return baseline
    return next((r["variant"] for r in rows if r.get("speedup_x") == 1.0), None)


def _line_style(i: int, n_points: int) -> dict[str, Any]:
    """The i-th curve's line style and marker; markers start at staggered steps so equal curves show each one."""
    every = max(n_points // 8, 1)
    return {"linestyle": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)],
            "markevery": (i % every, every), "markersize": 4, "linewidth": 1}


def loss_figure(rows: list[dict[str, Any]], steps: dict[str, pd.DataFrame], baseline: str | None) -> Figure:
    """Loss per step (top) and each curve minus the baseline's (bottom), with distinct styles per variant."""
    fig, (ax_loss, ax_diff) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(3, 2))
    curves = {r["variant"]: r for r in rows if r["variant"] in steps}
    base = steps[baseline].set_index("step").loss if baseline in curves else None
    identical = []
    for i, (name, r) in enumerate(curves.items()):
        s = steps[name]
        style = _line_style(i, len(s))
        label = name if r["status"] == "ok" else f"{name} ({r['status']})"
        line, = ax_loss.plot(s.step, s.loss, label=label, **style)
        if base is not None:
            diff = (s.set_index("step").loss - base).dropna()
            ax_diff.plot(diff.index, diff.values, color=line.get_color(), **style)
            if name != baseline and not diff.abs().any():
                identical.append(name)
    ax_loss.set_ylabel("training loss (nats)")
    ax_loss.set_title("Loss curves (same seed, same data order)")
    if curves:
        ax_loss.legend(fontsize=8, ncols=2)
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
    """The figure as a PNG at path, written whole or not at all, then closed."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
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
    """Tokens/s (top) and peak memory (bottom) against sequences per step, one line per sweep; a batch without a
    measurement (out of memory, skipped) is a grey cross on the axis, labelled with its status."""
    fig, (ax_tps, ax_mem) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, sweep in enumerate(sweeps):
        label = ", ".join(r["variant"] for r in sweep)
        ok = [r for r in sweep if r["status"] == "ok"]
        style = _line_style(i, len(ok))
        for ax, value in ((ax_tps, lambda r: r.get("tokens_per_sec")), (ax_mem, lambda r: memory_of(r, mem_key))):
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
    reserved = any(r["status"] == "ok" and r.get("mem_reserved") for sweep in sweeps for r in sweep)
    ax_mem.set_ylabel(MEMORY_LABELS[mem_key] + ("\n(reserved under CUDA graphs)" if reserved else ""))
    for ax in (ax_tps, ax_mem):
        ax.set_ylim(bottom=0)
    ax_tps.legend(fontsize=8)
    ax_tps.set_title("Batch sweeps: variants that differ only in batch size")
    return fig


def make_plots(rows: list[dict[str, Any]], steps_dir: Path, out_dir: Path, baseline: str | None = None) -> list[Path]:
    """Write the four PNGs into out_dir, and batch_sweep.png where some variants differ only in batch size;
    baseline defaults to the row whose speedup is 1."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = read_steps(rows, steps_dir)
    mem_key = memory_key(rows)
    figures = {
        "throughput.png": bar_figure(rows, "tokens_per_sec", THROUGHPUT_LABEL, "Throughput by variant"),
        "memory.png": memory_figure(rows, mem_key),
        "step_times.png": step_time_figure(rows, steps),
        "loss_curves.png": loss_figure(rows, steps, baseline_name(rows, baseline)),
    }
    sweeps = batch_sweeps(rows)
    if sweeps:
        figures["batch_sweep.png"] = batch_figure(sweeps, mem_key)
    for name, fig in figures.items():
        save_png(fig, out_dir / name)
    return [out_dir / name for name in figures]
