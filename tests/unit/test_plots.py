"""The PNG plots: rows grouped and coloured by kind, a reference line, whiskers, units users think in, and every
variant keeps a labelled row."""

import tempfile
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.testing.compare import compare_images

from benchlab.analysis.plot_style import (
    ENERGY_LABEL,
    KIND_COLORS,
    MEMORY_LABELS,
    REFERENCE_COLOR,
    RESERVED_NOTE,
    THROUGHPUT_LABEL,
    WHISKER_NOTE,
    grouped,
    measured,
    memory_key,
    status_note,
    whiskers,
)
from benchlab.analysis.plots import (
    baseline_name,
    batch_figure,
    energy_figure,
    loss_figure,
    make_plots,
    memory_figure,
    read_steps,
    save_png,
    step_time_figure,
    throughput_figure,
)


def row(name: str, status: str = "ok", notes: str = "", **kw: Any) -> dict[str, Any]:
    values = {"tokens_per_sec": 1000.0, "speedup_x": 1.0, "peak_rss_mb": 400.0} if status == "ok" else {}
    return {"variant": name, "status": status, "notes": notes, "kind": "seed", **values, **kw}


ROWS = [
    row("base", speedup_vs="base"),
    row("fast", tokens_per_sec=1500.0, speedup_x=1.5, speedup_vs="base", kind="recipe"),
    row("tf32", "skipped", "precision=tf32 is a CUDA tensor-core mode (Ampere or newer); on CPU it would time fp32"),
    row("big", "oom", "out of memory at shape.batch_size=64: CUDA out of memory"),
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
    assert ax.get_xlim() == (0.0, pytest.approx(1.44))  # room beyond the whisker's end, not only the bar's
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
            row("graphs", peak_mem_allocated_mb=50.0, peak_mem_reserved_mb=768.0, peak_mem_allocated_comparable=False),
            row("off", "skipped", "no GPU", peak_mem_allocated_comparable=False)]
    fig = memory_figure(rows, "peak_mem_allocated_mb")
    ax = fig.axes[0]
    assert [bar.get_width() for bar in ax.patches] == [0.5, 0.75]  # GiB; not the 50 MiB the allocator saw
    assert [bar.get_hatch() for bar in ax.patches] == [None, "//"]
    assert ax.patches[1].get_facecolor() == (1.0, 1.0, 1.0, 1.0)  # an outline, apart from the filled bars
    assert ax.patches[1].get_edgecolor() == to_rgba(KIND_COLORS["seed"])
    assert value_labels(ax) == [" 0.50", " 0.75 reserved"]
    assert [t.get_position()[0] for t in ax.texts if t.get_text().startswith(" ")] == [0.5, 0.75]  # at the bar ends
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


def test_loss_curves_are_drawn_against_the_csvs_own_step_numbers(tmp_path: Path) -> None:
    header = "step,loss,lr,step_ms,timed\n"
    for name, losses in {"a": [5.0, 4.0, 3.0], "b": [5.0, 4.0, 3.0], "c": [5.0, 4.0, 3.0], "d": [5.0, 4.5, 3.5]}.items():
        (tmp_path / f"{name}.csv").write_text(header + "".join(f"{10 + i},{v},0.1,5.0,1\n" for i, v in enumerate(losses)))
    rows = [row(name) for name in "abcd"]
    fig = loss_figure(rows, read_steps(rows, tmp_path), "a")
    ax_loss, ax_diff = fig.axes
    assert [list(line.get_xdata()) for line in ax_loss.get_lines()] == [[10, 11, 12]] * 4
    assert [list(line.get_xdata()) for line in ax_diff.get_lines()[:4]] == [[10, 11, 12]] * 4  # then the zero line
    assert texts(ax_diff) == ["equal to a at every step: b, c"]
    plt.close(fig)
    fig = loss_figure(rows[::3], read_steps(rows, tmp_path), "a")  # a and d only: nothing equal, nothing said
    assert texts(fig.axes[1]) == [""]
    plt.close(fig)
    fig = loss_figure(rows, read_steps(rows, tmp_path), None)  # no baseline named at all
    assert fig.axes[1].get_ylabel() == "loss minus baseline (nats)"
    assert texts(fig.axes[1]) == ["no loss curve for the baseline (none named)"]
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
    with_energy = [{**r, "tokens_per_joule": 100.0} if r["status"] == "ok" else r for r in ROWS]
    assert make_plots(with_energy, steps_dir, tmp_path / "energy")[-1].name == "energy.png"


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
    from benchlab.analysis.plots import batch_sweeps

    sweeps = batch_sweeps([row("no_settings"), *SWEEP_ROWS])  # a row without knobs is passed over, not the end
    assert [[r["variant"] for r in s] for s in sweeps] == [["b4", "recipe", "b64", "b512"], ["fp32_b8", "fp32"]]


