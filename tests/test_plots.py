"""The PNG plots: rows grouped and coloured by kind, a reference line, whiskers, units users think in, and every
variant keeps a labelled row."""

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba
import pandas as pd
import pytest

from benchlab.plots import (ENERGY_LABEL, KIND_COLORS, MEMORY_LABELS, RESERVED_NOTE, REFERENCE_COLOR, THROUGHPUT_LABEL,
                            WHISKER_NOTE, baseline_name, energy_figure, grouped, loss_figure, make_plots,
                            memory_figure, read_steps, status_note, step_time_figure, throughput_figure)


def row(name: str, status: str = "ok", notes: str = "", **kw: Any) -> dict[str, Any]:
    values = {"tokens_per_sec": 1000.0, "speedup_x": 1.0, "peak_rss_mb": 400.0} if status == "ok" else {}
    return {"variant": name, "status": status, "notes": notes, "kind": "seed", **values, **kw}


ROWS = [
    row("base", speedup_vs="base"),
    row("fast", tokens_per_sec=1500.0, speedup_x=1.5, speedup_vs="base", kind="recipe"),
    row("tf32", "skipped", "precision=tf32 is a CUDA tensor-core mode (Ampere or newer); on CPU it would time fp32"),
    row("big", "oom", "out of memory at train.batch_size=64: CUDA out of memory"),
    row("wild", "diverged", "loss is nan at step 3", kind="ours"),
]


@pytest.fixture()
def steps_dir(tmp_path: Path) -> Path:
    """Per-step CSVs as the bench stage writes them: base and fast coincide, wild stops early, the rest are empty."""
    header = "step,loss,lr,step_ms,timed\n"
    for name, losses in {"base": [8.0, 7.5, 7.0, 6.8], "fast": [8.0, 7.5, 7.0, 6.8], "wild": [8.0, 9.0]}.items():
        lines = [f"{i},{loss},0.001,{40.0 + i},{int(i >= 1)}" for i, loss in enumerate(losses)]
        (tmp_path / f"{name}.csv").write_text(header + "\n".join(lines) + "\n")
    for name in ("tf32", "big"):
        (tmp_path / f"{name}.csv").write_text(header)
    return tmp_path


def texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.texts]


def value_labels(ax: Any) -> list[str]:
    return [t for t in texts(ax) if t.startswith(" ")]


def test_unmeasured_variants_keep_a_row_that_says_why() -> None:
    fig = throughput_figure(ROWS)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["base", "fast", "tf32", "big", "wild"]
    notes = texts(ax)
    assert any(n.startswith("skipped: precision=tf32 is a CUDA") for n in notes)
    assert any(n.startswith("oom: out of memory") for n in notes)
    assert any(n.startswith("diverged: loss is nan") for n in notes)
    assert len(ax.patches) == 2  # bars for the two measured variants only
    plt.close(fig)


def test_throughput_is_in_thousands_with_speedups_colours_by_kind_and_the_reference_line() -> None:
    fig = throughput_figure(ROWS, reference="fast")
    ax = fig.axes[0]
    assert [bar.get_width() for bar in ax.patches] == [1.0, 1.5]  # thousands of tokens/s
    assert value_labels(ax) == [" 1.0k  1.00x", " 1.5k  1.50x"]
    assert [bar.get_facecolor() for bar in ax.patches] == [to_rgba(KIND_COLORS["seed"]), to_rgba(KIND_COLORS["recipe"])]
    lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(lines) == 1 and list(lines[0].get_xdata()) == [1.5, 1.5] and lines[0].get_color() == REFERENCE_COLOR
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["the seed's matrix", "knobs on the recipe", "our own", "reference: fast"]
    assert ax.get_xlabel() == THROUGHPUT_LABEL and "thousand tokens/s" in THROUGHPUT_LABEL
    assert ax.get_title() == "Throughput by variant (speedup vs base)"
    plt.close(fig)
    fig = throughput_figure(ROWS, reference="big")  # a reference that did not run: no line, no legend entry
    assert not [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert "reference: big" not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)


