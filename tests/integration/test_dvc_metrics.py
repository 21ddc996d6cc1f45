"""`dvc metrics show` and `dvc metrics diff` run on a fresh clone's files print no failure, before and after a search.
Why every declared metrics file is committed: tests/unit/test_dvc_metrics.py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.test_dvc_metrics import PIPELINES, files_in_git  # noqa: F401  (files_in_git: a fixture)

FAILED = "failed to load"  # DVC's line: "DVC failed to load some metrics for following revisions: ..."


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"dvc {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.integration
def test_metrics_show_and_diff_print_no_failure_before_and_after_a_search(files_in_git: set[str],
                                                                          tmp_path: Path) -> None:
    # The pipelines, params, lock and metrics as a fresh clone has them (a clone of the working tree's files).
    keep = [n for n in files_in_git if n.startswith(("metrics/", ".dvc/")) or n in (*PIPELINES, "params.yaml",
                                                                                      "dvc.lock", ".dvcignore")]
    for name in keep:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "clone")
    for args in (("metrics", "show"), ("metrics", "diff")):
        proc = dvc(tmp_path, *args)
        assert FAILED not in proc.stderr + proc.stdout, proc.stderr
    # A search writes its summary (benchlab/search/report.py's keys): the diff shows it against the commit.
    (tmp_path / "metrics/search.json").write_text(json.dumps({"status": "ok", "runs": 7, "spent_s": 280.5}))
    diff = dvc(tmp_path, "metrics", "diff")
    assert FAILED not in diff.stderr + diff.stdout, diff.stderr
    assert any(line.split()[:2] == ["metrics/search.json", "runs"] and "7" in line for line in diff.stdout.splitlines())
    git(tmp_path, "commit", "-qam", "searched")
    for args in (("metrics", "show"), ("metrics", "diff", "HEAD~1")):
        proc = dvc(tmp_path, *args)
        assert FAILED not in proc.stderr + proc.stdout, proc.stderr