def test_batch_figure_draws_measured_batches_and_marks_the_oom(tmp_path: Path) -> None:
    from benchlab.analysis.plots import batch_figure, batch_sweeps

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
    from benchlab.analysis.plots import batch_figure

    sweep = [row("g4", settings=knobs(4), peak_mem_allocated_mb=10.0, peak_mem_reserved_mb=512.0, peak_mem_allocated_comparable=False),
             row("g16", settings=knobs(16), peak_mem_allocated_mb=20.0, peak_mem_reserved_mb=2048.0, peak_mem_allocated_comparable=False)]
    fig = batch_figure([sweep], "peak_mem_allocated_mb")
    ax_mem = fig.axes[1]
    assert list(ax_mem.get_lines()[0].get_ydata()) == [0.5, 2.0]
    assert ax_mem.get_ylabel().endswith("(reserved under CUDA graphs)")
    plt.close(fig)


def test_status_note_keeps_the_first_reason_and_cuts_at_the_word_before_the_limit() -> None:
    assert status_note(row("x", "skipped", "no GPU; and a second reason")) == "skipped: no GPU"
    assert status_note(row("x", "skipped", "a" * 70)) == "skipped: " + "a" * 70  # at the limit: whole
    assert status_note(row("x", "skipped", "a" * 68 + " " + "b" * 5)) == "skipped: " + "a" * 68 + "…"


def test_value_labels_switch_format_at_a_hundred_thousand_and_ten_gib() -> None:
    rows = [row("a", tokens_per_sec=100_000.0, speedup_x=None), row("b", tokens_per_sec=99_940.0, speedup_x=None)]
    fig = throughput_figure(rows)
    assert value_labels(fig.axes[0]) == [" 100k", " 99.9k"]  # no speedup, no "x"
    assert fig.axes[0].get_title() == "Throughput by variant"  # nothing compared: no "(speedup vs ...)"
    plt.close(fig)
    fig = memory_figure([row("a", peak_rss_mb=10_240.0), row("b", peak_rss_mb=10_230.0)], "peak_rss_mb")
    assert value_labels(fig.axes[0]) == [" 10.0", " 9.99"]
    plt.close(fig)


def test_unmeasured_names_are_grey_the_rows_run_top_down_and_a_rule_parts_the_first_two_kinds() -> None:
    rows = [row("a"), row("b", kind="recipe"), row("c", "skipped", "no GPU", kind="recipe")]
    fig = throughput_figure(rows)
    ax = fig.axes[0]
    assert [to_rgba(t.get_color()) for t in ax.get_yticklabels()] == [to_rgba("black")] * 2 + [to_rgba("0.45")]
    assert ax.get_ylim() == (2.5, -0.5)  # the first row on top, half a row of room at each end
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "-"] == [0.5]
    note, = [t for t in ax.texts if t.get_text() == "skipped: no GPU"]
    assert note.get_position() == (0.01, 2) and note.get_transform() == ax.get_yaxis_transform()
    assert ax.get_xlim() == (0.0, pytest.approx(1.2))  # a fifth more than the longest bar, for its label
    assert tuple(fig.get_size_inches()) == pytest.approx((9.0, 0.32 * 3 + 1.4))  # a third of an inch a row
    plt.close(fig)
    fig = throughput_figure([row("c", "skipped", "no GPU")])  # nothing measured: a plain axis, two rows high
    assert fig.axes[0].get_xlim() == (0.0, 1.0) and fig.get_size_inches()[1] == pytest.approx(0.32 * 2 + 1.4)
    plt.close(fig)