def test_whiskers_show_the_interval_where_there_were_repeats() -> None:
    rows = [row("base", tokens_per_sec_pi95_low=900.0, tokens_per_sec_pi95_high=1200.0), row("once")]
    fig = throughput_figure(rows)
    ax = fig.axes[0]
    whiskers = [c for c in ax.collections if len(c.get_segments()) == 1]
    assert len(whiskers) == 1  # one row had repeats
    (start, end), = [tuple(p[0] for p in seg) for seg in whiskers[0].get_segments()]
    assert (start, end) == pytest.approx((0.9, 1.2))
    assert ax.get_xlabel() == f"{THROUGHPUT_LABEL}; {WHISKER_NOTE}"
    assert value_labels(ax)[0] == " 1.0k  1.00x" and texts(ax)[0] and ax.texts[0].get_position()[0] == 1.2
    plt.close(fig)
    fig = throughput_figure([row("once")])
    assert fig.axes[0].get_xlabel() == THROUGHPUT_LABEL  # no repeats: no whisker note
    plt.close(fig)


def test_rows_are_grouped_by_kind_in_params_order() -> None:
    rows = [row("a", kind="ours"), row("b"), row("c", kind="recipe"), row("d", kind="other"), row("e"),
            row("f", kind="unknown")]
    assert [r["variant"] for r in grouped(rows)] == ["b", "e", "c", "a", "d", "f"]
    fig = throughput_figure(grouped(rows))
    rules = [line.get_ydata()[0] for line in fig.axes[0].get_lines() if line.get_linestyle() == "-"]
    assert rules == [1.5, 2.5, 3.5]  # a thin rule between kinds, none inside one
    plt.close(fig)


def test_memory_bars_are_in_gib_and_show_reserved_where_cuda_graphs_hide_the_allocated_peak() -> None:
    rows = [row("eager", peak_mem_allocated_mb=512.0, peak_mem_reserved_mb=600.0),
            row("big", "oom", "out of memory", peak_mem_allocated_mb=900.0),  # a figure, but no bar: not measured
            row("graphs", peak_mem_allocated_mb=50.0, peak_mem_reserved_mb=768.0, mem_reserved=True),
            row("off", "skipped", "no GPU", mem_reserved=True)]
    fig = memory_figure(rows, "peak_mem_allocated_mb")
    ax = fig.axes[0]
    assert [bar.get_width() for bar in ax.patches] == [0.5, 0.75]  # GiB; not the 50 MiB the allocator saw
    assert [bar.get_hatch() for bar in ax.patches] == [None, "//"]
    assert ax.patches[1].get_facecolor() == (1.0, 1.0, 1.0, 1.0)  # an outline, apart from the filled bars
    assert ax.patches[1].get_edgecolor() == to_rgba(KIND_COLORS["seed"])
    assert value_labels(ax) == [" 0.50", " 0.75 reserved"]
    assert ax.get_xlabel() == f"{MEMORY_LABELS['peak_mem_allocated_mb']}; {RESERVED_NOTE}"
    assert ax.get_title() == "Peak memory by variant"
    plt.close(fig)
    fig = memory_figure(rows[:1], "peak_mem_allocated_mb")  # no graphs: the plain label
    assert fig.axes[0].get_xlabel() == MEMORY_LABELS["peak_mem_allocated_mb"] == "peak GPU memory allocated (GiB)"
    plt.close(fig)


def test_energy_bars_are_tokens_per_joule_and_unmeasured_rows_say_why() -> None:
    rows = [row("gpu", tokens_per_joule=735.0, power_w_mean=700.0),
            row("cpu", tokens_per_joule=None, energy_note="not measured: no NVML power reading on a CPU")]
    fig = energy_figure(rows)
    ax = fig.axes[0]
    assert [bar.get_width() for bar in ax.patches] == [735.0]
    assert value_labels(ax) == [" 735"]
    assert "not measured: no NVML power reading on a CPU" in texts(ax)
    assert ax.get_xlabel() == ENERGY_LABEL and "tokens per joule" in ENERGY_LABEL
    plt.close(fig)


