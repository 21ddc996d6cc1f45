"""aggregate: ratios against the baseline (or a fallback), loss, parity and energy columns, and one environment and
one source per table."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from benchlab.analysis.records import check_one_env, check_one_source, load_parity, load_results, uncommitted
from benchlab.analysis.summary import UNCOMMITTED_NOTE, assign_kinds, markdown, ratio_reference, summarize, to_csv
from benchlab.core.errors import LabError
from benchlab.core.record import Memory
from benchlab.run.profiling import exposed_communication, family, kernel_markdown, kernel_summary

ENV = {"env.gpu": "NVIDIA H200", "env.driver": "580", "env.cuda": "13.0", "env.torch": "2.11",
       "env.python": "3.12", "env.cpu": "Xeon", "env.torch_threads": 16}


def result(name: str, tps: float, val: float, mem: float, ci: tuple[float, float] | None = None, **kw) -> dict:
    return {"variant": name, "status": "ok", "tokens_per_sec": tps, "val_loss": val, "val_perplexity": 2.0 ** val,
            "peak_mem_allocated_mb": mem, "tokens_per_sec_pi95_low": ci[0] if ci else None,
            "tokens_per_sec_pi95_high": ci[1] if ci else None, "batch_size": 16, "steady_state_ok": True, **ENV, **kw}


def test_rows_compare_each_variant_with_the_baseline() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.00, 1000.0, (99, 101)),
        result("fast", 300.0, 5.02, 400.0, (290, 310)),
        result("drifts", 200.0, 5.50, 1000.0, (100.5, 300)),
    ], "fp32_baseline", tolerance=0.1)
    base, fast, drifts = rows
    assert fast["speedup_x"] == pytest.approx(3.0) and fast["mem_change_pct"] == pytest.approx(-60.0)
    assert fast["significant"] == "yes" and fast["loss_ok"] == "yes"
    assert drifts["significant"] == "no"  # its interval overlaps the baseline's
    assert drifts["loss_ok"].startswith("NO (0.500 > 0.1)")
    assert base["speedup_x"] == pytest.approx(1.0) and base["significant"] is None
    assert fast["settings"]["batch_size"] == 16 and fast["settings"]["precision"] is None  # the knobs, for sweeps


def test_repeats_that_disagree_are_flagged() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, 1000.0, val_loss_repeat_spread=0.0),
        result("noisy", 200.0, 5.0, 500.0, val_loss_repeat_spread=0.05),
    ], "fp32_baseline", tolerance=0.1, repeat_tolerance=0.02)
    assert rows[0]["notes"] == ""
    assert rows[1]["notes"] == "repeats disagree: val loss spread 0.0500 > 0.02"


def test_repeats_a_time_limit_stopped_are_said() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, 1000.0, repeats=3, repeats_asked=3),
        result("cut", 200.0, 5.0, 500.0, repeats=2, repeats_asked=3),
        result("older", 200.0, 5.0, 500.0, repeats=1),  # a record from before repeats_asked existed
    ], "fp32_baseline", tolerance=0.1)
    assert [r["notes"] for r in rows] == ["", "2 of 3 repeats: a time limit stopped the rest", ""]


def test_failed_and_skipped_variants_get_no_figures() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, 1000.0),
        {"variant": "fp16", "status": "skipped", "message": "needs a CUDA GPU", **ENV},
        {"variant": "huge", "status": "oom", "message": "out of memory at shape.batch_size=64", **ENV},
    ], "fp32_baseline", 0.1)
    for row in rows[1:]:
        assert row["speedup_x"] is None and row.get("tokens_per_sec") is None and row["notes"]
    table = markdown(rows, {"env.gpu": "NVIDIA H200"})
    assert "| fp16 " in table and "needs a CUDA GPU" in table and "oom" in table
    assert "NVIDIA H200" in table.splitlines()[0]
    assert to_csv(rows).splitlines()[0].startswith("variant,status,track,tokens_per_sec")


def test_results_from_two_machines_are_refused_unless_allowed() -> None:
    a, b = result("fp32_baseline", 1, 1, 1), result("fast", 2, 1, 1, **{"env.gpu": "NVIDIA A100-SXM4-80GB"})
    with pytest.raises(LabError, match="measured in another environment.*allow_mixed_env=true"):
        check_one_env([a, b], allow_mixed=False)
    check_one_env([a, b], allow_mixed=True)


def test_only_variants_named_in_params_are_read(tmp_path: Path) -> None:
    for name in ("fp32_baseline", "removed_long_ago"):
        (tmp_path / f"{name}.json").write_text(json.dumps(result(name, 1, 1, 1)))
    assert [r["variant"] for r in load_results(tmp_path, ["fp32_baseline"])] == ["fp32_baseline"]
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(LabError, match="not valid JSON.*dvc repro -f bench@broken"):
        load_results(tmp_path, ["broken"])


def test_results_from_other_code_are_refused_unless_allowed() -> None:
    src = "provenance.source_sha256"
    a, b = result("fp32_baseline", 1, 1, 1, **{src: "aaaa"}), result("fast", 2, 1, 1, **{src: "bbbb"})
    with pytest.raises(LabError, match="ran different source code.*aaaa.*fp32_baseline.*allow_mixed_source=true"):
        check_one_source([a, b], allow_mixed=False)
    check_one_source([a, b], allow_mixed=True)
    dirty = {src: "bbbb", "provenance.tree_clean": False}  # modified, but modified alike: still two codes
    with pytest.raises(LabError, match="ran different source code"):
        check_one_source([a, result("fast", 2, 1, 1, **dirty)], allow_mixed=False)


def test_a_modified_but_consistent_tree_is_flagged_per_row_not_refused() -> None:
    dirty = {"provenance.source_sha256": "aaaa", "provenance.tree_clean": False}
    results = [result("fp32_baseline", 100.0, 5.0, 1.0, **dirty),
               result("clean", 200.0, 5.0, 1.0, **{**dirty, "provenance.tree_clean": True}),
               result("noisy", 200.0, 5.0, 1.0, val_loss_repeat_spread=0.05, **dirty),
               {"variant": "off", "status": "skipped", "message": "needs a CUDA GPU", **dirty}]
    check_one_source(results, allow_mixed=False)  # the workspace's run goes on
    assert uncommitted(results) == ["fp32_baseline", "noisy", "off"]
    rows = summarize(results, "fp32_baseline", 0.1, repeat_tolerance=0.02)
    assert [r["notes"] for r in rows] == [
        UNCOMMITTED_NOTE, "", f"repeats disagree: val loss spread 0.0500 > 0.02; {UNCOMMITTED_NOTE}",
        f"needs a CUDA GPU; {UNCOMMITTED_NOTE}"]
    assert rows[1]["speedup_x"] == 2.0  # flagged rows keep their figures
    assert UNCOMMITTED_NOTE == "measured from uncommitted code"
    assert UNCOMMITTED_NOTE in markdown(rows, {})


def test_rows_say_what_their_figures_cannot_be_compared_with() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, 1000.0),
        result("graphs", 300.0, 5.0, 100.0, peak_mem_reserved_mb=900.0, peak_mem_allocated_comparable=False),
        result("big_batch", 300.0, 4.0, 3000.0, batch_size=64),
        result("shared", 100.0, 5.0, 1000.0, interference_suspected=True, other_gpu_processes=[4242],
               cpu_busy_others_pct_max=35.0),
    ], "fp32_baseline", tolerance=0.1)
    graphs, big, shared = rows[1:]
    assert graphs["mem_change_pct"] == pytest.approx(-10.0)  # reserved, not the allocated peak graphs hide
    assert "compare reserved memory" in graphs["notes"]
    assert Memory.of(graphs).by_reserved and not any(Memory.of(r).by_reserved for r in (rows[0], big, shared))
    assert big["loss_ok"] == "n/a (batch 64, fp32_baseline 16)"  # another batch learns another curve
    assert shared["notes"] == "machine shared while timed: other GPU processes [4242], others kept 35% of the CPU busy"


def test_kernel_summary_counts_kernels_once_per_step() -> None:
    events = [
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9000},  # op rows are not kernel time
        {"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 500, "dur": 900},  # before the traced steps
        {"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 1000, "dur": 3000},
        {"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 9000, "dur": 1000},
        {"cat": "kernel", "name": "triton_red_fused__log_softmax_0", "ts": 12000, "dur": 2000},  # optimizer span
        {"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 14500, "dur": 700},  # after the window
        {"cat": "gpu_user_annotation", "name": "ProfilerStep#3", "ts": 1000, "dur": 6000},
        {"cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 7000, "dur": 1000},
        {"cat": "gpu_user_annotation", "name": "ProfilerStep#4", "ts": 8000, "dur": 4000},
        {"cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 12000, "dur": 2000},
    ]
    s = kernel_summary(events, steps=2)
    assert s["kernel_ms_per_step"] == 3.0 and s["gpu_step_ms"] == 6.5
    assert s["kernels"][0] == ("nvjet_sm90_tst_256x128", 2.0, 1.0)
    assert dict(s["families"]) == {"matmul": 2.0, "cross-entropy": 1.0}
    assert family("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "attention"
    assert "| matmul | 2.00 | 66.7 |" in kernel_markdown(s)


def test_exposed_communication_is_the_part_no_other_kernel_runs_beside() -> None:
    def kernel(name: str, ts: float, dur: float) -> dict:
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}

    kernels = [kernel("nvjet_sm90_a", 0, 10), kernel("ncclDevKernel_AllReduce_Sum_f32", 5, 20),
               kernel("triton_poi_b", 20, 10), kernel("ncclDevKernel_AllReduce_Sum_f32", 40, 10),
               kernel("ncclDevKernel_AllGather", 45, 10), kernel("triton_poi_c", 50, 2), kernel("nvjet_d", 60, 5)]
    # Communication runs over 5-25 and 40-55 (35 µs); compute hides 5-10, 20-25 and 50-52 of it: 23 µs exposed.
    assert exposed_communication(kernels) == (35.0, 23.0)
    assert exposed_communication([kernel("nvjet_sm90_a", 0, 10)]) == (0.0, 0.0)
    events = kernels + [{"cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100}]
    summary = kernel_summary(events, steps=1)
    assert summary["comm_ms_per_step"] == 0.035 and summary["comm_exposed_ms_per_step"] == 0.023
    assert "in 0.02 ms of it no other kernel ran beside them (exposed communication, 23.0% of the GPU step)" in (
        kernel_markdown(summary))


def test_union_merges_overlaps_and_uncovered_skips_what_the_cover_hides() -> None:
    from benchlab.run.profiling import uncovered, union

    # (6, 7) lies inside the merged (4, 8): the merge keeps the later end.
    assert union([(4.0, 6.0), (0.0, 1.0), (2.0, 3.0), (5.0, 8.0), (6.0, 7.0)]) == [(0.0, 1.0), (2.0, 3.0), (4.0, 8.0)]
    cover = [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (25.0, 35.0)]
    # 0-10 loses the three covered units; 20-30 is covered from 25; 40-50 comes after every cover.
    assert uncovered([(0.0, 10.0), (20.0, 30.0), (40.0, 50.0)], cover) == 7.0 + 5.0 + 10.0
    assert uncovered([(0.0, 10.0)], []) == 10.0


def oom(name: str, reserved: float | None, allocated: float | None, cap: float | None = None) -> dict:
    """A record of a variant that ran out of memory, as the bench stage writes it."""
    return {"variant": name, "status": "oom", "message": "CUDA out of memory. Tried to allocate 768.00 MiB",
            "peak_mem_reserved_mb": reserved, "peak_mem_allocated_mb": allocated, "params.harness.memory_cap_gib": cap,
            **ENV}


def test_ratios_are_against_the_baseline_where_it_ran() -> None:
    results = [result("fp32_baseline", 100.0, 5.0, 1000.0), result("recipe", 400.0, 5.0, 500.0),
               result("lean", 300.0, 5.0, 250.0)]
    name, note = ratio_reference(results, "fp32_baseline", ["recipe"])
    assert name == "fp32_baseline"
    assert note == "Ratios (speedup, memory change, loss check) are against fp32_baseline, aggregate.baseline."
    rows = summarize(results, "fp32_baseline", 0.1, fallbacks=["recipe"])
    assert [r["speedup_x"] for r in rows] == [1.0, 4.0, 3.0]
    assert {r["speedup_vs"] for r in rows} == {"fp32_baseline"}
    assert rows[2]["mem_change_pct"] == pytest.approx(-75.0)


def test_ratios_fall_back_to_the_first_fallback_that_ran_when_the_baseline_is_oom() -> None:
    results = [oom("fp32_baseline", 23900.0, 23100.0, cap=24), {**oom("tf32", None, None), "status": "skipped"},
               result("recipe", 400.0, 5.0, 500.0), result("lean", 300.0, 5.1, 250.0), result("fast", 800.0, 5.0, 600)]
    name, note = ratio_reference(results, "fp32_baseline", ["tf32", "recipe", "lean"])
    assert name == "recipe"  # tf32 did not run; recipe is the first that did, lean comes after it
    assert note == ("fp32_baseline ran out of memory at 23,900 MiB reserved (23,100 MiB allocated) under a 24 GiB "
                    "cap; ratios are against recipe, the first fallback that ran.")
    rows = {r["variant"]: r for r in summarize(results, "fp32_baseline", 0.1, fallbacks=["tf32", "recipe", "lean"])}
    assert rows["lean"]["speedup_x"] == pytest.approx(0.75) and rows["lean"]["speedup_vs"] == "recipe"
    assert rows["lean"]["mem_change_pct"] == pytest.approx(-50.0)
    assert rows["fast"]["speedup_x"] == pytest.approx(2.0) and rows["recipe"]["speedup_x"] == 1.0
    assert rows["fp32_baseline"]["speedup_x"] is None and rows["fp32_baseline"]["speedup_vs"] is None
    table = markdown(list(rows.values()), {}, note)
    assert table.splitlines()[2] == note  # one line under the environment
    assert "speedup_vs" in to_csv(list(rows.values())).splitlines()[0]


def test_without_a_baseline_or_fallback_that_ran_there_are_no_ratios_and_a_note_says_why() -> None:
    results = [oom("fp32_baseline", None, 20000.0), oom("recipe", 30000.0, None), result("lean", 300.0, 5.0, 250.0)]
    name, note = ratio_reference(results, "fp32_baseline", ["recipe"])
    assert name is None
    assert note == ("fp32_baseline ran out of memory at 20,000 MiB allocated, and no fallback ran ok (recipe); "
                    "the table has no ratios.")
    rows = summarize(results, "fp32_baseline", 0.1, fallbacks=["recipe"])
    assert all(r["speedup_x"] is None and r["mem_change_pct"] is None for r in rows)
    assert "has no result in this run" in ratio_reference([result("lean", 1, 1, 1)], "fp32_baseline")[1]
    assert ratio_reference([oom("fp32_baseline", None, None)], "fp32_baseline")[1] == (
        "fp32_baseline ran out of memory, and no fallback ran ok (none named in aggregate.fallback_baselines); "
        "the table has no ratios.")


def parity(name: str, learns: bool | None, verdict: str, status: str = "ok", gap: float | None = 0.01) -> dict:
    """A parity record as the parity stage writes it (the keys the summary reads)."""
    return {"variant": name, "reference": "tf32", "status": status, "message": "", "learns_same": learns,
            "verdict": verdict, "gap_nats": gap, "tail_loss": 5.0 + (gap or 0.0), "reference_tail_loss": 5.0}


def test_learns_the_same_column_comes_from_the_parity_records(tmp_path: Path) -> None:
    records = {"recipe": parity("recipe", True, "same", gap=0.004),
               "lean": parity("lean", False, "worse by 0.12 nats", gap=0.12),
               "fastest": parity("fastest", None, "not judged: the reference's own seeds differ by 0.08 nats"),
               "wild": parity("wild", None, "not judged: diverged at step 40", status="diverged", gap=None)}
    results = [result(n, 100.0, 5.0, 1.0) for n in ("fp32_baseline", "recipe", "lean", "fastest", "wild")]
    rows = {r["variant"]: r for r in summarize(results, "fp32_baseline", 0.1, parity=records)}
    assert rows["fp32_baseline"]["learns_same"] is None  # parity did not train it: a dash in the table
    assert rows["recipe"]["learns_same"] == "yes" and rows["recipe"]["parity_gap_nats"] == 0.004
    assert rows["lean"]["learns_same"] == "no: worse by 0.12 nats" and rows["lean"]["parity_gap_nats"] == 0.12
    assert rows["fastest"]["learns_same"].startswith("not judged: the reference's own seeds")
    assert rows["wild"]["parity_gap_nats"] is None
    line = next(x for x in markdown(list(rows.values()), {}).splitlines() if x.startswith("| fp32_baseline"))
    assert "learns the same" in markdown(list(rows.values()), {}) and "| –" in line
    for name, rec in records.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    (tmp_path / "reference-seeds.json").write_text(json.dumps({"reference": "tf32", "noise_nats": 0.01}))
    loaded = load_parity(tmp_path)
    assert loaded["lean"] == records["lean"] and loaded["reference-seeds"]["noise_nats"] == 0.01
    assert load_parity(tmp_path / "missing") == {}  # no parity stages: no column, no error
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(LabError, match="broken.json is not valid JSON.*dvc repro -f parity@broken"):
        load_parity(tmp_path)


def test_energy_shows_what_was_measured_and_says_why_not_elsewhere() -> None:
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, 1.0, power_w_mean=650.0, tokens_per_joule=0.1538, power_note=None),
        result("cpu", 100.0, 5.0, 1.0, power_w_mean=None, tokens_per_joule=None,
               power_note="no NVML power reading on a CPU"),
        result("old", 100.0, 5.0, 1.0),  # a record from before power was measured
        {"variant": "off", "status": "skipped", "power_w_mean": None, "power_note": "not timed"},
    ], "fp32_baseline", 0.1)
    assert (rows[0]["power_w_mean"], rows[0]["tokens_per_joule"], rows[0]["energy_note"]) == (650.0, 0.1538, None)
    assert rows[1]["power_w_mean"] is None and rows[1]["energy_note"] == "not measured: no NVML power reading on a CPU"
    assert rows[2]["energy_note"] is None and rows[3]["energy_note"] is None
    table = markdown(rows, {})
    line = next(x for x in table.splitlines() if x.startswith("| fp32_baseline"))
    assert "board W" in table and "tokens/J" in table and "| 650 " in line and "| 0.2 " in line
    assert "not measured: no NVML power reading on a CPU" in table


def test_kinds_follow_the_knobs() -> None:
    def row(name: str, **knobs: object) -> dict:
        base = {"precision": "fp32", "attention": "manual", "compile": False, "batch_size": 16, "parallel": "none",
                "nproc": 1}
        return {"variant": name, "settings": {**base, **knobs}}

    recipe = {"precision": "bf16", "attention": "sdpa", "compile": True}
    rows = [row("fp32_baseline"), row("tf32", precision="tf32"), row("recipe", **recipe),
            row("ckpt", **recipe, activation_checkpointing="full"), row("batch_4", **recipe, batch_size=4),
            row("fastest", **recipe, loss="onepass"), row("ddp_2", parallel="ddp", nproc=2),
            row("fp16_sdpa", precision="fp16", attention="sdpa")]  # two knobs from each: not nearer the recipe
    assign_kinds(rows, "fp32_baseline", "recipe", ["fastest"])
    assert {r["variant"]: r["kind"] for r in rows} == {
        "fp32_baseline": "seed", "tf32": "seed", "recipe": "recipe", "ckpt": "recipe", "batch_4": "recipe",
        "fastest": "ours", "ddp_2": "other", "fp16_sdpa": "other"}
    assign_kinds(rows, "fp32_baseline", "gone", [])  # no reference row: nothing is "on the recipe"
    assert {r["variant"]: r["kind"] for r in rows}["ckpt"] == "other"
    assert {r["variant"]: r["kind"] for r in rows}["fastest"] == "other"


def test_an_empty_matrix_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="params.yaml names no variants"):
        load_results(tmp_path, [])


def test_every_warning_reads_exactly_and_boundaries_are_inclusive() -> None:
    rows = summarize([
        result("fp32_baseline", 1000.0, 5.0, 100.0, (990, 1010)),
        # Gap 0.125 == tolerance and spread 0.02 == repeat_tolerance: both still within.
        result("odd", 2000.0, 5.125, None, (1900, 2100), peak_rss_mb=50.0, steady_state_ok=False,
               steady_gap_pct=7.25, leak_suspected=True, mem_growth_mb=12.5, fp16_skipped_steps=3,
               val_loss_repeat_spread=0.02, peak_mem_allocated_comparable=False, peak_mem_reserved_mb=150.0),
    ], "fp32_baseline", tolerance=0.125, repeat_tolerance=0.02)
    odd = rows[1]
    assert odd["notes"] == ("timed halves differ by 7.2%: not steady; memory grew 12.5 MiB over the timed steps; "
                            "CUDA graphs: allocated peak misses the graph pools; compare reserved memory; "
                            "GradScaler skipped 3 steps")
    assert odd["loss_ok"] == "yes" and odd["significant"] == "yes" and odd["speedup_x"] == 2.0
    assert odd["mem_change_pct"] == pytest.approx(50.0)  # reserved 150 against the baseline's 100
    assert odd["tokens_per_sec_pi95"] == "1,900 to 2,100" and odd["peak_rss_mb"] == 50.0
    assert rows[0]["notes"] == "" and rows[0]["tokens_per_sec_pi95"] == "990 to 1,010"


def test_a_stalled_timing_says_it_was_disturbed_and_by_how_much() -> None:
    """Issue 46: a 20 s `kill -STOP` in the timed window read as a clean row."""
    stall = {"steady_state_ok": False, "steady_gap_pct": 0.5, "step_ms_median": 15.0}
    rows = summarize([
        result("fp32_baseline", 1000.0, 5.0, 100.0),
        result("stopped", 1000.0, 5.0, 100.0, **stall, stalled_steps=1, stall_ms_max=20_000.0,
               stall_outside_steps_ms=0.0),
        result("starved", 1000.0, 5.0, 100.0, **stall, stalled_steps=3, stall_ms_max=1_500.0,
               stall_outside_steps_ms=20_000.0),
        result("halves", 1000.0, 5.0, 100.0, steady_state_ok=False, steady_gap_pct=9.0, stalled_steps=0,
               stall_ms_max=0.0, stall_outside_steps_ms=0.0),
    ], "fp32_baseline", tolerance=0.1)
    assert rows[1]["notes"] == ("timing disturbed: 1 timed step stalled, the longest 20,000 ms beyond the 15.00 ms "
                                "median step (a stall: over 10x it); rerun on a quiet machine")
    assert rows[2]["notes"] == ("timing disturbed: 3 timed steps stalled, the longest 1,500 ms beyond the 15.00 ms "
                                "median step (a stall: over 10x it); 20,000 ms passed between timed steps (the process "
                                "was stopped or starved); rerun on a quiet machine")
    assert rows[3]["notes"] == "timed halves differ by 9.0%: not steady"  # a drift without a stall, as before
    assert rows[0]["notes"] == ""


def test_memory_falls_back_to_rss_and_rows_without_a_figure_get_none() -> None:
    cpu = {"peak_mem_allocated_mb": None}
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, None, **cpu, peak_rss_mb=200.0),
        result("lean", 100.0, 5.0, None, **cpu, peak_rss_mb=150.0),
        result("unknown", 100.0, 5.0, None, **cpu),
        result("half_ci", 100.0, 5.0, 1.0, tokens_per_sec_pi95_low=1.0),
    ], "fp32_baseline", tolerance=0.1)
    assert rows[1]["mem_change_pct"] == pytest.approx(-25.0)
    assert rows[2]["mem_change_pct"] is None
    assert rows[3]["tokens_per_sec_pi95"] is None and rows[3]["significant"] is None  # one bound is no interval


def test_a_baseline_that_did_not_run_gives_no_comparisons() -> None:
    rows = summarize([{"variant": "fp32_baseline", "status": "oom", "message": "out of memory"},
                      result("fast", 200.0, 5.0, 1.0)], "fp32_baseline", tolerance=0.1)
    assert rows[1]["speedup_x"] is None and rows[1]["loss_ok"] is None and rows[1]["notes"] == ""
    assert rows[0]["notes"] == "out of memory"
    missing = summarize([result("fast", 200.0, 5.0, 1.0)], "fp32_baseline", tolerance=0.1)
    assert missing[0]["speedup_x"] is None


def test_interference_note_leaves_out_an_idle_cpu() -> None:
    rows = summarize([result("fp32_baseline", 1.0, 5.0, 1.0),
                      result("gpu_only", 1.0, 5.0, 1.0, interference_suspected=True, other_gpu_processes=[7],
                             cpu_busy_others_pct_max=0.0)], "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "machine shared while timed: other GPU processes [7]"
    rows = summarize([result("fp32_baseline", 1.0, 5.0, 1.0),
                      result("cpu_only", 1.0, 5.0, 1.0, interference_suspected=True, cpu_busy_others_pct_max=0.5)],
                     "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "machine shared while timed: others kept 0% of the CPU busy"


def _scaling_rows() -> list[dict]:
    return [
        # A failed one-process row with the same knobs must never be the reference.
        {**result("one_failed", 1.0, 9.0, 1.0), "status": "error"},
        result("fp32_baseline", 100.0, 5.0, 1.0, batch_size=16),
        result("one_b32", 150.0, 4.75, 1.0, batch_size=32),
        result("ddp_2", 180.0, 5.0, 1.0, batch_size=32, world_size=2, parallel="ddp", nproc=2, ddp_bucket_mb=50),
        result("fsdp_2_global", 120.0, 4.5, 1.0, batch_size=16, world_size=2, parallel="fsdp2", nproc=2),
        result("bf16_ddp_2", 400.0, 5.0, 1.0, batch_size=32, world_size=2, parallel="ddp", nproc=2,
               precision="bf16"),
        {**result("ddp_failed", 1.0, 5.0, 1.0, batch_size=32, world_size=2), "status": "error"},
    ]


def test_scaling_takes_the_same_per_rank_batch_first_and_the_loss_gap_at_the_same_global_batch() -> None:
    rows = {r["variant"]: r for r in summarize(_scaling_rows(), "fp32_baseline", tolerance=1.0)}
    ddp = rows["ddp_2"]
    assert ddp["scaling_efficiency_pct"] == pytest.approx(90.0)  # 180 / (2 x 100)
    assert ddp["scaling_ref"] == "fp32_baseline (same per-rank batch)"
    assert ddp["val_loss_gap_1proc"] == pytest.approx(0.25)  # against one_b32, which saw the same data
    glob = rows["fsdp_2_global"]
    assert glob["scaling_efficiency_pct"] == pytest.approx(60.0)  # 120 / (2 x 100)
    assert glob["scaling_ref"] == "fp32_baseline (same global batch)"
    assert glob["val_loss_gap_1proc"] == pytest.approx(-0.5)
    none = {"scaling_efficiency_pct": None, "scaling_ref": None, "val_loss_gap_1proc": None}
    for name in ("bf16_ddp_2", "ddp_failed", "fp32_baseline", "one_b32", "one_failed"):  # no counterpart / one process
        assert {k: rows[name][k] for k in none} == none, name


def test_markdown_and_csv_read_exactly() -> None:
    rows = summarize([result("fp32_baseline", 1000.0, 5.0, 100.0), result("fast", 2000.0, 5.0, 50.5)],
                     "fp32_baseline", tolerance=0.1)
    for row in rows:  # keep the table narrow: the columns under test only
        for key in ("val_perplexity", "significant", "tokens_per_sec_pi95", "loss_ok"):
            row.pop(key)
    rows[1]["notes"] = ""
    table = markdown(rows, {"env.gpu": "NVIDIA H200", "env.driver": None, "env.cuda": "13.0"})
    assert table == (
        "Measured on gpu: NVIDIA H200, cuda: 13.0.\n\n"
        "| variant       | status   | track        |   tokens/s |   speedup |   peak alloc MiB |   memory vs base % |   val loss |\n"
        "|---------------|----------|--------------|------------|-----------|------------------|--------------------|------------|\n"
        "| fp32_baseline | ok       | systems-only |      1,000 |         1 |              100 |                0   |          5 |\n"
        "| fast          | ok       | systems-only |      2,000 |         2 |               50 |              -49.5 |          5 |\n"
    )
    header, base, fast = to_csv(rows).split("\n")[:3]
    assert header.split(",")[:4] == ["variant", "status", "track", "tokens_per_sec"] and len(header.split(",")) == 34
    assert base == "fp32_baseline,ok,systems-only,1000.0,,,,,,,1.0,,,,,,,100.0,,,0.0,,,,5.0,,,,,,,,,fp32_baseline"
    assert fast.startswith("fast,ok,systems-only,2000.0,") and "\r" not in to_csv(rows)
    assert to_csv([{**rows[0], "not_a_column": 1}]).count("\n") == 2  # extra keys are left out, not an error


def test_refusals_name_every_difference(tmp_path: Path) -> None:
    a = result("fp32_baseline", 1, 1, 1)
    b = result("fast", 2, 1, 1, **{"env.gpu": "A100", "env.cuda": "12.4"})
    with pytest.raises(LabError) as err:
        check_one_env([a, b, result("x", 1, 1, 1)], allow_mixed=False)
    assert str(err.value) == (
        "fast was measured in another environment than fp32_baseline "
        "({'env.gpu': ('NVIDIA H200', 'A100'), 'env.cuda': ('13.0', '12.4')}); "
        "rerun the matrix on one machine, or set aggregate.allow_mixed_env=true to compare anyway")
    src = "provenance.source_sha256"
    rows = [result("a", 1, 1, 1, **{src: "0123456789abcdef"}), result("b", 1, 1, 1, **{src: "0123456789abcdef"}),
            result("c", 1, 1, 1, **{src: "fedcba9876543210"})]
    with pytest.raises(LabError) as err:
        check_one_source(rows, allow_mixed=False)
    text = str(err.value)
    assert "0123456789ab: a, b" in text and "fedcba987654: c" in text and "0123456789abc" not in text
    assert text.endswith("(`dvc repro -f` the stale ones), or set aggregate.allow_mixed_source=true to compare anyway")
    dirty = [result(n, 1, 1, 1, **{src: "s", "provenance.tree_clean": clean}) for n, clean in (("a", False),
                                                                                                  ("b", True))]
    check_one_source(dirty, allow_mixed=False)  # one code, uncommitted: flagged, not refused
    assert uncommitted(dirty) == ["a"]
    with pytest.raises(LabError) as err:
        load_results(tmp_path, ["gone"])
    assert str(err.value) == f"{tmp_path / 'gone.json'} is missing; run `dvc repro bench@gone`"


def test_rows_without_optional_keys_read_as_no_warning_and_no_note() -> None:
    old = result("old_record", 100.0, 5.0, 1.0)
    del old["steady_state_ok"]  # records from before the steady-state check
    rows = summarize([result("fp32_baseline", 100.0, 5.0, 1.0), old, {"variant": "bare", "status": "skipped"}],
                     "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "" and rows[2]["notes"] == ""
    table = markdown(rows, {})
    assert table.splitlines()[-1].startswith("| bare ") and "| –" in table  # a figure not measured is a dash
    both_bf16 = [result("one", 100.0, 5.0, 1.0, precision="bf16"),
                 result("ddp", 150.0, 5.0, 1.0, precision="bf16", world_size=2, parallel="ddp", nproc=2)]
    assert summarize(both_bf16, "one", 0.1)[1]["scaling_ref"] == "one (same global batch)"


def test_source_groups_are_listed_with_commas() -> None:
    src = "provenance.source_sha256"
    rows = [result("a", 1, 1, 1, **{src: "0123456789abcdef"}), result("c", 1, 1, 1, **{src: "fedcba9876543210"})]
    with pytest.raises(LabError) as err:
        check_one_source(rows, allow_mixed=False)
    assert str(err.value).split(" (")[1].split(")")[0] in ("0123456789ab: a, fedcba987654: c",
                                                           "fedcba987654: c, 0123456789ab: a")


def test_the_kernel_table_in_full_names_each_family_kernel_and_the_communication_it_waited_on() -> None:
    long = "a|b" + "x" * 120
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 1000, "dur": 3000},
              {"cat": "kernel", "name": long, "ts": 2000, "dur": 1000},
              {"cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 4000, "dur": 2000},
              {"cat": "gpu_user_annotation", "name": "ProfilerStep#3", "ts": 1000, "dur": 8000}]
    summary = kernel_summary(events, steps=2)
    assert summary == {"kernels": [("nvjet_sm90_tst_256x128", 1.5, 0.5), ("ncclDevKernel_AllReduce", 1.0, 0.5),
                                   (long, 0.5, 0.5)],
                       "comm_share_pct": 100.0 / 3, "families": [("matmul", 1.5), ("communication", 1.0), ("other", 0.5)],
                       "kernel_ms_per_step": 3.0, "comm_ms_per_step": 1.0, "comm_exposed_ms_per_step": 1.0,
                       "gpu_step_ms": 4.0}
    assert kernel_markdown(summary) == (
        "| family | device ms per step | share % |\n| --- | --- | --- |\n| matmul | 1.50 | 50.0 |\n"
        "| communication | 1.00 | 33.3 |\n| other | 0.50 | 16.7 |\n\n"
        "| kernel | family | calls per step | device ms per step | share % |\n| --- | --- | --- | --- | --- |\n"
        "| `nvjet_sm90_tst_256x128` | matmul | 0.5 | 1.500 | 50.0 |\n"
        "| `ncclDevKernel_AllReduce` | communication | 0.5 | 1.000 | 33.3 |\n"
        f"| `a/b{'x' * 94}...` | other | 0.5 | 0.500 | 16.7 |\n\n"
        "Kernel time: 3.00 ms per traced step (communication kernels 33.3% of it, overlapped or not), in 4.00 ms of "
        "GPU time per traced step (the rest: gaps between kernels). Communication kernels ran during 1.00 ms per step; "
        "in 1.00 ms of it no other kernel ran beside them (exposed communication, 25.0% of the GPU step).\n")
    assert kernel_markdown(summary, rows=1).count("| `") == 1  # the top kernels only
    # A kernel that starts as the window closes belongs to the next step; one of 101 characters is cut.
    edge = kernel_summary(events + [{"cat": "kernel", "name": "k" * 101, "ts": 9000, "dur": 5}], steps=2)
    assert edge["kernels"] == summary["kernels"]
    cut = kernel_summary([{"cat": "kernel", "name": "k" * 101, "ts": 0, "dur": 3000}], steps=1)
    assert f"| `{'k' * 97}...` |" in kernel_markdown(cut)
    assert kernel_summary([], steps=1)["comm_share_pct"] is None  # no kernel time: no share of it
    # No annotations: every kernel counts and there is no GPU step to compare with; exactly 100 characters stay whole.
    alone = kernel_summary([{"cat": "kernel", "name": "k" * 100, "ts": 0, "dur": 3000}], steps=1)
    assert (alone["gpu_step_ms"], alone["comm_share_pct"], alone["comm_ms_per_step"]) == (None, 0.0, 0.0)
    assert kernel_markdown(alone).endswith(
        f"| `{'k' * 100}` | other | 1.0 | 3.000 | 100.0 |\n\nKernel time: 3.00 ms per traced step.\n")
    comm_only = {**alone, "comm_share_pct": 50.0, "comm_ms_per_step": 1.5, "comm_exposed_ms_per_step": 0.5}
    assert kernel_markdown(comm_only).endswith(
        "Kernel time: 3.00 ms per traced step (communication kernels 50.0% of it, overlapped or not). Communication "
        "kernels ran during 1.50 ms per step; in 0.50 ms of it no other kernel ran beside them (exposed "
        "communication).\n")


class FakeProfile:
    """What write_profile reads of torch.profiler: its Chrome trace and its per-op averages."""

    class Op:
        def __init__(self, key: str, count: int, self_us: float) -> None:
            self.key, self.count, self.self_cpu_time_total = key, count, self_us

    def __init__(self, events: list) -> None:
        self.events = events

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps({"traceEvents": self.events}))

    def key_averages(self) -> list:
        return [self.Op("aten::add", 4, 1e6), self.Op("aten::" + "m" * 120, 2, 3e6)]


def test_a_profile_writes_the_gzipped_trace_and_the_table_titled_with_what_was_traced(tmp_path: Path) -> None:
    from benchlab.run.profiling import write_not_profiled, write_profile

    events = [{"cat": "kernel", "name": "nvjet_a", "ts": 0, "dur": 2000}]
    write_profile(FakeProfile(events), tmp_path, "fp32", torch.device("cpu"), "tiny, batch 2 x 8.", steps=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp32_kernels.md", "fp32_trace.json.gz"]  # no raw trace left
    with gzip.open(tmp_path / "fp32_trace.json.gz", "rt") as f:
        assert json.load(f) == {"traceEvents": events}
    assert (tmp_path / "fp32_kernels.md").read_text() == (
        "# fp32: top ops by self CPU time\n\ntiny, batch 2 x 8.\n\n"
        "| op | calls per step | self CPU ms per step | share % |\n| --- | --- | --- | --- |\n"
        f"| `aten::{'m' * 94}` | 1.0 | 1500.000 | 75.0 |\n| `aten::add` | 2.0 | 500.000 | 25.0 |\n\n"
        "Self CPU time: 2000.00 ms per step.\n")
    write_profile(FakeProfile(events), tmp_path, "bf16", torch.device("cuda"), "about.", steps=1)
    assert (tmp_path / "bf16_kernels.md").read_text() == (
        "# bf16: top kernels by device time\n\nabout.\n\n" + kernel_markdown(kernel_summary(events, 1)))
    write_not_profiled(tmp_path, "fp16", "Not profiled on cpu: precision=fp16 needs a GPU\n")
    assert (tmp_path / "fp16_kernels.md").read_text() == "Not profiled on cpu: precision=fp16 needs a GPU\n"
    with gzip.open(tmp_path / "fp16_trace.json.gz", "rt") as f:
        assert f.read() == '{"traceEvents": []}'


def test_a_row_without_a_measurement_says_why_in_words() -> None:
    from benchlab.analysis.summary import memory_cap_gib, not_run_reason, stopped_at

    assert not_run_reason(None) == "has no result in this run"
    assert not_run_reason({"status": "skipped", "message": "fp16 needs a GPU"}) == "was skipped (fp16 needs a GPU)"
    assert not_run_reason({"status": "diverged", "message": ""}) == "diverged"
    assert not_run_reason({"status": "error"}) == "ended in an error"
    assert not_run_reason({"status": "killed", "message": "signal 9"}) == "ended killed (signal 9)"
    oom = {"status": "oom", "peak_mem_reserved_mb": 23900.0, "peak_mem_allocated_mb": 23100.0,
           "params.harness.memory_cap_gib": 24}
    assert not_run_reason(oom) == "ran out of memory at 23,900 MiB reserved (23,100 MiB allocated) under a 24 GiB cap"
    assert stopped_at({"peak_mem_allocated_mb": 512.0, "memory_cap_gib": 0.5}) == (
        " at 512 MiB allocated under a 0.5 GiB cap")  # a record from before the params' key: its own key
    assert stopped_at({}) == "" and memory_cap_gib({"memory_cap_gib": 0}) is None
    assert memory_cap_gib({"params.harness.memory_cap_gib": 16, "memory_cap_gib": 8}) == 16


def test_energy_is_shown_only_as_measured_and_otherwise_says_why() -> None:
    from benchlab.analysis.summary import energy

    measured = {"status": "ok", "power_w_mean": 400.0, "tokens_per_joule": 1250.0}
    assert energy(measured) == {"power_w_mean": 400.0, "tokens_per_joule": 1250.0, "energy_note": None}
    half = {"status": "ok", "power_w_mean": 400.0, "tokens_per_joule": None}
    assert energy(half)["energy_note"] == "not measured"
    assert energy({"status": "ok", "power_note": "no NVML on a CPU"})["energy_note"] == "not measured: no NVML on a CPU"
    assert energy({"status": "ok", "power_w_mean": None})["energy_note"] == "not measured"
    assert energy({"status": "ok"})["energy_note"] is None  # a record from before power was measured
    assert energy({"status": "oom", "power_note": "x"})["energy_note"] is None


def test_parity_s_verdict_in_words_and_its_gap_only_from_a_judged_run() -> None:
    from benchlab.analysis.summary import parity_columns

    assert parity_columns(None) == {"learns_same": None, "parity_gap_nats": None}
    assert parity_columns({"learns_same": True, "status": "ok", "gap_nats": 0.01}) == {
        "learns_same": "yes", "parity_gap_nats": 0.01}
    assert parity_columns({"learns_same": False, "verdict": "worse by 0.12 nats", "status": "ok", "gap_nats": 0.12}) == {
        "learns_same": "no: worse by 0.12 nats", "parity_gap_nats": 0.12}
    assert parity_columns({"status": "diverged", "message": "loss became nan", "gap_nats": 3.0}) == {
        "learns_same": "diverged: loss became nan", "parity_gap_nats": None}
    assert parity_columns({}) == {"learns_same": "no verdict: no message", "parity_gap_nats": None}
    assert parity_columns({"status": "ok", "gap_nats": "n/a"})["parity_gap_nats"] is None


def test_a_summary_row_keeps_the_record_s_name_status_repeats_and_whiskers() -> None:
    r = {"variant": "bf16", "status": "ok", "tokens_per_sec": 100.0, "val_loss": 3.0, "repeats": 2,
         "tokens_per_sec_pi95_low": 90.0, "tokens_per_sec_pi95_high": 110.0}
    row = summarize([r], "bf16", 0.05)[0]
    assert (row["variant"], row["status"], row["repeats"]) == ("bf16", "ok", 2)
    assert (row["tokens_per_sec_pi95_low"], row["tokens_per_sec_pi95_high"]) == (90.0, 110.0)
    assert row["tokens_per_sec_pi95"] == "90 to 110" and "significant" in row and row["significant"] is None
    assert row["speedup_vs"] == "bf16"


def test_a_time_limited_row_says_how_many_repeats_ran() -> None:
    from benchlab.analysis.summary import warnings

    assert warnings({"repeats_asked": 3, "repeats": 1}, 1.0) == ["1 of 3 repeats: a time limit stopped the rest"]
    assert warnings({"repeats_asked": 3}, 1.0) == []  # a record without its count ran them all


def test_the_markdown_table_always_has_the_variant_column_and_prints_text_as_is() -> None:
    from benchlab.analysis.summary import markdown

    text = markdown([{"variant": None, "status": "ok", "notes": "a note"}], {})
    assert text.splitlines()[2].startswith("| variant ") and "a note" in text
    assert markdown([{"variant": "x", "tokens_per_sec": 1234.5}], {}).count("1,234") == 1  # numbers by their spec


def test_kinds_come_from_whichever_of_baseline_and_recipe_ran() -> None:
    rows = [{"variant": "recipe", "settings": {"a": 1}}, {"variant": "near_recipe", "settings": {"a": 1, "b": 2}},
            {"variant": "odd", "settings": {"a": 5, "b": 6, "c": 7}}]
    assign_kinds(rows, "fp32_baseline", "recipe", ours=[])  # no baseline row
    assert [r["kind"] for r in rows] == ["recipe", "recipe", "recipe"]
    rows = [{"variant": "fp32_baseline", "settings": {"a": 1}}, {"variant": "near", "settings": {"a": 2}},
            {"variant": "far", "settings": {"a": 2, "b": 3, "c": 4}}]
    assign_kinds(rows, "fp32_baseline", "recipe", ours=[])  # no recipe row
    assert [r["kind"] for r in rows][:2] == ["seed", "seed"] and rows[2]["kind"] != "recipe"


def test_fallbacks_that_did_not_run_are_named_and_one_absent_is_passed_over() -> None:
    results = [oom("fp32_baseline", None, None), result("lean", 300.0, 5.0, 250.0)]
    name, note = ratio_reference(results, "fp32_baseline", ["gone", "recipe", "lean"])
    assert name == "lean"
    assert ratio_reference(results[:1], "fp32_baseline", ["gone", "recipe"])[1] == (
        "fp32_baseline ran out of memory, and no fallback ran ok (gone, recipe); the table has no ratios.")


def test_an_empty_matrix_s_error_reads_in_full(tmp_path: Path) -> None:
    with pytest.raises(LabError) as err:
        load_results(tmp_path, [])
    assert str(err.value) == ("params.yaml names no variants, so there is nothing to tabulate; add one under "
                              "`variants:`")


def test_the_table_sorts_kinds_by_the_aggregate_s_own_baseline() -> None:
    from benchlab.analysis.summary import table
    from benchlab.core.sections import AggregateParams

    rows, note = table([result("fp32_baseline", 100.0, 5.0, 1000.0), result("tf32", 120.0, 5.0, 1000.0)],
                       AggregateParams(baseline="fp32_baseline", reference="recipe", ours=[]), {})
    assert [r["kind"] for r in rows] == ["seed", "seed"] and note.endswith("aggregate.baseline.")


def test_the_tables_list_the_top_25_by_default() -> None:
    from benchlab.run.profiling import cpu_ops_markdown

    events = [{"cat": "kernel", "name": f"kernel_{i}", "ts": i * 10, "dur": 100 + i} for i in range(30)]
    assert kernel_markdown(kernel_summary(events, steps=1)).count("| `kernel_") == 25

    class Many(FakeProfile):
        def key_averages(self) -> list:
            return [self.Op(f"aten::op{i}", 1, 10.0 + i) for i in range(30)]

    assert cpu_ops_markdown(Many([]), steps=1).count("| `aten::op") == 25