def test_a_row_that_did_not_run_ok_has_no_figure_and_whiskers_need_both_ends() -> None:
    assert measured(row("x", "oom", tokens_per_sec=5.0), "tokens_per_sec") is None
    assert measured(row("x", tokens_per_sec=5.0), "tokens_per_sec") == 5.0  # unscaled by default
    assert whiskers(row("x", tokens_per_sec_pi95_low=2.0, tokens_per_sec_pi95_high=4.0)) == (2.0, 4.0)
    assert whiskers(row("x", tokens_per_sec_pi95_low=None, tokens_per_sec_pi95_high=4.0)) is None
    assert whiskers(row("x", tokens_per_sec_pi95_low=2.0, tokens_per_sec_pi95_high=None)) is None
    assert memory_key([row("a"), row("b", peak_mem_allocated_mb=1.0)]) == "peak_mem_allocated_mb"
    assert memory_key([row("a"), row("b", peak_mem_allocated_mb=0.0)]) == "peak_rss_mb"


def test_the_baseline_is_the_named_comparison_before_the_row_at_one_x() -> None:
    rows = [row("first", speedup_x=1.0), row("named", speedup_x=1.0, speedup_vs="named")]
    assert baseline_name(rows, None) == "named"
    assert baseline_name([row("a", speedup_x=2.0)], None) is None
    assert baseline_name([], "given") == "given"


def test_an_energy_row_that_did_not_run_keeps_its_status_and_one_without_a_reading_says_not_measured() -> None:
    rows = [row("gpu", tokens_per_joule=735.0), row("bare"), row("off", "skipped", "no GPU", energy_note="x")]
    fig = energy_figure(rows, reference="gpu")
    ax = fig.axes[0]
    assert texts(ax)[1:] == ["not measured", "skipped: no GPU"]
    assert ax.get_title() == "Energy by variant"
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"] == [735.0]
    plt.close(fig)


def test_save_png_writes_at_110_dpi_cropped_to_what_is_drawn_and_closes_only_its_figure(tmp_path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1])
    other = plt.figure()
    save_png(fig, tmp_path / "a.png")
    width, height = plt.imread(tmp_path / "a.png").shape[1::-1]
    assert 300 < width < 440 and 250 < height < 330  # 4 x 3 inches at 110 dpi is 440 x 330 before the crop
    assert not plt.fignum_exists(fig.number) and plt.fignum_exists(other.number)
    plt.close(other)


def test_make_plots_draws_each_figure_as_its_function_does_with_the_baseline_and_reference_given(
        tmp_path: Path) -> None:
    steps_dir = tmp_path / "steps"
    steps_dir.mkdir()
    write_look_steps(steps_dir)
    out = tmp_path / "a" / "b"  # parents made; a second run into it is fine
    paths = make_plots(LOOK_ROWS, steps_dir, out, reference="recipe")
    assert [p.name for p in paths] == ["throughput.png", "memory.png", "step_times.png", "loss_curves.png",
                                       "energy.png"]
    for path in paths:  # the baseline from the rows' own comparison (fp32_baseline), the reference passed on
        assert compare_images(str(FIGURES / path.name), str(path), tol=LOOK_TOLERANCE) is None, path.name
    named = make_plots(LOOK_ROWS, steps_dir, out, baseline="bf16", reference="recipe")[3]
    save_png(loss_figure(LOOK_GROUPED, read_steps(LOOK_ROWS, steps_dir), "bf16", "recipe"), tmp_path / "bf16.png")
    assert compare_images(str(tmp_path / "bf16.png"), str(named), tol=LOOK_TOLERANCE) is None  # a named baseline


