"""aggregate: speedups against the baseline, loss checks, and one environment per table."""

import json
from pathlib import Path

import pytest

from benchlab.errors import LabError
from benchlab.profiling import exposed_communication, family, kernel_markdown, kernel_summary
from benchlab.report import check_one_env, check_one_source, load_results, markdown, summarize, to_csv

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
        {"variant": "huge", "status": "oom", "message": "out of memory at train.batch_size=64", **ENV},
    ], "fp32_baseline", 0.1)
    for row in rows[1:]:
        assert row["speedup_x"] is None and row.get("tokens_per_sec") is None and row["notes"]
    table = markdown(rows, {"env.gpu": "NVIDIA H200"})
    assert "| fp16 " in table and "needs a CUDA GPU" in table and "oom" in table
    assert "NVIDIA H200" in table.splitlines()[0]
    assert to_csv(rows).splitlines()[0].startswith("variant,status,tokens_per_sec")


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


def test_results_from_other_code_or_a_modified_tree_are_refused_unless_allowed() -> None:
    src = "provenance.source_sha256"
    a, b = result("fp32_baseline", 1, 1, 1, **{src: "aaaa"}), result("fast", 2, 1, 1, **{src: "bbbb"})
    with pytest.raises(LabError, match="ran different source code.*aaaa.*fp32_baseline.*allow_mixed_source=true"):
        check_one_source([a, b], allow_mixed=False)
    check_one_source([a, b], allow_mixed=True)
    dirty = result("fast", 2, 1, 1, **{src: "aaaa", "provenance.tree_clean": False})
    with pytest.raises(LabError, match="fast ran from a tree with uncommitted changes"):
        check_one_source([a, dirty], allow_mixed=False)
    check_one_source([a, result("fast", 2, 1, 1, **{src: "aaaa", "provenance.tree_clean": True})], allow_mixed=False)


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
    assert graphs["mem_reserved"] is True and not any(r["mem_reserved"] for r in (rows[0], big, shared))
    assert big["loss_ok"] == "n/a (batch 64, baseline 16)"  # another batch learns another curve
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
    from benchlab.profiling import uncovered, union

    # (6, 7) lies inside the merged (4, 8): the merge keeps the later end.
    assert union([(4.0, 6.0), (0.0, 1.0), (2.0, 3.0), (5.0, 8.0), (6.0, 7.0)]) == [(0.0, 1.0), (2.0, 3.0), (4.0, 8.0)]
    cover = [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (25.0, 35.0)]
    # 0-10 loses the three covered units; 20-30 is covered from 25; 40-50 comes after every cover.
    assert uncovered([(0.0, 10.0), (20.0, 30.0), (40.0, 50.0)], cover) == 7.0 + 5.0 + 10.0
    assert uncovered([(0.0, 10.0)], []) == 10.0
