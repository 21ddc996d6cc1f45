"""The README's figures come from committed result files, and its commands are the real ones."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchlab.profiling import exposed_communication, family, kernel_markdown, kernel_summary
from tests.conftest import ROOT


def test_readme_results_match_the_committed_result_files() -> None:
    proc = subprocess.run([sys.executable, "scripts/readme_results.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_check_survives_a_local_repro_but_not_an_edited_section(tmp_path: Path) -> None:
    """Quick start 1 on another machine rewrites metrics/ with that machine's timings; quick start 2 must pass."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.copy(ROOT / "scripts/readme_results.py", clone / "scripts/readme_results.py")
    check = [sys.executable, "scripts/readme_results.py", "--check"]
    eval_json = clone / "metrics/eval.json"
    local = json.loads(eval_json.read_text())
    eval_json.write_text(json.dumps({**local, "val_loss": local["val_loss"] + 0.5}))  # as a local dvc repro would
    proc = subprocess.run(check, cwd=clone, capture_output=True, text=True)
    assert proc.returncode == 0 and "a local dvc repro" in proc.stdout, proc.stdout + proc.stderr
    readme = clone / "README.md"
    readme.write_text(readme.read_text().replace("reaches validation loss", "reaches a validation loss", 1))
    proc = subprocess.run(check, cwd=clone, capture_output=True, text=True)
    assert proc.returncode == 1 and "out of date" in proc.stdout


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "python -m pytest -q" in readme and "python -m pytest -q" in ci
    assert "python -m pytest -q -m slow" in ci  # the long checks the README's command leaves out
    assert "pip install -r requirements-test.txt" in readme and "-r requirements-test.txt" in ci


def test_every_result_folder_names_its_machine() -> None:
    env_files = list(Path(ROOT / "results").glob("**/metrics/env.json"))
    assert len(env_files) >= 5  # h200, h200-repeats and the three runs of h200-knobs
    for env_file in env_files:
        assert '"gpu": "NVIDIA H200"' in env_file.read_text(), env_file


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