# The look of each figure, pinned: one matrix of every kind of row, drawn by each figure function and saved by
# save_png, must give the same pixels as the PNG in tests/figures/ that a person looked at. Labels, colours,
# sizes, fonts and line styles are what a plotting module does; the tests above check what each figure says,
# this one checks how it shows it. After a change meant to alter a figure, look at the new PNGs and rewrite the
# references with `python -m tests.unit.test_plots` (matplotlib is pinned, so the pixels are the same on every install).
FIGURES = Path(__file__).parent.parent / "figures"
LOOK_TOLERANCE = 0.0  # RMS over all pixels: any changed pixel fails


def look(name: str, status: str = "ok", kind: str = "seed", tokens: float | None = None, speedup: float | None = None,
         mem_mib: float | None = None, notes: str = "", **kw: Any) -> dict[str, Any]:
    """row() with a GPU run's figures: tokens/s, speedup against fp32_baseline, allocated peak in MiB."""
    values = {"tokens_per_sec": tokens, "speedup_x": speedup, "speedup_vs": "fp32_baseline",
              "peak_mem_allocated_mb": mem_mib} if status == "ok" else {}
    return row(name, status, notes, kind=kind, **values, **kw)


LOOK_ROWS = [
    look("fp32_baseline", tokens=45_257.0, speedup=1.0, mem_mib=12_000.0, tokens_per_sec_pi95_low=44_000.0,
         tokens_per_sec_pi95_high=46_500.0, tokens_per_joule=120.0),
    look("bf16", tokens=100_000.0, speedup=2.21, mem_mib=10_240.0, energy_note="not measured: no power reading"),
    look("tf32", "skipped", notes="precision=tf32 is a CUDA tensor-core mode of Ampere or newer GPUs, and this one has "
         "none; it would time fp32"),
    look("recipe", kind="recipe", tokens=504_180.0, speedup=11.14, mem_mib=900.0, peak_mem_reserved_mb=4_000.0,
         peak_mem_allocated_comparable=False, tokens_per_sec_pi95_low=492_864.0, tokens_per_sec_pi95_high=515_833.0,
         tokens_per_joule=735.0),
    look("recipe_b64", "oom", kind="recipe", notes="CUDA out of memory", peak_mem_reserved_mb=140_000.0),
    look("recipe_nocompile", kind="recipe", tokens=301_000.0, speedup=6.65, mem_mib=30_000.0, tokens_per_joule=500.0),
    look("fastest", kind="ours", tokens=550_000.0, speedup=12.15, mem_mib=20_000.0, tokens_per_joule=800.0),
    look("lean", "diverged", kind="ours", notes="loss is nan at step 3"),
    look("custom", kind="custom-kind", tokens=480_000.0, speedup=10.61, mem_mib=8_000.0, tokens_per_joule=700.0),
]
for extra in range(5):  # enough curves for the loss legend's second column
    LOOK_ROWS.append(look(f"knob_{extra}", kind="recipe", tokens=400_000.0 + 10_000.0 * extra,
                          speedup=8.84 + 0.2 * extra, mem_mib=9_000.0 + 500.0 * extra))
LOOK_MS = {"fp32_baseline": 180.0, "bf16": 80.0, "recipe": 16.0, "recipe_nocompile": 27.0, "fastest": 14.5,
           "custom": 17.0, **{f"knob_{k}": 18.0 + 4.0 * k for k in range(5)}}
