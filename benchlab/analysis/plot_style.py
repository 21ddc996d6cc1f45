"""What every plot of the matrix shares: axis labels in the units users think in, a colour per kind of variant, line
styles told apart in greyscale, and the axis, note and legend helpers that give every variant its row."""

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from benchlab.analysis.summary import KINDS  # noqa: E402
from benchlab.core.record import ALLOCATED, RSS, Memory  # noqa: E402

# Axis labels in words and in the units users think in; the memory one depends on which peak was measured.
THROUGHPUT_LABEL = "throughput (thousand tokens/s, median over timed steps)"


WHISKER_NOTE = "whiskers: 95% interval of the next run"


MEMORY_LABELS = {
    ALLOCATED: "peak GPU memory allocated (GiB)",
    RSS: "peak process memory, RSS (GiB)",
}


ENERGY_LABEL = "energy efficiency (tokens per joule of board power; more is better)"


RESERVED_NOTE = "hatched: reserved, where CUDA graphs hide their pools from the allocated peak"


STEP_TIME_LABEL = "step time (ms, log scale; timed steps of the first repeat)"


MIB_PER_GIB = 1024.0


NOTE_COLOR = "0.45"  # grey for rows that have no measurement


NOTE_CHARS = 70  # a reason longer than this is cut; the summary table has it whole


# One colour per kind, told apart also in greyscale by lightness; the reference line is black.
KIND_COLORS = {"seed": "#4c72b0", "recipe": "#dd8452", "ours": "#2ca02c", "other": "#8c8c8c"}


REFERENCE_COLOR = "black"


# Line styles and markers that differ in shape, not only colour, so curves
# stay apart in greyscale and where they cross.
LINE_STYLES = ["-", "--", "-.", ":"]


MARKERS = ["o", "s", "^", "D", "v", "x", "P", "*"]


def status_note(row: dict[str, Any]) -> str:
    """'skipped: <reason>' for a row without a measurement, cut short to fit beside a bar; an oom row says the
    memory it reached where its record has it ('oom at 23,900 MiB: ...')."""
    reason = (row.get("notes") or "").split(";")[0].strip()
    if len(reason) > NOTE_CHARS:
        reason = reason[: NOTE_CHARS - 1].rstrip() + "…"
    status = row["status"]
    reached = Memory.of(row).reached()
    if status == "oom" and reached:
        status += f" at {reached:,.0f} MiB"
    return f"{status}: {reason}" if reason else status


def kind_of(row: dict[str, Any]) -> str:
    return row.get("kind") if row.get("kind") in KINDS else "other"


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows by kind in KINDS' order, each kind in the rows' own (params) order."""
    order = list(KINDS)
    return sorted(rows, key=lambda r: order.index(kind_of(r)))


def memory_key(rows: list[dict[str, Any]]) -> str:
    """The memory axis's label (a key of MEMORY_LABELS): CUDA's peak allocated where any row has it, else the CPU's
    peak RSS. Each row's figure is the one it is compared by (`memory_of`)."""
    return ALLOCATED if any(Memory.of(r).allocated_mb for r in rows) else RSS


def memory_of(row: dict[str, Any]) -> float | None:
    """The memory figure (MiB) a row that ran ok is compared by (benchlab.core.record.Memory.compared): its
    reserved peak where CUDA graphs hide their pools from the allocated one; None for a row without one."""
    return Memory.of(row).compared() if row["status"] == "ok" else None


def by_reserved(row: dict[str, Any]) -> bool:
    """A row that ran ok and is compared by its reserved peak: drawn hatched, labelled "reserved"."""
    return row["status"] == "ok" and Memory.of(row).by_reserved


def variant_axis(ax: Any, rows: list[dict[str, Any]], has_value: list[bool]) -> None:
    """One labelled row per variant, top to bottom; unmeasured names in grey, a thin rule between kinds."""
    ax.set_yticks(range(len(rows)), [r["variant"] for r in rows])
    for tick, measured in zip(ax.get_yticklabels(), has_value):
        if not measured:
            tick.set_color(NOTE_COLOR)
    for i in range(1, len(rows)):
        if kind_of(rows[i]) != kind_of(rows[i - 1]):
            ax.axhline(i - 0.5, color="0.8", linewidth=0.8)
    ax.set_ylim(len(rows) - 0.5, -0.5)


def note_unmeasured(ax: Any, rows: list[dict[str, Any]], has_value: list[bool]) -> None:
    for i, (r, measured) in enumerate(zip(rows, has_value)):
        if not measured:
            ax.text(0.01, i, status_note(r), transform=ax.get_yaxis_transform(), va="center",
                    fontsize=8, color=NOTE_COLOR, style="italic")


def legend(ax: Any, rows: list[dict[str, Any]], reference: str | None) -> None:
    """The kinds present, and the reference line where one is drawn, right of the plot."""
    handles: list[Any] = [Patch(color=KIND_COLORS[k], label=title) for k, title in KINDS.items()
                          if any(kind_of(r) == k for r in rows)]
    if reference:
        handles.append(Line2D([], [], color=REFERENCE_COLOR, linestyle="--", label=f"reference: {reference}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def height(n_rows: int) -> float:
    return 0.32 * max(n_rows, 2) + 1.4


def measured(row: dict[str, Any], key: str, scale: float = 1.0) -> float | None:
    """row[key] / scale for a row that ran ok and has the figure; None otherwise."""
    value = row.get(key) if row["status"] == "ok" else None
    return None if value is None else value / scale


def whiskers(row: dict[str, Any], scale: float = 1.0) -> tuple[float, float] | None:
    """The 95% interval of the next run's tokens/s (repeats >= 2), scaled; None without repeats."""
    low, high = row.get("tokens_per_sec_pi95_low"), row.get("tokens_per_sec_pi95_high")
    if row["status"] != "ok" or low is None or high is None:
        return None
    return low / scale, high / scale