def test_status_note_is_short_and_keeps_the_status() -> None:
    note = status_note(row("x", "skipped", "a" * 200 + "; second reason"))
    assert note.startswith("skipped: aaa") and len(note) < 90 and "second" not in note
    assert status_note(row("y", "oom")) == "oom"
    assert status_note(row("z", "oom", "CUDA out of memory", peak_mem_allocated_mb=23100.0)) == (
        "oom at 23,100 MiB: CUDA out of memory")
    assert status_note(row("z", "oom", "", peak_mem_allocated_mb=1.0, peak_mem_reserved_mb=23900.0)) == (
        "oom at 23,900 MiB")


def test_axis_labels_are_words() -> None:
    for label in (*MEMORY_LABELS.values(), THROUGHPUT_LABEL, ENERGY_LABEL):
        assert "_" not in label
    assert MEMORY_LABELS["peak_rss_mb"] == "peak process memory, RSS (GiB)"


def test_step_time_ticks_are_plain_milliseconds(steps_dir: Path) -> None:
    fig = step_time_figure(ROWS, read_steps(ROWS, steps_dir))
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ax.get_xscale() == "log" and labels
    assert all(label.replace(".", "").isdigit() for label in labels), labels  # no 10^k mathtext
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    assert "ms" in ax.get_xlabel()
    assert any(n.startswith("skipped:") for n in texts(ax))
    plt.close(fig)


def test_loss_figure_has_a_difference_from_baseline_panel(steps_dir: Path) -> None:
    fig = loss_figure(ROWS, read_steps(ROWS, steps_dir), "base")
    ax_loss, ax_diff = fig.axes
    assert ax_diff.get_ylabel() == "loss minus base (nats)"
    diffs = {tuple(line.get_ydata()) for line in ax_diff.get_lines()}
    assert (0.0, 0.0, 0.0, 0.0) in diffs and (0.0, 1.5) in diffs  # fast coincides with base; wild does not
    assert "equal to base at every step: fast" in texts(ax_diff)
    legend = [t.get_text() for t in ax_loss.get_legend().get_texts()]
    assert legend == ["base", "fast", "wild (diverged)"]
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax_loss.get_lines()}
    assert len(styles) == 3  # coinciding curves differ in shape, not only colour
    assert [line.get_color() for line in ax_loss.get_lines()] == [KIND_COLORS[k] for k in ("seed", "recipe", "ours")]
    plt.close(fig)


def test_loss_figure_draws_the_reference_curve_in_black(steps_dir: Path) -> None:
    fig = loss_figure(ROWS, read_steps(ROWS, steps_dir), "base", reference="fast")
    ax_loss = fig.axes[0]
    fast = ax_loss.get_lines()[1]
    assert fast.get_color() == REFERENCE_COLOR and fast.get_linewidth() > ax_loss.get_lines()[0].get_linewidth()
    assert [t.get_text() for t in ax_loss.get_legend().get_texts()][1] == "fast (reference)"
    plt.close(fig)


def test_missing_baseline_curve_is_said(steps_dir: Path) -> None:
    fig = loss_figure(ROWS, read_steps(ROWS, steps_dir), "tf32")
    assert "no loss curve for the baseline (tf32)" in texts(fig.axes[1])
    plt.close(fig)


def test_make_plots_writes_the_pngs_the_same_bytes_twice_and_finds_the_baseline(steps_dir: Path,
                                                                               tmp_path: Path) -> None:
    paths = make_plots(ROWS, steps_dir, tmp_path / "out")
    assert [p.name for p in paths] == ["throughput.png", "memory.png", "step_times.png", "loss_curves.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    again = make_plots(ROWS, steps_dir, tmp_path / "again")
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]  # deterministic output
    assert b"Matplotlib version" not in paths[0].read_bytes()
    assert not pd.read_csv(steps_dir / "tf32.csv").shape[0]  # the header-only CSV did not break it
    assert baseline_name(ROWS, None) == "base"  # the row the ratios are against
    assert baseline_name([{**r, "speedup_vs": None} for r in ROWS], None) == "base"  # else the one at exactly 1x
    assert baseline_name(ROWS, "fast") == "fast"
    measured = [{**r, "tokens_per_joule": 100.0} if r["status"] == "ok" else r for r in ROWS]
    assert make_plots(measured, steps_dir, tmp_path / "energy")[-1].name == "energy.png"