LOOK_SWEEPS = [
    [look(f"b{b}", kind="recipe", tokens=t, speedup=t / 45_257.0, mem_mib=m, settings={"batch_size": b})
     for b, t, m in ((16, 420_000.0, 30_000.0), (32, 480_000.0, 56_000.0), (64, 504_180.0, 110_000.0))]
    + [look("b128", "oom", kind="recipe", settings={"batch_size": 128})],
    [look(f"graphs_b{b}", kind="ours", tokens=t, speedup=t / 45_257.0, mem_mib=500.0, peak_mem_reserved_mb=m,
          peak_mem_allocated_comparable=False, settings={"batch_size": b, "cuda_graphs": True})
     for b, t, m in ((8, 300_000.0, 20_000.0), (16, 390_000.0, 36_000.0))]
    + [look("graphs_b32", "skipped", kind="ours", settings={"batch_size": 32, "cuda_graphs": True})],
]


def write_look_steps(steps_dir: Path) -> dict[str, pd.DataFrame]:
    """Per-step CSVs of 24 steps: smooth loss curves (fp32_compile's equal to the baseline's, lean's cut short by
    its divergence) and step times a few percent apart around each variant's median, the first step untimed."""
    header = "step,loss,lr,step_ms,timed\n"
    for r in LOOK_ROWS:
        name, n = r["variant"], 24 if r["status"] == "ok" else 4 if r["status"] == "diverged" else 0
        offset = 0.0 if name in ("fp32_baseline", "bf16") else 0.01 * (len(name) % 7) - 0.03
        ms = LOOK_MS.get(name, 50.0)
        lines = [f"{i},{10.8 - 0.12 * i + offset * i / 23 + (0.4 * (i - 2) if name == 'lean' and i > 2 else 0)},"
                 f"0.0006,{ms * (3.0 if i == 0 else 1.0 + 0.03 * ((i * 7) % 5 - 2))},{int(i > 0)}" for i in range(n)]
        (steps_dir / f"{name}.csv").write_text(header + "".join(line + "\n" for line in lines))
    return read_steps(LOOK_ROWS, steps_dir)


LOOK_GROUPED = grouped(LOOK_ROWS)  # as make_plots hands them on
LOOKS: dict[str, Any] = {
    "throughput.png": lambda steps: throughput_figure(LOOK_GROUPED, reference="recipe"),
    "memory.png": lambda steps: memory_figure(LOOK_GROUPED, "peak_mem_allocated_mb", reference="recipe"),
    "energy.png": lambda steps: energy_figure(LOOK_GROUPED, reference="recipe"),
    "step_times.png": lambda steps: step_time_figure(LOOK_GROUPED, steps),
    "loss_curves.png": lambda steps: loss_figure(LOOK_GROUPED, steps, "fp32_baseline", reference="recipe"),
    "batch_sweep.png": lambda steps: batch_figure(LOOK_SWEEPS, "peak_mem_allocated_mb"),
}


def draw_looks(out_dir: Path, names: tuple[str, ...] = tuple(LOOKS)) -> list[Path]:
    """Each named figure of the look matrix as save_png writes it into out_dir."""
    with tempfile.TemporaryDirectory() as steps_dir:
        steps = write_look_steps(Path(steps_dir))
    for name in names:
        save_png(LOOKS[name](steps), out_dir / name)
    return [out_dir / name for name in names]


@pytest.mark.parametrize("name", list(LOOKS))
def test_each_figure_looks_as_the_reference_a_person_checked(name: str, tmp_path: Path) -> None:
    draw_looks(tmp_path, (name,))
    assert (FIGURES / name).is_file(), f"no reference {FIGURES / name}: write them with `python -m tests.unit.test_plots`"
    differs = compare_images(str(FIGURES / name), str(tmp_path / name), tol=LOOK_TOLERANCE)
    assert differs is None, (f"{name} no longer looks like tests/figures/{name}: {differs}. If the change is "
                             f"meant, look at {tmp_path / name} and rewrite the references: python -m tests.unit.test_plots")


if __name__ == "__main__":
    for path in draw_looks(FIGURES):
        print(f"wrote {path}")
