"""The README's figures come from committed result files, and its commands are the real ones."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_result_plots_are_drawn_from_the_committed_files(tmp_path: Path) -> None:
    """The README's regime and batch-sweep figures: each script reads only committed results and writes a PNG."""
    out = tmp_path / "regimes.png"
    proc = subprocess.run([sys.executable, "scripts/regime_plot.py", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and out.read_bytes().startswith(b"\x89PNG"), proc.stderr
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results/h200-small/metrics", run / "metrics")
    proc = subprocess.run([sys.executable, "scripts/sweep_plot.py", str(run)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and "batch_4, recipe, batch_64" in proc.stdout, proc.stderr
    assert (run / "batch_sweep.png").read_bytes().startswith(b"\x89PNG")
    for name in ("batch_4", "batch_64"):
        (run / "metrics/variants" / f"{name}.json").unlink()
    proc = subprocess.run([sys.executable, "scripts/sweep_plot.py", str(run)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "no variants that differ only in batch size" in proc.stderr