def knobs(batch: int, **kw: Any) -> dict[str, Any]:
    return {"precision": "bf16", "compile": True, "grad_accum": 1, **kw, "batch_size": batch}


SWEEP_ROWS = [
    row("recipe", settings=knobs(16), peak_mem_allocated_mb=100.0),
    row("b4", tokens_per_sec=400.0, settings=knobs(4), peak_mem_allocated_mb=40.0),
    row("b512", "oom", "out of memory at batch size 512", settings=knobs(512)),
    row("b64", tokens_per_sec=1800.0, settings=knobs(64), peak_mem_allocated_mb=380.0),
    row("accum", settings=knobs(16, grad_accum=4)),  # another knob differs: not the recipe's sweep
    row("fp32", settings=knobs(16, precision="fp32")),
    row("fp32_b8", settings=knobs(8, precision="fp32")),
    row("alone", settings=knobs(32, compile=False)),  # one batch size: no sweep
]


def test_batch_sweeps_group_rows_that_differ_only_in_batch() -> None:
    from benchlab.plots import batch_sweeps

    sweeps = batch_sweeps([row("no_settings"), *SWEEP_ROWS])  # a row without knobs is passed over, not the end
    assert [[r["variant"] for r in s] for s in sweeps] == [["b4", "recipe", "b64", "b512"], ["fp32_b8", "fp32"]]


def test_batch_figure_draws_measured_batches_and_marks_the_oom(tmp_path: Path) -> None:
    from benchlab.plots import batch_figure, batch_sweeps

    fig = batch_figure(batch_sweeps(SWEEP_ROWS), "peak_mem_allocated_mb")
    ax_tps, ax_mem = fig.axes
    recipe_line = ax_tps.get_lines()[0]
    assert list(recipe_line.get_xdata()) == [4, 16, 64] and list(recipe_line.get_ydata()) == [0.4, 1.0, 1.8]
    assert list(ax_mem.get_lines()[0].get_ydata()) == [40.0 / 1024, 100.0 / 1024, 380.0 / 1024]  # GiB
    assert "oom" in texts(ax_tps) and ax_mem.get_xscale() == "log"
    assert ax_mem.get_ylabel() == MEMORY_LABELS["peak_mem_allocated_mb"]
    assert [t.get_text() for t in ax_tps.get_legend().get_texts()][0] == "b4, recipe, b64, b512"
    plt.close(fig)
    paths = make_plots(SWEEP_ROWS, tmp_path, tmp_path / "out")
    assert paths[-1].name == "batch_sweep.png" and paths[-1].read_bytes().startswith(b"\x89PNG")
    assert "batch_sweep.png" not in [p.name for p in make_plots(ROWS, tmp_path, tmp_path / "out2")]


def test_batch_sweep_of_cuda_graph_rows_plots_their_reserved_peak() -> None:
    from benchlab.plots import batch_figure

    sweep = [row("g4", settings=knobs(4), peak_mem_allocated_mb=10.0, peak_mem_reserved_mb=512.0, mem_reserved=True),
             row("g16", settings=knobs(16), peak_mem_allocated_mb=20.0, peak_mem_reserved_mb=2048.0, mem_reserved=True)]
    fig = batch_figure([sweep], "peak_mem_allocated_mb")
    ax_mem = fig.axes[1]
    assert list(ax_mem.get_lines()[0].get_ydata()) == [0.5, 2.0]
    assert ax_mem.get_ylabel().endswith("(reserved under CUDA graphs)")
    plt.close(fig)
